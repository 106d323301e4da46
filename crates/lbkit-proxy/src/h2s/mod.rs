//! The proxy's HTTP/2 server: HTTP/2 over cleartext with prior knowledge (what gRPC clients
//! speak without TLS), on the `h2` crate directly, as the h2c upstream client is (`h2c.rs`).
//!
//! hyper's server, used before, gave a proxy no hold on a connection's streams: it could not
//! tell a stream its client reset from one that ended, reset one stream on its own, or answer
//! abuse with `GOAWAY ENHANCE_YOUR_CALM`. Tried as an attacker would, that let through a paced
//! rapid reset (requests, a `PING`, its `ACK`, then `RST_STREAM` for each: 122 000–148 000
//! streams on one connection in 5 s, each of which made an upstream connection) and streams
//! stuck on a zero flow-control window that held their upstream exchange for ever while the
//! connection's other streams kept its timers quiet. Here every connection and stream is
//! watched:
//!
//! | what | limit (`[limits]`) | then | Envoy / nginx |
//! |---|---|---|---|
//! | streams the client resets before their answer started | `max_premature_resets` (100), once they are also half of the streams opened | `GOAWAY ENHANCE_YOUR_CALM`, connection closed | `premature_reset_total_stream_count` (500, the same half) / none |
//! | requests on one connection | `max_requests_per_connection` (1 000) | graceful `GOAWAY`: streams in flight finish | `max_requests_per_connection` (none) / `keepalive_requests` (1 000) |
//! | a stream with no byte either way | `stream_idle_timeout_ms` (5 min; noticed within a quarter of it more) | `RST_STREAM CANCEL`, its upstream exchange cancelled | `stream_idle_timeout` (5 min) / none |
//! | an answer waiting for the client's window | the route's `timeout_ms` (15 s), if shorter | the same | — / `send_timeout` per connection |
//! | a stream already reset when it is first polled (after the connection has read every frame it had) | — | never routed: no pick, no upstream connection | |
//!
//! `h2`'s own guards stay on as hyper set them: 200 concurrent streams, a header list of
//! `max_header_bytes` (an HPACK bomb or a `CONTINUATION` flood ends with the connection), 20
//! streams reset before they were accepted (the burst rapid reset: `GOAWAY ENHANCE_YOUR_CALM`),
//! 1 024 streams the server had to reset for a client's errors, flow-control overflows
//! (`FLOW_CONTROL_ERROR`), and `PING`/`SETTINGS` floods (their answers are queued only as fast
//! as the client reads them). The connection's watchdog (`watchdog.rs`) still closes a
//! connection that never starts a request or stays idle, and its IO (`h1::Rewind`) fails a
//! write that makes no progress for the longest route timeout.
//!
//! **On a current-thread runtime a connection's streams are served by the connection's own
//! task** (a `FuturesUnordered` polled in its loop), not a task each: `h2` wakes a stream when
//! its frames arrive, and the stream's sends wake the connection to write them, so with a task a
//! stream every frame crossed the scheduler twice. There one task a connection loses no
//! parallelism (`lbkit proxy`'s worker threads each run such a runtime, so a connection's
//! stream tasks ran on its thread anyway), and it took 0.97x the CPU a unary gRPC call
//! (BENCHMARKS.md, "A connection's HTTP/2 streams in its own task"). On a multi-thread runtime
//! (a library user's `Proxy::start`) each stream still gets a task, so that one connection's
//! streams run in parallel. The loop polls a new stream only once it has accepted every stream
//! and read every frame it could, as a new task ran only then, so a reset that came with them is
//! seen first; and it polls the streams before the connection, so that the answers of the
//! streams ready at once leave in one write. A panic still ends only its stream. Streams still
//! in flight when the loop ends (a `GOAWAY` sent, the connection's error, its end) are handed to
//! tasks of their own, as they ran before; with the connection gone they end with its error.

mod stream;

use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use h2::Reason;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::sync::{watch, Notify};

