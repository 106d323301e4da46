//! The HTTP/1.1 fast path of the HTTP listeners.
//!
//! Most proxied traffic is plain HTTP/1.1: a request line, a few headers, no body or a small
//! one. For those, this module does what nginx does — parse the head in place (`httparse`),
//! write the rewritten head and body to a kept-alive upstream connection from this thread's
//! pool, relay the answer back as it arrives — in the connection's own task: no hyper
//! dispatcher, no per-request allocation, no per-request timer registration, no hop to a
//! connection task. Every request takes the same route through the balancer, retries, retry
//! budget, outlier statistics and metrics as the hyper path ([`crate::forward`]).
//!
//! Anything else — HTTP/1.0, h2c (prior knowledge or `Upgrade`), `Expect`, chunked or large
//! request bodies, absolute-form targets, too many or malformed headers, a head over
//! `max_header_bytes`, a service that talks h2c upstream — is handed to hyper with the bytes
//! already read, for the rest of the connection.

mod io;
mod wire;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use lbkit_core::http::is_idempotent_method;
use lbkit_core::{
    AttemptPolicy, Attempts, CallGuard, FastRng, Next, Observed, Outcome, Stop, Timestamp,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;

pub(crate) use io::{pin_runtime_thread, sweep_idle, Rewind};
use io::{Buffers, Timer};
use wire::{BodyCursor, Forward, Hdr, Parsed, ReqHead};

use crate::config::Limits;
use crate::server::Shared;
use crate::service::Service;
use crate::state::State;

/// Free space kept for a read from the client.
const CLIENT_READ: usize = 4096;

/// Largest input buffer an idle connection keeps (a larger one, grown for a large head or body,
/// is dropped once empty).
const MAX_IDLE_INPUT: usize = 16 * 1024;

/// Free space kept for a read from an upstream.
const UPSTREAM_READ: usize = 16 * 1024;

/// Largest response head read from an upstream.
const MAX_RESPONSE_HEAD: usize = 64 * 1024;

/// Response bytes gathered before they are written to the client: a response up to this size
/// leaves in one write (nginx's `proxy_buffering`); a larger one streams in writes of about
/// this size. The call's deadline covers the exchange until the first write.
const FLUSH_AT: usize = crate::forward::MAX_BUFFERED_RESPONSE as usize;

/// How a connection left the fast path.
pub(crate) enum End {
    /// It is closed (by either side, a timeout or shutdown).
    Closed,
    /// hyper serves the rest: the stream and the bytes already read from it.
    Handover(TcpStream, Bytes),
}

/// Serve the HTTP/1.1 connection `stream` from `peer` until it closes or needs hyper.
pub(crate) async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    shared: &Shared,
    limits: &Limits,
    shutdown: &mut watch::Receiver<bool>,
) -> End {
    let mut conn = Conn {
        stream,
        peer,
        forward: Forward::new(peer.ip()),
        input: Vec::new(),
        req_headers: Vec::new(),
        b: Buffers::default(),
        head_timer: Timer::new(),
        call_timer: Timer::new(),
        rng: FastRng::from_entropy(),
        limits,
        gated: io::gated(),
    };
    loop {
        let head = match conn.read_request(shutdown).await {
            Read::Request(head) => head,
            Read::Closed => return End::Closed,
            Read::Other => return conn.handover(),
        };
        let closing = head.close || shutdown.has_changed().unwrap_or(true);
        // Held for this request only: after a reload, services that left the configuration
        // stop (their health checks, discovery) once no request uses them, not when an idle
        // connection next speaks.
        let state = shared.state.load_full();
        conn.b = io::lend();
        let served = conn.serve_request(&head, closing, &state).await;
        io::give_back_buffers(std::mem::take(&mut conn.b));
        match served {
            Served::KeepAlive if !closing => {
                conn.input.drain(..head.len + head.body);
                if conn.input.is_empty() && conn.input.capacity() > MAX_IDLE_INPUT {
                    // A large body came in: do not keep its room while idle.
                    conn.input = Vec::new();
                }
            }
            Served::KeepAlive | Served::Close => return End::Closed,
            Served::Other => return conn.handover(),
        }
    }
}

