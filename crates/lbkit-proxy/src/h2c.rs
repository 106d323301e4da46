//! The upstream client of services with `h2c = true`: calls go out on the `h2` crate's client
//! directly, one HTTP/2 connection per endpoint and per thread that calls upstreams (hyper_util's
//! pool, used before, also kept one per endpoint).
//!
//! Why not hyper's client, which sits on the same `h2`: for every request it hands the request
//! to the connection's task through a channel, spawns a task that waits for the answer and sends
//! it back through a oneshot, and spawns one more for a body it cannot send at once. Here the
//! request's own task sends it (`h2` shares a connection behind its own lock) and waits for the
//! answer; a body already in memory (every body the proxy buffers for replay) goes out with the
//! head, and only a streamed body gets a task (`pipe`), as it must outlive the answer's head for
//! streaming calls. On unary gRPC through `lbkit proxy` this took a quarter to a third off the
//! proxy's CPU a call (BENCHMARKS.md, issue 18).
//!
//! * **Connections**: made on the first call to an endpoint (within `connect_timeout_ms`) and
//!   kept in a map swapped whole (`ArcSwap`: a call reads it without a lock; a new connection
//!   is rare). A connection that cannot take a stream any more (closed, `GOAWAY`) is dropped
//!   from the map and a new one made for the call. One unused for `upstream_idle_timeout_ms` is
//!   dropped from the map and closes once its last stream ends, as hyper_util's pool closes idle
//!   ones; so are all when the service goes (a reload that removes it).
//! * **Silent connections**: a connection whose upstream host vanished (a partition, a VM
//!   gone: no `FIN`, no reset) would hold every call to that endpoint until the kernel gives up
//!   on it, about 15 minutes, each call timing out in turn (and a POST never going elsewhere).
//!   When a call gives up waiting for its answer's head (its timeout, its client gone), a task
//!   sends the connection a `PING` (at most one a second); with no `PONG` within
//!   `connect_timeout_ms` the connection is shut down, the calls on it fail (retried when
//!   idempotent), and the next call connects again, which a vanished host refuses or lets time
//!   out: a connect failure, retried for any method. Only calls that gave up cause `PING`s, so a
//!   healthy connection sees none, and grpc-go's limit on `PING`s is not approached.
//! * **Flow control and limits** are `h2`'s, set as hyper's client sets them (2 MB stream
//!   window, 5 MB connection window, 16 KB frames and header lists, push disabled). The large
//!   connection window also sizes `h2`'s budget of small `DATA` frames buffered unread (half the
//!   window): with `h2`'s default 64 KB window, 64 concurrent gRPC answers of one small message
//!   each exceed it and `h2` closes the connection (`ENHANCE_YOUR_CALM`).
//! * **What a failure means**: no connection (refused, timed out, handshake failed) is
//!   [`Observed::ConnectFailed`]. A stream the upstream refused (`REFUSED_STREAM`), or one
//!   above the last stream id of the upstream's `GOAWAY` (with or without an error code: `h2`
//!   hands the `GOAWAY`'s error only to those streams and to streams opened after it), was not
//!   processed, and is also retried for any method, as a connect failure is. Any other error
//!   before the answer's head is [`Observed::ResetBeforeResponse`]: a stream at or below that
//!   id, or on a connection that ended without a `GOAWAY`, may have been processed.

use std::collections::HashMap;
use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::atomic::{
    AtomicU64, AtomicU8,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::{Arc, Weak};
use std::task::{ready, Context, Poll, Waker};
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};
use bytes::Bytes;
use h2::client::{Connection, SendRequest};
use h2::PingPong;
use h2::{Reason, RecvStream, SendStream};
use http::{Request, Response};
use http_body::Body;
use http_body_util::{Either, Full};
use lbkit_core::Observed;
use tokio::net::TcpStream;
use tokio::sync::oneshot;

use crate::body::ClientBody;
pub(crate) use crate::h2body::H2Body;
use crate::h2body::{Pipe, Piped};

/// The connections of one service on one thread, by endpoint address.
#[derive(Debug)]
pub(crate) struct H2Client {
    slots: ArcSwap<HashMap<Box<str>, Arc<Slot>>>,
    connect_timeout: Duration,
    idle: Duration,
}

