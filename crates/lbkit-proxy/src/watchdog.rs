//! The timers of a connection hyper serves (after the fast path hands it over): hyper's own
//! timers cover an HTTP/1 head and a stalled write, but not a half-sent HTTP/2 preface, an
//! HTTP/2 connection left open with nothing to do, a request body trickled after its answer,
//! or HTTP/2 streams stuck on flow control. One watchdog per connection covers every state:
//!
//! | state | limit | then |
//! |---|---|---|
//! | no request has started since the handover (a half-sent preface, a slow first head) | `header_read_timeout_ms` | closed |
//! | no request in flight, none starting or ending | `idle_timeout_ms` | graceful close (HTTP/2 `GOAWAY`), closed `header_read_timeout_ms` later at the latest |
//! | requests in flight, no byte read or written | `stream_idle_timeout_ms` | closed |
//!
//! The connection's IO counts its bytes and each request holds a [`Busy`] mark until its
//! response body is done, so the watchdog reads three counters per tick (a quarter of the
//! shortest limit) and nothing runs per byte but one relaxed add.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

/// What a connection is doing, counted by its IO and its requests.
#[derive(Debug, Default)]
pub(crate) struct Activity {
    /// Bytes read from and written to the client.
    moved: AtomicU64,
    /// Requests started, and ended, in one count: it moves at every start and every end.
    events: AtomicU64,
    /// Requests started since the handover.
    started: AtomicU64,
    /// Requests whose response is not done yet.
    in_flight: AtomicU64,
}