/// One client connection's state; the buffers are reused by every request on it.
struct Conn<'a> {
    stream: TcpStream,
    peer: SocketAddr,
    forward: Forward,
    /// Bytes read from the client not yet served.
    input: Vec<u8>,
    req_headers: Vec<Hdr>,
    /// The exchange's buffers, lent by the thread while a request is served: an idle
    /// connection holds only its input buffer.
    b: Buffers,
    /// `header_read_timeout` of the request being read.
    head_timer: Timer,
    /// The route's timeout of the exchange in progress.
    call_timer: Timer,
    rng: FastRng,
    limits: &'a Limits,
    /// Upstream writes go through the thread's write gate (threads that drive their
    /// current-thread runtime for good: `Proxy::pin_runtime_thread`).
    gated: bool,
}

enum Read {
    Request(ReqHead),
    Closed,
    Other,
}

enum Served {
    KeepAlive,
    Close,
    Other,
}

/// What one upstream attempt gave.
enum Attempt {
    /// The upstream's answer (`status`) is read; the rest of it for the client is in
    /// `output`. `close`: the client connection must close after it.
    Answered {
        outcome: Outcome,
        status: u16,
        close: bool,
    },
    /// A failing answer's head that is retried on `next`; `outcome` is the failed attempt's.
    Retry { next: CallGuard, outcome: Outcome },
    /// Failed before anything reached the client.
    Failed(Observed),
    /// The client got part of an answer, then the upstream failed, or the client went away
    /// ([`Observed::ClientGone`]).
    Broken(Observed),
}

