//! The source abstraction: a stream of [`Update`]s.
//!
//! Every endpoint source — a static list, a watched file, a ZooKeeper registry — is a
//! [`Stream`] of `Result<Update, DiscoveryError>` (linkerd's `Discover`), boxed as
//! [`UpdateStream`]. A stream rather than an async trait because it composes: a
//! [`Controller`](crate::Controller) consumes any of them, tests feed one from a channel
//! ([`channel`]), and a user-written source needs nothing from lbkit but the item type.
//!
//! * `Ok(Update::Reset(..))` replaces the whole set, `Add` adds or replaces endpoints by key
//!   (that is also how a weight or metadata change is expressed), `Remove` removes by key.
//! * `Err(..)` reports a problem (unreachable registry, broken file); the source keeps going,
//!   and the consumer keeps the last good set.
//! * The end of the stream means the source is done (a static list ends after its one `Reset`).

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;
use lbkit_core::{EndpointSpec, Update};
use tokio::sync::mpsc;

use crate::error::DiscoveryError;

/// One item of a source: an update, or the reason none could be produced.
pub type SourceItem = Result<Update, DiscoveryError>;

/// A boxed endpoint source.
pub type UpdateStream = Pin<Box<dyn Stream<Item = SourceItem> + Send + 'static>>;

/// Queue length between a source task and its consumer. Registry sources pace themselves and
/// coalesce what changes meanwhile (see [`Pace`]), so a short queue is enough; a full queue
/// makes the source wait (backpressure), never drop.
pub const SOURCE_QUEUE: usize = 64;

/// Holds the next piece of work back by what the last one cost: after work that took `t`, the
/// next may start `t` after it ended. How the stages of a discovery pipeline (a registry source
/// building whole sets, a [`Controller`](crate::Controller) applying batches, `lbkit watch`
/// printing them) keep a source that changes faster than sets are built to about half a core
/// each, coalescing the changes that arrive meanwhile instead of queueing them. Work that costs
/// nothing (virtual time in tests, small sets) is never held back.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap().block_on(async {
/// use std::time::Duration;
/// use lbkit_discovery::source::Pace;
/// use tokio::time::Instant;
/// let mut pace = Pace::default();
/// assert_eq!(pace.ready_at(), None);
/// let began = Instant::now();
/// tokio::time::advance(Duration::from_millis(3)).await; // the work
/// pace.done(began);
/// assert_eq!(pace.ready_at(), Some(began + Duration::from_millis(6)));
/// pace.wait().await;
/// assert_eq!(Instant::now(), began + Duration::from_millis(6));
/// # });
/// ```
#[derive(Debug, Default)]
pub struct Pace {
    next: Option<tokio::time::Instant>,
}

// === impl Pace ===

impl Pace {
    /// When the next piece of work may start (`None`: now).
    pub fn ready_at(&self) -> Option<tokio::time::Instant> {
        self.next
    }

    /// Wait until the next piece of work may start.
    pub async fn wait(&mut self) {
        if let Some(at) = self.next.take() {
            tokio::time::sleep_until(at).await;
        }
    }

    /// The work that began at `began` has just ended.
    pub fn done(&mut self, began: tokio::time::Instant) {
        let now = tokio::time::Instant::now();
        self.next = Some(now + now.duration_since(began));
    }
}

/// A [`Stream`] over the receiving half of a tokio channel: how source tasks hand updates to
/// their consumer.
pub struct ChannelStream(mpsc::Receiver<SourceItem>);

// === impl ChannelStream ===

impl ChannelStream {
    /// Wrap a receiver.
    pub fn new(rx: mpsc::Receiver<SourceItem>) -> Self {
        ChannelStream(rx)
    }

    /// Box it as an [`UpdateStream`].
    pub fn boxed(self) -> UpdateStream {
        Box::pin(self)
    }
}

impl Stream for ChannelStream {
    type Item = SourceItem;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<SourceItem>> {
        self.0.poll_recv(cx)
    }
}

impl fmt::Debug for ChannelStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChannelStream").finish_non_exhaustive()
    }
}

/// Read-only view of a source task's status (counters, connection state), updated by the task.
///
/// Wait on a condition with [`Status::wait_for`] (under `tokio::time::timeout`) rather than
/// polling it.
#[derive(Clone, Debug)]
pub struct Status<T>(tokio::sync::watch::Receiver<T>);

// === impl Status ===

impl<T: Clone> Status<T> {
    #[cfg_attr(not(feature = "runtime"), allow(dead_code))] // used by the file and ZooKeeper sources
    pub(crate) fn new(rx: tokio::sync::watch::Receiver<T>) -> Self {
        Status(rx)
    }

    /// The latest status.
    pub fn get(&self) -> T {
        self.0.borrow().clone()
    }

    /// Wait until `pred` holds and return that status. If the source task has ended, returns
    /// the last status whether or not `pred` holds.
    pub async fn wait_for(&mut self, mut pred: impl FnMut(&T) -> bool) -> T {
        let found = self.0.wait_for(|s| pred(s)).await.map(|s| s.clone());
        found.unwrap_or_else(|_| self.get())
    }
}

/// A hand-driven source: send updates (or errors) into the sender, consume the stream.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use futures_util::StreamExt;
/// use lbkit_core::{EndpointSpec, Update};
/// let (tx, mut stream) = lbkit_discovery::source::channel();
/// tx.send(Ok(Update::Reset(vec![EndpointSpec::new("a:1")]))).await.unwrap();
/// drop(tx);
/// assert!(matches!(stream.next().await, Some(Ok(Update::Reset(_)))));
/// assert!(stream.next().await.is_none());
/// # });
/// ```
pub fn channel() -> (mpsc::Sender<SourceItem>, UpdateStream) {
    let (tx, rx) = mpsc::channel(SOURCE_QUEUE);
    (tx, ChannelStream::new(rx).boxed())
}

/// A static list as a source: one `Reset`, then the end of the stream.
///
/// ```
/// let specs = lbkit_discovery::parse_static_list("10.0.0.1:80=5,10.0.0.2:80", "--endpoints").unwrap();
/// let _stream = lbkit_discovery::source::static_source(specs);
/// ```
pub fn static_source(specs: Vec<EndpointSpec>) -> UpdateStream {
    let (tx, rx) = mpsc::channel(1);
    // Capacity 1 and a fresh channel: the send cannot fail.
    let _ = tx.try_send(Ok(Update::Reset(specs)));
    ChannelStream::new(rx).boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn static_source_is_one_reset_then_the_end() {
        let mut s = static_source(vec![EndpointSpec::new("a:1")]);
        match s.next().await {
            Some(Ok(Update::Reset(specs))) => assert_eq!(specs[0].address, "a:1"),
            other => panic!("unexpected {other:?}"),
        }
        assert!(s.next().await.is_none());
    }
}

/// Exponential pauses between reconnection attempts to a registry (ZooKeeper, an xDS control
/// plane), from `min` doubling up to `max` (no jitter: one process holds few sessions, and the
/// pauses are short).
#[derive(Debug)]
#[cfg_attr(not(any(feature = "zookeeper", feature = "xds")), allow(dead_code))] // the registry sources use it
pub(crate) struct Backoff {
    next: Duration,
    min: Duration,
    max: Duration,
}

#[cfg_attr(not(any(feature = "zookeeper", feature = "xds")), allow(dead_code))]
impl Backoff {
    pub(crate) fn between(min: Duration, max: Duration) -> Self {
        Backoff {
            next: min,
            min,
            max: max.max(min),
        }
    }

    pub(crate) fn reset(&mut self) {
        self.next = self.min;
    }

    pub(crate) fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }
}
