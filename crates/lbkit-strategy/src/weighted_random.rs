//! `weighted-random`: a random endpoint with probability proportional to its (warm-up) weight.
//!
//! * **Algorithm**: Walker/Vose alias table over the effective weights, built at prepare time
//!   with exact integer thresholds; a pick draws a column and a threshold. When every weight is
//!   equal it draws uniformly (Dubbo's `sameWeight` fast path).
//! * **Origin**: Dubbo `RandomLoadBalance` (weights with warm-up).
//! * **Complexity**: prepare O(n); pick O(1) (two RNG draws, one table read), independent of n;
//!   memory 16 bytes per endpoint.
//! * **A change**: the alias table is built again, O(n) (23–25 µs at 10 000 endpoints;
//!   BENCHMARKS.md, "What a change costs a strategy"), from weights computed out of the
//!   snapshot's dense copies ([`Snapshot::eligible_weights`](lbkit_core::Snapshot::eligible_weights)),
//!   no endpoint read: Vose's construction pairs each light entry
//!   with a heavy one, so one weight can move pairs anywhere in the table. It is built on the
//!   publisher's thread; picks keep the last table until the new one is swapped in.
//! * **Behaviour under trouble**: blind to load. A warming endpoint's share follows Dubbo's
//!   warm-up curve (the balancer re-prepares every [`WARMUP_REFRESH`](lbkit_core::WARMUP_REFRESH)
//!   during the window). Weight-0 endpoints are never drawn.
//! * **Differences from the origin**: Dubbo draws an offset and scans linearly (O(n) per pick);
//!   the alias table is O(1). Probabilities are identical (exactly `wᵢ / Σw`).
//!
//! ```
//! use std::sync::Arc;
//! use lbkit_core::{EndpointSpec, FastRng, PickContext, Picker, Snapshot, Strategy, Timestamp};
//! use lbkit_strategy::WeightedRandom;
//! let snap = Arc::new(Snapshot::from_specs(
//!     vec![EndpointSpec::new("a:1").with_weight(9), EndpointSpec::new("b:1").with_weight(1)],
//!     Timestamp::ZERO));
//! let picker = WeightedRandom.prepare(&snap, Timestamp::ZERO);
//! let mut rng = FastRng::seed_from_u64(1);
//! let a = (0..1000)
//!     .filter(|_| picker.pick(&mut PickContext::new(Timestamp::ZERO, &mut rng)).unwrap().get() == 0)
//!     .count();
//! assert!((850..950).contains(&a));
//! ```

use std::sync::Arc;

use lbkit_core::{EndpointIdx, PickContext, PickError, Picker, Snapshot, Strategy, Timestamp};

use crate::alias::AliasTable;
use crate::common::{all_equal, coverage_of, effective_weights, share};

/// Weighted random choice (Dubbo's `random`).
#[derive(Debug, Clone, Copy, Default)]
pub struct WeightedRandom;

impl Strategy for WeightedRandom {
    type Picker = WeightedRandomPicker;

    fn name(&self) -> &str {
        "weighted-random"
    }

    fn prepare(&self, snapshot: &Arc<Snapshot>, now: Timestamp) -> WeightedRandomPicker {
        WeightedRandomPicker::new(&effective_weights(snapshot, now)).with_coverage(snapshot)
    }
}

/// Prepared weighted random draw; shared with other weight-driven strategies.
#[derive(Debug)]
pub struct WeightedRandomPicker {
    draw: Draw,
    weights: Box<[(EndpointIdx, u64)]>,
    /// The aperture's coverage the weights include, for `--explain`.
    coverage: Option<Box<[u32]>>,
}

#[derive(Debug)]
enum Draw {
    Uniform(Box<[EndpointIdx]>),
    Alias(AliasTable),
}

impl WeightedRandomPicker {
    /// A picker drawing each endpoint with probability proportional to its weight; uniform when
    /// all weights are equal or all are zero.
    pub(crate) fn new(weights: &[(EndpointIdx, u64)]) -> Self {
        let uniform = || Draw::Uniform(weights.iter().map(|&(i, _)| i).collect());
        let draw = if all_equal(weights) {
            uniform()
        } else {
            AliasTable::new(weights).map_or_else(uniform, Draw::Alias)
        };
        WeightedRandomPicker {
            draw,
            weights: weights.into(),
            coverage: None,
        }
    }

    /// Say in `--explain` the aperture coverage `snapshot`'s weights include, if any.
    pub(crate) fn with_coverage(mut self, snapshot: &Snapshot) -> Self {
        self.coverage = coverage_of(snapshot);
        self
    }

    /// The weight used for `idx`, and the total.
    pub(crate) fn weight_of(&self, idx: EndpointIdx) -> Option<(u64, u64)> {
        let total = self.weights.iter().map(|&(_, w)| w).sum();
        self.weights
            .iter()
            .find(|&&(i, _)| i == idx)
            .map(|&(_, w)| (w, total))
    }
}

impl Picker for WeightedRandomPicker {
    #[inline]
    fn pick(&self, cx: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> {
        match &self.draw {
            Draw::Alias(table) => Ok(table.sample(cx.rng)),
            Draw::Uniform(list) if list.is_empty() => Err(PickError::NoEndpoints),
            Draw::Uniform(list) => Ok(list[cx.rng.index(list.len())]),
        }
    }

    fn explain(&self, idx: EndpointIdx, _now: Timestamp) -> Option<String> {
        let (w, total) = self.weight_of(idx)?;
        debug_assert!(match &self.draw {
            Draw::Alias(t) => t.total() == total,
            Draw::Uniform(_) => true,
        });
        let coverage = self.coverage.as_ref().map(|c| c[idx.get()]);
        Some(share(w, total, coverage))
    }
}