impl Conn<'_> {
    /// Read the next request head, and its body, into `input`.
    async fn read_request(&mut self, shutdown: &mut watch::Receiver<bool>) -> Read {
        let mut armed = false;
        // A complete head waiting for its body: parsed once (its offsets stay valid while the
        // buffer only grows).
        let mut parsed: Option<ReqHead> = None;
        loop {
            if let Some(head) = parsed.take() {
                if self.input.len() >= head.len + head.body {
                    return Read::Request(head);
                }
                parsed = Some(head);
            } else if !self.input.is_empty() {
                match wire::parse_request(
                    &self.input,
                    &mut self.req_headers,
                    self.limits.max_headers,
                ) {
                    Parsed::Plain(head) if self.input.len() >= head.len + head.body => {
                        return Read::Request(head)
                    }
                    Parsed::Plain(head) => parsed = Some(head),
                    Parsed::Partial if self.input.len() >= self.limits.max_header_bytes => {
                        return Read::Other
                    }
                    Parsed::Partial => {}
                    Parsed::Other => return Read::Other,
                }
            }
            if !armed {
                let timeout = Duration::from_millis(self.limits.header_read_timeout_ms);
                self.head_timer.set(Instant::now() + timeout);
                armed = true;
            }
            reserve(&mut self.input, CLIENT_READ);
            let idle = self.input.is_empty();
            let read = self.stream.read_buf(&mut self.input);
            let read = async {
                if idle {
                    tokio::select! {
                        biased;
                        r = read => Some(r),
                        _ = shutdown.changed() => None,
                    }
                } else {
                    Some(read.await)
                }
            };
            match self.head_timer.run(read).await {
                Ok(Some(Ok(n))) if n > 0 => {}
                // EOF, an error, shutdown while idle, or too slow a client.
                _ => return Read::Closed,
            }
        }
    }

    fn handover(self) -> End {
        End::Handover(self.stream, Bytes::from(self.input))
    }

    /// Route, forward and answer one request.
    async fn serve_request(&mut self, head: &ReqHead, closing: bool, state: &State) -> Served {
        let target = &self.input[head.target.clone()];
        let path = wire::path_of(target);
        let host = head
            .host
            .clone()
            .and_then(|r| std::str::from_utf8(&self.input[r]).ok());
        let Some(route) = std::str::from_utf8(path)
            .ok()
            .and_then(|p| state.route(host, p))
        else {
            return self.answer(404, "no route\n", closing).await;
        };
        let service = &route.service;
        if service.config().h2c {
            return Served::Other;
        }
        let started = service.clock().now();
        service.metrics().start();
        let key = route.hash_key.as_ref().and_then(|k| {
            let source = wire::Source {
                buf: &self.input,
                hdrs: &self.req_headers,
                target,
                ip: self.peer.ip(),
            };
            k.extract(&source).map(|k| k.into_owned())
        });
        self.b.upstream.clear();
        wire::write_request(
            &mut self.b.upstream,
            &self.input,
            head,
            &self.req_headers,
            &self.forward,
        );
        let idempotent = is_idempotent_method(&self.input[head.method.clone()]);
        let head_request = &self.input[head.method.clone()] == b"HEAD";
        let call = Call {
            service,
            key: key.as_deref(),
            idempotent,
            head_request,
            closing,
            started,
            tick: Instant::now(),
            policy: route.policy,
        };
        let (status, close, ended) = self.call(call).await;
        let ended = ended.unwrap_or_else(|| service.clock().now());
        service
            .metrics()
            .finish(ended.saturating_duration_since(started), status >= 500);
        if close {
            Served::Close
        } else {
            Served::KeepAlive
        }
    }

    /// The attempts of one request under lbkit-core's [`Attempts`]: pick, exchange, retry on an
    /// endpoint not tried yet. Returns the status the client got, whether its connection must
    /// close, and when the call ended if the clock was read for it.
    async fn call(&mut self, c: Call<'_>) -> (u16, bool, Option<Timestamp>) {
        let service = c.service;
        let clock = service.clock();
        // The request (head and body) stays in the input buffer: every attempt can resend it.
        let mut attempts =
            Attempts::start(c.policy, service.budget(), c.idempotent, true, c.started);
        // One clock read per request on the way in: the first pick uses the start.
        let first = attempts.pick(&service.active().balancer, c.started, c.key, &mut self.rng);
        let mut guard = match first {
            Ok(g) => g,
            Err(e) => {
                let text = format!("{e}\n");
                return (503, self.answer_closing(503, &text, c.closing).await, None);
            }
        };
        let (mut tick, mut now) = (c.tick, c.started);
        loop {
            self.call_timer.set(deadline(tick, attempts.timeout(now)));
            let exchange = Exchange {
                service,
                address: guard.endpoint().address(),
                key: c.key,
                attempts: &mut attempts,
                head_request: c.head_request,
                closing: c.closing,
                tick,
                stream_timeout: c.policy.overall.unwrap_or(FAR),
            };
            let failed = match self.exchange(exchange).await {
                Attempt::Answered {
                    outcome,
                    status,
                    close,
                } => {
                    // The call ends with the upstream's part, before the client has the last
                    // bytes (so statistics are current when it reads them).
                    let ended = clock.now();
                    guard.finish_at(outcome, ended);
                    // Within the call's deadline (re-armed per write once the answer streams):
                    // a client that stops reading does not pin the connection.
                    let write = self.stream.write_all(&self.b.output);
                    let failed = !matches!(self.call_timer.run(write).await, Ok(Ok(())));
                    return (status, close || failed, Some(ended));
                }
                Attempt::Retry { next, outcome } => {
                    guard.finish(outcome);
                    guard = next;
                    (tick, now) = (Instant::now(), clock.now());
                    continue;
                }
                Attempt::Broken(observed) => {
                    guard.finish(observed.classify().outcome);
                    let code = if observed == Observed::ClientGone {
                        499
                    } else {
                        502
                    };
                    return (code, true, None);
                }
                Attempt::Failed(observed) => observed,
            };
            let cl = failed.classify();
            let mut exhausted = false;
            match attempts.after(cl, service.budget(), clock) {
                Next::Retry => {
                    let at = clock.now();
                    if let Ok(next) = self.retry_pick(service, &mut attempts, at, c.key) {
                        guard.finish_at(cl.outcome, at);
                        guard = next;
                        (tick, now) = (Instant::now(), at);
                        continue;
                    }
                }
                Next::Answer(stop) => exhausted = stop == Stop::BudgetExhausted,
            }
            if exhausted {
                service.metrics().retry_refused();
            }
            guard.finish(cl.outcome);
            let code = if failed == Observed::Timeout {
                504
            } else {
                502
            };
            let text = if exhausted {
                "upstream failed (retry budget exhausted)\n"
            } else {
                "upstream failed\n"
            };
            return (code, self.answer_closing(code, text, c.closing).await, None);
        }
    }

    /// The endpoint of a retry (counted as one when found).
    fn retry_pick(
        &mut self,
        service: &Service,
        attempts: &mut Attempts,
        now: Timestamp,
        key: Option<&[u8]>,
    ) -> Result<CallGuard, lbkit_core::PickError> {
        let next = attempts.pick(&service.active().balancer, now, key, &mut self.rng)?;
        service.metrics().retried();
        Ok(next)
    }

    /// One attempt on one endpoint: send the request on a pooled (or new) connection and relay
    /// the answer, unless its head is a failure that [`Attempts`] retries.
    async fn exchange(&mut self, x: Exchange<'_>) -> Attempt {
        let now = x.tick;
        let mut pooled = io::take(x.service, x.address, now);
        let upstream = loop {
            let reused = pooled.is_some();
            let mut stream = match pooled.take() {
                Some(s) => s,
                None => match self.connect(x.service, x.address).await {
                    Ok(s) => s,
                    Err(observed) => return Attempt::Failed(observed),
                },
            };
            self.b.response.clear();
            match self.send(&mut stream, x.head_request, x.address).await {
                Ok(head) => break (stream, head),
                // A pooled connection the upstream had closed: once more on a new one, when
                // the request cannot have been acted on (it was not accepted) or may be
                // repeated. Not the endpoint's failure.
                Err(SendError::Stale { written })
                    if reused && (!written || x.attempts.is_idempotent()) => {}
                Err(SendError::Timeout) => return Attempt::Failed(Observed::Timeout),
                Err(_) => return Attempt::Failed(Observed::ResetBeforeResponse),
            }
        };
        let (mut stream, ref head) = upstream;
        let c = Observed::Status(head.code).classify();
        if c.is_failure() {
            // Only a failure may be retried: an answer's head costs no decision.
            match x.attempts.after(c, x.service.budget(), x.service.clock()) {
                Next::Retry => {
                    let at = x.service.clock().now();
                    if let Ok(next) = self.retry_pick(x.service, x.attempts, at, x.key) {
                        return Attempt::Retry {
                            next,
                            outcome: c.outcome,
                        };
                    }
                }
                Next::Answer(Stop::BudgetExhausted) => x.service.metrics().retry_refused(),
                Next::Answer(_) => {}
            }
        }
        let outcome = c.outcome;
        let close = x.closing || head.framing == wire::Framing::Close;
        self.b.output.clear();
        wire::write_response_head(
            &mut self.b.output,
            &self.b.response,
            head,
            &self.b.resp_headers,
            close,
        );
        let mut cursor = BodyCursor::new(head.framing);
        let mut at = head.len;
        let mut streamed = false;
        let reusable = loop {
            let Ok(n) = cursor.feed(&self.b.response[at..]) else {
                return fail(Observed::ResetBeforeResponse, streamed);
            };
            self.b
                .output
                .extend_from_slice(&self.b.response[at..at + n]);
            if cursor.done() {
                break head.keep_alive && at + n == self.b.response.len();
            }
            self.b.response.clear();
            at = 0;
            if self.b.output.len() >= FLUSH_AT {
                // Streaming: each write and read from here on gets the route's timeout anew
                // (nginx's send_timeout and proxy_read_timeout).
                self.call_timer
                    .set(deadline(Instant::now(), Some(x.stream_timeout)));
                let write = self.stream.write_all(&self.b.output);
                if !matches!(self.call_timer.run(write).await, Ok(Ok(()))) {
                    return Attempt::Broken(Observed::ClientGone);
                }
                self.b.output.clear();
                streamed = true;
                self.call_timer
                    .set(deadline(Instant::now(), Some(x.stream_timeout)));
            }
            reserve(&mut self.b.response, UPSTREAM_READ);
            let read = self
                .call_timer
                .run(stream.read_buf(&mut self.b.response))
                .await;
            match read {
                Ok(Ok(0)) if cursor == BodyCursor::Close => break false,
                Ok(Ok(n)) if n > 0 => {}
                Ok(_) => return fail(Observed::ResetBeforeResponse, streamed),
                Err(_) => return fail(Observed::Timeout, streamed),
            }
        };
        if reusable {
            io::give_back(x.service, x.address, stream, now);
        }
        if streamed {
            self.call_timer
                .set(deadline(Instant::now(), Some(x.stream_timeout)));
        }
        Attempt::Answered {
            outcome,
            status: head.code,
            close,
        }
    }

    /// A new connection to `address`, within the service's connect timeout and the call's
    /// deadline.
    async fn connect(&mut self, service: &Service, address: &str) -> Result<TcpStream, Observed> {
        let timeout = Duration::from_millis(service.config().connect_timeout_ms);
        let connect = tokio::time::timeout(timeout, TcpStream::connect(address));
        match self.call_timer.run(connect).await {
            Ok(Ok(Ok(stream))) => {
                let _ = stream.set_nodelay(true);
                Ok(stream)
            }
            // Refused, unreachable, or the connect timeout: nothing was sent.
            Ok(_) => Err(Observed::ConnectFailed),
            Err(_) => Err(Observed::Timeout),
        }
    }

    /// Write the request on `stream` and read the answer's head (skipping 1xx ones) into
    /// `response`.
    async fn send(
        &mut self,
        stream: &mut TcpStream,
        head_request: bool,
        address: &str,
    ) -> Result<wire::RespHead, SendError> {
        // Let the other connections that are ready in this round parse their requests first:
        // the upstream writes then leave together, grouped by upstream, so an upstream wakes
        // once for several requests (the yield alone: backend wake-ups per request 0.78 →
        // 0.58; grouping: backends' CPU per request −15 to −30 %, BENCHMARKS.md).
        if self.gated {
            io::write_turn(address.as_ptr() as usize).await;
        } else {
            tokio::task::yield_now().await;
        }
        match self
            .call_timer
            .run(stream.write_all(&self.b.upstream))
            .await
        {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(SendError::Stale { written: false }),
            Err(_) => return Err(SendError::Timeout),
        }
        loop {
            match wire::parse_response(&self.b.response, &mut self.b.resp_headers, head_request) {
                Ok(Some(h)) if h.code == 101 => return Err(SendError::Broken),
                Ok(Some(h)) if (100..200).contains(&h.code) => {
                    self.b.response.drain(..h.len);
                    continue;
                }
                Ok(Some(h)) => return Ok(h),
                Ok(None) if self.b.response.len() < MAX_RESPONSE_HEAD => {}
                Ok(None) | Err(()) => return Err(SendError::Broken),
            }
            reserve(&mut self.b.response, UPSTREAM_READ);
            let empty = self.b.response.is_empty();
            match self
                .call_timer
                .run(stream.read_buf(&mut self.b.response))
                .await
            {
                Ok(Ok(n)) if n > 0 => {}
                Ok(_) if empty => return Err(SendError::Stale { written: true }),
                Ok(_) => return Err(SendError::Broken),
                Err(_) => return Err(SendError::Timeout),
            }
        }
    }

    /// Answer with a proxy-made response and keep the connection unless `closing`.
    async fn answer(&mut self, code: u16, text: &str, closing: bool) -> Served {
        if self.answer_closing(code, text, closing).await {
            Served::Close
        } else {
            Served::KeepAlive
        }
    }

    /// Answer with a proxy-made response; whether the connection must close.
    async fn answer_closing(&mut self, code: u16, text: &str, closing: bool) -> bool {
        self.b.output.clear();
        wire::write_local(&mut self.b.output, code, text, closing);
        self.stream.write_all(&self.b.output).await.is_err() || closing
    }
}

