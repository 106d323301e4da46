//! Shared choice machinery of the load-aware strategies: the cheapest of the eligible endpoints,
//! by an exact scan over small sets and by two weighted samples over large ones.

use lbkit_core::{EndpointIdx, FastRng, PickContext, Snapshot, Timestamp};

use crate::alias::AliasTable;
use crate::common::{all_equal, effective_weights};

/// Largest set scanned exactly (Dubbo's and Ribbon's semantics); larger sets compare two
/// weighted samples (power of two choices), which keeps a pick O(1) at 100 000 endpoints. The
/// scan costs about 3.5× the two-sample path at 16 endpoints (BENCHMARKS.md, issue 3), so it is
/// kept to small sets, as DESIGN.md suggests.
pub(crate) const EXACT_SCAN: usize = 8;

/// How ties on the lowest cost are broken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ties {
    /// Weighted random among the tied (Dubbo's least-active and shortest-response).
    Weighted,
    /// The earliest in source order (Ribbon's best-available).
    First,
}

/// The eligible endpoints with their effective weights, prepared once per snapshot.
#[derive(Debug)]
pub(crate) struct Candidates {
    idx: IndexList,
    weights: Box<[u64]>,
    /// Weighted sampler for large sets (`None` when all weights are equal: uniform draws).
    alias: Option<AliasTable>,
}

impl Candidates {
    pub(crate) fn new(snapshot: &Snapshot, now: Timestamp) -> Self {
        let w = effective_weights(snapshot, now);
        let alias = if w.len() > EXACT_SCAN && !all_equal(&w) {
            AliasTable::new(&w)
        } else {
            None
        };
        Candidates {
            idx: IndexList::new(w.iter().map(|&(i, _)| i).collect()),
            weights: w.iter().map(|&(_, w)| w).collect(),
            alias,
        }
    }

    pub(crate) fn weight_of(&self, idx: EndpointIdx) -> Option<u64> {
        self.idx
            .as_slice()
            .iter()
            .position(|&i| i == idx)
            .map(|p| self.weights[p])
    }

    /// The endpoint with the lowest `cost`. `None` when empty or every cost is infinite.
    #[inline]
    pub(crate) fn cheapest(
        &self,
        cx: &mut PickContext<'_>,
        ties: Ties,
        cost: impl Fn(EndpointIdx) -> f64,
    ) -> Option<EndpointIdx> {
        if self.idx.len() <= EXACT_SCAN {
            self.scan(cx.rng, ties, cost)
        } else {
            let (a, b) = self.two_samples(cx.rng);
            let (ca, cb) = (cost(a), cost(b));
            let best = if cb < ca { (b, cb) } else { (a, ca) };
            best.1.is_finite().then_some(best.0)
        }
    }

    /// Exact minimum; ties by weight (random) or by order. No allocation: ties are counted and
    /// the winner found in a second pass.
    fn scan(
        &self,
        rng: &mut FastRng,
        ties: Ties,
        cost: impl Fn(EndpointIdx) -> f64,
    ) -> Option<EndpointIdx> {
        let mut costs = [0.0f64; EXACT_SCAN];
        let mut best = f64::INFINITY;
        let (mut tied_weight, mut first) = (0u64, None);
        for (p, &i) in self.idx.as_slice().iter().enumerate() {
            let c = cost(i);
            costs[p] = c;
            if c < best {
                (best, tied_weight, first) = (c, 0, Some(p));
            }
            if c == best {
                tied_weight += self.weights[p];
            }
        }
        let first = first?;
        if ties == Ties::First || tied_weight == 0 {
            return Some(self.idx.at(first));
        }
        let mut r = rng.below(tied_weight);
        for (p, &c) in costs[..self.idx.len()].iter().enumerate() {
            if c == best {
                if r < self.weights[p] {
                    return Some(self.idx.at(p));
                }
                r -= self.weights[p];
            }
        }
        Some(self.idx.at(first))
    }

    /// Two distinct candidates, drawn by weight (uniformly when weights are equal).
    #[inline]
    pub(crate) fn two_samples(&self, rng: &mut FastRng) -> (EndpointIdx, EndpointIdx) {
        match &self.alias {
            Some(table) => table.two(rng, AliasTable::sample),
            None => self.idx.two_distinct(rng),
        }
    }
}

/// A list of endpoint indices that knows when it is every index of the snapshot in order (the
/// usual case: everything eligible), so a random draw is used as the index directly, without
/// reading the list: at 100 000 endpoints that saves a dependent cache miss per candidate.
#[derive(Debug)]
pub(crate) struct IndexList {
    idx: Box<[EndpointIdx]>,
    identity: bool,
}

impl IndexList {
    pub(crate) fn new(idx: Box<[EndpointIdx]>) -> Self {
        let identity = idx.iter().enumerate().all(|(k, i)| i.get() == k);
        IndexList { idx, identity }
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.idx.len()
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.idx.is_empty()
    }

    /// The `k`-th entry (`k < len`).
    #[inline]
    pub(crate) fn at(&self, k: usize) -> EndpointIdx {
        if self.identity {
            EndpointIdx::new(k)
        } else {
            self.idx[k]
        }
    }

    pub(crate) fn as_slice(&self) -> &[EndpointIdx] {
        &self.idx
    }

    /// Two distinct uniformly random entries (the same one twice when there is one).
    #[inline]
    pub(crate) fn two_distinct(&self, rng: &mut FastRng) -> (EndpointIdx, EndpointIdx) {
        let (a, b) = two_distinct_positions(self.len(), rng);
        (self.at(a), self.at(b))
    }
}

/// Two distinct uniformly random positions below `n` (`n ≥ 1`; the same one twice when
/// `n == 1`).
#[inline]
fn two_distinct_positions(n: usize, rng: &mut FastRng) -> (usize, usize) {
    let a = rng.index(n);
    if n < 2 {
        return (a, a);
    }
    let mut b = rng.index(n - 1);
    if b >= a {
        b += 1;
    }
    (a, b)
}
