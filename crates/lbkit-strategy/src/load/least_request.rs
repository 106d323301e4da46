//! `least-request`: Envoy's least-request balancer.
//!
//! * **Algorithm**: with equal weights, draw `choice_count` (default 2) endpoints at random and
//!   take the one with the fewest calls in flight. With unequal weights, every endpoint's
//!   effective weight is `weight / (in_flight + 1)^active_request_bias` (bias default 1.0), and a
//!   pick draws an endpoint with probability proportional to it: a draw by static weight from an
//!   alias table is accepted with probability `1 / (in_flight + 1)^bias` (rejection sampling);
//!   after 32 rejected draws the best of them is taken. Bias 0 makes the weights static: smooth
//!   weighted round robin, as Envoy's EDF scheduler then is.
//! * **Origin**: Envoy `LEAST_REQUEST` (`choice_count`, `active_request_bias`).
//! * **Complexity**: prepare O(n); pick O(choice_count) with equal weights, O(1) expected with
//!   unequal ones (at most 32 draws).
//! * **A change**: the weights are computed again from the snapshot's dense copies
//!   ([`Snapshot::eligible_weights`](lbkit_core::Snapshot::eligible_weights), no endpoint read) and
//!   the candidate list or the weighted table rebuilt, O(n) (27 µs at 10 000 endpoints of equal weight; BENCHMARKS.md, "What a change costs a
//!   strategy").
//! * **Behaviour under trouble**: a slow endpoint's calls in flight pile up and its share shrinks
//!   with them; weights still count, so a large server takes more.
//! * **Differences from the origin**: Envoy recomputes EDF deadlines under a per-worker
//!   scheduler; lbkit picks lock-free from shared state, so it samples the same distribution
//!   instead of scheduling it. Envoy draws its choices independently, so both can be the same
//!   (busy) host; here the first two are distinct, further ones independent.

use std::sync::Arc;

use lbkit_core::{EndpointIdx, PickContext, PickError, Picker, Snapshot, Strategy, Timestamp};

use super::choose::IndexList;
use crate::alias::AliasTable;
use crate::common::{all_equal, effective_weights, share};
use crate::round_robin::Counters;
use crate::smooth_weighted::SmoothWeightedPicker;

/// Draws before rejection sampling settles for the best draw. With a quarter of draws accepted
/// (bias 2 over a loaded fleet) 32 draws leave a 10⁻⁴ chance of the fallback; under very
/// heavy load the fallback, the best of 32 weighted samples, is itself strongly load-aware.
const MAX_DRAWS: u32 = 32;

/// Envoy's least-request strategy.
#[derive(Debug, Clone)]
pub struct LeastRequest {
    choice_count: u32,
    bias: f64,
    counter: Counters,
}

impl Default for LeastRequest {
    fn default() -> Self {
        LeastRequest::new(2, 1.0)
    }
}

impl LeastRequest {
    /// `choice_count` candidates (at least 1) with equal weights; `bias` (≥ 0) with unequal ones.
    pub fn new(choice_count: u32, bias: f64) -> Self {
        LeastRequest {
            choice_count: choice_count.max(1),
            bias: if bias.is_finite() { bias.max(0.0) } else { 1.0 },
            counter: Counters::new(0),
        }
    }
}

impl Strategy for LeastRequest {
    type Picker = LeastRequestPicker;

    fn name(&self) -> &str {
        "least-request"
    }

    fn prepare(&self, snapshot: &Arc<Snapshot>, now: Timestamp) -> LeastRequestPicker {
        let weights = effective_weights(snapshot, now);
        let mode = if all_equal(&weights) {
            Mode::Choices(IndexList::new(weights.iter().map(|&(i, _)| i).collect()))
        } else if self.bias == 0.0 {
            Mode::Static(
                SmoothWeightedPicker::from_weights(weights.clone(), self.counter.of(snapshot))
                    .with_coverage(snapshot),
            )
        } else {
            match AliasTable::new(&weights) {
                Some(alias) => {
                    let mut by_idx = vec![0u64; snapshot.len()];
                    weights.iter().for_each(|&(i, w)| by_idx[i.get()] = w);
                    Mode::Weighted {
                        alias,
                        weight: by_idx.into(),
                    }
                }
                None => Mode::Choices(IndexList::new(weights.iter().map(|&(i, _)| i).collect())),
            }
        };
        LeastRequestPicker {
            snapshot: snapshot.clone(),
            mode,
            choice_count: self.choice_count,
            bias: self.bias,
            total: weights.iter().map(|&(_, w)| w).sum(),
        }
    }
}

/// Prepared [`LeastRequest`].
#[derive(Debug)]
pub struct LeastRequestPicker {
    snapshot: Arc<Snapshot>,
    mode: Mode,
    choice_count: u32,
    bias: f64,
    total: u64,
}

#[derive(Debug)]
enum Mode {
    Choices(IndexList),
    Static(SmoothWeightedPicker),
    Weighted {
        alias: AliasTable,
        weight: Box<[u64]>,
    },
}

impl LeastRequestPicker {
    #[inline]
    fn in_flight(&self, i: EndpointIdx) -> u32 {
        self.snapshot.live(i).in_flight()
    }

    /// `(in_flight + 1)^bias`, with the common bias 1.0 as a plain add.
    #[inline]
    fn load_factor(&self, i: EndpointIdx) -> f64 {
        let load = f64::from(self.in_flight(i)) + 1.0;
        if self.bias == 1.0 {
            load
        } else {
            load.powf(self.bias)
        }
    }
}

impl Picker for LeastRequestPicker {
    #[inline]
    fn pick(&self, cx: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> {
        match &self.mode {
            Mode::Choices(list) if list.is_empty() => Err(PickError::NoEndpoints),
            Mode::Choices(list) => {
                let (a, b) = list.two_distinct(cx.rng);
                let mut best = if self.choice_count > 1 && self.in_flight(b) < self.in_flight(a) {
                    b
                } else {
                    a
                };
                for _ in 2..self.choice_count {
                    let c = list.at(cx.rng.index(list.len()));
                    if self.in_flight(c) < self.in_flight(best) {
                        best = c;
                    }
                }
                Ok(best)
            }
            Mode::Static(p) => p.pick(cx),
            Mode::Weighted { alias, weight } => {
                let (mut best, mut best_w) = (EndpointIdx::new(0), -1.0f64);
                for _ in 0..MAX_DRAWS {
                    let i = alias.sample(cx.rng);
                    let factor = self.load_factor(i);
                    if cx.rng.unit_f64() * factor < 1.0 {
                        return Ok(i);
                    }
                    let w = weight[i.get()] as f64 / factor;
                    if w > best_w {
                        (best, best_w) = (i, w);
                    }
                }
                Ok(best)
            }
        }
    }

    fn explain(&self, idx: EndpointIdx, now: Timestamp) -> Option<String> {
        let load = self.in_flight(idx);
        Some(match &self.mode {
            Mode::Choices(_) => format!(
                "{load} in flight; best of {} random choices",
                self.choice_count
            ),
            Mode::Static(p) => p.explain(idx, now)?,
            Mode::Weighted { weight, .. } => {
                let w = weight[idx.get()];
                format!(
                    "weight {w} / ({load} + 1)^{} = {:.3}; static {}",
                    self.bias,
                    w as f64 / self.load_factor(idx),
                    share(
                        w,
                        self.total,
                        self.snapshot.coverage().map(|c| c[idx.get()])
                    )
                )
            }
        })
    }
}