/// One request's call.
struct Call<'a> {
    service: &'a Arc<Service>,
    key: Option<&'a [u8]>,
    idempotent: bool,
    head_request: bool,
    closing: bool,
    /// When the request started, on the service's clock.
    started: Timestamp,
    /// The same moment on the runtime's clock (deadlines, the pool's idle times).
    tick: Instant,
    /// The route's limits and the service's retries.
    policy: AttemptPolicy,
}

/// One attempt's parameters.
struct Exchange<'a> {
    service: &'a Arc<Service>,
    address: &'a str,
    key: Option<&'a [u8]>,
    /// The call's attempts: asked whether a failing answer's head is retried.
    attempts: &'a mut Attempts,
    head_request: bool,
    /// The client connection closes after this request.
    closing: bool,
    /// When the attempt started, on the runtime's clock.
    tick: Instant,
    /// Once the answer streams, the longest wait for each read or write (the route's timeout).
    stream_timeout: Duration,
}

/// A deadline for the runtime's timer: `limit` after `tick`, or far away without one.
fn deadline(tick: Instant, limit: Option<Duration>) -> Instant {
    tick + limit.unwrap_or(FAR).min(FAR)
}

/// "No deadline": far enough never to matter, near enough never to overflow an `Instant`.
const FAR: Duration = Duration::from_secs(86_400 * 365);

enum SendError {
    /// The connection was closed before any answer (`written`: the request had been written).
    Stale {
        written: bool,
    },
    Timeout,
    /// A malformed or unexpected answer, or the connection broke mid-head.
    Broken,
}

/// A failure while the answer was read: retryable while nothing reached the client.
fn fail(observed: Observed, streamed: bool) -> Attempt {
    match (streamed, observed) {
        (true, Observed::Timeout) => Attempt::Broken(Observed::Timeout),
        (true, _) => Attempt::Broken(Observed::ResetAfterResponse),
        (false, o) => Attempt::Failed(o),
    }
}

/// Keep at least `free` bytes of spare capacity (no zeroing: reads fill it).
fn reserve(buf: &mut Vec<u8>, free: usize) {
    if buf.capacity() - buf.len() < free {
        buf.reserve(free);
    }
}