use crate::config::Limits;
use crate::h1::Rewind;
use crate::hub::{Defences, Hub};
use crate::watchdog::{self, Activity, Expired};

/// The client connection preface of HTTP/2 (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Whether a connection whose first bytes are `read` speaks HTTP/2 with prior knowledge,
/// reading more of it (within `limit`) while `read` is too short to tell. `None`: the client
/// closed or was too slow.
pub(crate) async fn sniff(
    stream: &mut TcpStream,
    read: Bytes,
    limit: Duration,
) -> Option<(bool, Bytes)> {
    let mut buf = BytesMut::from(read);
    let decide = |b: &[u8]| {
        let n = b.len().min(PREFACE.len());
        if b[..n] != PREFACE[..n] {
            Some(false)
        } else {
            (n == PREFACE.len()).then_some(true)
        }
    };
    let read_more = async {
        loop {
            if let Some(h2) = decide(&buf) {
                return Some(h2);
            }
            match stream.read_buf(&mut buf).await {
                Ok(n) if n > 0 => {}
                _ => return None,
            }
        }
    };
    let h2 = tokio::time::timeout(limit, read_more).await.ok()??;
    Some((h2, buf.freeze()))
}

/// An HTTP/2 client connection and what serving it needs.
pub(crate) struct Conn {
    pub(crate) hub: Arc<Hub>,
    pub(crate) peer: SocketAddr,
    pub(crate) limits: Arc<Limits>,
    pub(crate) shutdown: watch::Receiver<bool>,
    /// Counted by the connection's IO and its streams, for the watchdog.
    pub(crate) activity: Arc<Activity>,
}

/// What the connection and its streams share.
#[derive(Debug)]
struct Shared {
    hub: Arc<Hub>,
    peer: SocketAddr,
    stream_idle: Duration,
    max_premature: u64,
    /// Streams accepted.
    opened: AtomicU64,
    /// Streams the client reset before their answer started.
    premature: AtomicU64,
    /// Told when `premature` passes the limit.
    calm: Notify,
    /// The connection is closing with an error (its `GOAWAY`, or the client's protocol
    /// error): `h2` ends every stream with it, which is no reset of the client's.
    closing: AtomicBool,
}

impl Shared {
    /// A stream its client reset before its answer started: counted, and past the limit the
    /// connection is told to close.
    fn premature_reset(&self) {
        if self.closing.load(Relaxed) {
            return;
        }
        Defences::count(&self.hub.defences.premature_resets);
        let n = self.premature.fetch_add(1, Relaxed) + 1;
        let opened = self.opened.load(Relaxed);
        if self.max_premature > 0 && n >= self.max_premature && 2 * n >= opened {
            self.calm.notify_one();
        }
    }
}

/// What the connection's loop waits for.
#[allow(clippy::large_enum_variant)] // made once per turn of the loop, taken apart at once
enum Event {
    Accepted(Option<Result<stream::Accepted, h2::Error>>),
    /// The connection read every frame it could: the streams accepted meanwhile may start.
    Read,
    /// A stream was served to its end.
    Served,
    Calm,
    Drain,
    Expired(Expired),
    /// An idle connection closing gracefully ran out of time.
    Deadline,
}

/// Where the connection's loop stands.
#[derive(Debug, Default)]
struct Phase {
    /// A graceful `GOAWAY` was sent: streams still come (those the client sent before it saw
    /// it) and are served, until `h2` says the connection is over.
    draining: bool,
    /// The watchdog fired (its future is done: never polled again).
    watched: bool,
    /// An idle connection being closed gracefully is cut at this moment at the latest.
    deadline: Option<tokio::time::Instant>,
}

impl Phase {
    /// Send a graceful `GOAWAY`: the streams in flight, and those the client sent before it
    /// sees it, are still served.
    fn drain(&mut self, h2: &mut Served) {
        h2.graceful_shutdown();
        self.draining = true;
    }
}

