//! The fast path's I/O helpers: the per-thread pool of idle upstream connections, timers that
//! are re-armed lazily (not once per request), and the stream that replays already-read bytes
//! when a connection is handed to hyper.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::{poll_fn, Future};
use std::io;
use std::pin::{pin, Pin};
use std::sync::{Arc, Weak};
use std::task::{ready, Context, Poll, Waker};
use std::time::Duration;

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use super::wire::Hdr;
use crate::service::Service;

/// Idle connections kept per service, address and thread.
const MAX_IDLE_PER_ADDRESS: usize = 1024;

/// How often a request's take or give-back sweeps its thread's pool: drops expired connections
/// and those of services a reload removed.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// How often [`sweep_idle`] sweeps its thread's pool: an idle connection is closed at most this
/// long after its service's `upstream_idle_timeout_ms`, with or without requests (on the
/// threads a sweeper runs on).
const SWEEP_TICK: Duration = Duration::from_secs(1);

/// Spare exchange buffers kept per thread (enough for the requests in flight on a busy worker;
/// more are dropped when given back).
const SPARE_BUFFERS: usize = 512;

/// Buffers larger than this are not kept (one large answer should not pin its memory).
const MAX_KEPT_BUFFER: usize = 256 * 1024;

thread_local! {
    static GATE: RefCell<Gate> = RefCell::new(Gate::default());
    static POOL: RefCell<Pool> = RefCell::new(Pool::default());
    static SPARE: RefCell<Vec<Buffers>> = const { RefCell::new(Vec::new()) };
}

/// The upstream writers of this thread's scheduler round, released together when the round
/// ends, in the order of their upstream (so an upstream gets its requests back to back).
#[derive(Default)]
struct Gate {
    /// Whether [`pin_runtime_thread`] was called on this thread.
    pinned: bool,
    /// Writers waiting: their upstream key and waker.
    waiting: Vec<(usize, Waker)>,
    /// Whether a writer is waiting for the round's end on behalf of all.
    leading: bool,
    /// Rounds released so far.
    round: u64,
}

/// Promise that the runtime serving connections on this thread is a current-thread runtime
/// driven from this thread only, for its whole life (built and `block_on`'d here, as worker
/// threads and `lbkit proxy` do). Connections accepted afterwards on this thread use the
/// thread's write gate ([`write_turn`]); without the promise they yield plainly, since a
/// runtime driven from another thread later would strand the gate's round.
pub(crate) fn pin_runtime_thread() {
    GATE.with(|g| g.borrow_mut().pinned = true);
}

/// Whether connections on this thread may use the write gate.
pub(super) fn gated() -> bool {
    GATE.with(|g| g.borrow().pinned)
        && tokio::runtime::Handle::current().runtime_flavor()
            == tokio::runtime::RuntimeFlavor::CurrentThread
}

/// Wait for this thread's scheduler round to end, then go in the order of `key` (the
/// upstream): the first writer of a round yields to the runtime once (the other ready
/// connections parse their requests and wait here meanwhile), then wakes every waiting writer
/// grouped by key, itself included, so each upstream gets its requests back to back. The
/// groups' order changes every round (no upstream is always last). Only where [`gated`].
pub(super) async fn write_turn(key: usize) {
    let (lead, round) = GATE.with(|g| {
        let mut g = g.borrow_mut();
        let lead = !g.leading;
        g.leading = true;
        (lead, g.round)
    });
    if lead {
        let mut pending = Release(true);
        tokio::task::yield_now().await;
        let mut released = false;
        poll_fn(|cx| {
            if released {
                return Poll::Ready(());
            }
            released = true;
            pending.0 = false;
            release(Some((key, cx.waker())));
            Poll::Pending
        })
        .await;
        return;
    }
    // Where this writer's waker is in the round's list (a second poll updates it in place).
    let mut slot: Option<usize> = None;
    poll_fn(|cx| {
        GATE.with(|g| {
            let mut g = g.borrow_mut();
            if g.round != round {
                return Poll::Ready(());
            }
            match slot.and_then(|i| g.waiting.get_mut(i)) {
                Some(entry) => entry.1.clone_from(cx.waker()),
                None => {
                    slot = Some(g.waiting.len());
                    g.waiting.push((key, cx.waker().clone()));
                }
            }
            Poll::Pending
        })
    })
    .await;
}

