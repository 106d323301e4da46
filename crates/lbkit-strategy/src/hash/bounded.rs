//! Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam, "Consistent Hashing
//! with Bounded Loads", SODA 2018 / arXiv 1608.01350, 2016), as Envoy's `hash_balance_factor`
//! and HAProxy's `hash-balance-factor` offer it.
//!
//! With factor `c ≥ 1`, `T` calls in flight over the eligible endpoints and the new call counted
//! (`T + 1`), endpoint `i` of weight `wᵢ` (out of `W`) has capacity
//! `capᵢ = ⌈c · (T + 1) · wᵢ / W⌉`. A candidate whose in-flight count `fᵢ` would exceed it once
//! it took the call (`fᵢ + 1 > capᵢ`, equivalently `c · (T + 1) · wᵢ ≤ fᵢ · W`) is passed over and
//! the strategy walks on to its next candidate. Since `Σ capᵢ ≥ T + 1 > Σ fᵢ`, some endpoint always
//! has room, so no endpoint ever holds more than its capacity because of a pick.
//!
//! # Complexity
//! A candidate with nothing in flight is admitted at once (one atomic load). Otherwise the total
//! `T` is summed over the eligible endpoints, stopping as soon as the partial sum proves the
//! candidate has room, and kept for the rest of the pick: O(n) atomic loads in the worst case,
//! only when a factor is set. lbkit-core keeps in-flight counts per endpoint only; an O(1) total
//! would need a shared counter beside them.

use std::sync::Arc;

use lbkit_core::{Endpoint, EndpointIdx, Snapshot};

/// The balance factor `c ≥ 1` of consistent hashing with bounded loads: an endpoint takes at
/// most `⌈c × its weighted share of the calls in flight⌉`, counting the new one (see the
/// [module docs](self)). `1.25` is the value the paper and Envoy's docs use as an example: keys
/// stay where they hash unless their endpoint holds 25% more than its share.
///
/// ```
/// use lbkit_strategy::BalanceFactor;
/// assert!(BalanceFactor::new(1.25).is_some());
/// assert!(BalanceFactor::new(0.9).is_none());
/// assert!(BalanceFactor::new(f64::NAN).is_none());
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BalanceFactor(f64);

// === impl BalanceFactor ===

impl BalanceFactor {
    /// The factor, or `None` unless it is finite and at least 1.0.
    pub fn new(factor: f64) -> Option<Self> {
        (factor.is_finite() && factor >= 1.0).then_some(BalanceFactor(factor))
    }

    /// The factor.
    pub fn get(self) -> f64 {
        self.0
    }
}

/// The load bound prepared for one snapshot. Immutable after prepare.
#[derive(Debug)]
pub(crate) struct Bound {
    factor: f64,
    snapshot: Arc<Snapshot>,
    /// Weight by endpoint position; only eligible endpoints are ever asked about.
    weights: Box<[f64]>,
    /// Sum of the weights of the eligible endpoints.
    total_weight: f64,
}

// === impl Bound ===

impl Bound {
    /// A bound over the eligible endpoints of `snapshot`, weighing each by `weight`.
    pub(crate) fn new(
        factor: BalanceFactor,
        snapshot: &Arc<Snapshot>,
        weight: impl Fn(&Endpoint) -> u64,
    ) -> Self {
        Bound::holding(factor, snapshot, weight, std::iter::repeat(true))
    }

    /// [`new`](Self::new), where only the endpoints `holds` says own keys (one item for each
    /// endpoint, in position order; missing items say no) weigh: the others weigh 0. An
    /// endpoint new to a patched Maglev table or waiting to join a held ring takes no load.
    pub(crate) fn holding(
        factor: BalanceFactor,
        snapshot: &Arc<Snapshot>,
        weight: impl Fn(&Endpoint) -> u64,
        holds: impl IntoIterator<Item = bool>,
    ) -> Self {
        let holds = holds.into_iter().chain(std::iter::repeat(false));
        let weights = (snapshot.endpoints().iter().zip(holds))
            .map(|(e, h)| if h { weight(e) as f64 } else { 0.0 })
            .collect();
        Bound::with_weights(factor, snapshot, weights)
    }

