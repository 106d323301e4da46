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
//!   Only when the cycle would exceed [`MAX_CYCLE`] entries (Σw / gcd over a million) is the
//!   stride computed per pick instead: the shared counter advances by a and the endpoint
//!   owning the point is found via a bucket index over the cumulative weights — O(1) typical
//!   (no division: a Barrett reduction and a multiply-shift), O(log n) worst; the same order
//!   (and once per 2³² picks or more, when the 64-bit counter wraps, a span is off by about
//!   one pick).
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

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use lbkit_core::{EndpointIdx, PickContext, PickError, Picker, Snapshot, Strategy, Timestamp};

use crate::common::{effective_weights, share};
use crate::round_robin::{counter, SharedCounter};

/// Longest cycle kept in memory (4 MiB of indices): beyond it, the golden-ratio stride is
/// computed per pick.
pub const MAX_CYCLE: u64 = 1 << 20;

/// Most steps (cycle length × distinct weights) spent building an nginx cycle, which bounds
/// prepare time to about 15 ms on the benchmark machine (5.7 M steps took 20 ms); beyond it,
/// weighted round robin builds the cycle in golden-ratio stride order (one step per entry,
/// about 0.5 ms for 500 000 entries), and the load-driven strategies' schedulers compute the
/// stride per pick.
pub const MAX_CYCLE_WORK: u64 = 1 << 22;

/// Smooth weighted round robin (nginx order).
#[derive(Debug, Clone)]
pub struct SmoothWeightedRoundRobin {
    counter: SharedCounter,
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
            counter: counter(0),
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
            self.counter.clone(),
            Unroll::Yes,
        )
    }
}

/// Prepared [`SmoothWeightedRoundRobin`].
#[derive(Debug)]
pub struct SmoothWeightedPicker {
    order: Order,
    weights: Box<[(EndpointIdx, u64)]>,
    total: u64,
    counter: SharedCounter,
}

/// Whether a golden-ratio stride that fits in [`MAX_CYCLE`] is stored as a cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unroll {
    Yes,
    No,
}

#[derive(Debug)]
enum Order {
    /// nginx's cycle.
    Cycle(Box<[EndpointIdx]>),
    /// The golden-ratio stride's cycle, unrolled ([`golden_cycle`]).
    Golden(Box<[EndpointIdx]>),
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
    /// stride's cycle when it fits in [`MAX_CYCLE`], else the stride computed per pick.
    fn build(weights: Vec<(EndpointIdx, u64)>, counter: SharedCounter, unroll: Unroll) -> Self {
        let weights: Vec<(EndpointIdx, u64)> =
            weights.into_iter().filter(|&(_, w)| w > 0).collect();
        let total: u64 = weights.iter().map(|&(_, w)| w).sum();
        let g = weights.iter().fold(0, |g, &(_, w)| gcd(g, w));
        let cycle_len = total.checked_div(g).unwrap_or(0);
        let groups = weights
            .iter()
            .map(|&(_, w)| w)
            .collect::<std::collections::BTreeSet<_>>()
            .len() as u64;
        let fits = cycle_len <= MAX_CYCLE;
        let order = if fits && cycle_len.saturating_mul(groups) <= MAX_CYCLE_WORK {
            Order::Cycle(nginx_cycle(&weights, g))
        } else if fits && unroll == Unroll::Yes {
            Order::Golden(golden_cycle(&weights, g))
        } else {
            Order::Stride(GoldenStride::new(&weights))
        };
        SmoothWeightedPicker {
            order,
            weights: weights.into_boxed_slice(),
            total,
            counter,
        }
    }

    /// The weight this picker gives `idx`, and the total.
    pub(crate) fn weight_of(&self, idx: EndpointIdx) -> Option<(u64, u64)> {
        let &(_, w) = self.weights.iter().find(|&&(i, _)| i == idx)?;
        Some((w, self.total))
    }

    /// Whether the exact nginx cycle is kept (rather than the golden-ratio stride).
    pub fn is_exact_nginx_order(&self) -> bool {
        matches!(self.order, Order::Cycle(_))
    }
}

