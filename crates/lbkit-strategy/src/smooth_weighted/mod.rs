//! `weighted-round-robin`: smooth weighted round robin in exactly nginx's order.
//!
//! * **Algorithm**: nginx's smooth weighted round robin: every pick adds each endpoint's weight
//!   to its current value, takes the largest (ties to the earlier endpoint) and subtracts the
//!   total from it. The order repeats every `W = Σw / gcd(w)` picks, so lbkit computes one cycle
//!   at prepare time and a pick is `cycle[counter mod W]`.
//!   Endpoints of equal weight always take their turns in source order, so the cycle is built
//!   one weight *group* at a time: O(W · G) for G distinct weights, not O(W · n).
//! * **Origin**: nginx `ngx_http_upstream_get_peer` (smooth weighting, 2012; the commit message
//!   gives `{5, 1, 1}` → `a a b a c a a`); Dubbo ≥ 2.6.5 `RoundRobinLoadBalance` uses the same
//!   order.
//! * **Complexity**: pick O(1) (one atomic add, one table read) in cycle mode. When building
//!   the nginx cycle would take more than [`MAX_CYCLE_WORK`] steps (many distinct weights), a
//!   cycle of the same length in *golden-ratio stride* order is built instead, in O(W): pick k
//!   takes the endpoint owning point `k · a mod W` of the cumulative weight line (a ≈ W/φ,
//!   coprime with W). Each span of W consecutive picks still holds exactly wᵢ picks of endpoint
//!   i, spread evenly, but not in nginx's order. A pick costs the same as from the nginx cycle.
//!   When the cycle would exceed [`MAX_CYCLE`] entries (Σw / gcd over a million) but Σw is
//!   below 2³², a *folded* cycle is stored instead (for up to 262 144 endpoints): the golden
//!   cycle of the weights divided by D (⌊wᵢ / D⌋ entries each, D chosen so that at most 16
//!   entries per endpoint are stored), read D times over, with the Σ(wᵢ mod D) leftover picks
//!   interleaved evenly (Bresenham's line) and taken from a stored order of their own (at most
//!   as long as the table; longer ones take the stride per pick). It repeats every Σw picks,
//!   so each span of Σw consecutive picks still holds exactly wᵢ of endpoint i, and
//!   consecutive picks read consecutive table entries: a pick is the counter's `fetch_add`,
//!   four multiplications and a sequential read, whatever n (at 100 000 endpoints about 3 % of
//!   picks are leftovers, which cost a call and a read more). Memory: at most 2 × 16 entries
//!   of 4 bytes per endpoint; prepare: O(table + leftovers).
//!   The counter advances by ⌈2⁶⁴ / Σw⌉ per pick and is read as a phase, so once per 2⁶⁴ / Σw
//!   picks or more (over 2³²) one span is off by a pick. Only the load-driven strategies'
//!   schedulers, which re-prepare every period, and totals of 2³² or more compute the stride
//!   per pick: the shared counter advances by a and the endpoint owning the point is found via
//!   a bucket index over the cumulative weights — O(1) typical (no division: a Barrett
//!   reduction and a multiply-shift), O(log n) worst; the same order (and once per 2³² picks
//!   or more, when the 64-bit counter wraps, a span is off by about one pick).
//! * **A change**: the cycle is built again on the publisher's thread, O(W · G), O(W) or O(table)
//!   as above (95–97 µs at 10 000 endpoints of equal weight; 0.25 ms at 10 000 warming up with
//!   weights 1 to 5, 1.1 ms with weights 1 to 100, the golden cycle; BENCHMARKS.md, "What a
//!   change costs a strategy", "Smooth weighted round robin under churn"): one weight changes
//!   the order of the whole cycle, so nothing of the last one is reused. The counter is the
//!   strategy's and keeps its place; picks keep the last cycle until the new one is swapped
//!   in.
//! * **Behaviour under trouble**: blind to load; warming endpoints follow Dubbo's curve (the cycle
//!   is rebuilt every second during warm-up).
//! * **Differences from the origin**: Dubbo 2.5 ran an O(maxWeight · n) loop per pick and nginx
//!   O(n) per pick under a lock; here a pick is lock-free and O(1). The counter survives snapshot
//!   swaps, so shares stay exact across updates (the phase within the new cycle may differ from
//!   nginx, which restarts on reload).
//!
//! ```
//! use std::sync::Arc;
//! use lbkit_core::{EndpointSpec, FastRng, PickContext, Picker, Snapshot, Strategy, Timestamp};
//! use lbkit_strategy::SmoothWeightedRoundRobin;
//! let specs = [("a:1", 5), ("b:1", 1), ("c:1", 1)]
//!     .map(|(a, w)| EndpointSpec::new(a).with_weight(w));
//! let snap = Arc::new(Snapshot::from_specs(specs.to_vec(), Timestamp::ZERO));
//! let picker = SmoothWeightedRoundRobin::new().prepare(&snap, Timestamp::ZERO);
//! let mut rng = FastRng::seed_from_u64(1);
//! let order: String = (0..7)
//!     .map(|_| picker.pick(&mut PickContext::new(Timestamp::ZERO, &mut rng)).unwrap().get())
//!     .map(|i| ['a', 'b', 'c'][i])
//!     .collect();
//! assert_eq!(order, "aabacaa");
//! ```

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use lbkit_core::{
    weight_gcd as gcd, EndpointIdx, PickContext, PickError, Picker, Snapshot, Strategy, Timestamp,
};

