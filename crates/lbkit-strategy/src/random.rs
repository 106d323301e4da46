//! `random`: a uniformly random eligible endpoint.
//!
//! * **Algorithm**: one draw from the caller's RNG, index into the eligible list.
//! * **Origin**: Ribbon `RandomRule`, Envoy `RANDOM`.
//! * **Complexity**: prepare O(n); pick O(1), no shared writes at all (the RNG is the caller's),
//!   so it scales across threads without contention.
//! * **A change**: the eligible list is copied again, O(n); nothing else is kept.
//! * **Behaviour under trouble**: blind to load and to weights (see `weighted-random` for
//!   Dubbo's weighted `RandomLoadBalance`).
//! * **Differences from the origin**: Ribbon's `RandomRule` loops (and can spin) while the server
//!   it drew is down; here the draw only ever sees eligible endpoints, and the balancer's re-pick
//!   is bounded.
//!
//! ```
//! use std::sync::Arc;
//! use lbkit_core::{EndpointSpec, FastRng, PickContext, Picker, Snapshot, Strategy, Timestamp};
//! use lbkit_strategy::Random;
//! let snap = Arc::new(Snapshot::from_specs(
//!     vec![EndpointSpec::new("a:1"), EndpointSpec::new("b:1")], Timestamp::ZERO));
//! let picker = Random.prepare(&snap, Timestamp::ZERO);
//! let mut rng = FastRng::seed_from_u64(1);
//! let idx = picker.pick(&mut PickContext::new(Timestamp::ZERO, &mut rng)).unwrap();
//! assert!(idx.get() < 2);
//! ```

use std::sync::Arc;

use lbkit_core::{EndpointIdx, PickContext, PickError, Picker, Snapshot, Strategy, Timestamp};

/// Uniform random choice.
#[derive(Debug, Clone, Copy, Default)]
pub struct Random;

impl Strategy for Random {
    type Picker = RandomPicker;

    fn name(&self) -> &str {
        "random"
    }

    fn prepare(&self, snapshot: &Arc<Snapshot>, _now: Timestamp) -> RandomPicker {
        RandomPicker {
            eligible: snapshot.eligible().into(),
        }
    }
}

/// Prepared [`Random`].
#[derive(Debug)]
pub struct RandomPicker {
    eligible: Box<[EndpointIdx]>,
}

impl Picker for RandomPicker {
    #[inline]
    fn pick(&self, cx: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> {
        if self.eligible.is_empty() {
            return Err(PickError::NoEndpoints);
        }
        Ok(self.eligible[cx.rng.index(self.eligible.len())])
    }

    fn explain(&self, _idx: EndpointIdx, _now: Timestamp) -> Option<String> {
        Some(format!("1/{} of picks on average", self.eligible.len()))
    }
}
