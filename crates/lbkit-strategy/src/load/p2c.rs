//! `p2c-least-loaded` and `p2c-ewma`: the power of two choices.
//!
//! * **Algorithm**: draw two distinct endpoints uniformly at random and take the cheaper one.
//!   `p2c-least-loaded` costs an endpoint `in_flight + 1`; `p2c-ewma` costs it
//!   `peak_ewma_latency × (in_flight + 1)`, where the peak EWMA jumps to any new peak, decays
//!   toward new samples and toward zero while idle (time constant `decay`: by default the
//!   statistics' own, 10 s; [`P2cEwma::with_decay`] sets it on every endpoint the strategy's
//!   balancer publishes), and an endpoint without samples costs `default_rtt` (30 ms).
//! * **Origin**: Mitzenmacher's power of two choices; Finagle's `P2CLeastLoaded` and
//!   `P2CPeakEwma`, linkerd's and tower's `p2c` + `PeakEwma` (the 30 ms default RTT is
//!   linkerd's; the 10 s decay Finagle's).
//! * **Complexity**: prepare O(n); pick O(1): two RNG draws and two statistics reads.
//! * **A change**: the eligible list is copied again, O(n) (2.6 µs at 10 000 endpoints;
//!   BENCHMARKS.md, "What a change costs a strategy"); the statistics the picks compare stay with
//!   the endpoints.
//! * **Behaviour under trouble**: a slow endpoint's EWMA jumps at its first slow response, so it
//!   loses nearly every comparison at once; after it recovers its estimate decays and it is
//!   probed again. With two samples the worst endpoint is never picked while another exists.
//! * **Differences from the origin**: time is passed in (no clock read inside the pick) and
//!   reading the EWMA never mutates it; weights are ignored (use `least-request` for weighted
//!   load-aware balancing). Behind a deterministic aperture that covers some servers only
//!   partly ([`Snapshot::coverage`]), the two candidates are drawn in proportion to their
//!   coverage, as Finagle's aperture draws them (`Ring.pick2`).
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use lbkit_core::*;
//! use lbkit_strategy::P2cEwma;
//! let now = Timestamp::from_millis(1_000);
//! let snap = Arc::new(Snapshot::from_specs(vec![EndpointSpec::new("slow:1"), EndpointSpec::new("fast:1")], now));
//! snap.endpoints()[0].stats().record(Duration::from_millis(500), now, Outcome::Success);
//! snap.endpoints()[1].stats().record(Duration::from_millis(5), now, Outcome::Success);
//! let picker = P2cEwma::default().prepare(&snap, now);
//! let mut rng = FastRng::seed_from_u64(1);
//! assert_eq!(picker.pick(&mut PickContext::new(now, &mut rng)).unwrap().get(), 1);
//! ```

use std::sync::Arc;
use std::time::Duration;

use lbkit_core::{
    exp_small, EndpointIdx, FastRng, LiveStats, PickContext, PickError, Picker, Snapshot, Strategy,
    Timestamp,
};

use super::choose::IndexList;
use crate::alias::AliasTable;

/// linkerd's default RTT for an endpoint without samples.
pub const DEFAULT_RTT: Duration = Duration::from_millis(30);

/// P2C over calls in flight.
#[derive(Debug, Clone, Copy, Default)]
pub struct P2cLeastLoaded;

/// P2C over peak-EWMA latency × calls in flight.
#[derive(Debug, Clone, Copy)]
pub struct P2cEwma {
    default_rtt_ns: f64,
    decay: Option<Duration>,
}

impl Default for P2cEwma {
    fn default() -> Self {
        P2cEwma::new(DEFAULT_RTT)
    }
}

impl P2cEwma {
    /// Cost endpoints without samples at `default_rtt`.
    pub fn new(default_rtt: Duration) -> Self {
        P2cEwma {
            default_rtt_ns: default_rtt.as_nanos() as f64,
            decay: None,
        }
    }

    /// Give the endpoints' peak EWMA the time constant `decay` (linkerd's `decay`): shorter
    /// forgets a slow spell sooner and probes a recovered endpoint sooner; longer remembers a
    /// spike longer. Default: the statistics' own ([`lbkit_core::DEFAULT_EWMA_DECAY`], 10 s).
    pub fn with_decay(mut self, decay: Duration) -> Self {
        self.decay = Some(decay);
        self
    }
}

#[derive(Debug, Clone, Copy)]
enum Cost {
    InFlight,
    Ewma { default_rtt_ns: f64 },
}

impl Strategy for P2cLeastLoaded {
    type Picker = P2cPicker;

    fn name(&self) -> &str {
        "p2c-least-loaded"
    }

    fn prepare(&self, snapshot: &Arc<Snapshot>, _now: Timestamp) -> P2cPicker {
        P2cPicker::new(snapshot, Cost::InFlight)
    }
}

impl Strategy for P2cEwma {
    type Picker = P2cPicker;

    fn name(&self) -> &str {
        "p2c-ewma"
    }

    fn prepare(&self, snapshot: &Arc<Snapshot>, _now: Timestamp) -> P2cPicker {
        P2cPicker::new(
            snapshot,
            Cost::Ewma {
                default_rtt_ns: self.default_rtt_ns,
            },
        )
    }

    fn ewma_decay(&self) -> Option<Duration> {
        self.decay
    }
}