/// What the loop does after an event.
enum Next {
    /// Wait for the next event.
    Wait,
    /// The connection is over.
    End,
    /// Send `GOAWAY` with this error, then close within the head limit.
    Close(Reason),
}

/// `h2`'s end of a client connection.
type Served = h2::server::Connection<Rewind, Bytes>;

/// A stream being served (see [`stream::serve`]).
type Stream = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The connection's streams being served: polled by the connection's own task on a
/// current-thread runtime (`local`), else each in a task of its own (see the module's docs).
/// A new stream waits in `fresh`, unpolled, until the connection has read every frame it can
/// (its accept is pending), as a new task ran only then: a reset that came with it is seen
/// before the stream is routed.
struct Streams {
    set: FuturesUnordered<Stream>,
    fresh: Vec<Stream>,
    local: bool,
}

impl Streams {
    fn new() -> Self {
        let flavor = tokio::runtime::Handle::current().runtime_flavor();
        Streams {
            set: FuturesUnordered::new(),
            fresh: Vec::new(),
            local: flavor == tokio::runtime::RuntimeFlavor::CurrentThread,
        }
    }

    fn add(&mut self, stream: Stream) {
        if self.local {
            self.fresh.push(stream);
        } else {
            tokio::spawn(stream);
        }
    }

    /// The connection read all it could: the new streams are polled from now on.
    fn adopt(&mut self) {
        self.set.extend(self.fresh.drain(..));
    }

    /// Streams still in flight when the connection's loop ends go on as tasks of their own.
    fn release(self) {
        for s in self.set.into_iter().chain(self.fresh) {
            tokio::spawn(s);
        }
    }
}

/// The connection's next stream; [`Event::Read`] instead of waiting when streams accepted
/// before wait to be polled.
fn accept(h2: &mut Served, fresh: bool, cx: &mut std::task::Context<'_>) -> Poll<Event> {
    match h2.poll_accept(cx) {
        Poll::Pending if fresh => Poll::Ready(Event::Read),
        next => next.map(Event::Accepted),
    }
}

impl Conn {
    /// Serve the connection (its preface is the first of `io`'s bytes) until it closes.
    pub(crate) async fn serve(self, io: Rewind) {
        let limits = &self.limits;
        let watched = watchdog::Limits::of(limits);
        let mut watchdog = pin!(watchdog::watch(&self.activity, watched));
        let handshake = builder(limits).handshake::<_, Bytes>(io);
        let mut h2 = tokio::select! {
            made = handshake => match made {
                Ok(h2) => h2,
                Err(e) => return tracing::debug!(peer = %self.peer, error = %e, "HTTP/2 handshake failed"),
            },
            _ = &mut watchdog => return,
        };
        let shared = Arc::new(Shared {
            hub: self.hub.clone(),
            peer: self.peer,
            stream_idle: watched.stream_idle,
            max_premature: limits.max_premature_resets,
            opened: AtomicU64::new(0),
            premature: AtomicU64::new(0),
            calm: Notify::new(),
            closing: AtomicBool::new(false),
        });
        let mut phase = Phase::default();
        let mut streams = Streams::new();
        // Made once, not at every turn of the loop: a waiter that was polled takes its
        // `Notify`'s lock to leave when it is dropped, and the loop turns at every stream's end.
        let mut calm = pin!(shared.calm.notified());
        let mut shutdown = self.shutdown.clone();
        let mut drain = pin!(shutdown.changed());
        loop {
            let (deadline, fresh) = (phase.deadline, !streams.fresh.is_empty());
            let event = tokio::select! {
                biased;
                () = &mut calm => Event::Calm,
                // The streams before the connection: their answers are written together.
                Some(()) = streams.set.next(), if !streams.set.is_empty() => Event::Served,
                event = poll_fn(|cx| accept(&mut h2, fresh, cx)) => event,
                _ = &mut drain, if !phase.draining => Event::Drain,
                why = &mut watchdog, if !phase.watched => Event::Expired(why),
                () = sleep_until(deadline), if deadline.is_some() => Event::Deadline,
            };
            match self.on(event, &mut h2, &shared, &mut phase, &mut streams) {
                Next::Wait => {}
                Next::End => return streams.release(),
                Next::Close(reason) => {
                    shared.closing.store(true, Relaxed);
                    streams.release();
                    h2.abrupt_shutdown(reason);
                    // The GOAWAY goes out, then the connection closes (bounded: a client that
                    // stops reading does not keep it).
                    let closed = poll_fn(|cx| h2.poll_closed(cx));
                    let _ = tokio::time::timeout(watched.head, closed).await;
                    return;
                }
            }
        }
    }

