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

mod buffers;
pub(crate) mod fuzzing;
mod gate;
mod pool;
mod rewind;
mod timer;
mod wire;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use lbkit_core::http::is_idempotent_method;
use lbkit_core::{
    AttemptPolicy, Attempts, CallGuard, Clock, FastRng, Observed, Outcome, RequestTagBuf, Route,
    Timestamp,
};
use lbkit_tower::orca;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;

use buffers::{reserve, Buffers};
pub(crate) use gate::pin_runtime_thread;
pub(crate) use pool::sweep_idle;
pub(crate) use rewind::Rewind;
use timer::deadline;
use timer::Timer;
pub(crate) use timer::FAR;
use wire::{BodyCursor, ClientAddr, Hdr, Parsed, ReqHead, RespHead};

use crate::config::Limits;
use crate::envelope::{failure_answer, Envelope, MAX_BUFFERED_RESPONSE};
use crate::hub::{Defences, Hub};
use crate::service::Service;
use crate::state::{RouteEntry, State};

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
const FLUSH_AT: usize = MAX_BUFFERED_RESPONSE as usize;

/// How a connection left the fast path.
pub(crate) enum End {
    /// It is closed (by either side, a timeout or shutdown).
    Closed,
    /// hyper serves the rest: the stream, the bytes already read from it, and the requests
    /// served on it so far (they count against `max_requests_per_connection`).
    Handover(TcpStream, Bytes, u64),
}

