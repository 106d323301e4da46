//! `round-robin`: each eligible endpoint in turn.
//!
//! * **Algorithm**: a shared counter, `fetch_add(1)`, index = counter mod n over the eligible
//!   endpoints in source order.
//! * **Origin**: Ribbon `RoundRobinRule`, Dubbo's unweighted case, Envoy `ROUND_ROBIN` with equal
//!   weights.
//! * **Complexity**: prepare O(n) (copies the eligible list); pick O(1), one atomic add on a
//!   cache-padded counter; memory 4 bytes per endpoint.
//! * **A change**: nothing to carry over but the counter, which is the strategy's and keeps its
//!   place: the eligible list is copied again, O(n) (0.28 µs at 10 000 endpoints; BENCHMARKS.md,
//!   "What a change costs a strategy").
//! * **Behaviour under trouble**: blind to load, so a slow endpoint keeps its full share
//!   (use `least-active` or `p2c-ewma` there); endpoints marked down are skipped because only
//!   eligible ones are in the cycle; the availability filter passes over tripped ones.
//! * **Differences from the origin**: the counter is one 64-bit counter per strategy (per
//!   service or method) and per set it picks in (each tag's set and each stage's leaf has its
//!   own, by [`Snapshot::scope`]), kept across snapshot swaps, so an update does not send the
//!   next call back to the first endpoint; it wraps after 2⁶⁴ calls (Ribbon's
//!   `incrementAndGetModulo` CAS loop is replaced by one `fetch_add`).
//!
//! ```
//! use std::sync::Arc;
//! use lbkit_core::{EndpointSpec, FastRng, PickContext, Picker, Snapshot, Strategy, Timestamp};
//! use lbkit_strategy::RoundRobin;
//! let snap = Arc::new(Snapshot::from_specs(
//!     vec![EndpointSpec::new("a:1"), EndpointSpec::new("b:1")], Timestamp::ZERO));
//! let picker = RoundRobin::new().prepare(&snap, Timestamp::ZERO);
//! let mut rng = FastRng::seed_from_u64(1);
//! let picks: Vec<usize> = (0..4)
//!     .map(|_| picker.pick(&mut PickContext::new(Timestamp::ZERO, &mut rng)).unwrap().get())
//!     .collect();
//! assert_eq!(picks, [0, 1, 0, 1]);
//! ```

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use crossbeam_utils::CachePadded;
// loom's atomics under `--cfg lbkit_loom` (tests/loom.rs).
use lbkit_core::sync::{AtomicU64, Ordering::Relaxed};
use lbkit_core::{EndpointIdx, PickContext, PickError, Picker, Snapshot, Strategy, Timestamp};

/// A counter the pickers of one set share (survives snapshot swaps).
pub(crate) type SharedCounter = Arc<CachePadded<AtomicU64>>;

pub(crate) fn counter(start: u64) -> SharedCounter {
    Arc::new(CachePadded::new(AtomicU64::new(start)))
}

/// Most per-set counters a strategy keeps; beyond it those no picker holds are forgotten.
const MAX_SCOPES: usize = 1024;

/// A strategy's counters: one for whole snapshots, one per set of a snapshot it is prepared
/// on ([`Snapshot::scope`]: a tag's set, a stage's leaf, a zone), each kept across snapshot
/// swaps. One counter for every set made requests that alternate strictly between two
/// 2-endpoint subsets land on the same endpoint of each, every time.
#[derive(Debug, Clone)]
pub(crate) struct Counters(Arc<CountersInner>);

#[derive(Debug)]
struct CountersInner {
    whole: SharedCounter,
    // Read and replaced at prepare time only, never by a pick.
    scoped: ArcSwap<HashMap<u64, SharedCounter>>,
}

impl Counters {
    pub(crate) fn new(start: u64) -> Self {
        Counters(Arc::new(CountersInner {
            whole: counter(start),
            scoped: ArcSwap::from_pointee(HashMap::new()),
        }))
    }

    /// The counter for the set `snapshot` is. A new set's starts where the whole snapshot's
    /// turn stands (so a random start, [`RoundRobin::with_start`], carries over), offset by
    /// its scope.
    pub(crate) fn of(&self, snapshot: &Snapshot) -> SharedCounter {
        let scope = snapshot.scope();
        if scope == 0 {
            return self.0.whole.clone();
        }
        if let Some(c) = self.0.scoped.load().get(&scope) {
            return c.clone();
        }
        // A new set: a copy of the map with its counter added (a prepare racing for the same
        // set keeps the first one in).
        let fresh = counter(self.0.whole.load(Relaxed).wrapping_add(scope));
        self.0.scoped.rcu(|m| {
            let mut m = HashMap::clone(m);
            if m.len() >= MAX_SCOPES {
                // Keep the sets some picker still counts with; forget the others.
                m.retain(|_, c| Arc::strong_count(c) > 1);
                if m.len() >= MAX_SCOPES {
                    m.clear();
                }
            }
            m.entry(scope).or_insert_with(|| fresh.clone());
            m
        });
        self.0.scoped.load().get(&scope).cloned().unwrap_or(fresh)
    }
}

/// Round robin over the eligible endpoints.
#[derive(Debug, Clone)]
pub struct RoundRobin {
    counter: Counters,
}

impl Default for RoundRobin {
    fn default() -> Self {
        RoundRobin::new()
    }
}

// === impl RoundRobin ===

impl RoundRobin {
    /// Starts at the first endpoint.
    pub fn new() -> Self {
        RoundRobin::with_start(0)
    }

    /// Starts at position `start` (a random start keeps a fleet of clients out of lockstep).
    pub fn with_start(start: u64) -> Self {
        RoundRobin {
            counter: Counters::new(start),
        }
    }
}

impl Strategy for RoundRobin {
    type Picker = RoundRobinPicker;

    fn name(&self) -> &str {
        "round-robin"
    }

    fn prepare(&self, snapshot: &Arc<Snapshot>, _now: Timestamp) -> RoundRobinPicker {
        RoundRobinPicker {
            eligible: snapshot.eligible().into(),
            counter: self.counter.of(snapshot),
        }
    }
}

/// Prepared [`RoundRobin`].
#[derive(Debug)]
pub struct RoundRobinPicker {
    eligible: Box<[EndpointIdx]>,
    counter: SharedCounter,
}

impl Picker for RoundRobinPicker {
    #[inline]
    fn pick(&self, _cx: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> {
        let n = self.eligible.len() as u64;
        if n == 0 {
            return Err(PickError::NoEndpoints);
        }
        let c = self.counter.fetch_add(1, Relaxed);
        Ok(self.eligible[(c % n) as usize])
    }

    fn explain(&self, _idx: EndpointIdx, _now: Timestamp) -> Option<String> {
        Some(format!("1 of {} in turn", self.eligible.len()))
    }
}