/// End the round: wake its writers grouped by key, the leader's (`own`) group last, then the
/// leader (a task woken while it runs is queued after everything it woke).
fn release(own: Option<(usize, &Waker)>) {
    // During thread-local teardown (a runtime dropped then) there is nobody left to wake.
    let Ok((mut waiting, round)) = GATE.try_with(|g| {
        let mut g = g.borrow_mut();
        g.leading = false;
        g.round = g.round.wrapping_add(1);
        (std::mem::take(&mut g.waiting), g.round)
    }) else {
        return;
    };
    // Equal keys stay together (a stable sort on a bijection of the key); which group goes
    // first changes with the round.
    let mix = (round as usize).wrapping_mul(0x9E37_79B9_7F4A_7C15_u64 as usize);
    let lead = own.map(|(key, _)| key);
    waiting.sort_by_key(|&(key, _)| (Some(key) == lead, key ^ mix));
    for (_, waker) in waiting.drain(..) {
        waker.wake();
    }
    if let Some((_, waker)) = own {
        waker.wake_by_ref();
    }
    // Keep the room for the next round.
    let _ = GATE.try_with(|g| {
        let mut g = g.borrow_mut();
        if g.waiting.is_empty() {
            g.waiting = waiting;
        }
    });
}

/// Releases a round whose leader is dropped before it could (its writers would wait forever).
struct Release(bool);

impl Drop for Release {
    fn drop(&mut self) {
        if self.0 {
            release(None);
        }
    }
}

/// The buffers of one exchange: lent by the thread for the time a request is served, so an
/// idle keep-alive connection holds none of them (nginx's model; ≈ 20 KiB per connection
/// otherwise).
#[derive(Debug, Default)]
pub(super) struct Buffers {
    /// The request as sent upstream.
    pub(super) upstream: Vec<u8>,
    /// Bytes read from the upstream.
    pub(super) response: Vec<u8>,
    /// Bytes for the client.
    pub(super) output: Vec<u8>,
    pub(super) resp_headers: Vec<Hdr>,
}

/// Buffers for one exchange: spare ones of this thread, or new (empty) ones.
pub(super) fn lend() -> Buffers {
    SPARE.with(|s| s.borrow_mut().pop()).unwrap_or_default()
}

/// Return an exchange's buffers to this thread.
pub(super) fn give_back_buffers(mut b: Buffers) {
    let big = [
        b.upstream.capacity(),
        b.response.capacity(),
        b.output.capacity(),
    ]
    .into_iter()
    .any(|c| c > MAX_KEPT_BUFFER);
    if big {
        return;
    }
    b.upstream.clear();
    b.response.clear();
    b.output.clear();
    b.resp_headers.clear();
    SPARE.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < SPARE_BUFFERS {
            s.push(b);
        }
    });
}

/// The idle upstream connections of one thread. Each worker thread runs its own runtime, so a
/// connection is taken and given back on the thread (and runtime) that made it; on a
/// multi-threaded runtime a task may give it back on a sibling thread of the same runtime.
/// No lock: the `RefCell` is borrowed only between awaits.
#[derive(Default)]
struct Pool {
    services: Vec<ServicePool>,
    swept: Option<Instant>,
}

struct ServicePool {
    /// The owner; a dead one's connections go at the next sweep. Holding the `Weak` keeps the
    /// allocation, so its address identifies the service for as long as the entry lives.
    service: Weak<Service>,
    /// The service's `upstream_idle_timeout_ms`.
    idle_for: Duration,
    idle: HashMap<Box<str>, Vec<(TcpStream, Instant)>>,
}

/// An idle connection to `address` for `service`, if this thread has one that is neither
/// expired nor closed by its peer (whose readiness, already known to the runtime, says so
/// without a system call).
pub(super) fn take(service: &Arc<Service>, address: &str, now: Instant) -> Option<TcpStream> {
    POOL.with(|pool| {
        let mut pool = pool.borrow_mut();
        pool.sweep_due(now);
        let entry = pool
            .services
            .iter_mut()
            .find(|s| std::ptr::eq(s.service.as_ptr(), Arc::as_ptr(service)))?;
        let idle_for = entry.idle_for;
        let idle = entry.idle.get_mut(address)?;
        while let Some((stream, since)) = idle.pop() {
            if now.saturating_duration_since(since) < idle_for && open(&stream) {
                return Some(stream);
            }
        }
        None
    })
}

