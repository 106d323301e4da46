//! `rendezvous`: highest-random-weight hashing, weighted.
//!
//! * **Algorithm**: for a call with key hash `k`, every eligible endpoint `i` gets a score from
//!   `h = fmix64(k ⊕ aᵢ)`, where `aᵢ` is lbkit's SipHash of its address and `fmix64` is
//!   MurmurHash3's 64-bit finalizer. With equal weights the score is `h` itself; otherwise `h` is
//!   mapped to `u ∈ (0, 1)` (its top 53 bits, centred) and the score is `−wᵢ / ln u`, so endpoint
//!   `i` wins with probability `wᵢ / Σw` exactly. The highest score wins (ties: the earlier
//!   endpoint); the preference order is the ranking by score.
//! * **Origin**: Thaler & Ravishankar, "Using Name-Based Mappings to Increase Hit Rates",
//!   IEEE/ACM ToN 1998 (HRW); the weighted score `−w / ln h` is the logarithmic method of
//!   Schindelhauer & Schomaker, "Weighted Distributed Hash Tables", SPAA 2005 (as used by
//!   Resch's "New Hashing Algorithms for Data Storage" and Ceph's straw2 buckets).
//! * **Complexity**: prepare O(n); pick O(n): one mix (and, with unequal weights, one `ln`) per
//!   eligible endpoint — inherent to rendezvous hashing, so prefer a ring or Maglev beyond a few
//!   hundred endpoints; memory 24 bytes per endpoint. Walking to the `p`-th preference keeps the
//!   best 16 in one pass; beyond them each further step is another O(n) pass.
//! * **A change**: every eligible endpoint's address is hashed again, O(n) (101 µs at 10 000
//!   endpoints; BENCHMARKS.md, "What a change costs a strategy"). No table: keys of endpoints that
//!   stay never move.
//! * **Behaviour under trouble**: blind to load unless `balance_factor` is set (bounds are
//!   weighted). Only eligible endpoints are ranked, and removing one from a ranking leaves the
//!   order of the others unchanged, so only keys of a failed endpoint move, each to its next
//!   preference. A rejected candidate makes the pick return the next preference. Weights are the
//!   configured ones (warm-up would move keys every second).
//! * **Differences from the origin**: the key is the 64-bit
//!   [`PickContext::hash`](lbkit_core::PickContext::hash) (lbkit's SipHash of
//!   [`PickContext::key`](lbkit_core::PickContext::key) when the caller gave a key), combined
//!   with a precomputed address hash by a mixing function rather than hashing (key, address)
//!   afresh per endpoint, which keeps a pick at a few ns per endpoint. Without a key or hash, a
//!   random draw from the caller's RNG.
//!
//! ```
//! use std::sync::Arc;
//! use lbkit_core::{EndpointSpec, FastRng, PickContext, Picker, Snapshot, Strategy, Timestamp};
//! use lbkit_strategy::Rendezvous;
//! let snap = Arc::new(Snapshot::from_specs(
//!     ["a:1", "b:1", "c:1"].map(EndpointSpec::new).to_vec(),
//!     Timestamp::ZERO,
//! ));
//! let picker = Rendezvous::new().prepare(&snap, Timestamp::ZERO);
//! let mut rng = FastRng::seed_from_u64(1);
//! let mut cx = PickContext::new(Timestamp::ZERO, &mut rng).with_key(b"session-7");
//! let best = picker.pick(&mut cx).unwrap();
//! cx.probe = 1; // the best one was rejected: the second preference, never the best again
//! assert_ne!(picker.pick(&mut cx).unwrap(), best);
//! ```

use std::sync::Arc;

use lbkit_core::{
    key_hash, EndpointIdx, PickContext, PickError, Picker, Snapshot, Strategy, Timestamp,
};

use super::bounded::{BalanceFactor, Bound, LoadCheck};
use super::walk::nth_admitted;

/// Rendezvous (highest random weight) hashing (`rendezvous`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Rendezvous {
    balance: Option<BalanceFactor>,
}

// === impl Rendezvous ===

impl Rendezvous {
    /// Weighted rendezvous hashing, no load bound.
    pub fn new() -> Self {
        Rendezvous { balance: None }
    }

    /// Bound every endpoint's load, in proportion to its weight (see [`BalanceFactor`]).
    pub fn with_balance_factor(self, factor: BalanceFactor) -> Self {
        self.with_balance_factor_opt(Some(factor))
    }

    pub(crate) fn with_balance_factor_opt(mut self, factor: Option<BalanceFactor>) -> Self {
        self.balance = factor;
        self
    }
}

impl Strategy for Rendezvous {
    type Picker = RendezvousPicker;

    fn name(&self) -> &str {
        "rendezvous"
    }