/// One endpoint's connection, and the lock a call takes to make a new one (off the request
/// path: only when there is no open connection), so that the calls arriving meanwhile wait for
/// that one instead of each making its own.
///
/// The calls that waited share the outcome: when the connection could not be made, they fail
/// at once as the call that tried did, rather than each trying in turn (an endpoint whose
/// connects time out would otherwise hold the n-th waiting call for n connect timeouts).
#[derive(Debug, Default)]
struct Slot {
    conn: ArcSwapOption<Conn>,
    connecting: tokio::sync::Mutex<()>,
    /// Connects that ended (made or failed) so far.
    tries: AtomicU64,
}

/// One connection: the handle that opens streams on it, how many calls it was given (the
/// idle check compares two readings), and what checks it when a call gave up on its answer.
#[derive(Debug)]
struct Conn {
    send: SendRequest<Bytes>,
    calls: AtomicU64,
    check: Check,
}

/// A connection's liveness check: a `PING`, and the connection shut down when its `PONG` does
/// not come in time. Run by a task of its own, spawned only when a call gives up waiting for its
/// answer's head, so that the connection's own task polls nothing more for it.
#[derive(Debug)]
struct Check {
    /// `h2`'s handle for the connection's `PING`s (one taker; `None` when `h2` gave none).
    pings: tokio::sync::Mutex<Option<PingPong>>,
    /// [`IDLE`], [`RUNNING`] (a check, or the rest of [`CHECK_EVERY`] after it), or [`AGAIN`]
    /// (running, and a call gave up meanwhile: another check follows).
    state: AtomicU8,
    /// A duplicate of the connection's socket: shutting it down ends the connection (its reads
    /// see the end at once, a silent peer or not) from outside the connection's task.
    socket: Option<socket2::Socket>,
    /// How long the `PONG` may take (the service's connect timeout: one round trip).
    limit: Duration,
    /// Checks that got their `PONG` in time.
    passed: AtomicU64,
    address: Box<str>,
}

/// Checks start at most this often on one connection: a server that answers slowly but is
/// alive is not flooded with `PING`s by the timeouts of its calls (grpc-go closes a connection
/// that pings too often).
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// [`Check::state`]s.
const IDLE: u8 = 0;
const RUNNING: u8 = 1;
const AGAIN: u8 = 2;

impl Check {
    /// Check `conn`: now, or when the running check and the rest of its [`CHECK_EVERY`] are over.
    fn start(conn: &Arc<Conn>) {
        let state = &conn.check.state;
        let mut now = state.load(Relaxed);
        loop {
            let next = if now == IDLE { RUNNING } else { AGAIN };
            match state.compare_exchange_weak(now, next, Acquire, Relaxed) {
                Ok(_) => break,
                Err(seen) => now = seen,
            }
        }
        if now == IDLE {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn(Check::run(conn.clone()))),
                // A call dropped outside its runtime (shutting down): nothing left to check.
                Err(_) => state.store(IDLE, Release),
            }
        }
    }

    /// Check until no call gave up during the last check.
    async fn run(conn: Arc<Conn>) {
        let state = &conn.check.state;
        loop {
            conn.check.once().await;
            if state
                .compare_exchange(RUNNING, IDLE, Release, Relaxed)
                .is_ok()
            {
                return;
            }
            state.store(RUNNING, Relaxed); // it was AGAIN
        }
    }

    /// One `PING`, and the connection shut down when its `PONG` does not come in time; returns
    /// [`CHECK_EVERY`] after it started at the earliest.
    async fn once(&self) {
        let started = tokio::time::Instant::now();
        let mut pings = self.pings.lock().await;
        // `None`: no `PING` could be sent, or its `PONG` came as an error: either way the
        // connection is ending already.
        let pong = match pings.as_mut() {
            Some(p) => match p.send_ping(h2::Ping::opaque()) {
                Ok(()) => {
                    let pong = poll_fn(|cx| p.poll_pong(cx));
                    Some(tokio::time::timeout(self.limit, pong).await)
                }
                Err(_) => None,
            },
            None => None,
        };
        drop(pings);
        match pong {
            Some(Ok(Ok(_))) => {
                self.passed.fetch_add(1, Relaxed);
            }
            None | Some(Ok(Err(_))) => {}
            Some(Err(_elapsed)) => {
                tracing::warn!(
                    address = %self.address,
                    limit = ?self.limit,
                    "upstream HTTP/2 connection silent (no PONG in time): closed"
                );
                if let Some(socket) = &self.socket {
                    let _ = socket.shutdown(std::net::Shutdown::Both);
                }
            }
        }
        tokio::time::sleep_until(started + CHECK_EVERY).await;
    }
}

