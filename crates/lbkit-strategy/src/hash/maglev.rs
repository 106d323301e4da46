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
//!   entry) plus O(n log n) sorting, 1.2–1.3 ms at 65 537 entries and 10 000 endpoints. The walks
//!   step by additions over a bitmap of the entries taken (8 KiB at 65 537), and the last 128
//!   free entries, where a walk would cost `M / free` probes a claim, go to the endpoint whose
//!   permutation reaches them first, `(entry − at) · skip⁻¹ mod M` steps on (a unit test checks
//!   the table against the listing's one-division-a-probe form); pick O(1): one xxHash64 of the key (or
//!   none, with a caller's hash) and one table read; memory 4 bytes per entry (256 KiB by
//!   default). Keep `M` above 100 × endpoints for shares within about 1% (paper §5.3).
//! * **A change**: the table is built again, O(M log M) (1.24 ms at 10 000 endpoints and M =
//!   65 537, 1.80 ms before the bitmap and the tail; BENCHMARKS.md, "What a change costs a
//!   strategy"): endpoints take entries in turns, so
//!   one endpoint more or less shifts whose turn fills which entry everywhere after its first one;
//!   the paper bounds the entries that move, not where they are. What feeds the build is carried
//!   over ([`Strategy::prepare_next`]): the last table keeps its endpoints' permutations,
//!   weights and address order, so the endpoints that are the same objects are not read again
//!   (a cache miss each, across a fleet), and only the k new and changed ones are hashed and
//!   placed by binary search, O(n) dense copies plus O(k log n) reads. It is built on the
//!   publisher's thread; picks keep the last table until the new one is swapped in.
//!   **While changes come faster than the rebuild interval** (100 ms in the catalog's
//!   `maglev`, which the proxy and the `Pool` run; none for [`Maglev::new`], which builds on
//!   every change, as Envoy: [`Maglev::with_rebuild_interval`]), a change within the interval
//!   of the last build patches the last table instead, O(M + n), 0.19 ms against 1.3 ms for a
//!   build at 10 000 endpoints (`maglev/patch.rs`): the entries of endpoints gone, down or
//!   drained go to the next entry of one still there, a new endpoint waits for the build,
//!   which the balancer's next tick from the interval's end makes ([`Picker::refresh_at`]), or
//!   the next change after it. An endpoint back from down or from weight 0, or new endpoints
//!   of more than a tenth of the weight kept, have the table built at once. Under
//!   a fleet's churn (100 changes a second) this builds about ten tables a second instead of a
//!   hundred: the proxy's CPU following 10 000 providers at 1 %/s went from 19.4 % to 8.7 % of
//!   a core (BENCHMARKS.md, "Maglev under churn: the last table patched between builds").
//! * **Behaviour under trouble**: blind to load unless `balance_factor` is set (bounds are
//!   weighted). The table is built over every endpoint with weight > 0, healthy or not; an entry of
//!   a down endpoint is resolved, at prepare, to the next entry of an eligible one, so keys of
//!   healthy endpoints never move when another goes down, and a pick stays O(1). A rejected
//!   candidate makes the pick walk on to the next table entries' distinct endpoints. Weights are
//!   the configured ones (warm-up would reshuffle the table every second); a weight change,
//!   draining to 0 included, moves a few keys of other endpoints too once the table is built
//!   (Maglev's disruption is small, not minimal: paper §5.3); within the rebuild interval the
//!   drained endpoint's entries go to the next entries' endpoints first.
//! * **Differences from the origin**: Envoy builds the table over healthy hosts only, so a
//!   health change moves some keys of healthy hosts too; lbkit keeps them. Envoy retries by
//!   mutating the hash (`hash ^ (~0 − attempt + 1)`); lbkit walks to the next entries. A built
//!   table equals Envoy's for the same addresses and weights while all are healthy (not
//!   checked against a running Envoy); a patched one (within the rebuild interval) differs
//!   until the next build. Without a key, [`PickContext::hash`](lbkit_core::PickContext::hash)
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
use std::time::Duration;