use crate::common::{coverage_of, effective_weights, share};
use crate::round_robin::{Counters, SharedCounter};

/// Longest cycle kept in memory (4 MiB of indices): beyond it, a folded cycle is stored.
pub const MAX_CYCLE: u64 = 1 << 20;

/// Most entries of a folded cycle's table, and of its leftovers' stored order: 16 per
/// endpoint, at least [`MAX_CYCLE`] and at most four times that (16 MiB of indices each). The
/// leftover picks are about n / (2 · entries) of all picks: about 3 % with 16 entries per
/// endpoint. Weight sets of more than `MAX_FOLDED / 16` (262 144) endpoints, where the table
/// could no longer hold 16 entries each and the leftovers would grow, keep the stride per
/// pick.
pub const MAX_FOLDED: u64 = 4 * MAX_CYCLE;

/// Table entries per endpoint of a folded cycle.
const FOLDED_PER_ENDPOINT: u64 = 16;

/// Entries a folded cycle may have for `n` endpoints.
fn folded_limit(n: usize) -> u64 {
    (n as u64)
        .saturating_mul(FOLDED_PER_ENDPOINT)
        .clamp(MAX_CYCLE, MAX_FOLDED)
}

/// Most steps (cycle length × distinct weights) spent building an nginx cycle, which bounds
/// prepare time to about 4 ms (3.2 M steps take 2.7 ms on the benchmark machine,
/// `prepare::weighted_round_robin_nginx_work_limit`); beyond it,
/// weighted round robin builds the cycle in golden-ratio stride order (one step per entry,
/// about 0.5 ms for 500 000 entries), and the load-driven strategies' schedulers compute the
/// stride per pick.
pub const MAX_CYCLE_WORK: u64 = 1 << 22;

/// Smooth weighted round robin (nginx order).
#[derive(Debug, Clone)]
pub struct SmoothWeightedRoundRobin {
    counter: Counters,
}

impl Default for SmoothWeightedRoundRobin {
    fn default() -> Self {
        SmoothWeightedRoundRobin::new()
    }
}

// === impl SmoothWeightedRoundRobin ===

impl SmoothWeightedRoundRobin {
    /// Starts at the beginning of the nginx cycle.
    pub fn new() -> Self {
        SmoothWeightedRoundRobin {
            counter: Counters::new(0),
        }
    }
}

impl Strategy for SmoothWeightedRoundRobin {
    type Picker = SmoothWeightedPicker;

    fn name(&self) -> &str {
        "weighted-round-robin"
    }

    fn prepare(&self, snapshot: &Arc<Snapshot>, now: Timestamp) -> SmoothWeightedPicker {
        SmoothWeightedPicker::build(
            effective_weights(snapshot, now),
            self.counter.of(snapshot),
            Unroll::Yes,
        )
        .with_coverage(snapshot)
    }
}

/// Prepared [`SmoothWeightedRoundRobin`].
#[derive(Debug)]
pub struct SmoothWeightedPicker {
    order: Order,
    weights: Box<[(EndpointIdx, u64)]>,
    total: u64,
    counter: SharedCounter,
    /// The aperture's coverage the weights include, for `--explain`.
    coverage: Option<Box<[u32]>>,
}

/// Which order a stored cycle holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CycleKind {
    /// nginx's smooth weighted round robin.
    Nginx,
    /// The golden-ratio stride's.
    Golden,
}

/// Whether the golden-ratio stride is stored: as a cycle when it fits in [`MAX_CYCLE`], else
/// folded ([`MAX_FOLDED`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unroll {
    Yes,
    No,
}