impl Conn {
    /// A handle ready for one more stream, counting the call; `None` when the connection can
    /// take no more (closed, or closing after a `GOAWAY`).
    async fn ready(&self) -> Option<SendRequest<Bytes>> {
        self.calls.fetch_add(1, Relaxed);
        self.send.clone().ready().await.ok()
    }
}

/// A connection ready for one more stream: the handle that opens it, and the connection (kept
/// until the answer's head comes, to have the connection checked if the call gives up first).
type Ready = (SendRequest<Bytes>, Arc<Conn>);

impl Slot {
    /// The open connection, ready for one more stream; when it is closing, forgotten.
    /// `Err(kept)`: no connection is ready, and whether there was one.
    async fn ready(&self) -> Result<Ready, bool> {
        let Some(conn) = self.conn.load_full() else {
            return Err(false);
        };
        if let Some(send) = conn.ready().await {
            return Ok((send, conn));
        }
        self.forget(Arc::as_ptr(&conn));
        Err(true)
    }

    /// Forget `conn` if it is still this endpoint's connection.
    fn forget(&self, conn: *const Conn) {
        self.conn.rcu(|current| match current {
            Some(c) if Arc::as_ptr(c) == conn => None,
            other => other.clone(),
        });
    }
}

impl H2Client {
    /// A client without connections; they are made within `connect_timeout` and closed after
    /// `idle` without a call.
    pub(crate) fn new(connect_timeout: Duration, idle: Duration) -> Arc<Self> {
        Arc::new(H2Client {
            slots: ArcSwap::default(),
            connect_timeout,
            idle,
        })
    }

