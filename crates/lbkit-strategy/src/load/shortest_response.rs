//! `shortest-response`: the lowest estimated wait, `average response × (in flight + 1)`.
//!
//! * **Algorithm**: for each candidate, the mean successful response time over the sliding
//!   window (`window_ms`, default 30 s — Dubbo's `slidePeriod`) times its calls in flight plus
//!   one; the lowest estimate wins, ties by weighted random.
//! * **Origin**: Dubbo `ShortestResponseLoadBalance` (2.7.7+).
//! * **Complexity**: prepare O(n); pick O(n) up to 8 endpoints (exact, as Dubbo), O(1) beyond
//!   (the better of two weight-proportional samples). The window is [`EndpointStats`]'
//!   lock-free slots (5 s each, up to 60 s).
//! * **Behaviour under trouble**: a provider that turns slow sees its estimate grow with each slow
//!   response and with the calls queueing on it; an endpoint without successful samples in the
//!   window estimates 0 and is tried first (as in Dubbo), which probes new and recovered
//!   endpoints; failures do not count as fast responses.
//! * **Differences from the origin**: Dubbo resets its window every `slidePeriod` wholesale (a
//!   saw-tooth); here the window slides in 5 s slots.
//!
//! [`EndpointStats`]: lbkit_core::EndpointStats

use std::sync::Arc;
use std::time::Duration;

use lbkit_core::{EndpointIdx, PickContext, PickError, Picker, Snapshot, Strategy, Timestamp};

use super::choose::{Candidates, Ties};

/// Dubbo's default sliding window (`slidePeriod`, 30 s).
pub const DEFAULT_SLIDE_WINDOW: Duration = Duration::from_secs(30);

/// Dubbo's shortest-response strategy.
#[derive(Debug, Clone, Copy)]
pub struct ShortestResponse {
    window: Duration,
}

impl Default for ShortestResponse {
    fn default() -> Self {
        ShortestResponse::new(DEFAULT_SLIDE_WINDOW)
    }
}

impl ShortestResponse {
    /// Average response times over `window` (at most 60 s are kept).
    pub fn new(window: Duration) -> Self {
        ShortestResponse { window }
    }
}

impl Strategy for ShortestResponse {
    type Picker = ShortestResponsePicker;

    fn name(&self) -> &str {
        "shortest-response"
    }

    fn prepare(&self, snapshot: &Arc<Snapshot>, now: Timestamp) -> ShortestResponsePicker {
        ShortestResponsePicker {
            snapshot: snapshot.clone(),
            candidates: Candidates::new(snapshot, now),
            window: self.window,
        }
    }
}

/// Prepared [`ShortestResponse`].
#[derive(Debug)]
pub struct ShortestResponsePicker {
    snapshot: Arc<Snapshot>,
    candidates: Candidates,
    window: Duration,
}

impl ShortestResponsePicker {
    /// Estimated wait of `idx` at `now`, in nanoseconds.
    #[inline]
    pub fn estimate(&self, idx: EndpointIdx, now: Timestamp) -> f64 {
        let stats = self.snapshot.endpoint(idx).stats();
        let avg = stats
            .avg_response_at(now, self.window)
            .map_or(0.0, |d| d.as_nanos() as f64);
        avg * (f64::from(stats.in_flight()) + 1.0)
    }
}

impl Picker for ShortestResponsePicker {
    #[inline]
    fn pick(&self, cx: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> {
        let now = cx.now;
        self.candidates
            .cheapest(cx, Ties::Weighted, |i| self.estimate(i, now))
            .ok_or(PickError::NoEndpoints)
    }

    fn explain(&self, idx: EndpointIdx, now: Timestamp) -> Option<String> {
        let w = self.candidates.weight_of(idx)?;
        let stats = self.snapshot.endpoint(idx).stats();
        let avg = stats.avg_response_at(now, self.window);
        Some(format!(
            "estimate {:.3} ms = avg {} × {} (in flight + 1); tie weight {w}",
            self.estimate(idx, now) / 1e6,
            avg.map_or("0 (no samples)".to_owned(), |d| format!(
                "{:.3} ms",
                d.as_secs_f64() * 1e3
            )),
            stats.in_flight() + 1
        ))
    }
}
