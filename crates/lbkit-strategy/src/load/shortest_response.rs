//! `shortest-response`: the lowest estimated wait, `average response × (in flight + 1)`.
//!
//! * **Algorithm**: for each candidate, the mean successful response time over the sliding
//!   window (`window_ms`, default 30 s — Dubbo's `slidePeriod`) times its calls in flight plus
//!   one; the lowest estimate wins, ties by weighted random.
//! * **Origin**: Dubbo `ShortestResponseLoadBalance` (2.7.7+).
//! * **Complexity**: prepare O(n); pick O(n) up to 8 endpoints (exact, as Dubbo), O(1) beyond
//!   (the better of two weight-proportional samples). The window is [`EndpointStats`]'
//!   lock-free slots (5 s each, up to 60 s), read once per endpoint at prepare; a pick reads
//!   only the endpoint's hot line ([`LiveStats`]: in flight, cumulative successes and their
//!   latency sum). Prepare records, per endpoint, the cumulative counters minus the window's
//!   samples; a pick's mean is `(sum − base sum) / (count − base count)`: the window as of
//!   prepare plus every success since. The strategy asks to be prepared again every slot (5 s,
//!   [`Strategy::refresh_interval`], done by [`Balancer::tick`]), so samples leave the window
//!   at most one slot late — the slots' own granularity.
//! * **A change**: the windows' bases are read again, O(n); the statistics stay with the endpoints.
//! * **Behaviour under trouble**: a provider that turns slow sees its estimate grow with each slow
//!   response and with the calls queueing on it; an endpoint without successful samples in the
//!   window estimates 0 and is tried first (as in Dubbo), which probes new and recovered
//!   endpoints; failures do not count as fast responses.
//! * **Differences from the origin**: Dubbo resets its window every `slidePeriod` wholesale (a
//!   saw-tooth, every endpoint estimating 0 right after a reset); here the window slides in 5 s
//!   slots.
//!
//! [`EndpointStats`]: lbkit_core::EndpointStats
//! [`LiveStats`]: lbkit_core::LiveStats
//! [`Balancer::tick`]: lbkit_core::Balancer::tick

use std::sync::Arc;
use std::time::Duration;

use lbkit_core::{
    EndpointIdx, PickContext, PickError, Picker, Snapshot, Strategy, Timestamp, SLOT,
};

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
        let base = snapshot
            .endpoints()
            .iter()
            .map(|e| {
                let stats = e.stats();
                // Cumulative first: a success recorded between the two reads then shows in
                // the window only, and the base errs low (the sample counts once, not never).
                let (count, sum) = (stats.live().successes(), stats.live().success_nanos());
                let (in_window, window_sum) = stats.window_sum_at(now, self.window);
                Base {
                    count: count.saturating_sub(in_window),
                    sum: sum.saturating_sub(window_sum),
                }
            })
            .collect();
        ShortestResponsePicker {
            snapshot: snapshot.clone(),
            candidates: Candidates::new(snapshot, now),
            window: self.window,
            base,
        }
    }

    /// Every slot (5 s): samples older than the window leave it.
    fn refresh_interval(&self) -> Option<Duration> {
        Some(SLOT)
    }
}

/// Cumulative successes and latency sum of one endpoint at prepare, minus its window's.
#[derive(Debug, Clone, Copy)]
struct Base {
    count: u64,
    sum: u64,
}

/// Prepared [`ShortestResponse`].
#[derive(Debug)]
pub struct ShortestResponsePicker {
    snapshot: Arc<Snapshot>,
    candidates: Candidates,
    window: Duration,
    /// Indexed like the snapshot's endpoints.
    base: Box<[Base]>,
}

impl ShortestResponsePicker {
    /// Mean successful response time of `idx` in nanoseconds: the window as of prepare plus the
    /// successes since; `None` without samples.
    #[inline]
    pub fn average_ns(&self, idx: EndpointIdx) -> Option<f64> {
        let live = self.snapshot.live(idx);
        let base = self.base[idx.get()];
        let count = live.successes().saturating_sub(base.count);
        (count > 0).then(|| live.success_nanos().saturating_sub(base.sum) as f64 / count as f64)
    }

    /// Estimated wait of `idx`, in nanoseconds: the mean response time × (in flight + 1). `now`
    /// is not needed (the window was read at prepare) and is kept for the caller's symmetry with
    /// the other load-aware pickers.
    #[inline]
    pub fn estimate(&self, idx: EndpointIdx, _now: Timestamp) -> f64 {
        let avg = self.average_ns(idx).unwrap_or(0.0);
        avg * (f64::from(self.snapshot.live(idx).in_flight()) + 1.0)
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
        Some(format!(
            "estimate {:.3} ms = avg {} over {} s × {} (in flight + 1); tie weight {w}",
            self.estimate(idx, now) / 1e6,
            self.average_ns(idx)
                .map_or("0 (no samples)".to_owned(), |ns| format!(
                    "{:.3} ms",
                    ns / 1e6
                )),
            self.window.as_secs(),
            self.snapshot.live(idx).in_flight() + 1
        ))
    }
}