    /// Send `req` (its URI names the endpoint's address) and wait for the answer's head. Not
    /// an `async fn`, which would keep `req` twice (as its argument and taken apart).
    pub(crate) fn request(
        self: &Arc<Self>,
        req: Request<Either<Full<Bytes>, ClientBody>>,
    ) -> impl Future<Output = Result<Response<H2Body>, Observed>> + '_ {
        let (parts, body) = req.into_parts();
        self.send(parts, body)
    }

    async fn send(
        self: &Arc<Self>,
        parts: http::request::Parts,
        body: Either<Full<Bytes>, ClientBody>,
    ) -> Result<Response<H2Body>, Observed> {
        let Some(address) = parts.uri.authority() else {
            return Err(Observed::ConnectFailed);
        };
        let (mut send, conn) = self.ready(address.as_str()).await?;
        let head = Request::from_parts(parts, ());
        match body {
            Either::Left(full) => {
                let data = full_bytes(full);
                let eos = data.is_empty();
                let (answer, mut tx) = send.send_request(head, eos).map_err(|e| observed(&e))?;
                if !eos {
                    // At most `MAX_REPLAY_BODY` bytes: `h2` queues what the window does not
                    // admit yet.
                    tx.send_data(data, true).map_err(|e| observed(&e))?;
                }
                let resp = answer_head(answer, &conn).await.map_err(|e| observed(&e))?;
                Ok(answer_body(resp, None))
            }
            Either::Right(streamed) => {
                let (answer, tx) = send.send_request(head, false).map_err(|e| observed(&e))?;
                // The pipe stops (resetting the stream) when this call lets go: the answer
                // never came (timeout, client gone) or its body was dropped unfinished.
                let (cancel, cancelled) = oneshot::channel();
                tokio::spawn(pipe(streamed, tx, cancelled));
                let resp = answer_head(answer, &conn).await.map_err(|e| observed(&e))?;
                Ok(answer_body(resp, Some(cancel)))
            }
        }
    }

    /// A connection to `address` ready for one more stream: the open one, or a new one when
    /// there is none or it is closing (made by one call while the others wait for it).
    async fn ready(self: &Arc<Self>, address: &str) -> Result<Ready, Observed> {
        let slot = self.slot(address);
        match slot.ready().await {
            Ok(ready) => return Ok(ready),
            Err(true) => tracing::debug!(%address, "upstream HTTP/2 connection closed"),
            Err(false) => {}
        }
        let tries = slot.tries.load(Relaxed);
        let _connecting = slot.connecting.lock().await;
        // A call that held the lock before this one may have connected, or failed to.
        match slot.ready().await {
            Ok(ready) => return Ok(ready),
            Err(false) if slot.tries.load(Relaxed) != tries => return Err(Observed::ConnectFailed),
            Err(_) => {}
        }
        // Boxed: connecting (the handshake's state) is rare, and every call would carry it.
        let made = Box::pin(self.connect(address, &slot)).await;
        slot.tries.fetch_add(1, Relaxed);
        let conn = made?;
        let send = conn.ready().await.ok_or(Observed::ConnectFailed)?;
        Ok((send, conn))
    }

    /// The slot of `address`, made on its first call.
    fn slot(&self, address: &str) -> Arc<Slot> {
        if let Some(slot) = self.slots.load().get(address) {
            return slot.clone();
        }
        let mut made = None;
        self.slots.rcu(|m| {
            let mut m = HashMap::clone(m);
            let slot = m.entry(address.into()).or_default().clone();
            made = Some(slot);
            m
        });
        made.unwrap_or_default()
    }

    /// Connect to `address`, keep the connection in `slot` and start its task.
    async fn connect(
        self: &Arc<Self>,
        address: &str,
        slot: &Arc<Slot>,
    ) -> Result<Arc<Conn>, Observed> {
        let limit = self.connect_timeout;
        let tcp = match tokio::time::timeout(limit, TcpStream::connect(address)).await {
            Ok(Ok(tcp)) => tcp,
            _ => return Err(Observed::ConnectFailed),
        };
        let _ = tcp.set_nodelay(true);
        let socket = socket2::SockRef::from(&tcp).try_clone().ok();
        // hyper's client settings; hyper's first stream limit too (h2's own is unbounded), so
        // that a burst before the upstream's `SETTINGS` arrive is not refused past its limit.
        let handshake = h2::client::Builder::new()
            .enable_push(false)
            .initial_max_send_streams(100)
            .initial_window_size(2 << 20)
            .initial_connection_window_size(5 << 20)
            .max_frame_size(16 << 10)
            .max_header_list_size(16 << 10)
            .max_send_buffer_size(1 << 20)
            .handshake(tcp);
        let (send, mut connection) = match tokio::time::timeout(limit, handshake).await {
            Ok(Ok(pair)) => pair,
            _ => return Err(Observed::ConnectFailed),
        };
        let conn = Arc::new(Conn {
            send,
            calls: AtomicU64::new(0),
            check: Check {
                pings: tokio::sync::Mutex::new(connection.ping_pong()),
                state: AtomicU8::new(IDLE),
                socket,
                limit,
                passed: AtomicU64::new(0),
                address: address.into(),
            },
        });
        slot.conn.store(Some(conn.clone()));
        self.adopt(address, slot);
        tokio::spawn(drive(
            connection,
            Arc::downgrade(self),
            address.into(),
            Arc::downgrade(slot),
            Arc::downgrade(&conn),
        ));
        Ok(conn)
    }

    /// Put `slot`, which now holds a connection, back in the map if it is no longer there: the
    /// task of the endpoint's previous connection drops the slot when that connection ends and
    /// the slot holds none, which can happen just after a call took the slot to connect again.
    /// Left out of the map, the new connection would serve that one call and the next call
    /// would open another.
    fn adopt(&self, address: &str, slot: &Arc<Slot>) {
        if self.slots.load().contains_key(address) {
            return;
        }
        self.slots.rcu(|m| {
            let mut m = HashMap::clone(m);
            m.entry(address.into()).or_insert_with(|| slot.clone());
            m
        });
    }

    /// Drop `address`'s slot if it holds no connection (its endpoint may be gone for good).
    fn drop_slot(&self, address: &str, slot: &Arc<Slot>) {
        self.slots.rcu(|m| {
            let mut m = HashMap::clone(m);
            if m.get(address)
                .is_some_and(|s| Arc::ptr_eq(s, slot) && s.conn.load().is_none())
            {
                m.remove(address);
            }
            m
        });
    }

    /// The number of open connections kept (for tests).
    #[cfg(test)]
    pub(crate) fn kept(&self) -> usize {
        let slots = self.slots.load();
        slots.values().filter(|s| s.conn.load().is_some()).count()
    }
}