/// Give back a connection that finished its exchange cleanly.
pub(super) fn give_back(service: &Arc<Service>, address: &str, stream: TcpStream, now: Instant) {
    POOL.with(|pool| {
        let mut pool = pool.borrow_mut();
        pool.sweep_due(now);
        let i = match pool
            .services
            .iter()
            .position(|s| std::ptr::eq(s.service.as_ptr(), Arc::as_ptr(service)))
        {
            Some(i) => i,
            None => {
                pool.services.push(ServicePool {
                    service: Arc::downgrade(service),
                    idle_for: service.config().upstream_idle(),
                    idle: HashMap::new(),
                });
                pool.services.len() - 1
            }
        };
        let idle = &mut pool.services[i].idle;
        let list = match idle.get_mut(address) {
            Some(list) => list,
            None => idle.entry(address.into()).or_default(),
        };
        if list.len() < MAX_IDLE_PER_ADDRESS {
            list.push((stream, now));
        }
    });
}

impl Pool {
    /// Sweep when the last sweep is `SWEEP_EVERY` old: on a thread without [`sweep_idle`] (a
    /// sibling thread of a multi-threaded calling runtime), the only sweeps.
    fn sweep_due(&mut self, now: Instant) {
        if self
            .swept
            .is_none_or(|t| now.saturating_duration_since(t) >= SWEEP_EVERY)
        {
            self.sweep(now);
        }
    }

    fn sweep(&mut self, now: Instant) {
        self.swept = Some(now);
        self.services.retain(|s| s.service.strong_count() > 0);
        for s in &mut self.services {
            let idle_for = s.idle_for;
            s.idle.retain(|_, list| {
                list.retain(|(_, since)| now.saturating_duration_since(*since) < idle_for);
                !list.is_empty()
            });
        }
        self.services.retain(|s| !s.idle.is_empty());
    }
}

/// Sweep this thread's pool every `SWEEP_TICK`, so idle upstream connections close on time even
/// when no request comes (a worker that stops proxying does not keep them). Runs on every
/// runtime that serves connections; on a current-thread runtime (each worker's, and `lbkit
/// proxy`'s) that is every pool. On a multi-threaded calling runtime it sweeps the thread it
/// runs on; the others' pools are swept by their requests (`SWEEP_EVERY`). Once `owner` (the
/// proxy's shared state) is gone, it ends when the pool is empty (the services are gone, or
/// their connections expired). It holds no shutdown receiver: the drain waits for those.
pub(crate) async fn sweep_idle<T>(owner: Weak<T>) {
    let mut tick = tokio::time::interval(SWEEP_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let empty = POOL.with(|pool| {
            let mut pool = pool.borrow_mut();
            pool.sweep(Instant::now());
            pool.services.is_empty()
        });
        if empty && owner.strong_count() == 0 {
            return;
        }
    }
}

/// Whether an idle connection is still open with nothing unasked to read. Usually answered by
/// the readiness the runtime already knows (polled with a no-op waker: nobody waits on it), no
/// system call; only when the last read left readiness set does a one-byte read check.
fn open(stream: &TcpStream) -> bool {
    let mut cx = Context::from_waker(Waker::noop());
    if stream.poll_read_ready(&mut cx).is_pending() {
        return true;
    }
    let mut probe = [0u8; 1];
    matches!(stream.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}

/// A deadline that arms its timer lazily: moving the deadline later (every request does) costs
/// nothing; the timer, when it fires early, re-arms itself to the current deadline. One timer
/// registration per timeout period instead of one per request.
pub(super) struct Timer {
    sleep: Pin<Box<Sleep>>,
    deadline: Instant,
}

/// The deadline passed.
#[derive(Debug)]
pub(super) struct Elapsed;

impl Timer {
    /// A timer with no deadline yet.
    pub(super) fn new() -> Self {
        // Far enough never to fire before a real deadline is set.
        let never = Instant::now() + Duration::from_secs(86_400 * 365);
        Timer {
            sleep: Box::pin(tokio::time::sleep_until(never)),
            deadline: never,
        }
    }

    /// Set the deadline.
    pub(super) fn set(&mut self, deadline: Instant) {
        self.deadline = deadline;
        if self.sleep.deadline() > deadline {
            self.sleep.as_mut().reset(deadline);
        }
    }

    /// Ready once the deadline has passed.
    pub(super) fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            ready!(self.sleep.as_mut().poll(cx));
            if Instant::now() >= self.deadline {
                return Poll::Ready(());
            }
            let deadline = self.deadline;
            self.sleep.as_mut().reset(deadline);
        }
    }

    /// Run `fut` until it finishes or the deadline passes.
    pub(super) async fn run<F: Future>(&mut self, fut: F) -> Result<F::Output, Elapsed> {
        let mut fut = pin!(fut);
        poll_fn(|cx| {
            if let Poll::Ready(out) = fut.as_mut().poll(cx) {
                return Poll::Ready(Ok(out));
            }
            self.poll_expired(cx).map(|()| Err(Elapsed))
        })
        .await
    }
}

