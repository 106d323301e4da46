//! `maglev`: the Maglev lookup table, weighted as Envoy builds it; O(1) per pick.
//!
//! * **Algorithm**: a table of `M` entries (a prime, default 65 537). Each endpoint of positive
//!   weight has a permutation of the table, `(offset + skip · k) mod M`, with
//!   `offset = xxHash64(address, seed 0) mod M` and
//!   `skip = xxHash64(address, seed 1) mod (M − 1) + 1`.
//!   Endpoints, sorted by address, take turns claiming the next free entry of their permutation;
//!   in round `r` an endpoint of normalized weight `w` (of maximum `wmax`) takes a turn when
//!   `r · w ≥ target`, and each turn raises its `target` by `wmax`, so entries split in
//!   proportion to weight (1 : 2 → 21 846 : 43 691 of 65 537). A call goes to entry
//!   `hash mod M`.
//! * **Origin**: Eisenbud et al., "Maglev: A Fast and Reliable Software Network Load Balancer",
//!   NSDI 2016, §3.4 (pseudocode listing 1; table size 65 537 recommended in §5.3). Weights,
//!   hashes and ordering follow Envoy's `MaglevTable` (`source/extensions/load_balancing_policies/
//!   maglev/maglev_lb.cc`: sorted build entries, `xxHash64(key)` / `xxHash64(key, 1)`, the
//!   `iteration * weight_ < target_weight_` turn rule in `double`); the key hash with a request
//!   key is `xxHash64(key)`, as Envoy's header hash policy computes it. Table size limit
//!   5 000 011 and the prime requirement are Envoy's too.
//! * **Complexity**: prepare O(M log M) expected (each endpoint's permutation walk to a free
//!   entry) plus O(n log n) sorting, a few ms at 65 537; pick O(1): one xxHash64 of the key (or
//!   none, with a caller's hash) and one table read; memory 4 bytes per entry (256 KiB by
//!   default). Keep `M` above 100 × endpoints for shares within about 1% (paper §5.3).
//! * **A change**: the table is built again, O(M log M) (1.80 ms at 10 000 endpoints and M =
//!   65 537; BENCHMARKS.md, "What a change costs a strategy"): endpoints take entries in turns, so
//!   one endpoint more or less shifts whose turn fills which entry everywhere after its first one;
//!   the paper bounds the entries that move, not where they are. It is built on the publisher's
//!   thread; picks keep the last table until the new one is swapped in.
//! * **Behaviour under trouble**: blind to load unless `balance_factor` is set (bounds are
//!   weighted). The table is built over every endpoint with weight > 0, healthy or not; an entry of
//!   a down endpoint is resolved, at prepare, to the next entry of an eligible one, so keys of
//!   healthy endpoints never move when another goes down, and a pick stays O(1). A rejected
//!   candidate makes the pick walk on to the next table entries' distinct endpoints. Weights are
//!   the configured ones (warm-up would reshuffle the table every second); a weight change,
//!   draining to 0 included, rebuilds the table and moves a few keys of other endpoints too
//!   (Maglev's disruption is small, not minimal: paper §5.3).
//! * **Differences from the origin**: Envoy builds the table over healthy hosts only, so a
//!   health change moves some keys of healthy hosts too; lbkit keeps them. Envoy retries by
//!   mutating the hash (`hash ^ (~0 − attempt + 1)`); lbkit walks to the next entries. The table
//!   equals Envoy's for the same addresses and weights while all are healthy (not checked
//!   against a running Envoy). Without a key, [`PickContext::hash`](lbkit_core::PickContext::hash)
//!   (or a random draw) is the hash.
//!
//! ```
//! use std::sync::Arc;
//! use lbkit_core::{EndpointSpec, Snapshot, Strategy, Timestamp};
//! use lbkit_strategy::Maglev;
//! let snap = Arc::new(Snapshot::from_specs(
//!     vec![EndpointSpec::new("a:80").with_weight(1), EndpointSpec::new("b:80").with_weight(2)],
//!     Timestamp::ZERO,
//! ));
//! let picker = Maglev::new().prepare(&snap, Timestamp::ZERO);
//! let a = picker.table().iter().filter(|i| i.get() == 0).count();
//! assert_eq!((a, picker.table().len() - a), (21_846, 43_691));
//! ```

use std::sync::Arc;

use lbkit_core::{EndpointIdx, PickContext, PickError, Picker, Snapshot, Strategy, Timestamp};
use xxhash_rust::xxh64::xxh64;

use super::bounded::{BalanceFactor, Bound};
use super::fallback_hash;
use super::walk::{from_slice, walk_cyclic};

/// Default table size: the paper's recommendation (§5.3) and Envoy's default; prime.
pub const DEFAULT_TABLE_SIZE: u32 = 65_537;

/// Largest table size accepted (Envoy's limit; prime).
pub const MAX_TABLE_SIZE: u32 = 5_000_011;