    /// A bound over the eligible endpoints of `snapshot` weighing `weights[position]`.
    fn with_weights(factor: BalanceFactor, snapshot: &Arc<Snapshot>, weights: Box<[f64]>) -> Self {
        let total_weight = snapshot.eligible().iter().map(|&i| weights[i.get()]).sum();
        Bound {
            factor: factor.get(),
            snapshot: snapshot.clone(),
            weights,
            total_weight,
        }
    }

    /// The weight `idx` is bounded by, and the eligible endpoints' total.
    #[cfg(test)]
    pub(crate) fn weight(&self, idx: EndpointIdx) -> (f64, f64) {
        (self.weights[idx.get()], self.total_weight)
    }

    #[inline]
    fn in_flight(&self, idx: EndpointIdx) -> u32 {
        self.snapshot.live(idx).in_flight()
    }

    /// Whether `idx` has no call in flight: then it is under any cap, and a pick can take it
    /// without summing the others (the fast path of every bounded picker).
    #[inline]
    pub(crate) fn is_idle(&self, idx: EndpointIdx) -> bool {
        self.in_flight(idx) == 0
    }
}

/// The load check of one pick: remembers how far the total in-flight count has been summed.
#[derive(Debug)]
pub(crate) struct LoadCheck<'a> {
    bound: Option<&'a Bound>,
    /// In-flight calls of the eligible endpoints summed so far.
    partial: u64,
    /// Eligible endpoints summed so far.
    next: usize,
}

// === impl LoadCheck ===

impl<'a> LoadCheck<'a> {
    /// A check against `bound`; `None` admits everything.
    #[inline]
    pub(crate) fn new(bound: Option<&'a Bound>) -> Self {
        LoadCheck {
            bound,
            partial: 0,
            next: 0,
        }
    }

    /// Whether `idx` has room for one more call.
    pub(crate) fn admits(&mut self, idx: EndpointIdx) -> bool {
        let Some(bound) = self.bound else {
            return true;
        };
        let in_flight = bound.in_flight(idx);
        if in_flight == 0 {
            return true;
        }
        let weight = bound.weights[idx.get()];
        let held = f64::from(in_flight) * bound.total_weight;
        let eligible = bound.snapshot.eligible();
        loop {
            // Room iff c·(T+1)·w > f·W; the partial sum only grows towards T.
            if bound.factor * (self.partial + 1) as f64 * weight > held {
                return true;
            }
            let Some(&other) = eligible.get(self.next) else {
                return false;
            };
            self.partial += u64::from(bound.in_flight(other));
            self.next += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lbkit_core::{Clock, Timestamp};
    use lbkit_testkit::snapshot;

    #[test]
    fn capacity_follows_the_weighted_share() {
        let snap = snapshot(&[("a:1", 1), ("b:1", 3)]);
        let bound = Bound::new(BalanceFactor::new(1.0).unwrap(), &snap, |e| {
            u64::from(e.weight())
        });
        let (a, b) = (EndpointIdx::new(0), EndpointIdx::new(1));
        let hold = |i: usize, n: usize| -> Vec<_> {
            (0..n)
                .map(|_| {
                    lbkit_core::CallGuard::new(
                        snap.endpoints()[i].clone(),
                        Timestamp::ZERO,
                        Clock::System,
                    )
                })
                .collect()
        };
        // Nothing in flight: everyone has room.
        assert!(LoadCheck::new(Some(&bound)).admits(a));
        // a holds 1, b holds 3: T+1 = 5, cap(a) = ceil(5/4) = 2 → room; cap(b) = ceil(15/4) = 4 → room.
        let _ga = hold(0, 1);
        let _gb = hold(1, 3);
        assert!(LoadCheck::new(Some(&bound)).admits(a));
        assert!(LoadCheck::new(Some(&bound)).admits(b));
        // a holds 2: T+1 = 6, cap(a) = ceil(6/4) = 2 → full.
        let _ga2 = hold(0, 1);
        assert!(!LoadCheck::new(Some(&bound)).admits(a));
        assert!(LoadCheck::new(Some(&bound)).admits(b));
        assert!(LoadCheck::new(None).admits(a));
    }
}