/// One variant for both stored cycles, so that `pick` matches three variants, not four: with
/// four, the compiler dispatched through a jump table, and the cycles' picks (the common case)
/// measured about 0.3 ns slower (1.00–1.11× the atomic floor before, 1.13–1.31× with it).
#[derive(Debug)]
enum Order {
    /// A stored cycle: nginx's, or the golden-ratio stride's unrolled ([`golden_cycle`]).
    Cycle(Box<[EndpointIdx]>, CycleKind),
    /// The golden-ratio stride's cycle of the weights divided by D, with the leftovers
    /// interleaved ([`Folded`]).
    Folded(Folded),
    /// The golden-ratio stride, computed per pick.
    Stride(GoldenStride),
}

impl SmoothWeightedPicker {
    /// The static scheduler of load-driven strategies (`adaptive`, weighted `least-request`)
    /// over `weights` (zero weights dropped), advancing `counter`: the exact nginx cycle when it
    /// is cheap enough to build, else the golden-ratio stride computed per pick. They re-prepare
    /// every period with weights that differ each time, so the stride's cycle is not unrolled:
    /// O(n) per period instead of O(Σw), and no table of up to [`MAX_CYCLE`] entries per
    /// balancer.
    pub(crate) fn from_weights(weights: Vec<(EndpointIdx, u64)>, counter: SharedCounter) -> Self {
        SmoothWeightedPicker::build(weights, counter, Unroll::No)
    }

    /// A picker over `weights` (zero weights dropped) advancing `counter`: the exact nginx
    /// cycle when it is cheap enough to build, else (with [`Unroll::Yes`]) the golden-ratio
    /// stride's cycle when it fits in [`MAX_CYCLE`], or folded when the total is below 2³²
    /// and there are at most [`MAX_FOLDED`] / 16 endpoints, else the stride computed per
    /// pick.
    fn build(weights: Vec<(EndpointIdx, u64)>, counter: SharedCounter, unroll: Unroll) -> Self {
        let weights: Vec<(EndpointIdx, u64)> =
            weights.into_iter().filter(|&(_, w)| w > 0).collect();
        let total: u64 = weights.iter().map(|&(_, w)| w).sum();
        let g = weights_gcd(&weights);
        let cycle_len = total.checked_div(g).unwrap_or(0);
        let distinct = distinct_weights(&weights);
        let fits = cycle_len <= MAX_CYCLE;
        let order = if fits && cycle_len.saturating_mul(distinct.len() as u64) <= MAX_CYCLE_WORK {
            Order::Cycle(nginx_cycle(&weights, &distinct, g), CycleKind::Nginx)
        } else if fits && unroll == Unroll::Yes {
            Order::Cycle(golden_cycle(&weights, g), CycleKind::Golden)
        } else if let Some(folded) = (unroll == Unroll::Yes
            && weights.len() as u64 <= MAX_FOLDED / FOLDED_PER_ENDPOINT)
            .then(|| Folded::new(&weights, g, folded_limit(weights.len())))
            .flatten()
        {
            Order::Folded(folded)
        } else {
            Order::Stride(GoldenStride::new(&weights))
        };
        SmoothWeightedPicker {
            order,
            weights: weights.into_boxed_slice(),
            total,
            counter,
            coverage: None,
        }
    }

    /// Say in `--explain` the aperture coverage `snapshot`'s weights include, if any.
    pub(crate) fn with_coverage(mut self, snapshot: &Snapshot) -> Self {
        self.coverage = coverage_of(snapshot);
        self
    }

    /// Whether the exact nginx cycle is kept (rather than the golden-ratio stride).
    pub fn is_exact_nginx_order(&self) -> bool {
        matches!(self.order, Order::Cycle(_, CycleKind::Nginx))
    }
}