/// A Maglev table size that is not a prime in `2..=MAX_TABLE_SIZE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("maglev table size {size} is not a prime number between 2 and {MAX_TABLE_SIZE} (e.g. 65537, 655373, 5000011)")]
pub struct TableSizeError {
    size: u32,
}

// === impl TableSizeError ===

impl TableSizeError {
    /// The size given.
    pub fn size(&self) -> u32 {
        self.size
    }
}

/// Maglev consistent hashing (`maglev`).
#[derive(Debug, Clone, Copy)]
pub struct Maglev {
    table_size: u32,
    balance: Option<BalanceFactor>,
}

impl Default for Maglev {
    fn default() -> Self {
        Maglev::new()
    }
}

// === impl Maglev ===

impl Maglev {
    /// A table of [`DEFAULT_TABLE_SIZE`] entries, no load bound.
    pub fn new() -> Self {
        Maglev {
            table_size: DEFAULT_TABLE_SIZE,
            balance: None,
        }
    }

    /// A table of `size` entries.
    ///
    /// # Errors
    /// When `size` is not a prime within `2..=`[`MAX_TABLE_SIZE`] (every permutation must visit
    /// every entry).
    pub fn try_with_table_size(size: u32) -> Result<Self, TableSizeError> {
        if size > MAX_TABLE_SIZE || !is_prime(size) {
            return Err(TableSizeError { size });
        }
        Ok(Maglev {
            table_size: size,
            balance: None,
        })
    }

    /// Bound every endpoint's load, in proportion to its weight (see [`BalanceFactor`]).
    pub fn with_balance_factor(self, factor: BalanceFactor) -> Self {
        self.with_balance_factor_opt(Some(factor))
    }

    pub(crate) fn with_balance_factor_opt(mut self, factor: Option<BalanceFactor>) -> Self {
        self.balance = factor;
        self
    }

    /// Entries in the table.
    pub fn table_size(&self) -> u32 {
        self.table_size
    }
}

impl Strategy for Maglev {
    type Picker = MaglevPicker;

    fn name(&self) -> &str {
        "maglev"
    }

    fn prepare(&self, snapshot: &Arc<Snapshot>, _now: Timestamp) -> MaglevPicker {
        let size = u64::from(self.table_size);
        let weighted = snapshot
            .endpoints()
            .iter()
            .enumerate()
            .filter(|(_, e)| e.weight() > 0);
        let raw = build_table(weighted.map(|(i, e)| (i, e.address(), e.weight())), size);
        let mut eligible = vec![false; snapshot.len()];
        snapshot
            .eligible()
            .iter()
            .for_each(|i| eligible[i.get()] = true);
        let table = resolve(&raw, &eligible).unwrap_or_else(|| {
            // No entry belongs to an eligible endpoint (more endpoints than entries): a table of
            // the eligible endpoints alone.
            let only = snapshot.eligible().iter().map(|&i| {
                let e = snapshot.endpoint(i);
                (i.get(), e.address(), e.weight())
            });
            build_table(only, size)
                .into_iter()
                .map(EndpointIdx::new)
                .collect()
        });
        let mut seen = vec![false; snapshot.len()];
        let distinct = table
            .iter()
            .filter(|o| !std::mem::replace(&mut seen[o.get()], true))
            .count();
        MaglevPicker {
            table,
            distinct: u32::try_from(distinct).unwrap_or(u32::MAX),
            bound: self
                .balance
                .map(|f| Bound::new(f, snapshot, |e| u64::from(e.weight()))),
            empty: snapshot.empty_error(),
        }
    }
}

/// Prepared [`Maglev`] table. Immutable after prepare.
#[derive(Debug)]
pub struct MaglevPicker {
    /// Entry → endpoint, ineligible endpoints already resolved to the next eligible entry.
    /// Empty when no endpoint is eligible.
    table: Box<[EndpointIdx]>,
    distinct: u32,
    bound: Option<Bound>,
    empty: PickError,
}

// === impl MaglevPicker ===

impl MaglevPicker {
    /// The lookup table: entry → endpoint (entries of ineligible endpoints resolved to the next
    /// eligible entry). Empty when no endpoint is eligible.
    pub fn table(&self) -> &[EndpointIdx] {
        &self.table
    }

    #[inline]
    fn hash(cx: &mut PickContext<'_>) -> u64 {
        match cx.key {
            Some(key) => xxh64(key, 0),
            None => fallback_hash(cx),
        }
    }
}