/// A connection whose first bytes were already read: they are read again first. What hyper
/// gets when the fast path hands a connection over.
///
/// A write that cannot progress for `stall` fails with `TimedOut` (nginx's `send_timeout`: the
/// limit is between two successive writes, not on the whole answer), so a client that stops
/// reading does not pin the connection, nor the upstream connection its answer streams from.
#[derive(Debug)]
pub(crate) struct Rewind {
    read: Bytes,
    stream: TcpStream,
    stall: Duration,
    /// The stall timer, made at the first write that waits and reset at each later one.
    timer: Option<Pin<Box<Sleep>>>,
    /// Whether a write is waiting (the timer runs).
    waiting: bool,
}

impl Rewind {
    pub(crate) fn new(read: Bytes, stream: TcpStream, stall: Duration) -> Self {
        Rewind {
            read,
            stream,
            stall,
            timer: None,
            waiting: false,
        }
    }

    /// The outcome of a write attempt: progress disarms the stall timer, waiting arms it, and
    /// waiting past `stall` is an error.
    fn stalled<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.waiting = false;
            return polled;
        }
        let timer = match (&mut self.timer, self.waiting) {
            (Some(timer), true) => timer,
            (slot, _) => {
                self.waiting = true;
                let deadline = Instant::now() + self.stall;
                match slot {
                    Some(timer) => {
                        timer.as_mut().reset(deadline);
                        timer
                    }
                    None => slot.insert(Box::pin(tokio::time::sleep_until(deadline))),
                }
            }
        };
        if timer.as_mut().poll(cx).is_ready() {
            self.waiting = false;
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client took no data for the route timeout",
            )));
        }
        Poll::Pending
    }
}

impl AsyncRead for Rewind {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.read.has_remaining() {
            let n = this.read.len().min(buf.remaining());
            buf.put_slice(&this.read[..n]);
            this.read.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewind {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.stalled(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.stalled(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The writers of one round go in the order of their upstream, each upstream's together;
    // a later round starts a new order.
    #[tokio::test(flavor = "current_thread")]
    async fn a_round_of_writers_goes_grouped_by_upstream() {
        pin_runtime_thread();
        for _ in 0..4 {
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let mut tasks = Vec::new();
            for key in [3, 1, 2, 3, 1, 2, 1] {
                let tx = tx.clone();
                tasks.push(tokio::spawn(async move {
                    write_turn(key).await;
                    tx.send(key).unwrap();
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
            let mut order = Vec::new();
            while let Ok(key) = rx.try_recv() {
                order.push(key);
            }
            // Grouped (the groups' order changes with the round).
            let mut groups = order.clone();
            groups.dedup();
            assert_eq!((groups.len(), order.len()), (3, 7), "{order:?}");
        }
        // The gate is free again: a lone writer passes on its own.
        write_turn(7).await;
        assert!(!GATE.with(|g| g.borrow().leading));
    }

    // A leader dropped while it waits for the round's end still wakes the writers waiting on
    // it, and a writer polled twice is listed once.
    #[tokio::test(flavor = "current_thread")]
    async fn a_dropped_leader_releases_its_round() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        struct Count(AtomicUsize);
        impl std::task::Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let poll = |f: &mut Pin<Box<dyn Future<Output = ()>>>, w: &Arc<Count>| {
            let waker = Waker::from(w.clone());
            f.as_mut().poll(&mut Context::from_waker(&waker))
        };
        let (leader_woken, follower_woken) = (
            Arc::new(Count(AtomicUsize::new(0))),
            Arc::new(Count(AtomicUsize::new(0))),
        );
        let mut leader: Pin<Box<dyn Future<Output = ()>>> = Box::pin(write_turn(1));
        let mut follower: Pin<Box<dyn Future<Output = ()>>> = Box::pin(write_turn(2));
        assert!(poll(&mut leader, &leader_woken).is_pending()); // leads, yields
        assert!(poll(&mut follower, &follower_woken).is_pending()); // waits
        assert!(poll(&mut follower, &follower_woken).is_pending()); // a spurious poll
        assert_eq!(GATE.with(|g| g.borrow().waiting.len()), 1);
        drop(leader);
        assert_eq!(follower_woken.0.load(Ordering::SeqCst), 1);
        assert!(poll(&mut follower, &follower_woken).is_ready());
        assert!(!GATE.with(|g| g.borrow().leading));
    }
}