impl Picker for SmoothWeightedPicker {
    #[inline]
    fn pick(&self, _cx: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> {
        match &self.order {
            Order::Cycle(c, _) if c.is_empty() => Err(PickError::NoEndpoints),
            Order::Cycle(c, _) => {
                Ok(c[(self.counter.fetch_add(1, Relaxed) % c.len() as u64) as usize])
            }
            // The counter is a phase: one add of the folded cycle's step per pick.
            Order::Folded(f) => Ok(f.pick(self.counter.fetch_add(f.step, Relaxed))),
            // The counter walks the point line itself: one add of the step per pick.
            Order::Stride(s) => Ok(s.owner(self.counter.fetch_add(s.step, Relaxed))),
        }
    }

    fn explain(&self, idx: EndpointIdx, _now: Timestamp) -> Option<String> {
        let &(_, w) = self.weights.iter().find(|&&(i, _)| i == idx)?;
        let mode = match self.order {
            Order::Cycle(_, CycleKind::Nginx) => "nginx cycle",
            Order::Cycle(_, CycleKind::Golden) => "golden stride cycle",
            Order::Folded(_) => "folded golden stride cycle",
            Order::Stride(_) => "golden stride",
        };
        let coverage = self.coverage.as_ref().map(|c| c[idx.get()]);
        Some(format!("{}, {mode}", share(w, self.total, coverage)))
    }
}

/// The greatest common divisor of the weights (0 for none), stopping at the first 1: a fleet
/// warming up has weights 1, 2, 3… and gets there within a few endpoints.
fn weights_gcd(weights: &[(EndpointIdx, u64)]) -> u64 {
    let mut g = 0;
    for &(_, w) in weights {
        g = gcd(g, w);
        if g == 1 {
            break;
        }
    }
    g
}

/// The weights' distinct values, ascending: the groups of [`nginx_cycle`].
fn distinct_weights(weights: &[(EndpointIdx, u64)]) -> Vec<u64> {
    let mut distinct: Vec<u64> = weights.iter().map(|&(_, w)| w).collect();
    distinct.sort_unstable();
    distinct.dedup();
    distinct
}

/// One cycle of nginx's smooth weighted round robin over weights divided by `g`: `W = Σw / g`
/// picks, built in O(W · G) for the G `distinct` weights (ascending, as [`distinct_weights`]
/// gives them). The caller keeps W within [`MAX_CYCLE`].
///
/// At step t (1-based) endpoint i holds `t·wᵢ − W·cᵢ` (cᵢ = its picks so far); the largest
/// value wins, ties to the earlier endpoint. Within a group of equal weight the member with
/// the fewest picks (then the earliest) is the group's best, and members take turns in order,
/// so each group is a cursor over its members. A group's best value, `t·w − W·(rounds its
/// cursor completed)`, grows by w a step and drops by W when its cursor wraps: with W ≤ 2²⁰
/// it stays within ±2⁴¹, so a step is G additions and comparisons of `i64`s.
fn nginx_cycle(weights: &[(EndpointIdx, u64)], distinct: &[u64], g: u64) -> Box<[EndpointIdx]> {
    let mut members: Vec<Vec<EndpointIdx>> = vec![Vec::new(); distinct.len()];
    for &(i, w) in weights {
        members[distinct.partition_point(|&d| d < w)].push(i);
    }
    // Each group's best value, weight and member up next: all a step reads.
    let mut heads: Vec<(i64, i64, EndpointIdx)> = Vec::with_capacity(members.len());
    for (m, &w) in members.iter().zip(distinct) {
        let (Some(&next), Ok(w)) = (m.first(), i64::try_from(w / g)) else {
            return Box::default();
        };
        heads.push((0, w, next));
    }
    let mut cursors = vec![0usize; members.len()];
    let total: i64 = heads
        .iter()
        .zip(&members)
        .map(|(h, m)| h.1 * m.len() as i64)
        .sum();
    let mut cycle = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
    for _ in 0..total {
        let (mut best, mut top, mut top_next) = (0, i64::MIN, usize::MAX);
        for (gi, (value, weight, next)) in heads.iter_mut().enumerate() {
            *value += *weight;
            if *value > top || (*value == top && next.get() < top_next) {
                (best, top, top_next) = (gi, *value, next.get());
            }
        }
        let (value, _, next) = &mut heads[best];
        cycle.push(*next);
        let (cursor, group) = (&mut cursors[best], &members[best]);
        *cursor += 1;
        if *cursor == group.len() {
            *cursor = 0;
            *value -= total;
        }
        *next = group[*cursor];
    }
    cycle.into_boxed_slice()
}

/// The golden-ratio stride's order over `weights` divided by `g`, one cycle of `W = Σw / g`
/// picks: entry k is the endpoint owning point `k · a mod W` ([`GoldenStride`]'s order from
/// counter 0). Built point by point in O(W) (no search): point p is pick `p · a⁻¹ mod W`, and
/// the points are walked in order, endpoint by endpoint.
fn golden_cycle(weights: &[(EndpointIdx, u64)], g: u64) -> Box<[EndpointIdx]> {
    let total: u64 = weights.iter().map(|&(_, w)| w / g).sum();
    let Some(&(first, _)) = weights.first() else {
        return Box::default();
    };
    let inverse = inverse_mod(golden_step(total), total);
    let mut cycle = vec![first; usize::try_from(total).unwrap_or(0)];
    let mut k = 0u64;
    for &(idx, w) in weights {
        for _ in 0..w / g {
            cycle[k as usize] = idx;
            // k + inverse < 2 · total < 2³³: no overflow.
            k += inverse;
            if k >= total {
                k -= total;
            }
        }
    }
    cycle.into_boxed_slice()
}

/// The golden-ratio step for a line of `total` points: coprime with it, within 64 of
/// `total / φ`, and the one there whose ratio `step / total` has the smallest largest
/// partial quotient in its continued fraction (searched outwards, stopping at one of 4 or
/// less).
///
/// How evenly k·a mod W spreads (each endpoint's lead or lag on its ideal share, its longest
/// wait) is bounded by those partial quotients. 1/φ's are all 1, but a ratio a/W near it
/// keeps only its first dozen or so; the first coprime step above W/φ often has one in the
/// tens or hundreds later on. For the benchmark's 100 000 skewed weights (W = 49 902 999)
/// that first step had a partial quotient of 106, and an endpoint ran 14 picks ahead of its
/// ideal share; searching brings the largest partial quotient to a few, and the lead to 4.
/// The search is at most 128 candidates, each a gcd and a continued fraction: about 25 µs
/// here, once per prepare.
fn golden_step(total: u64) -> u64 {
    let base = (((total as f64) / 1.618_033_988_749_895) as u64).max(1);
    let mut best: Option<(u64, u64)> = None;
    for d in 0..64 {
        for step in [base.saturating_add(d), base.saturating_sub(d)] {
            if step == 0 || (step >= total && total > 1) || gcd(step, total) != 1 {
                continue;
            }
            let largest = largest_partial_quotient(step, total);
            if best.is_none_or(|(l, _)| largest < l) {
                best = Some((largest, step));
            }
        }
        if best.is_some_and(|(l, _)| l <= 4) {
            break;
        }
    }
    best.map_or_else(
        || {
            // No coprime step within 64 (totals with very many small prime factors).
            let mut step = base;
            while total > 1 && gcd(step, total) != 1 {
                step += 1;
            }
            step
        },
        |(_, step)| step,
    )
}

/// The largest partial quotient of `a / m`'s continued fraction, the leading 0 aside.
fn largest_partial_quotient(a: u64, m: u64) -> u64 {
    let (mut num, mut den) = (m, a);
    let mut largest = 0;
    while den != 0 {
        largest = largest.max(num / den);
        (num, den) = (den, num % den);
    }
    largest
}

/// `a⁻¹ mod m` for `a` coprime with `m` (extended Euclid); 0 when `m` is 1.
fn inverse_mod(a: u64, m: u64) -> u64 {
    let (mut r0, mut r1) = (i128::from(m), i128::from(a % m));
    let (mut t0, mut t1) = (0i128, 1i128);
    while r1 != 0 {
        let q = r0 / r1;
        (r0, r1) = (r1, r0 - q * r1);
        (t0, t1) = (t1, t0 - q * t1);
    }
    u64::try_from(t0.rem_euclid(i128::from(m))).unwrap_or(0)
}

/// Exact shares without a stored cycle: the shared counter advances by `step` per pick, and a
/// pick takes the endpoint owning point `counter mod total` of the cumulative weight line.
/// `step` is coprime with the total, so Σw consecutive picks visit every point once (exact
/// shares); `step ≈ total / φ` spreads consecutive picks evenly (three-distance theorem). The
/// one exception: when the 64-bit counter wraps — once per 2⁶⁴ / step ≥ 2³² picks — the walk
/// jumps by `2⁶⁴ mod total` points, and the span across the wrap is off by a pick or so.
///
/// A pick is the counter's `fetch_add`, one modular reduction, a multiply-shift to a bucket and
/// usually one table read; no division. While the total is below 2³² (any weight set of up to
/// 65 536 endpoints of Dubbo-sized weights, and far beyond) the reduction is Barrett's in 64
/// bits — a 64×64→128 multiply, a subtraction and at most one correction — instead of the two
/// `u128` remainders of the first version, which cost 50–100 ns on hosts without a fast 128-bit
/// divide; larger totals keep `u128` arithmetic. Each bucket holds its first entry's end and
/// index in one word, so a point inside that entry (most points: a bucket spans half an
/// average weight) costs one read; the others scan on from it. (A layout half the size — 4-byte
/// ends and a bucket table of entry numbers, two dependent reads per pick — measured slower at
/// both 1 000 and 100 000 endpoints: BENCHMARKS.md, issue 18.)
#[derive(Debug)]
struct GoldenStride {
    total: u64,
    step: u64,
    /// `⌊(2⁶⁴ − 1) / total⌋`: Barrett's reciprocal of the total (narrow mode).
    reciprocal: u64,
    /// `bucket(p) = (p · bucket_mul) >> 64`: monotone from `[0, total)` onto the buckets.
    bucket_mul: u64,
    /// Per bucket, the entry owning its first point: that entry's word (narrow mode: its end
    /// and index) and its position, where a scan continues.
    first_word: Box<[u64]>,
    first: Box<[u32]>,
    entries: Entries,
}

/// Each endpoint's cumulative end (its range is `[previous end, end)`) and index.
#[derive(Debug)]
enum Entries {
    /// Total below 2³²: `end << 32 | index` in one word.
    Narrow(Box<[u64]>),
    /// Larger totals.
    Wide(Box<[(u64, EndpointIdx)]>),
}

/// Totals below this take the 64-bit path.
const NARROW: u64 = 1 << 32;

/// Entries a pick scans past its bucket's first before it binary-searches the rest: typical
/// weights put one or two entries in a bucket, and a pick stays O(log n) however skewed they
/// are.
const SCAN: usize = 4;

/// Buckets per entry: two, so a bucket spans half an average weight and most points fall in
/// their bucket's first entry.
const BUCKETS_PER_ENTRY: u64 = 2;

impl GoldenStride {
    fn new(weights: &[(EndpointIdx, u64)]) -> Self {
        let ends: Vec<u64> = weights
            .iter()
            .scan(0u64, |acc, &(_, w)| {
                *acc += w;
                Some(*acc)
            })
            .collect();
        let total = ends.last().copied().unwrap_or(0).max(1);
        let step = golden_step(total);
        let nb = (weights.len() as u64 * BUCKETS_PER_ENTRY).clamp(1, total);
        let bucket_mul =
            u64::try_from((u128::from(nb) << 64) / u128::from(total)).unwrap_or(u64::MAX);
        let bucket = |p: u64| ((u128::from(p) * u128::from(bucket_mul)) >> 64) as usize;
        // Walk the endpoints in order: the first one whose range reaches a bucket owns its
        // first point. Buckets past the last point's (the mapping may end short of nb) are
        // never looked up; they name the last endpoint.
        let mut first = vec![0u32; nb as usize];
        let mut next = 0;
        for (j, &end) in ends.iter().enumerate() {
            let last = bucket(end - 1).min(first.len() - 1);
            while next <= last {
                first[next] = j as u32;
                next += 1;
            }
        }
        let filled = next.min(first.len());
        first[filled..].fill(ends.len().saturating_sub(1) as u32);
        let entries = if total < NARROW {
            Entries::Narrow(
                ends.iter()
                    .zip(weights)
                    .map(|(&e, &(i, _))| e << 32 | i.get() as u64)
                    .collect(),
            )
        } else {
            Entries::Wide(
                ends.iter()
                    .zip(weights)
                    .map(|(&e, &(i, _))| (e, i))
                    .collect(),
            )
        };
        let first_word = match &entries {
            Entries::Narrow(words) => first.iter().map(|&j| words[j as usize]).collect(),
            Entries::Wide(_) => Box::default(),
        };
        GoldenStride {
            total,
            step,
            reciprocal: u64::MAX / total,
            bucket_mul,
            first_word,
            first: first.into_boxed_slice(),
            entries,
        }
    }

