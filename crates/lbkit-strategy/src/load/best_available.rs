//! `best-available`: the fewest calls in flight among endpoints whose circuit is not tripped.
//!
//! * **Algorithm**: skip endpoints whose Ribbon circuit breaker is tripped (3 consecutive
//!   failures: 10 s, then 20 s, then 30 s), take the one with the fewest calls in flight, the
//!   earliest on ties; if every circuit is tripped, round robin (Ribbon falls back to its
//!   parent rule).
//! * **Origin**: Netflix Ribbon `BestAvailableRule`.
//! * **Complexity**: prepare O(n); pick O(n) up to 8 endpoints (an exact scan, as Ribbon), O(1)
//!   beyond (the better of two samples).
//! * **A change**: the candidate list is built again, O(n); the counts stay with the endpoints.
//! * **Behaviour under trouble**: like `least-active`, plus failing endpoints are excluded while
//!   their breaker is tripped.
//! * **Differences from the origin**: Ribbon scans every server on every pick; large sets use two
//!   samples instead.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use lbkit_core::{
    CircuitBreaker, EndpointIdx, PickContext, PickError, Picker, Snapshot, Strategy, Timestamp,
};

use super::choose::{Candidates, Ties};
use crate::round_robin::{Counters, SharedCounter};

/// Ribbon's best-available strategy.
#[derive(Debug, Clone)]
pub struct BestAvailable {
    breaker: CircuitBreaker,
    fallback: Counters,
}

impl Default for BestAvailable {
    fn default() -> Self {
        BestAvailable::new(CircuitBreaker::default())
    }
}

impl BestAvailable {
    /// Skip endpoints whose `breaker` is tripped.
    pub fn new(breaker: CircuitBreaker) -> Self {
        BestAvailable {
            breaker,
            fallback: Counters::new(0),
        }
    }
}

impl Strategy for BestAvailable {
    type Picker = BestAvailablePicker;

    fn name(&self) -> &str {
        "best-available"
    }

    fn prepare(&self, snapshot: &Arc<Snapshot>, now: Timestamp) -> BestAvailablePicker {
        BestAvailablePicker {
            snapshot: snapshot.clone(),
            candidates: Candidates::new(snapshot, now),
            breaker: self.breaker,
            fallback: self.fallback.of(snapshot),
        }
    }
}

/// Prepared [`BestAvailable`].
#[derive(Debug)]
pub struct BestAvailablePicker {
    snapshot: Arc<Snapshot>,
    candidates: Candidates,
    breaker: CircuitBreaker,
    fallback: SharedCounter,
}

impl Picker for BestAvailablePicker {
    #[inline]
    fn pick(&self, cx: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> {
        let (snap, now) = (&self.snapshot, cx.now);
        let cost = |i: EndpointIdx| {
            let live = snap.live(i);
            if self.breaker.tripped_until_live(live, now).is_some() {
                f64::INFINITY
            } else {
                f64::from(live.in_flight())
            }
        };
        if let Some(i) = self.candidates.cheapest(cx, Ties::First, cost) {
            return Ok(i);
        }
        let eligible = snap.eligible();
        if eligible.is_empty() {
            return Err(PickError::NoEndpoints);
        }
        let k = self.fallback.fetch_add(1, Relaxed);
        Ok(eligible[(k % eligible.len() as u64) as usize])
    }

    fn explain(&self, idx: EndpointIdx, now: Timestamp) -> Option<String> {
        let e = self.snapshot.endpoint(idx);
        Some(match self.breaker.tripped_until(e, now) {
            Some(until) => format!(
                "circuit tripped for {} ms more: skipped",
                until.as_millis().saturating_sub(now.as_millis())
            ),
            None => format!("cost {} in flight", e.stats().in_flight()),
        })
    }
}
