//! `weighted-response-time`: faster endpoints get more calls (Ribbon's
//! `WeightedResponseTimeRule`), with its degenerate cases fixed.
//!
//! * **Algorithm**: every `interval` (default 30 s) the balancer re-prepares this strategy (one
//!   thread at a time, off the pick path). Prepare reads each endpoint's windowed average
//!   successful response time `avgᵢ` and sets `weightᵢ = Σavg − avgᵢ`, as Ribbon does; a pick
//!   draws from an alias table over those weights.
//! * **Origin**: Netflix Ribbon `WeightedResponseTimeRule` (`DynamicServerWeightTask`).
//! * **Complexity**: prepare O(n) per refresh tick; pick O(1).
//! * **A change**: prepared again from the statistics, O(n), as on every refresh tick; endpoints
//!   that stay keep their statistics (the snapshot keeps them).
//! * **Behaviour under trouble**: a slow endpoint's share shrinks at the next refresh (not at
//!   once: use `p2c-ewma` for fast reaction). Failures do not count as fast responses: only
//!   successes enter the average.
//! * **Differences from the origin**, fixing Ribbon's degenerate cases:
//!   - *no statistics yet* (all averages unknown): round robin, as Ribbon falls back to, but
//!     explicitly instead of through a total weight of 0;
//!   - *only one endpoint has statistics*, or a single endpoint: Ribbon's formula gives weight 0
//!     to everyone (`Σavg − avg = 0`) — here that case is round robin too;
//!   - *endpoints without statistics* (new ones) get the mean weight of the measured ones
//!     (gRPC's WRR rule) instead of the largest weight Ribbon gives them;
//!   - *a very slow endpoint* never drops below [`MIN_WEIGHT_PERCENT`] % of the mean weight, so
//!     it keeps receiving some calls and its statistics stay fresh (Ribbon could starve it at 0
//!     forever, with a stale average);
//!   - *all endpoints down*: Ribbon's `choose` loops forever; here an empty eligible set is a
//!     `PickError` at once.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use lbkit_core::*;
//! use lbkit_strategy::WeightedResponseTime;
//! let now = Timestamp::from_millis(100_000);
//! let snap = Arc::new(Snapshot::from_specs(
//!     vec![EndpointSpec::new("fast:1"), EndpointSpec::new("slow:1")], now));
//! for (e, ms) in snap.endpoints().iter().zip([10, 90]) {
//!     e.stats().record(Duration::from_millis(ms), now, Outcome::Success);
//! }
//! let picker = WeightedResponseTime::default().prepare(&snap, now);
//! // weights: fast = 100 − 10 = 90 ms, slow = 100 − 90 = 10 ms → 90 % / 10 %.
//! assert!(picker.explain(EndpointIdx::new(0), now).unwrap().contains("90.00%"));
//! ```

use std::sync::Arc;
use std::time::Duration;

use lbkit_core::{EndpointIdx, PickContext, PickError, Picker, Snapshot, Strategy, Timestamp};

use crate::common::share;
use crate::weighted_random::WeightedRandomPicker;
use crate::{RoundRobin, RoundRobinPicker};

/// Default refresh period (Ribbon's `serverWeightTaskTimerInterval`, 30 s).
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);

/// Default averaging window for response times.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(30);

/// Floor of any weight, in percent of the mean weight.
pub const MIN_WEIGHT_PERCENT: u64 = 5;

/// Response-time weighted random choice.
#[derive(Debug, Clone)]
pub struct WeightedResponseTime {
    interval: Duration,
    window: Duration,
    fallback: RoundRobin,
}

impl Default for WeightedResponseTime {
    fn default() -> Self {
        WeightedResponseTime::new(DEFAULT_INTERVAL, DEFAULT_WINDOW)
    }
}

// === impl WeightedResponseTime ===

impl WeightedResponseTime {
    /// Re-weigh every `interval` from averages over `window` (at most 60 s are kept).
    pub fn new(interval: Duration, window: Duration) -> Self {
        WeightedResponseTime {
            interval: interval.max(Duration::from_millis(1)),
            window,
            fallback: RoundRobin::new(),
        }
    }

