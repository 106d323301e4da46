//! The fast path's timers: a deadline re-armed lazily, so moving it later per request costs
//! no timer registration.

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// "No deadline": far enough never to matter, near enough never to overflow an `Instant`.
pub(crate) const FAR: Duration = Duration::from_secs(86_400 * 365);

/// A deadline for the runtime's timer: `limit` after `tick`, or far away without one.
pub(super) fn deadline(tick: Instant, limit: Option<Duration>) -> Instant {
    tick + limit.unwrap_or(FAR).min(FAR)
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
        let never = Instant::now() + FAR;
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