/// Prepared [`P2cLeastLoaded`] or [`P2cEwma`].
#[derive(Debug)]
pub struct P2cPicker {
    snapshot: Arc<Snapshot>,
    eligible: IndexList,
    cost: Cost,
    /// Per-endpoint factors on the EWMA cost, by endpoint index (`adaptive`'s reported-load
    /// weights: the largest weight's factor is 1). `None`: every factor is 1. `f32`: half the
    /// memory a pick may miss in cache at 100 000 endpoints.
    scale: Option<Box<[f32]>>,
    /// Candidates drawn by an aperture's coverage of each ([`Snapshot::coverage`]), one
    /// random number a draw; `None`: uniformly.
    covered: Option<AliasTable>,
}

impl P2cPicker {
    fn new(snapshot: &Arc<Snapshot>, cost: Cost) -> Self {
        let covered = snapshot.coverage().and_then(|c| {
            let units: Vec<(EndpointIdx, u64)> = snapshot
                .eligible()
                .iter()
                .map(|&i| (i, u64::from(c[i.get()])))
                .collect();
            AliasTable::new(&units)
        });
        P2cPicker {
            snapshot: snapshot.clone(),
            eligible: IndexList::new(snapshot.eligible().into()),
            cost,
            scale: None,
            covered,
        }
    }

    /// The two candidates: distinct and uniform, or by coverage.
    #[inline]
    fn candidates(&self, rng: &mut FastRng) -> (EndpointIdx, EndpointIdx) {
        match &self.covered {
            None => self.eligible.two_distinct(rng),
            Some(table) => table.two(rng, AliasTable::sample_one_draw),
        }
    }

    /// p2c-ewma whose costs are multiplied by `scale[endpoint index]` (every factor finite and
    /// positive, one per endpoint of `snapshot`).
    pub(crate) fn ewma_scaled(snapshot: &Arc<Snapshot>, scale: Box<[f32]>) -> Self {
        debug_assert_eq!(scale.len(), snapshot.len());
        P2cPicker {
            scale: Some(scale),
            ..P2cPicker::new(
                snapshot,
                Cost::Ewma {
                    default_rtt_ns: DEFAULT_RTT.as_nanos() as f64,
                },
            )
        }
    }

    /// The factor on `idx`'s cost.
    #[inline]
    fn factor(&self, idx: EndpointIdx) -> f64 {
        self.scale.as_ref().map_or(1.0, |s| f64::from(s[idx.get()]))
    }

    /// The cost of `idx` at `now` (lower wins).
    #[inline]
    pub fn cost(&self, idx: EndpointIdx, now: Timestamp) -> f64 {
        let live = self.snapshot.live(idx);
        match self.cost {
            Cost::InFlight => f64::from(live.in_flight()) + 1.0,
            Cost::Ewma { default_rtt_ns } => {
                let (base, x) = ewma_terms(live, now, default_rtt_ns);
                base * self.factor(idx) * exp_small(x)
            }
        }
    }
}

/// An endpoint's p2c-ewma cost as `(base, x)`, the cost being `base × e^x`: base = the last
/// EWMA estimate (or the default RTT, with x = 0) × (in flight + 1), x = its decay exponent.
#[inline]
fn ewma_terms(live: &LiveStats, now: Timestamp, default_rtt_ns: f64) -> (f64, f64) {
    let (estimate, x) = live.ewma_terms_at(now).unwrap_or((default_rtt_ns, 0.0));
    (estimate * (f64::from(live.in_flight()) + 1.0), x)
}

impl Picker for P2cPicker {
    #[inline]
    fn pick(&self, cx: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> {
        if self.eligible.is_empty() {
            return Err(PickError::NoEndpoints);
        }
        let (a, b) = self.candidates(cx.rng);
        let (la, lb) = (self.snapshot.live(a), self.snapshot.live(b));
        let b_cheaper = match self.cost {
            Cost::InFlight => lb.in_flight() < la.in_flight(),
            Cost::Ewma { default_rtt_ns } => {
                // Both lines are read before any `exp`, and the two projections are compared
                // with one: b wins when base_b × e^(x_b − x_a) < base_a, i.e. cost(b) < cost(a).
                let (sa, sb) = match &self.scale {
                    Some(s) => (f64::from(s[a.get()]), f64::from(s[b.get()])),
                    None => (1.0, 1.0),
                };
                let (base_a, xa) = ewma_terms(la, cx.now, default_rtt_ns);
                let (base_b, xb) = ewma_terms(lb, cx.now, default_rtt_ns);
                let (base_a, base_b) = (base_a * sa, base_b * sb);
                // Clamped so that e^d stays finite: a difference beyond 700 time constants
                // decides the comparison either way.
                base_b * exp_small((xb - xa).clamp(-700.0, 700.0)) < base_a
            }
        };
        Ok(if b_cheaper { b } else { a })
    }

    fn explain(&self, idx: EndpointIdx, now: Timestamp) -> Option<String> {
        let stats = self.snapshot.endpoint(idx).stats();
        Some(match self.cost {
            Cost::InFlight => format!("cost {} (in flight + 1)", stats.in_flight() + 1),
            Cost::Ewma { default_rtt_ns } => {
                let (rtt, src) = match stats.ewma_ns_at(now) {
                    Some(ns) => (ns, "peak EWMA"),
                    None => (default_rtt_ns, "default RTT"),
                };
                let f = self.factor(idx);
                let load = if f == 1.0 {
                    String::new()
                } else {
                    format!(" × {f:.2} (reported load)")
                };
                format!(
                    "cost {:.3} ms × {}{load} = {:.3} ({src})",
                    rtt / 1e6,
                    stats.in_flight() + 1,
                    rtt / 1e6 * f64::from(stats.in_flight() + 1) * f
                )
            }
        })
    }
}