    /// A new stream, counted, to be served by the connection's task. A panic in it ends that
    /// stream alone, as it did in a task of its own.
    fn admit(&self, (req, respond): stream::Accepted, shared: &Arc<Shared>) -> Stream {
        shared.opened.fetch_add(1, Relaxed);
        let busy = self.activity.begin();
        let serve = stream::serve(req, respond, shared.clone(), busy);
        Box::pin(AssertUnwindSafe(serve).catch_unwind().map(drop))
    }

    /// Too many streams reset before their answer: the connection closes.
    fn calm(&self, shared: &Shared) -> Next {
        Defences::count(&self.hub.defences.calmed);
        tracing::warn!(
            peer = %self.peer,
            resets = shared.premature.load(Relaxed),
            streams = shared.opened.load(Relaxed),
            "HTTP/2 client reset too many streams before their answer: GOAWAY ENHANCE_YOUR_CALM"
        );
        Next::Close(Reason::ENHANCE_YOUR_CALM)
    }

    /// What `event` means for the connection.
    fn on(
        &self,
        event: Event,
        h2: &mut Served,
        shared: &Arc<Shared>,
        phase: &mut Phase,
        streams: &mut Streams,
    ) -> Next {
        match event {
            Event::Served => Next::Wait,
            Event::Read => {
                streams.adopt();
                Next::Wait
            }
            Event::Accepted(Some(Ok(accepted))) => {
                streams.add(self.admit(accepted, shared));
                let cap = self.limits.max_requests_per_connection;
                if cap > 0 && shared.opened.load(Relaxed) >= cap && !phase.draining {
                    Defences::count(&self.hub.defences.capped);
                    phase.drain(h2);
                }
                Next::Wait
            }
            Event::Accepted(Some(Err(e))) => {
                // The streams end with the connection's error: none is the client's reset.
                shared.closing.store(true, Relaxed);
                tracing::debug!(peer = %self.peer, error = %e, "HTTP/2 connection error");
                Next::End
            }
            Event::Accepted(None) => Next::End,
            Event::Drain => {
                phase.drain(h2);
                Next::Wait
            }
            Event::Calm => self.calm(shared),
            // Nothing in flight: a graceful close loses nothing. Streams the client opened
            // before it saw the GOAWAY are still served, within the head limit.
            Event::Expired(Expired::Idle) => {
                phase.drain(h2);
                phase.watched = true;
                let head = Duration::from_millis(self.limits.header_read_timeout_ms);
                phase.deadline = Some(tokio::time::Instant::now() + head);
                Next::Wait
            }
            Event::Expired(why) => {
                tracing::debug!(peer = %self.peer, ?why, "client connection closed by its watchdog");
                Next::End
            }
            Event::Deadline => Next::End,
        }
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// `h2`'s server with hyper's settings (1 MB windows, 16 KB frames, 200 concurrent streams,
/// a 400 KB send buffer per stream, 1 024 local error resets) and the header list limit.
fn builder(limits: &Limits) -> h2::server::Builder {
    let mut b = h2::server::Builder::new();
    b.initial_window_size(1 << 20)
        .initial_connection_window_size(1 << 20)
        .max_frame_size(16 << 10)
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
        .max_concurrent_streams(200)
        .max_send_buffer_size(400 << 10)
        .max_local_error_reset_streams(Some(1024));
    b
}