use lbkit_core::{
    diff, EndpointIdx, PickContext, PickError, Picker, Snapshot, Strategy, Timestamp,
};
use xxhash_rust::xxh64::xxh64;

use super::bounded::{BalanceFactor, Bound};
use super::fallback_hash;
use super::walk::{from_slice, walk_cyclic};

/// Default table size: the paper's recommendation (§5.3) and Envoy's default; prime.
pub const DEFAULT_TABLE_SIZE: u32 = 65_537;

/// Largest table size accepted (Envoy's limit; prime).
pub const MAX_TABLE_SIZE: u32 = 5_000_011;

/// The [rebuild interval](Maglev::with_rebuild_interval) of the catalog's `maglev` unless its
/// `rebuild_interval_ms` says otherwise: what `lbkit proxy`, the tower `Pool` and the simulator
/// run with. They tick their balancers, which a patched table needs ([`Picker::refresh_at`]);
/// [`Maglev::new`] has none, so a balancer that is never ticked keeps Envoy's table. The
/// catalog's rings take the same parameter, off unless set
/// ([`ConsistentHash::with_rebuild_interval`](crate::ConsistentHash::with_rebuild_interval)).
pub const TICKED_REBUILD_INTERVAL: Duration = Duration::from_millis(100);

mod patch;

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
    rebuild: Duration,
}

impl Default for Maglev {
    fn default() -> Self {
        Maglev::new()
    }
}

// === impl Maglev ===