/// Run a connection until it ends; forget it when it ends or has gone a whole idle period
/// without a call (it then closes once its last stream ends and the last handle to it is
/// dropped).
async fn drive(
    connection: Connection<TcpStream, Bytes>,
    client: Weak<H2Client>,
    address: Box<str>,
    slot: Weak<Slot>,
    conn: Weak<Conn>,
) {
    let mut connection = pin!(connection);
    let mut seen = None;
    while let Some(idle) = client.upgrade().map(|c| c.idle) {
        tokio::select! {
            ended = connection.as_mut() => {
                if let Err(e) = ended {
                    tracing::debug!(%address, error = %e, "upstream HTTP/2 connection ended");
                }
                break;
            }
            () = tokio::time::sleep(idle) => {
                let calls = conn.upgrade().map(|c| c.calls.load(Relaxed));
                if calls.is_none() || calls == seen {
                    break;
                }
                seen = calls;
            }
        }
    }
    if let Some(slot) = slot.upgrade() {
        slot.forget(conn.as_ptr());
        if let Some(client) = client.upgrade() {
            client.drop_slot(&address, &slot);
        }
    }
    // Streams still open on it finish; the connection closes when they have and the last
    // handle is gone.
    let _ = connection.await;
}

/// Wait for the answer's head; a call that lets go first (its timeout, its client gone) has
/// the connection checked.
async fn answer_head(
    answer: h2::client::ResponseFuture,
    conn: &Arc<Conn>,
) -> Result<Response<RecvStream>, h2::Error> {
    /// Starts the check unless disarmed.
    struct GaveUp<'a>(Option<&'a Arc<Conn>>);
    impl Drop for GaveUp<'_> {
        fn drop(&mut self) {
            if let Some(conn) = self.0 {
                Check::start(conn);
            }
        }
    }
    let mut gave_up = GaveUp(Some(conn));
    let answered = answer.await;
    gave_up.0 = None;
    answered
}

/// What an `h2` error before the answer's head means for the call: a stream the upstream did
/// not process ([`lbkit_tower::policy::http2_unprocessed`], as the tower layer decides) is
/// retried as a connect failure is.
fn observed(e: &h2::Error) -> Observed {
    if lbkit_tower::policy::http2_unprocessed(e) {
        Observed::ConnectFailed
    } else {
        Observed::ResetBeforeResponse
    }
}

/// An answer with its body read as it comes; `tied` lives as long as the body.
fn answer_body(resp: Response<RecvStream>, tied: Option<oneshot::Sender<()>>) -> Response<H2Body> {
    let (parts, recv) = resp.into_parts();
    let body = H2Body::new(recv, &parts.headers)
        .grpc_answer(&parts.headers)
        .with_tied(tied);
    Response::from_parts(parts, body)
}

/// The bytes of a buffered body (`Full` yields them on its first poll, without waiting).
fn full_bytes(mut full: Full<Bytes>) -> Bytes {
    let mut cx = Context::from_waker(Waker::noop());
    match Pin::new(&mut full).poll_frame(&mut cx) {
        Poll::Ready(Some(Ok(frame))) => frame.into_data().unwrap_or_default(),
        _ => Bytes::new(),
    }
}

