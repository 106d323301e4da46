//! [`Completion`]: the hand-off of one call's [`CallGuard`] to whatever decides when the call has
//! ended (tower's `TrackCompletion` handle). The balance makes one per attempt; a
//! [`ResponsePolicy`](crate::ResponsePolicy) finishes it at once, or moves it into a response
//! body ([`TrackBody`](crate::http::TrackBody)) that finishes it at the first frame or at the end
//! of the stream.

use std::fmt;

use lbkit_core::{CallGuard, Clock, Endpoint, Outcome};

/// One call in flight to one endpoint. Finishing records latency and outcome in the endpoint's
/// statistics (which the [`telemetry`](crate::telemetry) families read); dropping it unfinished records a cancellation. Either way the
/// endpoint's `in_flight` count goes back down.
#[must_use = "dropping a Completion at once records a cancelled call"]
pub struct Completion {
    guard: Option<CallGuard>,
    clock: Clock,
    attempt: u32,
    /// Time the caller spent after the answer that is not the call's (a pushback waited out
    /// before a retry): taken off its latency when it finishes.
    held: std::time::Duration,
}

// === impl Completion ===

impl Completion {
    pub(crate) fn new(guard: CallGuard, clock: Clock, attempt: u32) -> Self {
        Completion {
            guard: Some(guard),
            clock,
            attempt,
            held: std::time::Duration::ZERO,
        }
    }

    /// A completion for a call picked outside a [`Pool`](crate::Pool) (by `lbkit proxy`, or
    /// any driver of lbkit-core's `Attempts`): finishing it records into the endpoint's
    /// statistics only, reading `clock` once.
    pub fn from_guard(guard: CallGuard, clock: Clock) -> Self {
        Completion {
            guard: Some(guard),
            clock,
            attempt: 0,
            held: std::time::Duration::ZERO,
        }
    }

    /// The request's tracing decision (see `lbkit_core::trace`).
    pub fn trace_id(&self) -> lbkit_core::trace::TraceId {
        self.guard
            .as_ref()
            .map_or(lbkit_core::trace::TraceId::UNDECIDED, CallGuard::trace_id)
    }

    /// The attempt this call is (0 = the first try of the request).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The endpoint called.
    ///
    /// # Panics
    /// Never: the guard is only taken by `finish`, which consumes `self`.
    pub fn endpoint(&self) -> &Endpoint {
        self.guard
            .as_ref()
            .expect("the guard is present until the completion is consumed")
            .endpoint()
    }

    /// The call was never sent (its retry budget was refused after the pick): nothing is
    /// recorded against the endpoint.
    pub(crate) fn abandon(mut self) {
        if let Some(guard) = self.guard.take() {
            guard.abandon();
        }
    }

    /// Record the load report in `headers` (an answer's head or trailers), if any, as the
    /// endpoint's last ([`crate::orca::record`]).
    #[cfg(feature = "http")]
    pub fn record_load(&self, headers: &http::HeaderMap) {
        if let Some(guard) = &self.guard {
            crate::orca::record(headers, guard.endpoint().stats(), &self.clock);
        }
    }

    /// The clock this call's end is read from.
    pub(crate) fn clock(&self) -> &Clock {
        &self.clock
    }

    /// End the call now (one clock read) with `outcome`.
    pub fn finish(mut self, outcome: Outcome) {
        if let Some(guard) = self.guard.take() {
            guard.finish_at(outcome, self.clock.now().saturating_sub(self.held));
        }
    }

    /// The caller spent `d` after the answer on something that is not the call (waiting out
    /// its pushback): however the call ends, its latency leaves `d` out.
    pub(crate) fn hold(&mut self, d: std::time::Duration) {
        self.held = self.held.saturating_add(d);
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        if let Some(guard) = self.guard.take() {
            let at = self.clock.now().saturating_sub(self.held);
            guard.finish_at(Outcome::Cancelled, at);
        }
    }
}

impl fmt::Debug for Completion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completion")
            .field("guard", &self.guard)
            .finish_non_exhaustive()
    }
}