impl Maglev {
    /// A table of [`DEFAULT_TABLE_SIZE`] entries, no load bound, built on every change.
    pub fn new() -> Self {
        Maglev {
            table_size: DEFAULT_TABLE_SIZE,
            balance: None,
            rebuild: Duration::ZERO,
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
            ..Maglev::new()
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

    /// Build the table at most once per `every` while changes come faster, and patch it in
    /// between (`Duration::ZERO`, the default: build it on every change, as Envoy does; the
    /// catalog's `maglev` takes [`TICKED_REBUILD_INTERVAL`]). Only for a balancer that is
    /// ticked ([`Balancer::tick`](lbkit_core::Balancer::tick)), as `lbkit_discovery`'s
    /// `Publisher` (with the controller's `refresh` set) and every lbkit driver tick theirs:
    /// a patched table is built at the first tick after the interval, or at the next change.
    ///
    /// A change that comes within `every` of the last build keeps the last table with its
    /// entries moved to the endpoints' new positions: the entries of endpoints gone, drained
    /// to weight 0 or down go to the next entry of one still there (as a down endpoint's do),
    /// and the endpoints new to the set take no keys yet. The picker then asks to be built
    /// again at the interval's end ([`Picker::refresh_at`]), which the
    /// [`Balancer`](lbkit_core::Balancer)'s next tick does. An endpoint back from down or from
    /// weight 0 always has the table built at once, so its keys come back at once. A patch
    /// costs one pass over the table and a few over the endpoints (0.19 ms at 65 537 entries
    /// and 10 000 endpoints, against 1.3 ms for a build).
    ///
    /// ```
    /// use std::time::Duration;
    /// use lbkit_strategy::Maglev;
    /// let coalescing = Maglev::new().with_rebuild_interval(Duration::from_millis(100));
    /// assert_eq!(coalescing.rebuild_interval(), Duration::from_millis(100));
    /// assert_eq!(Maglev::new().rebuild_interval(), Duration::ZERO);
    /// ```
    pub fn with_rebuild_interval(mut self, every: Duration) -> Self {
        self.rebuild = every;
        self
    }

    /// See [`with_rebuild_interval`](Self::with_rebuild_interval).
    pub fn rebuild_interval(&self) -> Duration {
        self.rebuild
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

    fn prepare(&self, snapshot: &Arc<Snapshot>, now: Timestamp) -> MaglevPicker {
        let weighted = snapshot
            .endpoints()
            .iter()
            .enumerate()
            .filter(|(_, e)| e.weight() > 0)
            .map(|(i, e)| (e.address(), i, e.weight()))
            .collect();
        self.picker(snapshot, seeds_of(weighted, self.table_size), now)
    }

    /// The table built again, from the last one's seeds: the endpoints that are the same
    /// objects keep their permutations and weights without being read, only the new and
    /// changed ones are hashed, and they join the address order by binary search. Within the
    /// [rebuild interval](Maglev::with_rebuild_interval) of the last build, the last table
    /// patched instead.
    fn prepare_next(
        &self,
        last_snapshot: &Arc<Snapshot>,
        last: &MaglevPicker,
        snapshot: &Arc<Snapshot>,
        now: Timestamp,
    ) -> MaglevPicker {
        let Some(carried) = last.carry(last_snapshot, snapshot, self.table_size) else {
            return self.prepare(snapshot, now);
        };
        let due = last.built_at.saturating_add(self.rebuild);
        if self.rebuild.is_zero() || now >= due {
            return self.picker(snapshot, carried.seeds, now);
        }
        match self.patched(last, last_snapshot, snapshot, carried, due) {
            Ok(patched) => patched,
            Err(seeds) => self.picker(snapshot, seeds, now),
        }
    }
}

impl Maglev {
    /// The picker of `snapshot` whose endpoints of positive weight are `seeds`, built at `now`.
    fn picker(&self, snapshot: &Arc<Snapshot>, seeds: Vec<Seed>, now: Timestamp) -> MaglevPicker {
        let size = self.table_size;
        let raw = build_table(&seeds, size);
        let mut eligible = vec![false; snapshot.len()];
        snapshot
            .eligible()
            .iter()
            .for_each(|i| eligible[i.get()] = true);
        let table = resolve(raw, &eligible).unwrap_or_else(|| {
            // No entry belongs to an eligible endpoint (more endpoints than entries): a table of
            // the eligible endpoints alone.
            let only = snapshot.eligible().iter().map(|&i| {
                let e = snapshot.endpoint(i);
                (e.address(), i.get(), e.weight())
            });
            build_table(&seeds_of(only.collect(), size), size)
                .into_iter()
                .map(|p| EndpointIdx::new(p as usize))
                .collect()
        });
        let mut holds = vec![false; snapshot.len()].into_boxed_slice();
        table.iter().for_each(|o| holds[o.get()] = true);
        let (built_at, refresh_at) = (now, None);
        self.assemble(snapshot, table, holds, seeds, built_at, refresh_at)
    }

    /// The picker of `snapshot` with `table`, whose entries the endpoints in `holds` own,
    /// built from `seeds`.
    fn assemble(
        &self,
        snapshot: &Arc<Snapshot>,
        table: Box<[EndpointIdx]>,
        holds: Box<[bool]>,
        seeds: Vec<Seed>,
        built_at: Timestamp,
        refresh_at: Option<Timestamp>,
    ) -> MaglevPicker {
        let distinct = holds.iter().filter(|&&h| h).count();
        // Bounds over the endpoints that own entries: one new to a patched table takes no load.
        let weight = |e: &lbkit_core::Endpoint| u64::from(e.weight());
        let bound =
            (self.balance).map(|f| Bound::holding(f, snapshot, weight, holds.iter().copied()));
        MaglevPicker {
            table,
            holds,
            distinct: u32::try_from(distinct).unwrap_or(u32::MAX),
            bound,
            empty: snapshot.empty_error(),
            seeds: seeds.into_boxed_slice(),
            size: self.table_size,
            of: snapshot.len(),
            built_at,
            refresh_at,
        }
    }
}

/// Prepared [`Maglev`] table. Immutable after prepare.
#[derive(Debug)]
pub struct MaglevPicker {
    /// Entry → endpoint, ineligible endpoints already resolved to the next eligible entry.
    /// Empty when no endpoint is eligible.
    table: Box<[EndpointIdx]>,
    /// Which endpoints own entries.
    holds: Box<[bool]>,
    /// How many do.
    distinct: u32,
    bound: Option<Bound>,
    empty: PickError,
    /// The endpoints of positive weight the table was built from, in address order.
    seeds: Box<[Seed]>,
    /// Entries the table was built with.
    size: u32,
    /// Endpoints in the snapshot it was prepared for.
    of: usize,
    /// When the table was last built (rather than patched).
    built_at: Timestamp,
    /// When a patched table asks to be built: the rebuild interval's end.
    refresh_at: Option<Timestamp>,
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

impl MaglevPicker {
    /// The seeds of `next` from this table's, made for `last`: the endpoints that are the same
    /// objects in both carried over (their positions in `next`), the new and changed ones of
    /// positive weight hashed and put in their places. `None` when the sets cannot be matched
    /// ([`diff::between`]) or this picker was not made for `last` with `size` entries.
    fn carry(&self, last: &Snapshot, next: &Snapshot, size: u32) -> Option<Carried> {
        if self.size != size || self.of != last.len() {
            return None;
        }
        let d = diff::between(last.endpoints(), next.endpoints(), None)?;
        let mut now: Vec<u32> = (d.pairs(last.len(), next.len()))
            .map(|p| p.and_then(|at| u32::try_from(at).ok()).unwrap_or(GONE))
            .collect();
        let carried = self.seeds.iter().filter_map(|s| {
            let at = *now.get(s.position as usize)?;
            (at != GONE).then_some(Seed { position: at, ..*s })
        });
        let carried = carried.collect();
        let fresh = d.changed.iter().filter_map(|&(i, _)| {
            let e = next.endpoints().get(i)?;
            (e.weight() > 0).then(|| (e.address(), i, e.weight()))
        });
        let seeds = merge(carried, seeds_of(fresh.collect(), size), next);
        // A changed endpoint keeps its key's entries until the next build.
        for &(at, was) in &d.changed {
            if let (Some(was), Ok(at)) = (was, u32::try_from(at)) {
                now[was] = at;
            }
        }
        Some(Carried { seeds, now })
    }
}

/// What a table carries over to the next snapshot's: the next seeds, and where each endpoint
/// of the last snapshot is in the next one (by key), or [`GONE`].
struct Carried {
    seeds: Vec<Seed>,
    now: Vec<u32>,
}

/// An endpoint of the last snapshot whose key the next one lacks.
const GONE: u32 = u32::MAX;

/// `carried` and `fresh` (each in address order, positions in `next`) in one address order.
fn merge(carried: Vec<Seed>, fresh: Vec<Seed>, next: &Snapshot) -> Vec<Seed> {
    if fresh.is_empty() {
        return carried;
    }
    let key = |s: &Seed| {
        (
            next.endpoint(EndpointIdx::new(s.position as usize))
                .address(),
            s.position,
        )
    };
    let mut out = Vec::with_capacity(carried.len() + fresh.len());
    let mut rest = &carried[..];
    for f in fresh {
        let k = key(&f);
        let before = rest.partition_point(|c| key(c) < k);
        out.extend_from_slice(&rest[..before]);
        out.push(f);
        rest = &rest[before..];
    }
    out.extend_from_slice(rest);
    out
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

    fn refresh_at(&self) -> Option<Timestamp> {
        self.refresh_at
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

/// One endpoint while the table is built (Envoy's `TableBuildEntry`). `at` is the entry its
/// permutation is on, `(offset + skip · next) mod M`, stepped by additions instead of computed
/// with a division each probe; `inverse` is `skip⁻¹ mod M` once the tail needs it (0 before).
struct BuildEntry {
    position: u32,
    at: u32,
    skip: u32,
    inverse: u32,
    weight: f64,
    target: f64,
}

// === impl BuildEntry ===

impl BuildEntry {
    /// The entries of `seeds`, weights normalized by their sum (in `f64`, in address order, as
    /// Envoy sums them).
    fn all(seeds: &[Seed]) -> Vec<BuildEntry> {
        let sum: f64 = seeds.iter().map(|s| f64::from(s.weight)).sum();
        seeds
            .iter()
            .map(|s| BuildEntry {
                position: s.position,
                at: s.offset,
                skip: s.skip,
                inverse: 0,
                weight: f64::from(s.weight) / sum,
                target: 0.0,
            })
            .collect()
    }

    /// Claim the first entry of the permutation from `at` on that `taken` does not hold, and
    /// step past it; returns the entry.
    #[inline]
    fn claim(&mut self, taken: &mut Taken, size: u32) -> u32 {
        let mut at = self.at;
        while taken.has(at) {
            at = wrap(at + self.skip, size);
        }
        taken.put(at);
        self.at = wrap(at + self.skip, size);
        at
    }

    /// [`claim`](Self::claim) when only the entries in `free` are left: the one the permutation
    /// reaches first is the one fewest steps from `at`, `(entry − at) · skip⁻¹ mod M`.
    fn claim_last(&mut self, free: &mut Vec<u32>, size: u32) -> u32 {
        if self.inverse == 0 {
            self.inverse = inverse_mod(self.skip, size);
        }
        let (m, inverse) = (u64::from(size), u64::from(self.inverse));
        let steps = |&entry: &u32| u64::from(wrap(entry + size - self.at, size)) * inverse % m;
        let (i, _) = free
            .iter()
            .enumerate()
            .min_by_key(|(_, e)| steps(e))
            .expect("a claim with the table full");
        let entry = free.swap_remove(i);
        self.at = wrap(entry + self.skip, size);
        entry
    }
}

/// `x mod size` for `x < 2 · size` (an entry plus a skip or an entry: both below
/// `size ≤ MAX_TABLE_SIZE`, so the sum does not overflow either).
#[inline]
fn wrap(x: u32, size: u32) -> u32 {
    if x >= size {
        x - size
    } else {
        x
    }
}

/// `x⁻¹ mod p` for a prime `p` and `0 < x < p` (extended Euclid).
fn inverse_mod(x: u32, p: u32) -> u32 {
    let (mut r0, mut r1) = (i64::from(p), i64::from(x));
    let (mut t0, mut t1) = (0i64, 1i64);
    while r1 != 0 {
        let q = r0 / r1;
        (r0, r1) = (r1, r0 - q * r1);
        (t0, t1) = (t1, t0 - q * t1);
    }
    t0.rem_euclid(i64::from(p)) as u32
}

/// The entries claimed so far, one bit each: the probes read 8 KiB at the default size instead
/// of the 256 KiB table.
struct Taken(Vec<u64>);

// === impl Taken ===

impl Taken {
    fn new(size: u32) -> Self {
        Taken(vec![0; (size as usize).div_ceil(64)])
    }

    #[inline]
    fn has(&self, at: u32) -> bool {
        self.0[(at >> 6) as usize] & (1 << (at & 63)) != 0
    }

    #[inline]
    fn put(&mut self, at: u32) {
        self.0[(at >> 6) as usize] |= 1 << (at & 63);
    }

    /// The entries below `size` not held.
    fn free(&self, size: u32) -> Vec<u32> {
        (0..size).filter(|&at| !self.has(at)).collect()
    }
}

/// A free table entry while the table is built.
const FREE: u32 = u32::MAX;

/// Free entries left when claims stop walking permutations and pick among the free entries
/// instead: a walk costs `M / free` probes a claim, the choice `free` multiplications.
const TAIL: u32 = 128;

/// One endpoint of positive weight as a table is built from it, and as the next table carries
/// it over: its position in the snapshot, its configured weight and its permutation.
#[derive(Clone, Copy, Debug)]
struct Seed {
    position: u32,
    weight: u32,
    offset: u32,
    skip: u32,
}

/// The seeds of `endpoints` (address, position, weight > 0), sorted by address (Envoy sorts
/// them so that the table does not depend on the hosts' order), with their permutations.
fn seeds_of(mut endpoints: Vec<(&str, usize, u32)>, size: u32) -> Vec<Seed> {
    endpoints.sort_unstable();
    let m = u64::from(size);
    endpoints
        .iter()
        .map(|&(address, position, weight)| Seed {
            position: u32::try_from(position).unwrap_or(FREE - 1),
            weight,
            offset: (xxh64(address.as_bytes(), 0) % m) as u32,
            skip: (xxh64(address.as_bytes(), 1) % (m - 1) + 1) as u32,
        })
        .collect()
}

/// Maglev's population (paper listing 1) with Envoy's weighted turns over `seeds` (in address
/// order); returns the position owning each of `size` entries. `size` is at most
/// [`MAX_TABLE_SIZE`].
fn build_table(seeds: &[Seed], size: u32) -> Vec<u32> {
    if seeds.is_empty() {
        return Vec::new();
    }
    let mut entries = BuildEntry::all(seeds);
    let max_weight = entries.iter().map(|e| e.weight).fold(0.0, f64::max);
    let mut table = vec![FREE; size as usize];
    let mut taken = Taken::new(size);
    // The last `TAIL` free entries, once the table is that full (empty before).
    let mut free = Vec::new();
    let mut filled = 0u32;
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
            let entry = if size - filled > TAIL {
                e.claim(&mut taken, size)
            } else {
                if free.is_empty() {
                    free = taken.free(size);
                }
                e.claim_last(&mut free, size)
            };
            table[entry as usize] = e.position;
            filled += 1;
        }
        iteration = iteration.saturating_add(1);
    }
    table
}

/// Replace each entry of an ineligible endpoint by the next entry (cyclically) of an eligible
/// one. `None` when no entry is eligible.
fn resolve(raw: Vec<u32>, eligible: &[bool]) -> Option<Box<[EndpointIdx]>> {
    let owner = |p: u32| EndpointIdx::new(p as usize);
    if eligible.iter().all(|&e| e) {
        // Converted where it lies (an index is a `u32`): no second table allocated.
        let table: Vec<EndpointIdx> = raw.into_iter().map(owner).collect();
        return (!table.is_empty()).then(|| table.into_boxed_slice());
    }
    let anchor = raw.iter().position(|&p| eligible[p as usize])?;
    let mut table = vec![owner(raw[anchor]); raw.len()];
    // Backwards from the anchor, cyclically: `next` is the resolved entry after `j`.
    let mut next = table[anchor];
    for j in (0..anchor).rev().chain((anchor + 1..raw.len()).rev()) {
        if eligible[raw[j] as usize] {
            next = owner(raw[j]);
        }
        table[j] = next;
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

    /// The population as the paper's listing and Envoy write it, one division a probe: the
    /// model `build_table` is checked against.
    fn reference_table(endpoints: &[(usize, &str, u32)], size: u64) -> Vec<usize> {
        let mut sorted: Vec<(&str, usize, u32)> =
            endpoints.iter().map(|&(i, a, w)| (a, i, w)).collect();
        if sorted.is_empty() {
            return Vec::new();
        }
        sorted.sort_unstable();
        let sum: f64 = sorted.iter().map(|&(_, _, w)| f64::from(w)).sum();
        // (position, offset, skip, weight, target, next)
        let mut entries: Vec<(usize, u64, u64, f64, f64, u64)> = sorted
            .iter()
            .map(|&(a, i, w)| {
                let offset = xxh64(a.as_bytes(), 0) % size;
                let skip = xxh64(a.as_bytes(), 1) % (size - 1) + 1;
                (i, offset, skip, f64::from(w) / sum, 0.0, 0)
            })
            .collect();
        let max_weight = entries.iter().map(|e| e.3).fold(0.0, f64::max);
        let mut table = vec![usize::MAX; size as usize];
        let (mut filled, mut iteration) = (0u64, 1u32);
        while filled < size {
            for e in entries.iter_mut() {
                if filled == size {
                    break;
                }
                if f64::from(iteration) * e.3 < e.4 {
                    continue;
                }
                e.4 += max_weight;
                let mut c = (e.1 + e.2 * e.5) % size;
                while table[c as usize] != usize::MAX {
                    e.5 += 1;
                    c = (e.1 + e.2 * e.5) % size;
                }
                table[c as usize] = e.0;
                e.5 += 1;
                filled += 1;
            }
            iteration += 1;
        }
        table
    }

    /// Resolution entry by entry: an eligible entry is kept, any other takes the first eligible
    /// one after it, cyclically.
    fn reference_resolve(raw: &[usize], eligible: &[bool]) -> Option<Vec<usize>> {
        raw.iter().any(|&p| eligible[p]).then(|| {
            (0..raw.len())
                .map(|j| {
                    (0..raw.len())
                        .map(|s| raw[(j + s) % raw.len()])
                        .find(|&p| eligible[p])
                        .unwrap_or(usize::MAX)
                })
                .collect()
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 64,
            rng_seed: proptest::test_runner::RngSeed::Fixed(2016),
            ..proptest::prelude::ProptestConfig::default()
        })]

        #[test]
        fn tables_equal_the_reference_population(
            weights in proptest::collection::vec(1u32..6, 1..40),
            down in proptest::collection::vec(proptest::bool::weighted(0.3), 40),
            size in proptest::sample::select(vec![2u32, 3, 7, 13, 251, 1_009, 65_537]),
        ) {
            let addresses: Vec<String> =
                (0..weights.len()).map(|i| format!("10.0.{}.{}:20880", i % 7, i)).collect();
            let endpoints: Vec<(usize, &str, u32)> = addresses
                .iter()
                .zip(&weights)
                .enumerate()
                .map(|(i, (a, &w))| (i, a.as_str(), w))
                .collect();
            let by_address = endpoints.iter().map(|&(i, a, w)| (a, i, w)).collect();
            let raw = build_table(&seeds_of(by_address, size), size);
            let want = reference_table(&endpoints, u64::from(size));
            let got: Vec<usize> = raw.iter().map(|&p| p as usize).collect();
            proptest::prop_assert_eq!(&got, &want);
            let eligible: Vec<bool> = (0..weights.len()).map(|i| !down[i]).collect();
            let resolved = resolve(raw, &eligible)
                .map(|t| t.iter().map(|i| i.get()).collect::<Vec<_>>());
            proptest::prop_assert_eq!(resolved, reference_resolve(&want, &eligible));
        }
    }

    /// A chain of sets, each table prepared from the last one's seeds (no rebuild interval:
    /// every table is built), equals the table built from scratch: endpoints coming and going
    /// (addresses in no order of their keys), weights changing, draining to 0 and coming back,
    /// health flipping, at two table sizes.
    #[test]
    fn tables_prepared_from_the_last_equal_rebuilt_ones() {
        use lbkit_core::{EndpointSpec, FastRng, SnapshotBuilder};
        use std::borrow::Cow;
        use std::collections::BTreeMap;
        // Keys ascend with `p`; addresses do not (the last octet runs backwards), and every
        // sixth endpoint shares the address of the one before it under a key of its own.
        let spec = |p: u32, (w, up): (u32, bool)| {
            let q = if p % 6 == 5 { p - 1 } else { p };
            EndpointSpec::new(format!("10.{}.0.{}:20880", q % 7, 250 - q))
                .with_key(format!("k{p:04}"))
                .with_weight(w)
                .with_healthy(up)
        };
        let mut rng = FastRng::seed_from_u64(2016);
        for size in [251, DEFAULT_TABLE_SIZE] {
            let strategy = Maglev::try_with_table_size(size)
                .unwrap()
                .with_rebuild_interval(Duration::ZERO);
            let mut set: BTreeMap<u32, (u32, bool)> = (0..40).map(|p| (p * 5, (1, true))).collect();
            let specs = |set: &BTreeMap<u32, (u32, bool)>| -> Vec<EndpointSpec> {
                set.iter().map(|(&p, &v)| spec(p, v)).collect()
            };
            let mut b = SnapshotBuilder::new();
            let mut last = b.reset_from(specs(&set).iter().map(Cow::Borrowed), Timestamp::ZERO);
            let mut picker = strategy.prepare(&last, Timestamp::ZERO);
            for round in 0..30 {
                for _ in 0..1 + round % 4 {
                    let p = rng.below(200) as u32;
                    let now = match set.get(&p).copied() {
                        Some((w, up)) if rng.below(3) == 0 => Some(((w + 1) % 4, up)),
                        Some((w, up)) if rng.below(2) == 0 => Some((w, !up)),
                        Some(_) => None,
                        None => Some((1 + rng.below(3) as u32, true)),
                    };
                    match now {
                        Some(v) => set.insert(p, v),
                        None => set.remove(&p),
                    };
                }
                let next = b.reset_from(specs(&set).iter().map(Cow::Borrowed), Timestamp::ZERO);
                picker = strategy.prepare_next(&last, &picker, &next, Timestamp::ZERO);
                let rebuilt = strategy.prepare(&next, Timestamp::ZERO);
                assert_eq!(
                    picker.table(),
                    rebuilt.table(),
                    "size {size}, round {round}"
                );
                assert_eq!(
                    picker.distinct, rebuilt.distinct,
                    "size {size}, round {round}"
                );
                last = next;
            }
        }
    }

    /// A table prepared from one of another size is built from scratch.
    #[test]
    fn a_table_of_another_size_is_not_carried_over() {
        let specs = (0..50)
            .map(|i| lbkit_core::EndpointSpec::new(format!("10.0.0.{i}:80")))
            .collect();
        let s = Arc::new(Snapshot::from_specs(specs, Timestamp::ZERO));
        let (small, large) = (Maglev::try_with_table_size(251).unwrap(), Maglev::new());
        let last = large.prepare(&s, Timestamp::ZERO);
        let next = small.prepare_next(&s, &last, &s, Timestamp::ZERO);
        assert_eq!(next.table(), small.prepare(&s, Timestamp::ZERO).table());
        assert_eq!(next.table().len(), 251);
    }

    /// The largest table Envoy allows equals the listing's population too.
    #[test]
    fn the_largest_table_equals_the_reference_population() {
        let endpoints = [(0, "a:1", 1), (1, "b:1", 2), (2, "c:1", 3)];
        let by_address = endpoints.iter().map(|&(i, a, w)| (a, i, w)).collect();
        let raw = build_table(&seeds_of(by_address, MAX_TABLE_SIZE), MAX_TABLE_SIZE);
        let want = reference_table(&endpoints, u64::from(MAX_TABLE_SIZE));
        assert!(raw.iter().zip(&want).all(|(&a, &b)| a as usize == b));
        assert_eq!(raw.len(), want.len());
    }

    #[test]
    fn down_entries_resolve_to_the_next_eligible_entry() {
        let raw = [0, 1, 1, 2, 0, 1];
        let t = resolve(raw.to_vec(), &[true, false, true]).unwrap();
        let got: Vec<usize> = t.iter().map(|i| i.get()).collect();
        assert_eq!(got, [0, 2, 2, 2, 0, 0]);
        assert!(resolve(raw.to_vec(), &[false, false, false]).is_none());
    }
}