    /// The endpoint owning point `counter mod total`.
    #[inline]
    fn owner(&self, counter: u64) -> EndpointIdx {
        match &self.entries {
            Entries::Narrow(entries) => {
                let p = barrett(counter, self.total, self.reciprocal);
                let b = self.bucket(p);
                let word = self.first_word[b];
                if word >> 32 > p {
                    return EndpointIdx::new((word & 0xffff_ffff) as usize);
                }
                // Past the bucket's first entry: scan a few more (the last entry ends at the
                // total, past any point, so the scan stops), then search the bucket's rest.
                let mut j = self.first[b] as usize + 1;
                for _ in 0..SCAN {
                    let e = entries[j];
                    if e >> 32 > p {
                        return EndpointIdx::new((e & 0xffff_ffff) as usize);
                    }
                    j += 1;
                }
                let hi = self.bucket_end(b, entries.len()).max(j);
                let j = j + entries[j..hi].partition_point(|&e| e >> 32 <= p);
                EndpointIdx::new((entries[j.min(entries.len() - 1)] & 0xffff_ffff) as usize)
            }
            Entries::Wide(entries) => {
                let p = counter % self.total;
                let b = self.bucket(p);
                let lo = self.first[b] as usize;
                let hi = self.bucket_end(b, entries.len());
                let j = lo + entries[lo..hi].partition_point(|&(e, _)| e <= p);
                entries[j.min(entries.len() - 1)].1
            }
        }
    }