impl Picker for MaglevPicker {
    #[inline]
    fn pick(&self, cx: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> {
        if self.table.is_empty() {
            return Err(self.empty);
        }
        let start = (Self::hash(cx) % self.table.len() as u64) as usize;
        let first = self.table[start];
        if cx.probe == 0 && self.bound.as_ref().is_none_or(|b| b.is_idle(first)) {
            return Ok(first);
        }
        Ok(walk_cyclic(
            || from_slice(&self.table, start),
            first,
            cx.probe,
            self.distinct,
            self.bound.as_ref(),
        ))
    }

    fn explain(&self, idx: EndpointIdx, _now: Timestamp) -> Option<String> {
        let n = self.table.iter().filter(|&&i| i == idx).count();
        (n > 0).then(|| {
            format!(
                "{n} of {} table entries ({:.2}%)",
                self.table.len(),
                n as f64 * 100.0 / self.table.len() as f64
            )
        })
    }
}

/// One endpoint while the table is built (Envoy's `TableBuildEntry`).
struct BuildEntry {
    position: usize,
    offset: u64,
    skip: u64,
    weight: f64,
    target: f64,
    next: u64,
}

/// Maglev's population (paper listing 1) with Envoy's weighted turns. `endpoints` are
/// (position, address, weight > 0); returns the position owning each of `size` entries.
fn build_table<'a>(
    endpoints: impl Iterator<Item = (usize, &'a str, u32)>,
    size: u64,
) -> Vec<usize> {
    let mut sorted: Vec<(&str, usize, u32)> = endpoints.map(|(i, a, w)| (a, i, w)).collect();
    if sorted.is_empty() {
        return Vec::new();
    }
    // Envoy sorts by the hashed key so that the table does not depend on the hosts' order.
    sorted.sort_unstable();
    let sum: f64 = sorted.iter().map(|&(_, _, w)| f64::from(w)).sum();
    let mut entries: Vec<BuildEntry> = sorted
        .iter()
        .map(|&(address, position, w)| BuildEntry {
            position,
            offset: xxh64(address.as_bytes(), 0) % size,
            skip: xxh64(address.as_bytes(), 1) % (size - 1) + 1,
            weight: f64::from(w) / sum,
            target: 0.0,
            next: 0,
        })
        .collect();
    let max_weight = entries.iter().map(|e| e.weight).fold(0.0, f64::max);
    const FREE: usize = usize::MAX;
    let mut table = vec![FREE; size as usize];
    let mut filled = 0u64;
    let mut iteration: u32 = 1;
    while filled < size {
        for e in entries.iter_mut() {
            if filled == size {
                break;
            }
            if f64::from(iteration) * e.weight < e.target {
                continue;
            }
            e.target += max_weight;
            let mut c = (e.offset + e.skip * e.next) % size;
            while table[c as usize] != FREE {
                e.next += 1;
                c = (e.offset + e.skip * e.next) % size;
            }
            table[c as usize] = e.position;
            e.next += 1;
            filled += 1;
        }
        iteration = iteration.saturating_add(1);
    }
    table
}

/// Replace each entry of an ineligible endpoint by the next entry (cyclically) of an eligible
/// one. `None` when no entry is eligible.
fn resolve(raw: &[usize], eligible: &[bool]) -> Option<Box<[EndpointIdx]>> {
    let m = raw.len();
    let anchor = raw.iter().position(|&p| eligible[p])?;
    let mut table = vec![EndpointIdx::new(raw[anchor]); m];
    for s in 1..m {
        let j = (anchor + m - s) % m;
        table[j] = if eligible[raw[j]] {
            EndpointIdx::new(raw[j])
        } else {
            table[(j + 1) % m]
        };
    }
    Some(table.into_boxed_slice())
}

/// Trial division; table sizes are at most a few million.
fn is_prime(n: u32) -> bool {
    if n < 2 {
        return false;
    }
    let n = u64::from(n);
    (2..).take_while(|d| d * d <= n).all(|d| n % d != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primes() {
        let small: Vec<u32> = (0..30).filter(|&n| is_prime(n)).collect();
        assert_eq!(small, [2, 3, 5, 7, 11, 13, 17, 19, 23, 29]);
        assert!(is_prime(65_537) && is_prime(MAX_TABLE_SIZE) && !is_prime(65_536));
        assert!(Maglev::try_with_table_size(65_536).is_err());
        assert!(
            Maglev::try_with_table_size(5_000_101).is_err(),
            "over the limit"
        );
        assert_eq!(Maglev::try_with_table_size(251).unwrap().table_size(), 251);
    }

    #[test]
    fn xxhash64_reference_values() {
        // XXH64 of the empty input (xxHash's published sanity values).
        assert_eq!(xxh64(b"", 0), 0xef46_db37_51d8_e999);
        assert_eq!(xxh64(b"", 1), 0xd5af_ba13_36a3_be4b);
    }

    #[test]
    fn down_entries_resolve_to_the_next_eligible_entry() {
        let raw = [0, 1, 1, 2, 0, 1];
        let t = resolve(&raw, &[true, false, true]).unwrap();
        let got: Vec<usize> = t.iter().map(|i| i.get()).collect();
        assert_eq!(got, [0, 2, 2, 2, 0, 0]);
        assert!(resolve(&raw, &[false, false, false]).is_none());
    }
}