impl Activity {
    /// `n` bytes went to or came from the client.
    #[inline]
    pub(crate) fn moved(&self, n: usize) {
        if n > 0 {
            self.moved.fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    /// A request starts; it is in flight until the mark (and the body it goes into) drops.
    pub(crate) fn begin(self: &Arc<Self>) -> Busy {
        self.started.fetch_add(1, Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.events.fetch_add(1, Ordering::Relaxed);
        Busy(self.clone())
    }
}

/// A request in flight on its connection (see [`Activity::begin`]).
#[derive(Debug)]
pub(crate) struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.0.events.fetch_add(1, Ordering::Relaxed);
    }
}

/// A response body that keeps its request in flight until it is done or dropped.
#[derive(Debug)]
pub(crate) struct BusyBody<B> {
    body: B,
    busy: Option<Busy>,
}

impl<B> BusyBody<B> {
    pub(crate) fn new(body: B, busy: Busy) -> Self {
        BusyBody {
            body,
            busy: Some(busy),
        }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for BusyBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            this.busy = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The watchdog's limits (see the module docs).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub(crate) head: Duration,
    pub(crate) idle: Duration,
    pub(crate) stream_idle: Duration,
}

impl Limits {
    /// The limits of a listener's `[limits]`.
    pub(crate) fn of(limits: &crate::config::Limits) -> Self {
        let ms = Duration::from_millis;
        Limits {
            head: ms(limits.header_read_timeout_ms),
            idle: ms(limits.idle_timeout_ms),
            stream_idle: ms(limits.stream_idle_timeout_ms),
        }
    }
}

/// Which limit a connection passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Expired {
    /// No request started within the head limit of the handover.
    Head,
    /// Nothing in flight, nothing started or ended, for the idle limit.
    Idle,
    /// Requests in flight, no byte moved, for the stream idle limit.
    Stuck,
}

/// Resolves with the first limit `activity` passes.
pub(crate) async fn watch(activity: &Activity, limits: Limits) -> Expired {
    let shortest = limits.head.min(limits.idle).min(limits.stream_idle);
    let tick = (shortest / 4).max(Duration::from_millis(1));
    let mut interval = tokio::time::interval_at(tokio::time::Instant::now() + tick, tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let (mut waited, mut idle, mut stuck) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let (mut events, mut moved) = (load(&activity.events), load(&activity.moved));
    loop {
        interval.tick().await;
        let (now_events, now_moved) = (load(&activity.events), load(&activity.moved));
        if load(&activity.started) == 0 {
            waited += tick;
            if waited >= limits.head {
                return Expired::Head;
            }
        } else if load(&activity.in_flight) > 0 {
            idle = Duration::ZERO;
            stuck = if now_moved == moved {
                stuck + tick
            } else {
                Duration::ZERO
            };
            if stuck >= limits.stream_idle {
                return Expired::Stuck;
            }
        } else {
            stuck = Duration::ZERO;
            idle = if now_events == events {
                idle + tick
            } else {
                Duration::ZERO
            };
            if idle >= limits.idle {
                return Expired::Idle;
            }
        }
        (events, moved) = (now_events, now_moved);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    const LIMITS: Limits = Limits {
        head: Duration::from_secs(10),
        idle: Duration::from_secs(60),
        stream_idle: Duration::from_secs(300),
    };

    /// Runs the watchdog against `life` (what the connection does, in virtual time) and says
    /// which limit passed, and when.
    async fn expires(
        activity: Arc<Activity>,
        life: impl std::future::Future<Output = ()>,
    ) -> (Expired, Duration) {
        let start = Instant::now();
        tokio::select! {
            why = watch(&activity, LIMITS) => (why, start.elapsed()),
            () = async { life.await; std::future::pending::<()>().await } => unreachable!(),
        }
    }

    fn within(took: Duration, at_least: u64, at_most: u64) -> bool {
        took >= Duration::from_secs(at_least) && took <= Duration::from_secs(at_most)
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_never_starts_a_request_passes_the_head_limit() {
        let a = Arc::new(Activity::default());
        // Bytes trickle in (a preface sent a byte at a time), but no request starts.
        let trickle = {
            let a = a.clone();
            async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    a.moved(1);
                }
            }
        };
        let (why, took) = expires(a, trickle).await;
        assert_eq!(why, Expired::Head);
        assert!(within(took, 10, 13), "{took:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_with_nothing_in_flight_passes_the_idle_limit_after_its_last_request() {
        let a = Arc::new(Activity::default());
        let life = {
            let a = a.clone();
            async move {
                // One request from 1 s to 31 s, its body trickling; then pings only.
                tokio::time::sleep(Duration::from_secs(1)).await;
                let busy = a.begin();
                tokio::time::sleep(Duration::from_secs(30)).await;
                drop(busy);
                loop {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    a.moved(17);
                }
            }
        };
        let (why, took) = expires(a, life).await;
        assert_eq!(why, Expired::Idle);
        assert!(within(took, 91, 96), "{took:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn requests_in_flight_with_no_byte_moving_pass_the_stream_idle_limit() {
        let a = Arc::new(Activity::default());
        let life = {
            let a = a.clone();
            async move {
                let _busy = a.begin();
                // Bytes for 100 s, then none (a client that stopped granting window).
                for _ in 0..100 {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    a.moved(100);
                }
                std::future::pending::<()>().await;
            }
        };
        let (why, took) = expires(a, life).await;
        assert_eq!(why, Expired::Stuck);
        assert!(within(took, 400, 404), "{took:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_body_ends_its_request_when_done_or_dropped() {
        use http_body_util::{BodyExt, Full};
        let a = Arc::new(Activity::default());
        let mut body = BusyBody::new(Full::new(Bytes::from_static(b"hi")), a.begin());
        assert_eq!(a.in_flight.load(Ordering::Relaxed), 1);
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), Bytes::from_static(b"hi"));
        assert_eq!(a.in_flight.load(Ordering::Relaxed), 1);
        assert!(body.frame().await.is_none());
        // Done while the body is still held (hyper may keep it until the connection moves on).
        assert_eq!(a.in_flight.load(Ordering::Relaxed), 0);
        drop(body);
        assert_eq!(a.in_flight.load(Ordering::Relaxed), 0);
        let body = BusyBody::new(Full::new(Bytes::from_static(b"hi")), a.begin());
        drop(body);
        assert_eq!(a.in_flight.load(Ordering::Relaxed), 0);
        assert_eq!(a.started.load(Ordering::Relaxed), 2);
    }
}