    /// The bucket of point `p`.
    #[inline]
    fn bucket(&self, p: u64) -> usize {
        let b = ((u128::from(p) * u128::from(self.bucket_mul)) >> 64) as usize;
        b.min(self.first.len() - 1)
    }

    /// One past the last entry that may own a point of bucket `b`: the next bucket's first.
    #[inline]
    fn bucket_end(&self, b: usize, len: usize) -> usize {
        self.first
            .get(b + 1)
            .map_or(len, |&h| h as usize + 1)
            .min(len)
    }
}

/// The golden-ratio stride's order folded into a bounded table, for totals too large to store
/// whole ([`MAX_CYCLE`]) but below 2³².
///
/// With weights wᵢ (divided by their gcd) and W = Σwᵢ, pick D = ⌈W / limit⌉ and split each
/// weight into `D · qᵢ + rᵢ` (rᵢ < D). The table is the golden cycle of the quotients, Q = Σqᵢ
/// entries; the R = Σrᵢ leftovers have an order of their own ([`Rest`]). Within each period
/// of W picks, pick c (c = k mod W for the k-th pick) is a leftover pick when
/// `⌊(c+1)·R/W⌋ > ⌊c·R/W⌋` (Bresenham's line: R of the W picks, evenly spread), and then
/// takes leftover number `⌊c·R/W⌋`; otherwise it takes table entry `(c − ⌊c·R/W⌋) mod Q`. A
/// period reads the table D times over (D·qᵢ picks of i) and walks the leftover order once
/// (rᵢ picks of i): wᵢ in all, and since the order repeats every W picks, any W consecutive
/// picks hold exactly wᵢ of endpoint i.
///
/// The shared counter advances by `step` = ⌈2⁶⁴ / W⌉ per pick and is read as a phase: after k
/// picks it holds k·step (wrapping), and `⌊phase · W / 2⁶⁴⌋` is k mod W, one multiplication
/// instead of a reduction. The error term k·(step·W − 2⁶⁴) / 2⁶⁴ stays below one position for
/// the first 2⁶⁴ / W > 2³² picks, and after that shifts the order by one position once per
/// 2⁶⁴ / W picks or more: the span across such a shift is off by a pick.
///
/// Consecutive picks read consecutive table entries, so a pick costs the same at any n: the
/// counter's `fetch_add`, the phase's multiplication, a 64×64→128 multiply for the Bresenham
/// step (`⌊c·R/W⌋` from a 64-bit fixed-point R/W, exact because c < W < 2³²), Lemire's
/// multiply-only remainder by Q, and a read that the hardware prefetcher has usually already
/// made. Only the leftover picks, about n·D / (2W) ≈ n / (2Q) of them, cost a call and a
/// read of their own order ([`Rest`]), itself sequential unless it is a stride.
#[derive(Debug)]
struct Folded {
    /// W: the weights' total, divided by their gcd.
    total: u64,
    /// `⌈2⁶⁴ / W⌉`: what the shared counter advances per pick.
    step: u64,
    /// `⌈R · 2⁶⁴ / W⌉`: R/W in 64-bit fixed point (0 when there are no leftovers).
    leftover_rate: u64,
    /// Lemire's constant for `mod Q`: `⌊(2⁶⁴ − 1) / Q⌋ + 1`, wrapping.
    table_mod: u64,
    /// The golden cycle of the quotients ⌊wᵢ / D⌋: Q entries.
    table: Box<[EndpointIdx]>,
    /// The order of the leftovers wᵢ mod D.
    rest: Rest,
}

/// The order of a [`Folded`] cycle's R leftover picks per period: leftover pick k is entry
/// `k mod R` of an order that repeats every R picks. Consecutive leftover picks are
/// consecutive k, so a stored order is read sequentially too.
#[derive(Debug)]
enum Rest {
    /// D divides every weight: no leftovers.
    None,
    /// R ≤ the limit: the golden cycle of the leftovers.
    Cycle(Box<[EndpointIdx]>),
    /// More leftovers than the limit: the stride per pick. (Folding them again would keep
    /// them sequential, but each level adds a table as large as the first, and a review
    /// measured 4 to 18 million entries for some weight sets.) Boxed: it is rare, and inline
    /// it would make every picker a cache line larger.
    Stride(Box<GoldenStride>),
}

impl Folded {
    /// The folded cycle of `weights` divided by `g`, with at most `limit` table entries;
    /// `None` when the total is 2³² or more, or when more than half the picks would be
    /// leftovers (among them: every weight below D, no table).
    fn new(weights: &[(EndpointIdx, u64)], g: u64, limit: u64) -> Option<Folded> {
        let total: u64 = weights.iter().map(|&(_, w)| w / g).sum();
        if total == 0 || total >= NARROW {
            return None;
        }
        let d = total.div_ceil(limit.max(1));
        let quotients: Vec<(EndpointIdx, u64)> = weights
            .iter()
            .map(|&(i, w)| (i, w / g / d))
            .filter(|&(_, q)| q > 0)
            .collect();
        let rest: Vec<(EndpointIdx, u64)> = weights
            .iter()
            .map(|&(i, w)| (i, w / g % d))
            .filter(|&(_, r)| r > 0)
            .collect();
        if quotients.is_empty() {
            return None;
        }
        let leftover: u64 = rest.iter().map(|&(_, r)| r).sum();
        if leftover > total / 2 {
            // Too many endpoints for the table (most weights below D): the stride does
            // better.
            return None;
        }
        let table = golden_cycle(&quotients, 1);
        let rest = if rest.is_empty() {
            Rest::None
        } else if leftover <= limit {
            Rest::Cycle(golden_cycle(&rest, 1))
        } else {
            Rest::Stride(Box::new(GoldenStride::new(&rest)))
        };
        // R < W, so R·2⁶⁴/W < 2⁶⁴ − 2⁶⁴/W and its ceiling fits.
        let leftover_rate =
            u64::try_from((u128::from(leftover) << 64).div_ceil(u128::from(total))).ok()?;
        Some(Folded {
            total,
            step: phase_step(total),
            leftover_rate,
            table_mod: (u64::MAX / table.len() as u64).wrapping_add(1),
            table,
            rest,
        })
    }