/// Serve the HTTP/1.1 connection `stream` from `peer` until it closes or needs hyper.
pub(crate) async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    hub: &Hub,
    limits: &Limits,
    shutdown: &mut watch::Receiver<bool>,
) -> End {
    let mut conn = Conn {
        stream,
        peer,
        client: ClientAddr::new(peer.ip()),
        input: Vec::new(),
        req_headers: Vec::new(),
        b: Buffers::default(),
        head_timer: Timer::new(),
        kept_alive: false,
        call_timer: Timer::new(),
        rng: FastRng::from_entropy(),
        limits,
        gated: gate::gated(),
        requests: 0,
    };
    let cap = limits.max_requests_per_connection;
    loop {
        let head = match conn.read_request(shutdown).await {
            Read::Request(head) => head,
            Read::Closed => return End::Closed,
            Read::Other => return conn.handover(),
        };
        // The connection's last request under `max_requests_per_connection` is answered with
        // `Connection: close`, as nginx's `keepalive_requests` does.
        let last = cap > 0 && conn.requests + 1 >= cap;
        let closing = head.close || last || shutdown.has_changed().unwrap_or(true);
        // Held for this request only: after a reload, services that left the configuration
        // stop (their health checks, discovery) once no request uses them, not when an idle
        // connection next speaks.
        let state = hub.state.load_full();
        conn.b = buffers::lend();
        let served = conn.serve_request(&head, closing, &state).await;
        buffers::give_back(std::mem::take(&mut conn.b));
        if !matches!(served, Served::Other) {
            conn.requests += 1;
            if last {
                Defences::count(&hub.defences.capped);
            }
        }
        match served {
            Served::KeepAlive if !closing => {
                conn.kept_alive = true;
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
    client: ClientAddr,
    /// Bytes read from the client not yet served.
    input: Vec<u8>,
    req_headers: Vec<Hdr>,
    /// The exchange's buffers, lent by the thread while a request is served: an idle
    /// connection holds only its input buffer.
    b: Buffers,
    /// `header_read_timeout` of the request being read (`idle_timeout` while waiting for the
    /// next request of a kept-alive connection).
    head_timer: Timer,
    /// A request was served and the connection kept.
    kept_alive: bool,
    /// The route's timeout of the exchange in progress.
    call_timer: Timer,
    rng: FastRng,
    limits: &'a Limits,
    /// Upstream writes go through the thread's write gate (threads that drive their
    /// current-thread runtime for good: `Proxy::pin_runtime_thread`).
    gated: bool,
    /// Requests served on the connection.
    requests: u64,
}

/// Which limit a read waits under.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// For the next request on a kept-alive connection (`idle_timeout_ms`).
    Idle,
    /// For the rest of a head (`header_read_timeout_ms`).
    Head,
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

/// What one attempt gave.
enum Step {
    /// The upstream's answer (`status`) is read; the rest of it for the client is in
    /// `output`. `close`: the client connection must close after it.
    Answered {
        outcome: Outcome,
        status: u16,
        close: bool,
        /// A chunked answer's trailers (a load report, a pushback), as ranges of `output`.
        trailer: Option<wire::Signals>,
    },
    /// The attempt failed with `outcome` (its answer came at `answered`); the call goes on
    /// with `next`, picked at `at` (later, when a pushback was waited out).
    Retried {
        next: CallGuard,
        at: Timestamp,
        outcome: Outcome,
        answered: Timestamp,
    },
    /// Failed before anything reached the client.
    Failed(Observed),
    /// The client got part of an answer, then the upstream failed, or the client went away
    /// ([`Observed::ClientGone`]).
    Broken(Observed),
}

/// How one request ended: the status the client got, whether its connection must close, and
/// when the call ended if the clock was read for it.
type Ended = (u16, bool, Option<Timestamp>);

impl Conn<'_> {
    /// Read the next request head, and its body, into `input`.
    async fn read_request(&mut self, shutdown: &mut watch::Receiver<bool>) -> Read {
        let mut armed = None;
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
            // Between requests of a kept-alive connection the idle limit runs; from a head's
            // first byte (or a new connection's start), the head limit.
            let idle = self.input.is_empty();
            let wait = if idle && self.kept_alive {
                Wait::Idle
            } else {
                Wait::Head
            };
            if armed != Some(wait) && armed != Some(Wait::Head) {
                let limit = match wait {
                    Wait::Idle => self.limits.idle_timeout_ms,
                    Wait::Head => self.limits.header_read_timeout_ms,
                };
                self.head_timer
                    .set(Instant::now() + Duration::from_millis(limit));
                armed = Some(wait);
            }
            reserve(&mut self.input, CLIENT_READ);
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
        End::Handover(self.stream, Bytes::from(self.input), self.requests)
    }

    /// Route, forward and answer one request.
    async fn serve_request(&mut self, head: &ReqHead, closing: bool, state: &State) -> Served {
        let target = &self.input[head.target.clone()];
        let host = head
            .host
            .clone()
            .and_then(|r| std::str::from_utf8(&self.input[r]).ok());
        let path = std::str::from_utf8(wire::path_of(target)).ok();
        let Some(route) = path.and_then(|p| state.route(host, p)) else {
            return self.answer(404, "no route\n", closing).await;
        };
        // h2c upstreams, requests a hedge may race (two upstream exchanges at once), and gRPC
        // on HTTP/1.1 (gRPC-web: its `grpc-timeout` and gRPC-shaped local answers) are hyper's
        // engine's.
        let hedged =
            route.hedge.is_some() && is_idempotent_method(&self.input[head.method.clone()]);
        if route.service.config().h2c || hedged || self.is_grpc(head) {
            return Served::Other;
        }
        let envelope = Envelope::open(route);
        let key = self.hash_key(route, head);
        let tag = self.tag(route, head);
        let attrs = route.service.attrs().read_owned(&self.source(head));
        let mut view = lbkit_strategy::attrs::attr_buf();
        self.b.upstream.clear();
        let (deadline, deadline_at) = self.write_upstream(route, head);
        let method = &self.input[head.method.clone()];
        let call = Call {
            service: envelope.service(),
            route: Route {
                key: key.as_deref(),
                tag: tag.as_ref().map(RequestTagBuf::get),
                attrs: attrs.view(&mut view),
            },
            idempotent: is_idempotent_method(method),
            head_request: method == b"HEAD",
            closing,
            started: envelope.started(),
            tick: Instant::now(),
            policy: route.policy,
            deadline,
            deadline_at,
        };
        let (status, close, ended) = self.call(call).await;
        envelope.close(status, ended);
        if close {
            Served::Close
        } else {
            Served::KeepAlive
        }
    }

    /// The request, as hash keys, tags and deadlines read it.
    fn source(&self, head: &ReqHead) -> wire::Source<'_> {
        wire::Source {
            buf: &self.input,
            hdrs: &self.req_headers,
            target: &self.input[head.target.clone()],
            ip: self.peer.ip(),
        }
    }

    /// Whether the request is gRPC's (`content-type: application/grpc…`, gRPC-web's too), as
    /// lbkit-tower's `is_grpc` reads it.
    fn is_grpc(&self, head: &ReqHead) -> bool {
        let source = self.source(head);
        lbkit_strategy::KeySource::header(&source, "content-type")
            .is_some_and(|v| lbkit_tower::http::GrpcKind::of(v).is_some())
    }

    /// The request's hash key for `route`, read as the tower layer reads it.
    fn hash_key(&self, route: &RouteEntry, head: &ReqHead) -> Option<Vec<u8>> {
        let source = self.source(head);
        let key = route.hash_key.as_ref()?.extract(&source)?;
        Some(key.into_owned())
    }

    /// Write the upstream request into `upstream` (forwarding headers per the service); the
    /// caller's deadline (the service's `deadline_header`) and where its value is in
    /// `upstream`, rewritten per attempt to the time left — only when the caller sent one: a
    /// route's own timeout is no deadline for the upstream.
    fn write_upstream(
        &mut self,
        route: &RouteEntry,
        head: &ReqHead,
    ) -> (Option<Duration>, Option<usize>) {
        let which = route.service.config().forwarded_headers;
        let header = route
            .service
            .deadline_header()
            .map(http::HeaderName::as_str);
        let deadline = header.and_then(|name| self.deadline(head, name));
        let rewrite = (which, header.filter(|_| deadline.is_some()));
        let (input, hdrs) = (&self.input, &self.req_headers);
        let out = &mut self.b.upstream;
        let at = wire::write_request(out, input, head, hdrs, &self.client, rewrite);
        (deadline, at)
    }

    /// The caller's deadline in the request's header `name` (whole milliseconds).
    fn deadline(&self, head: &ReqHead, name: &str) -> Option<Duration> {
        let source = self.source(head);
        lbkit_core::signal::parse_timeout_ms(lbkit_strategy::KeySource::header(&source, name)?)
    }

    /// The request's routing tag, read as the tower layer reads it.
    fn tag(&self, route: &RouteEntry, head: &ReqHead) -> Option<RequestTagBuf> {
        let source = self.source(head);
        route
            .service
            .tags()
            .headers()
            .read(&source)
            .map(RequestTagBuf::from)
    }

    /// The attempts of one request under lbkit-core's [`Attempts`]: pick, exchange, retry on an
    /// endpoint not tried yet.
    async fn call(&mut self, c: Call<'_>) -> Ended {
        let service = c.service;
        // The request (head and body) stays in the input buffer: every attempt can resend it.
        let mut attempts =
            Attempts::start(c.policy, service.budget(), c.idempotent, true, c.started);
        if let Some(d) = c.deadline {
            attempts.limit(d);
            if attempts.deadline_passed(service.clock().now()) {
                return self.refuse(504, "deadline exceeded\n", c.closing).await;
            }
        }
        // One clock read per request on the way in: the first pick uses the start.
        let mut guard = match service.pick(&mut attempts, c.started, c.route, &mut self.rng) {
            Ok(g) => g,
            Err(e) => return self.refuse(503, &format!("{e}\n"), c.closing).await,
        };
        let (mut tick, mut now) = (c.tick, c.started);
        loop {
            let limit = attempts.timeout(now);
            self.call_timer.set(deadline(tick, limit));
            if let Some(at) = c.deadline_at {
                wire::patch_deadline(&mut self.b.upstream, at, limit);
            }
            let endpoint = guard.endpoint();
            let (next, at, outcome) = match self.attempt(&c, endpoint, tick, &mut attempts).await {
                Step::Answered {
                    outcome,
                    status,
                    close,
                    trailer,
                } => {
                    if let Some(t) = trailer {
                        let stats = guard.endpoint().stats();
                        t.record_trailers(&self.b.output, status, stats, service.clock());
                    }
                    return self
                        .deliver(service.clock(), guard, outcome, status, close)
                        .await;
                }
                Step::Broken(observed) => return broken(guard, observed),
                Step::Retried {
                    next,
                    at,
                    outcome,
                    answered,
                } => {
                    // Its latency ends when its answer came, not after a pushback's wait.
                    guard.finish_at(outcome, answered);
                    guard = next;
                    (tick, now) = (Instant::now(), at);
                    continue;
                }
                Step::Failed(observed) => {
                    // No answer, so no pushback: the retry's decision is at once.
                    let cl = observed.classify();
                    match service.retry(&mut attempts, cl, c.route, &mut self.rng) {
                        Ok((next, at)) => (next, at, cl.outcome),
                        Err(stop) => {
                            guard.finish(cl.outcome);
                            let (code, text) = failure_answer(observed, stop);
                            return self.refuse(code, text, c.closing).await;
                        }
                    }
                }
            };
            guard.finish_at(outcome, at);
            guard = next;
            (tick, now) = (Instant::now(), at);
        }
    }

    /// One attempt on `address`: the answer's head from a pooled or new connection; a failing
    /// head is retried elsewhere when [`Attempts`] allows, any other answer is relayed.
    async fn attempt(
        &mut self,
        c: &Call<'_>,
        endpoint: &lbkit_core::Endpoint,
        tick: Instant,
        attempts: &mut Attempts,
    ) -> Step {
        let (idempotent, address) = (attempts.is_idempotent(), endpoint.address());
        let (stream, head) = match self.head(c, address, tick, idempotent).await {
            Ok(answer) => answer,
            Err(observed) => return Step::Failed(observed),
        };
        let signals = &head.signals;
        if let Some((bin, at)) = &signals.load {
            let value = &self.b.response[at.clone()];
            orca::record_value(*bin, value, endpoint.stats(), c.service.clock());
        }
        if let Some(p) = signals.pushback(&self.b.response, head.code, c.service.clock().now()) {
            p.record(endpoint.stats(), c.service.clock().now());
            attempts.pushed_back(p);
        }
        let cl = lbkit_core::classify_answer(head.code, || signals.grpc_failure);
        // Only a failure may be retried: an answer's head costs no decision.
        if cl.is_failure() {
            let answered = c.service.clock().now();
            let waited = c.service.wait_pushback(attempts, cl).await;
            if let Ok((next, at)) = c.service.retry(attempts, cl, c.route, &mut self.rng) {
                let outcome = cl.outcome;
                return Step::Retried {
                    next,
                    at,
                    outcome,
                    answered,
                };
            }
            if waited {
                // The wait spent the attempt's timer: the answer is read within what is left
                // of the call's.
                let left = attempts.timeout(c.service.clock().now());
                self.call_timer.set(deadline(Instant::now(), left));
            }
        }
        self.relay(c, address, tick, stream, &head, cl.outcome)
            .await
    }

    /// The answer's head from `address`, on a pooled connection or a new one. A pooled
    /// connection the upstream had already closed is not the endpoint's failure: the request
    /// goes once more on a new connection when it cannot have been acted on (it was not
    /// accepted) or may be repeated.
    async fn head(
        &mut self,
        c: &Call<'_>,
        address: &str,
        tick: Instant,
        idempotent: bool,
    ) -> Result<(TcpStream, RespHead), Observed> {
        let mut pooled = pool::take(c.service, address, tick);
        loop {
            let reused = pooled.is_some();
            let mut stream = match pooled.take() {
                Some(s) => s,
                None => self.connect(c.service, address).await?,
            };
            self.b.response.clear();
            match self.send(&mut stream, c.head_request, address).await {
                Ok(head) => return Ok((stream, head)),
                Err(SendError::Stale { written }) if reused && (!written || idempotent) => {}
                Err(SendError::Timeout) => return Err(Observed::Timeout),
                Err(_) => return Err(Observed::ResetBeforeResponse),
            }
        }
    }

    /// Relay the answer whose head `head` is in `response`, as its framing says: gathered into
    /// `output` up to [`FLUSH_AT`] (one write for most answers), streamed beyond. The
    /// connection goes back to the pool when the answer ended cleanly.
    async fn relay(
        &mut self,
        c: &Call<'_>,
        address: &str,
        tick: Instant,
        mut stream: TcpStream,
        head: &RespHead,
        outcome: Outcome,
    ) -> Step {
        let close = c.closing || head.framing == wire::Framing::Close;
        self.b.output.clear();
        let (out, response, hdrs) = (&mut self.b.output, &self.b.response, &self.b.resp_headers);
        wire::write_response_head(out, response, head, hdrs, close);
        let stream_timeout = c.policy.overall.unwrap_or(FAR);
        let mut cursor = BodyCursor::new(head.framing);
        let (mut at, mut streamed) = (head.len, false);
        let reusable = loop {
            let Ok(n) = cursor.feed(&self.b.response[at..]) else {
                return fail(Observed::ResetBeforeResponse, streamed);
            };
            let body = &self.b.response[at..at + n];
            self.b.output.extend_from_slice(body);
            if cursor.done() {
                break head.keep_alive && at + n == self.b.response.len();
            }
            self.b.response.clear();
            at = 0;
            if self.b.output.len() >= FLUSH_AT {
                if !self.flush(stream_timeout).await {
                    return Step::Broken(Observed::ClientGone);
                }
                streamed = true;
            }
            reserve(&mut self.b.response, UPSTREAM_READ);
            let read = stream.read_buf(&mut self.b.response);
            match self.call_timer.run(read).await {
                Ok(Ok(0)) if cursor == BodyCursor::Close => break false,
                Ok(Ok(n)) if n > 0 => {}
                Ok(_) => return fail(Observed::ResetBeforeResponse, streamed),
                Err(_) => return fail(Observed::Timeout, streamed),
            }
        };
        if reusable {
            pool::give_back(c.service, address, stream, tick);
        }
        if streamed {
            self.call_timer
                .set(deadline(Instant::now(), Some(stream_timeout)));
        }
        // A chunked answer's trailers (gRPC's status, a load report) end its call too.
        let (outcome, trailer) = wire::trailers(head.framing, &self.b.output, outcome);
        let status = head.code;
        Step::Answered {
            outcome,
            status,
            close,
            trailer,
        }
    }

    /// Write what the streaming answer gathered. Each write, and the read after it, gets the
    /// route's timeout `limit` anew (nginx's `send_timeout` and `proxy_read_timeout`); `false`
    /// when the client took too long or went away.
    async fn flush(&mut self, limit: Duration) -> bool {
        self.call_timer.set(deadline(Instant::now(), Some(limit)));
        let write = self.stream.write_all(&self.b.output);
        if !matches!(self.call_timer.run(write).await, Ok(Ok(()))) {
            return false;
        }
        self.b.output.clear();
        self.call_timer.set(deadline(Instant::now(), Some(limit)));
        true
    }

    /// The answer is read: the call ends with the upstream's part, before the client has the
    /// last bytes (so statistics are current when it reads them); the rest goes to the client
    /// within the call's deadline (re-armed per write once the answer streams), so a client that
    /// stops reading does not pin the connection.
    async fn deliver(
        &mut self,
        clock: &Clock,
        guard: CallGuard,
        outcome: Outcome,
        status: u16,
        close: bool,
    ) -> Ended {
        let ended = clock.now();
        guard.finish_at(outcome, ended);
        let write = self.stream.write_all(&self.b.output);
        let failed = !matches!(self.call_timer.run(write).await, Ok(Ok(())));
        (status, close || failed, Some(ended))
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
    ) -> Result<RespHead, SendError> {
        // Let the other connections that are ready in this round parse their requests first:
        // the upstream writes then leave together, grouped by upstream, so an upstream wakes
        // once for several requests (the yield alone: backend wake-ups per request 0.78 →
        // 0.58; grouping: backends' CPU per request −15 to −30 %, BENCHMARKS.md).
        if self.gated {
            gate::write_turn(address.as_ptr() as usize).await;
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

    /// Answer a request the proxy could not forward with `code`.
    async fn refuse(&mut self, code: u16, text: &str, closing: bool) -> Ended {
        (code, self.answer_closing(code, text, closing).await, None)
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
    /// Its hash key and routing tag.
    route: Route<'a>,
    idempotent: bool,
    head_request: bool,
    /// The client connection closes after this request.
    closing: bool,
    /// When the request started, on the service's clock.
    started: Timestamp,
    /// The same moment on the runtime's clock (deadlines, the pool's idle times).
    tick: Instant,
    /// The route's limits and the service's retries.
    policy: AttemptPolicy,
    /// The caller's deadline (the service's `deadline_header`), from `started`.
    deadline: Option<Duration>,
    /// Where the upstream request's deadline value is, rewritten per attempt.
    deadline_at: Option<usize>,
}

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
fn fail(observed: Observed, streamed: bool) -> Step {
    match (streamed, observed) {
        (true, Observed::Timeout) => Step::Broken(Observed::Timeout),
        (true, _) => Step::Broken(Observed::ResetAfterResponse),
        (false, o) => Step::Failed(o),
    }
}

/// The end of a call whose answer broke after part of it reached the client (499 when the
/// client went away): the connection closes.
fn broken(guard: CallGuard, observed: Observed) -> Ended {
    guard.finish(observed.classify().outcome);
    let code = if observed == Observed::ClientGone {
        499
    } else {
        502
    };
    (code, true, None)
}