impl Picker for SmoothWeightedPicker {
    #[inline]
    fn pick(&self, _cx: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> {
        match &self.order {
            Order::Cycle(c) | Order::Golden(c) if c.is_empty() => Err(PickError::NoEndpoints),
            Order::Cycle(c) | Order::Golden(c) => {
                Ok(c[(self.counter.fetch_add(1, Relaxed) % c.len() as u64) as usize])
            }
            // The counter walks the point line itself: one add of the step per pick.
            Order::Stride(s) => Ok(s.owner(self.counter.fetch_add(s.step, Relaxed))),
        }
    }

    fn explain(&self, idx: EndpointIdx, _now: Timestamp) -> Option<String> {
        let &(_, w) = self.weights.iter().find(|&&(i, _)| i == idx)?;
        let mode = match self.order {
            Order::Cycle(_) => "nginx cycle",
            Order::Golden(_) => "golden stride cycle",
            Order::Stride(_) => "golden stride",
        };
        Some(format!("{}, {mode}", share(w, self.total)))
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// One cycle of nginx's smooth weighted round robin over weights divided by `g`.
///
/// At step t (1-based) endpoint i holds `t·wᵢ − T·cᵢ` (cᵢ = its picks so far, T = Σw); the
/// largest value wins, ties to the earlier endpoint. Within a group of equal weight the member
/// with the fewest picks (then the earliest) is the group's best, and members take turns in
/// order, so each group is a cursor over its members.
fn nginx_cycle(weights: &[(EndpointIdx, u64)], g: u64) -> Box<[EndpointIdx]> {
    struct Group {
        weight: i128,
        members: Vec<EndpointIdx>,
        cursor: usize,
        picks: i128,
    }
    let mut by_weight: BTreeMap<u64, Vec<EndpointIdx>> = BTreeMap::new();
    for &(i, w) in weights {
        by_weight.entry(w / g).or_default().push(i);
    }
    let mut groups: Vec<Group> = by_weight
        .into_iter()
        .map(|(w, members)| Group {
            weight: i128::from(w),
            members,
            cursor: 0,
            picks: 0,
        })
        .collect();
    let total: i128 = weights.iter().map(|&(_, w)| i128::from(w / g)).sum();
    let mut cycle = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
    for t in 1..=total {
        let best = groups
            .iter()
            .enumerate()
            .map(|(gi, gr)| (t * gr.weight - total * gr.picks, gr.members[gr.cursor], gi))
            .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
            .map(|(_, _, gi)| gi)
            .expect("at least one group when the total is positive");
        let gr = &mut groups[best];
        cycle.push(gr.members[gr.cursor]);
        gr.cursor += 1;
        if gr.cursor == gr.members.len() {
            gr.cursor = 0;
            gr.picks += 1;
        }
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
            // k + inverse < 2 · total ≤ 2 · MAX_CYCLE: no overflow.
            k += inverse;
            if k >= total {
                k -= total;
            }
        }
    }
    cycle.into_boxed_slice()
}

/// The golden-ratio step for a line of `total` points: about `total / φ`, coprime with it.
fn golden_step(total: u64) -> u64 {
    let mut step = (((total as f64) / 1.618_033_988_749_895) as u64).max(1);
    while total > 1 && gcd(step, total) != 1 {
        step += 1;
    }
    step
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
/// bits — a 64×64→128 multiply, a subtraction and at most two corrections — instead of the two
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

/// `x mod d` by Barrett reduction, `m = ⌊(2⁶⁴ − 1) / d⌋`: the estimated quotient
/// `⌊x·m / 2⁶⁴⌋` is at most 2 below the true one for any 64-bit `x`, so the remainder needs at
/// most two corrections.
#[inline]
fn barrett(x: u64, d: u64, m: u64) -> u64 {
    let q = ((u128::from(x) * u128::from(m)) >> 64) as u64;
    let mut r = x - q * d;
    if r >= d {
        r -= d;
    }
    if r >= d {
        r -= d;
    }
    r
}

#[cfg(test)]
mod tests;