    fn prepare(&self, snapshot: &Arc<Snapshot>, _now: Timestamp) -> RendezvousPicker {
        let candidates: Box<[Candidate]> = snapshot
            .eligible()
            .iter()
            .map(|&idx| {
                let e = snapshot.endpoint(idx);
                Candidate {
                    idx,
                    address_hash: key_hash(e.address().as_bytes()),
                    weight: f64::from(e.weight()),
                }
            })
            .collect();
        let uniform = candidates.windows(2).all(|w| w[0].weight == w[1].weight);
        RendezvousPicker {
            candidates,
            uniform,
            bound: self
                .balance
                .map(|f| Bound::new(f, snapshot, |e| u64::from(e.weight()))),
            empty: snapshot.empty_error(),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Candidate {
    idx: EndpointIdx,
    address_hash: u64,
    weight: f64,
}

/// Prepared [`Rendezvous`]: the eligible endpoints with their address hashes.
#[derive(Debug)]
pub struct RendezvousPicker {
    candidates: Box<[Candidate]>,
    /// All weights equal: rank by the raw hash (no `ln`).
    uniform: bool,
    bound: Option<Bound>,
    empty: PickError,
}

/// Rank of a candidate: score in the high 64 bits, earlier position wins ties. Higher is better.
type Rank = u128;

/// How many preferences one pass keeps.
const TOP: usize = 16;

// === impl RendezvousPicker ===

impl RendezvousPicker {
    /// The endpoints in `key`'s preference order, best first.
    ///
    /// # Complexity
    /// O(n) for the first 16, then O(n) per further endpoint.
    pub fn preference(&self, key: u64) -> impl Iterator<Item = EndpointIdx> + '_ {
        Preference::new(self, key)
    }

    #[inline]
    fn rank(&self, key: u64, pos: usize) -> Rank {
        let c = &self.candidates[pos];
        let h = fmix64(key ^ c.address_hash);
        let score = if self.uniform {
            h
        } else {
            // u in (0, 1) from the top 53 bits; −w / ln u > 0, and positive floats order like
            // their bit patterns.
            let u = ((h >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64);
            (-c.weight / u.ln()).to_bits()
        };
        (Rank::from(score) << 64) | Rank::from(u64::MAX - pos as u64)
    }

    #[inline]
    fn best(&self, key: u64) -> EndpointIdx {
        let pos = (0..self.candidates.len())
            .max_by_key(|&p| self.rank(key, p))
            .unwrap_or(0);
        self.candidates[pos].idx
    }

    #[inline]
    fn key(cx: &mut PickContext<'_>) -> u64 {
        match (cx.hash, cx.key) {
            (Some(h), _) => h,
            (None, Some(key)) => key_hash(key),
            (None, None) => cx.rng.next_u64(),
        }
    }
}

impl Picker for RendezvousPicker {
    #[inline]
    fn pick(&self, cx: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> {
        if self.candidates.is_empty() {
            return Err(self.empty);
        }
        let key = Self::key(cx);
        if cx.probe == 0 {
            let best = self.best(key);
            if self.bound.as_ref().is_none_or(|b| b.is_idle(best)) {
                return Ok(best);
            }
        }
        let n = u32::try_from(self.candidates.len()).unwrap_or(u32::MAX);
        let probe = cx.probe % n;
        let found = nth_admitted(
            self.preference(key),
            probe,
            &mut LoadCheck::new(self.bound.as_ref()),
        )
        .or_else(|| nth_admitted(self.preference(key), probe, &mut LoadCheck::new(None)));
        Ok(found.unwrap_or_else(|| self.best(key)))
    }

    fn explain(&self, idx: EndpointIdx, _now: Timestamp) -> Option<String> {
        let c = self.candidates.iter().find(|c| c.idx == idx)?;
        let total: f64 = self.candidates.iter().map(|c| c.weight).sum();
        Some(format!(
            "weight {} ({:.2}% of keys)",
            c.weight,
            c.weight * 100.0 / total
        ))
    }
}

/// The preference order of one key: the best [`TOP`] from one pass, then one pass per step.
#[derive(Debug)]
struct Preference<'a> {
    picker: &'a RendezvousPicker,
    key: u64,
    top: [Rank; TOP],
    len: usize,
    cursor: usize,
    /// Rank of the last endpoint yielded.
    last: Rank,
}

// === impl Preference ===

impl<'a> Preference<'a> {
    fn new(picker: &'a RendezvousPicker, key: u64) -> Self {
        let mut top = [0; TOP];
        let mut len = 0;
        for pos in 0..picker.candidates.len() {
            let r = picker.rank(key, pos);
            if len == TOP && r <= top[TOP - 1] {
                continue;
            }
            let at = top[..len].partition_point(|&t| t > r);
            let end = len.min(TOP - 1);
            top.copy_within(at..end, at + 1);
            top[at] = r;
            len = (len + 1).min(TOP);
        }
        Preference {
            picker,
            key,
            top,
            len,
            cursor: 0,
            last: Rank::MAX,
        }
    }
}

impl Iterator for Preference<'_> {
    type Item = EndpointIdx;

    fn next(&mut self) -> Option<EndpointIdx> {
        let rank = if self.cursor < self.len {
            self.top[self.cursor]
        } else {
            // Past the kept ones: the best rank below the last one, by another pass.
            (0..self.picker.candidates.len())
                .map(|p| self.picker.rank(self.key, p))
                .filter(|&r| r < self.last)
                .max()?
        };
        self.cursor += 1;
        self.last = rank;
        let pos = u64::MAX - rank as u64;
        Some(self.picker.candidates[pos as usize].idx)
    }
}

/// MurmurHash3's 64-bit finalizer (public domain, Austin Appleby): a bijection with full
/// avalanche.
#[inline]
fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lbkit_testkit::snapshot;

    #[test]
    fn preference_lists_every_endpoint_once_in_rank_order() {
        let specs: Vec<(String, u32)> = (0..40)
            .map(|i| (format!("10.0.0.{i}:80"), 1 + i % 3))
            .collect();
        let refs: Vec<(&str, u32)> = specs.iter().map(|(a, w)| (a.as_str(), *w)).collect();
        let picker = Rendezvous::new().prepare(&snapshot(&refs), Timestamp::ZERO);
        for key in [0u64, 7, u64::MAX, 0xdead_beef] {
            let order: Vec<usize> = picker.preference(key).map(|i| i.get()).collect();
            let mut expected: Vec<usize> = (0..40).collect();
            expected.sort_by_key(|&p| std::cmp::Reverse(picker.rank(key, p)));
            assert_eq!(order, expected);
            assert_eq!(order[0], picker.best(key).get());
        }
    }
}