    /// Weights from the averages (`None` entries: no statistics), or `None` when round robin
    /// applies.
    fn weights(&self, avgs: &[(EndpointIdx, Option<u64>)]) -> Option<Vec<(EndpointIdx, u64)>> {
        let measured: Vec<u64> = avgs.iter().filter_map(|&(_, a)| a).collect();
        let sum: u64 = measured.iter().sum();
        let raw: Vec<Option<u64>> = avgs.iter().map(|&(_, a)| a.map(|a| sum - a)).collect();
        let known: Vec<u64> = raw.iter().flatten().copied().collect();
        let (max, count) = (known.iter().copied().max().unwrap_or(0), known.len() as u64);
        if max == 0 {
            return None; // no statistics, one measured endpoint, or all averages zero
        }
        let mean = known.iter().sum::<u64>() / count;
        let floor = (mean * MIN_WEIGHT_PERCENT / 100).max(1);
        Some(
            avgs.iter()
                .zip(raw)
                .map(|(&(i, _), w)| (i, w.unwrap_or(mean).max(floor)))
                .collect(),
        )
    }
}

impl Strategy for WeightedResponseTime {
    type Picker = ResponseTimePicker;

    fn name(&self) -> &str {
        "weighted-response-time"
    }

    fn prepare(&self, snapshot: &Arc<Snapshot>, now: Timestamp) -> ResponseTimePicker {
        let avgs: Vec<(EndpointIdx, Option<u64>)> = snapshot
            .eligible()
            .iter()
            .map(|&i| {
                let avg = snapshot
                    .endpoint(i)
                    .stats()
                    .avg_response_at(now, self.window);
                (
                    i,
                    avg.map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
                )
            })
            .collect();
        let inner = match self.weights(&avgs) {
            Some(w) => Inner::Weighted(WeightedRandomPicker::new(&w)),
            None => Inner::RoundRobin(self.fallback.prepare(snapshot, now)),
        };
        ResponseTimePicker {
            inner,
            avgs: avgs.into(),
        }
    }

    fn refresh_interval(&self) -> Option<Duration> {
        Some(self.interval)
    }
}

/// Prepared [`WeightedResponseTime`].
#[derive(Debug)]
pub struct ResponseTimePicker {
    inner: Inner,
    avgs: Box<[(EndpointIdx, Option<u64>)]>,
}

#[derive(Debug)]
enum Inner {
    RoundRobin(RoundRobinPicker),
    Weighted(WeightedRandomPicker),
}

impl Picker for ResponseTimePicker {
    #[inline]
    fn pick(&self, cx: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> {
        match &self.inner {
            Inner::RoundRobin(p) => p.pick(cx),
            Inner::Weighted(p) => p.pick(cx),
        }
    }

    fn explain(&self, idx: EndpointIdx, _now: Timestamp) -> Option<String> {
        let avg = self.avgs.iter().find(|&&(i, _)| i == idx)?.1;
        let avg = avg.map_or("no samples".to_owned(), |ns| {
            format!("avg {:.3} ms", ns as f64 / 1e6)
        });
        Some(match &self.inner {
            Inner::RoundRobin(_) => format!("{avg}; round robin until response times are known"),
            Inner::Weighted(p) => {
                let (w, total) = p.weight_of(idx)?;
                format!("{avg}; {}", share(w, total, None))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn avgs(v: &[Option<u64>]) -> Vec<(EndpointIdx, Option<u64>)> {
        v.iter()
            .enumerate()
            .map(|(i, &a)| (EndpointIdx::new(i), a))
            .collect()
    }

    fn weights(v: &[Option<u64>]) -> Option<Vec<u64>> {
        WeightedResponseTime::default()
            .weights(&avgs(v))
            .map(|w| w.into_iter().map(|(_, w)| w).collect())
    }

    #[test]
    fn ribbon_formula() {
        assert_eq!(
            weights(&[Some(10), Some(20), Some(70)]),
            Some(vec![90, 80, 30])
        );
    }

    #[test]
    fn degenerate_cases_fall_back_to_round_robin() {
        assert_eq!(weights(&[None, None]), None, "no statistics");
        assert_eq!(
            weights(&[Some(50), None]),
            None,
            "one measured endpoint: Σ − avg = 0"
        );
        assert_eq!(weights(&[Some(0), Some(0)]), None, "all zero");
    }

    #[test]
    fn equal_averages_give_equal_nonzero_weights() {
        assert_eq!(
            weights(&[Some(7), Some(7), Some(7)]),
            Some(vec![14, 14, 14])
        );
    }

    #[test]
    fn unmeasured_get_the_mean_and_slow_ones_keep_a_floor() {
        // Σ = 1010: weights 1000 and 10 → mean 505, floor 25.
        assert_eq!(
            weights(&[Some(10), Some(1000), None]),
            Some(vec![1000, 25, 505])
        );
    }
}
