//! `least-active`: fewest calls in flight; ties by weighted random.
//!
//! * **Algorithm**: read every candidate's in-flight count, keep the lowest; among endpoints tied
//!   on it, draw one with probability proportional to its (warm-up) weight.
//! * **Origin**: Dubbo `LeastActiveLoadBalance`.
//! * **Complexity**: prepare O(n); pick O(n) for up to 8 endpoints (exact, as Dubbo), and O(1)
//!   beyond: the less active of two weight-proportional samples (power of two choices), which
//!   is what makes it usable at 100 000 endpoints.
//! * **A change**: the candidate list is built again, O(n); the in-flight counts the picks compare
//!   stay with the endpoints.
//! * **Behaviour under trouble**: a slow endpoint accumulates calls in flight and stops getting
//!   new ones — the cure for requests piling up on a slow provider; a fast-failing endpoint
//!   looks idle, so pair it with outlier detection or the circuit breaker.
//! * **Differences from the origin**: Dubbo counts in-flight calls only when its `ActiveLimitFilter`
//!   is configured, and otherwise silently degrades to weighted random; here the count always comes
//!   from the pick's [`CallGuard`](lbkit_core::CallGuard).
//!
//! ```
//! use std::sync::Arc;
//! use lbkit_core::*;
//! use lbkit_strategy::LeastActive;
//! let snap = Arc::new(Snapshot::from_specs(vec![EndpointSpec::new("busy:1"), EndpointSpec::new("idle:1")], Timestamp::ZERO));
//! snap.endpoints()[0].stats().start(); // one call in flight on busy:1
//! let picker = LeastActive.prepare(&snap, Timestamp::ZERO);
//! let mut rng = FastRng::seed_from_u64(1);
//! assert_eq!(picker.pick(&mut PickContext::new(Timestamp::ZERO, &mut rng)).unwrap().get(), 1);
//! ```

use std::sync::Arc;

use lbkit_core::{EndpointIdx, PickContext, PickError, Picker, Snapshot, Strategy, Timestamp};

use super::choose::{Candidates, Ties};

/// Dubbo's least-active strategy.
#[derive(Debug, Clone, Copy, Default)]
pub struct LeastActive;

impl Strategy for LeastActive {
    type Picker = LeastActivePicker;

    fn name(&self) -> &str {
        "least-active"
    }

    fn prepare(&self, snapshot: &Arc<Snapshot>, now: Timestamp) -> LeastActivePicker {
        LeastActivePicker {
            snapshot: snapshot.clone(),
            candidates: Candidates::new(snapshot, now),
        }
    }
}

/// Prepared [`LeastActive`].
#[derive(Debug)]
pub struct LeastActivePicker {
    snapshot: Arc<Snapshot>,
    candidates: Candidates,
}

impl Picker for LeastActivePicker {
    #[inline]
    fn pick(&self, cx: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> {
        let snap = &self.snapshot;
        self.candidates
            .cheapest(cx, Ties::Weighted, |i| f64::from(snap.live(i).in_flight()))
            .ok_or(PickError::NoEndpoints)
    }

    fn explain(&self, idx: EndpointIdx, _now: Timestamp) -> Option<String> {
        let w = self.candidates.weight_of(idx)?;
        let active = self.snapshot.endpoint(idx).stats().in_flight();
        Some(format!("cost {active} in flight; tie weight {w}"))
    }
}