    /// The endpoint at `phase`, the shared counter after k picks (k · step, wrapping).
    #[inline]
    fn pick(&self, phase: u64) -> EndpointIdx {
        // c = k mod W with one multiplication: phase · W / 2⁶⁴ = k mod W + k·ε/2⁶⁴, where
        // ε = step · W − 2⁶⁴ < W, and the second term stays below one position until k
        // reaches 2⁶⁴ / ε > 2⁶⁴ / W > 2³² picks.
        let c = ((u128::from(phase) * u128::from(self.total)) >> 64) as u64;
        let (before, leftover) = bresenham(c, self.leftover_rate);
        if leftover {
            return self.leftover(before);
        }
        self.table[lemire_mod(c - before, self.table_mod, self.table.len() as u64) as usize]
    }

    /// Leftover pick number `k` (k < R).
    #[cold]
    #[inline(never)]
    fn leftover(&self, k: u64) -> EndpointIdx {
        match &self.rest {
            Rest::Cycle(cycle) => cycle[k as usize],
            // k < R < 2³² and the step < R: the product fits.
            Rest::Stride(stride) => stride.owner(k * stride.step),
            Rest::None => unreachable!("a leftover pick only when there are leftovers"),
        }
    }
}

/// What a counter read as a phase over `total` positions advances per pick: ⌈2⁶⁴ / W⌉ for
/// W > 1 (exactly 2⁶⁴ / W, no drift, when W is a power of two); 0 for W = 1, whose one
/// position is 0.
fn phase_step(total: u64) -> u64 {
    (u64::MAX / total).wrapping_add(1)
}

/// For `c < W < 2³²` and `rate = ⌈R · 2⁶⁴ / W⌉` (R < W): `⌊c·R/W⌋`, the leftover picks before
/// pick c, and whether pick c is one (`⌊(c+1)·R/W⌋ > ⌊c·R/W⌋`). Exact: the fixed point's error,
/// under c / 2⁶⁴ < 2⁻³², is below the gap 1/W between c·R/W and the next integer.
#[inline]
fn bresenham(c: u64, rate: u64) -> (u64, bool) {
    let x = u128::from(c) * u128::from(rate);
    let before = (x >> 64) as u64;
    // (c+1)·rate = c·rate + rate: the integer part grows exactly when the fraction carries.
    let (_, carry) = (x as u64).overflowing_add(rate);
    (before, carry)
}

/// `a mod d` for `a, d < 2³²` with `m = ⌊(2⁶⁴ − 1) / d⌋ + 1` (wrapping), by Lemire's two
/// multiplications (Lemire, Kaser, Kurz, "Faster remainder by direct computation", 2019).
#[inline]
fn lemire_mod(a: u64, m: u64, d: u64) -> u64 {
    let low = m.wrapping_mul(a);
    ((u128::from(low) * u128::from(d)) >> 64) as u64
}

/// `x mod d` by Barrett reduction, `m = ⌊(2⁶⁴ − 1) / d⌋`: the estimated quotient
/// `⌊x·m / 2⁶⁴⌋` is at most 1 below the true one q for any 64-bit `x`, so the remainder needs
/// at most one correction. (m·d ≥ 2⁶⁴ − d, so x·m / 2⁶⁴ ≥ x/d − x/2⁶⁴ > x/d − 1, and the
/// estimate, an integer above x/d − 2 ≥ q − 2, is at least q − 1.)
#[inline]
fn barrett(x: u64, d: u64, m: u64) -> u64 {
    let q = ((u128::from(x) * u128::from(m)) >> 64) as u64;
    let r = x - q * d;
    if r >= d {
        r - d
    } else {
        r
    }
}

#[cfg(test)]
mod tests;