/// Send a streamed body on `tx`, with `h2`'s flow control (never more than the stream's window
/// buffered), until it ends, the upstream resets the stream, or the call lets go (`cancelled`:
/// the stream is reset). Dropping the body at the end hands it back for a retry
/// ([`ClientBody`]).
async fn pipe(body: ClientBody, tx: SendStream<Bytes>, mut cancelled: oneshot::Receiver<()>) {
    let mut pipe = Pipe::new(body, tx);
    poll_fn(|cx| {
        if Pin::new(&mut cancelled).poll(cx).is_ready() {
            pipe.reset(Reason::CANCEL);
            return Poll::Ready(());
        }
        if let Piped::Failed(_) = ready!(pipe.poll(cx)) {
            // The client's upload broke (the body notes it for the call's answer).
            pipe.reset(Reason::CANCEL);
        }
        Poll::Ready(())
    })
    .await;
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::net::SocketAddr;
    use std::sync::atomic::AtomicUsize;

    use http::{HeaderMap, StatusCode};
    use http_body::Frame;
    use http_body_util::BodyExt;
    use hyper::body::Incoming;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use tokio::net::TcpListener;

    use super::*;

    const WAIT: Duration = Duration::from_secs(10);

    /// Frames handed out in order: a test server's answer body.
    struct Frames(VecDeque<Frame<Bytes>>);

    impl Body for Frames {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.0.pop_front().map(Ok))
        }
    }

    /// A test server: its address, and the connections it accepted and saw end. (A crash is
    /// played by a relay in front, `lbkit_testkit::relay`.)
    struct Server {
        addr: SocketAddr,
        opened: Arc<AtomicUsize>,
        closed: Arc<AtomicUsize>,
    }

    /// An HTTP/2 server on a loopback port answering every request with the request
    /// body's length, then two one-byte `DATA` frames and `grpc-status: 0` trailers (a gRPC
    /// answer's shape).
    async fn server() -> Server {
        let listener = TcpListener::bind(any_port()).await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (opened, closed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (o, c) = (opened.clone(), closed.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                o.fetch_add(1, Relaxed);
                let c = c.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(|req: Request<Incoming>| async move {
                        let read = req.into_body().collect().await.map(|b| b.to_bytes());
                        let len = read.map_or(0, |b| b.len());
                        let mut trailers = HeaderMap::new();
                        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                        let frames = VecDeque::from([
                            Frame::data(Bytes::from(len.to_string())),
                            Frame::data(Bytes::from_static(b"a")),
                            Frame::data(Bytes::from_static(b"b")),
                            Frame::trailers(trailers),
                        ]);
                        Ok::<_, std::convert::Infallible>(Response::new(Frames(frames)))
                    });
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                    c.fetch_add(1, Relaxed);
                });
            }
        });
        Server {
            addr,
            opened,
            closed,
        }
    }

    fn any_port() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 0))
    }

    fn request(addr: SocketAddr, body: &'static [u8]) -> Request<Either<Full<Bytes>, ClientBody>> {
        Request::post(format!("http://{addr}/echo.Echo/Say"))
            .version(http::Version::HTTP_2)
            .body(Either::Left(Full::new(Bytes::from_static(body))))
            .expect("a request")
    }

    /// The answer's body and its trailers.
    async fn read(resp: Response<H2Body>) -> (Bytes, Option<HeaderMap>) {
        let collected = resp.into_body().collect().await.expect("a whole body");
        let trailers = collected.trailers().cloned();
        (collected.to_bytes(), trailers)
    }

    /// One call to `addr` with an empty body: the answer's body.
    async fn call(client: &Arc<H2Client>, addr: SocketAddr) -> Bytes {
        let resp = client.request(request(addr, b"")).await;
        read(resp.expect("an answer")).await.0
    }

    /// Wait (bounded) until `what` holds: the event it watches happens in another task.
    async fn until(what: impl Fn() -> bool) {
        tokio::time::timeout(WAIT, async {
            while !what() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the awaited event within the bound");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn calls_share_one_connection_and_get_the_whole_answer() {
        let up = server().await;
        let client = H2Client::new(WAIT, Duration::from_secs(60));
        let resp = client
            .request(request(up.addr, b"hello"))
            .await
            .expect("an answer");
        assert_eq!(resp.status(), StatusCode::OK);
        let (body, trailers) = read(resp).await;
        assert_eq!(body.as_ref(), b"5ab");
        let status = trailers.as_ref().and_then(|t| t.get("grpc-status"));
        assert_eq!(status.map(|v| v.as_bytes()), Some(&b"0"[..]));
        let calls: Vec<_> = (0..50)
            .map(|_| {
                let (client, addr) = (client.clone(), up.addr);
                tokio::spawn(async move {
                    read(client.request(request(addr, b"")).await?)
                        .await
                        .0
                        .len()
                        .eq(&3)
                        .then_some(())
                        .ok_or(Observed::Done)
                })
            })
            .collect();
        for call in calls {
            call.await.expect("the task").expect("a whole answer");
        }
        assert_eq!(up.opened.load(Relaxed), 1, "one connection for every call");
        assert_eq!(client.kept(), 1);
    }

    /// h2 closes a connection (`ENHANCE_YOUR_CALM`) on which more small `DATA` frames wait
    /// unread than its budget allows, half the connection window: with h2's default 64 KB
    /// window, 400 answers of three small frames each, waiting to be read, are past it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_small_answers_waiting_to_be_read_keep_the_connection() {
        let up = server().await;
        let client = H2Client::new(WAIT, Duration::from_secs(60));
        let heads: Vec<_> = (0..400)
            .map(|_| {
                let (client, addr) = (client.clone(), up.addr);
                tokio::spawn(async move { client.request(request(addr, b"x")).await })
            })
            .collect();
        let mut answers = Vec::new();
        for head in heads {
            let head = tokio::time::timeout(WAIT, head).await.expect("in time");
            answers.push(head.expect("the task").expect("a head"));
        }
        // Only now is any answer read.
        for resp in answers {
            assert_eq!(read(resp).await.0.as_ref(), b"1ab");
        }
        assert_eq!(up.opened.load(Relaxed), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connection_the_upstream_dropped_is_replaced() {
        let up = server().await;
        let relay = lbkit_testkit::relay::Relay::start(up.addr).await;
        let client = H2Client::new(WAIT, Duration::from_secs(60));
        call(&client, relay.addr).await;
        // The upstream's connection ends (a crash, a restart), and the client lets go of it.
        relay.cut();
        until(|| client.kept() == 0).await;
        // The next call connects again.
        assert_eq!(call(&client, relay.addr).await.as_ref(), b"0ab");
        assert_eq!(up.opened.load(Relaxed), 2, "a new connection");
        assert_eq!(client.kept(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_idle_connection_is_closed_and_a_busy_one_kept() {
        let up = server().await;
        let client = H2Client::new(WAIT, Duration::from_millis(100));
        let resp = client
            .request(request(up.addr, b""))
            .await
            .expect("an answer");
        // An answer still being read keeps the connection open past the idle period...
        let started = tokio::time::Instant::now();
        until(|| client.kept() == 0).await;
        assert!(started.elapsed() >= Duration::from_millis(100));
        assert_eq!(up.closed.load(Relaxed), 0, "closed under an open stream");
        // ...and once it is read, the connection closes.
        assert_eq!(read(resp).await.0.as_ref(), b"0ab");
        until(|| up.closed.load(Relaxed) == 1).await;
        // The next call connects again.
        call(&client, up.addr).await;
        assert_eq!(up.opened.load(Relaxed), 2);
    }

    /// Calls that arrive while one call's connect is timing out wait for it and share its
    /// failure, instead of each trying in turn. The endpoint drops connects: a listener with a
    /// backlog of one that never accepts, its queue filled (Linux drops the SYNs past it). On
    /// tokio's paused clock, which moves to the next timer when nothing else can run.
    #[tokio::test(start_paused = true)]
    async fn calls_waiting_for_a_failed_connect_fail_with_it() {
        let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
        socket.bind(any_port()).expect("bind");
        let addr = socket.local_addr().expect("addr");
        let _listener = socket.listen(1).expect("listen");
        let mut filled = Vec::new();
        for _ in 0..4 {
            let connect = TcpStream::connect(addr);
            if let Ok(Ok(stream)) = tokio::time::timeout(Duration::from_millis(50), connect).await {
                filled.push(stream);
            }
        }
        let timeout = Duration::from_millis(300);
        let client = H2Client::new(timeout, Duration::from_secs(60));
        let started = tokio::time::Instant::now();
        let calls: Vec<_> = (0..10)
            .map(|_| {
                let client = client.clone();
                let call = async move { client.request(request(addr, b"")).await.err() };
                tokio::spawn(tokio::time::timeout(WAIT, call))
            })
            .collect();
        for call in calls {
            let failed = call
                .await
                .expect("the task")
                .expect("an end within the bound");
            assert_eq!(failed, Some(Observed::ConnectFailed));
        }
        // One connect timeout for all ten (ten in turn would be 3 s).
        let took = started.elapsed();
        assert!(took >= timeout && took < 2 * timeout, "{took:?}");
    }

    /// A connection that goes silent (its host vanished behind a partition: no `FIN`, no
    /// reset) would hold every later call to its endpoint until the kernel gives up on it
    /// (about 15 minutes), each call timing out in turn: a POST then never goes elsewhere. A
    /// call that lets go without an answer has the connection checked with a `PING`: a live
    /// one answers and is kept; with no `PONG` within the connect timeout it is closed, and the
    /// next call connects again. (The second check waits for the first one's second to end.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connection_gone_silent_is_closed_after_a_call_gave_up_on_it() {
        let up = server().await;
        let relay = lbkit_testkit::relay::Relay::start(up.addr).await;
        // The connect timeout bounds the PONG: ample on loopback, even on a loaded machine.
        let client = H2Client::new(Duration::from_millis(500), Duration::from_secs(60));
        assert_eq!(call(&client, relay.addr).await.as_ref(), b"0ab");
        // A call that gives up on a live connection: the check passes, the connection stays.
        // (Dropped after its first poll, which sends it; should its answer come within that
        // poll, another call tries.)
        let mut gave_up = false;
        for _ in 0..100 {
            let mut first = pin!(call(&client, relay.addr));
            gave_up = poll_fn(|cx| Poll::Ready(first.as_mut().poll(cx).is_pending())).await;
            if gave_up {
                break;
            }
        }
        assert!(gave_up, "a call given up before its answer");
        let passed = || {
            let slots = client.slots.load();
            let conn = slots.values().next().and_then(|s| s.conn.load_full());
            conn.map_or(0, |c| c.check.passed.load(Relaxed))
        };
        until(|| passed() == 1).await;
        assert_eq!(call(&client, relay.addr).await.as_ref(), b"0ab");
        assert_eq!((up.opened.load(Relaxed), client.kept()), (1, 1));
        relay.freeze();
        // Calls on the silent connection: one gives up (its per-try timeout), one waits.
        let given_up = Duration::from_millis(50);
        let gave_up = tokio::time::timeout(given_up, call(&client, relay.addr)).await;
        assert!(gave_up.is_err(), "no answer through a silent connection");
        let waiting = client.request(request(relay.addr, b""));
        let waited = tokio::time::timeout(WAIT, waiting).await.expect("an end");
        assert_eq!(waited.err(), Some(Observed::ResetBeforeResponse));
        until(|| client.kept() == 0).await;
        // The next call connects again.
        assert_eq!(call(&client, relay.addr).await.as_ref(), b"0ab");
        assert_eq!(up.opened.load(Relaxed), 2);
    }

    /// A stream above the `GOAWAY`'s last stream id was not processed whatever the frame's
    /// error code, and is retried as a connect failure is; one at or below it may have been.
    #[tokio::test]
    async fn a_goaway_tells_unprocessed_streams_from_others_whatever_its_error_code() {
        const ENHANCE_YOUR_CALM: u32 = 0xb;
        const NO_ERROR: u32 = 0;
        const INTERNAL_ERROR: u32 = 2;
        for (last, code, expected) in [
            (0, ENHANCE_YOUR_CALM, Observed::ConnectFailed),
            (0, INTERNAL_ERROR, Observed::ConnectFailed),
            (0, NO_ERROR, Observed::ConnectFailed),
            (1, ENHANCE_YOUR_CALM, Observed::ResetBeforeResponse),
            (1, NO_ERROR, Observed::ResetBeforeResponse),
        ] {
            let addr = lbkit_testkit::goaway_upstream(last, code).await;
            let client = H2Client::new(WAIT, Duration::from_secs(60));
            let call = client.request(request(addr, b"hello"));
            let err = tokio::time::timeout(WAIT, call)
                .await
                .expect("an end within the bound")
                .expect_err("no answer");
            assert_eq!(err, expected, "GOAWAY last stream {last}, error {code}");
        }
    }

    #[tokio::test]
    async fn no_connection_is_a_connect_failure() {
        let client = H2Client::new(WAIT, Duration::from_secs(60));
        let refused = lbkit_testkit::refused_addr();
        let err = client
            .request(request(refused, b""))
            .await
            .expect_err("refused");
        assert_eq!(err, Observed::ConnectFailed);
        assert_eq!(client.kept(), 0);
    }
}
