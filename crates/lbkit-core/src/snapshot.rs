//! [`Snapshot`]: the immutable endpoint set a picker is prepared for, and [`SnapshotBuilder`],
//! which turns source updates into snapshots while keeping the live statistics of endpoints that
//! stay.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::endpoint::{Endpoint, EndpointKey, EndpointSpec};
use crate::error::PickError;
use crate::stats::{EndpointStats, DEFAULT_EWMA_DECAY};
use crate::time::Timestamp;

/// Index of an endpoint in one [`Snapshot`]; meaningless in any other snapshot.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EndpointIdx(u32);

// === impl EndpointIdx ===

impl EndpointIdx {
    /// The index as a `usize`.
    #[inline]
    pub const fn get(self) -> usize {
        self.0 as usize
    }

    /// Build an index from a position in [`Snapshot::endpoints`].
    ///
    /// # Panics
    /// When `i` exceeds `u32::MAX` (a snapshot never holds that many endpoints).
    #[inline]
    pub fn new(i: usize) -> Self {
        EndpointIdx(u32::try_from(i).expect("snapshots hold at most u32::MAX endpoints"))
    }
}

/// An immutable set of endpoints, in source order, with the subset a strategy may pick.
///
/// Endpoints keep source order (config order; registry sources sort by key), so "ties go to the
/// earlier endpoint" means what nginx and Dubbo users expect.
///
/// ```
/// use lbkit_core::{EndpointSpec, Snapshot, Timestamp};
/// let snap = Snapshot::from_specs(
///     vec![EndpointSpec::new("a:1"), EndpointSpec::new("b:1").with_healthy(false)],
///     Timestamp::ZERO,
/// );
/// assert_eq!(snap.len(), 2);
/// assert_eq!(snap.eligible().len(), 1);
/// ```
#[derive(Debug)]
pub struct Snapshot {
    version: u64,
    endpoints: Box<[Endpoint]>,
    eligible: Box<[EndpointIdx]>,
    unhealthy: u32,
    drained: u32,
}

// === impl Snapshot ===

impl Snapshot {
    /// A snapshot of `endpoints` (version 0, nothing reused). Endpoints that are down or have
    /// weight 0 are kept but not eligible.
    pub fn new(version: u64, endpoints: Vec<Endpoint>) -> Self {
        let eligible: Vec<EndpointIdx> = endpoints
            .iter()
            .enumerate()
            .filter(|(_, e)| e.is_eligible())
            .map(|(i, _)| EndpointIdx::new(i))
            .collect();
        let unhealthy = endpoints.iter().filter(|e| !e.is_healthy()).count();
        let drained = endpoints
            .iter()
            .filter(|e| e.is_healthy() && e.weight() == 0)
            .count();
        Snapshot {
            version,
            endpoints: endpoints.into_boxed_slice(),
            eligible: eligible.into_boxed_slice(),
            unhealthy: saturating_u32(unhealthy),
            drained: saturating_u32(drained),
        }
    }

    /// A snapshot built from specs with fresh statistics, all first seen at `now`.
    pub fn from_specs(specs: Vec<EndpointSpec>, now: Timestamp) -> Self {
        let endpoints = specs
            .into_iter()
            .map(|s| Endpoint::new(s, Arc::new(EndpointStats::default()), now))
            .collect();
        Snapshot::new(0, endpoints)
    }

    /// Version, increasing with every snapshot a builder makes.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// All endpoints, in source order.
    pub fn endpoints(&self) -> &[Endpoint] {
        &self.endpoints
    }

    /// The endpoint at `idx`.
    ///
    /// # Panics
    /// When `idx` comes from another, larger snapshot.
    #[inline]
    pub fn endpoint(&self, idx: EndpointIdx) -> &Endpoint {
        &self.endpoints[idx.get()]
    }

    /// Indices of the endpoints a strategy may pick (healthy, weight > 0), in source order.
    #[inline]
    pub fn eligible(&self) -> &[EndpointIdx] {
        &self.eligible
    }

    /// Number of endpoints.
    pub fn len(&self) -> usize {
        self.endpoints.len()
    }

    /// Whether there are no endpoints at all.
    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }

    /// The error a pick returns when nothing is eligible.
    pub fn empty_error(&self) -> PickError {
        if self.endpoints.is_empty() {
            PickError::NoEndpoints
        } else {
            PickError::AllIneligible {
                unhealthy: self.unhealthy,
                drained: self.drained,
            }
        }
    }

    /// Look an endpoint up by key (O(n); not for the hot path).
    pub fn find(&self, key: &EndpointKey) -> Option<EndpointIdx> {
        self.endpoints
            .iter()
            .position(|e| e.key() == key)
            .map(EndpointIdx::new)
    }
}

fn saturating_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// A change from an endpoint source (linkerd's `Update`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Update {
    /// The full set: everything not listed is removed.
    Reset(Vec<EndpointSpec>),
    /// Add these endpoints, or replace the ones with the same key (weight, metadata, health).
    Add(Vec<EndpointSpec>),
    /// Remove the endpoints with these keys.
    Remove(Vec<EndpointKey>),
}

/// Applies [`Update`]s and builds [`Snapshot`]s, keeping the [`EndpointStats`] and first-seen
/// time of every endpoint whose key stays. Not on the hot path; owned by one task.
///
/// ```
/// use std::sync::Arc;
/// use lbkit_core::{EndpointSpec, SnapshotBuilder, Timestamp, Update};
/// let mut b = SnapshotBuilder::new();
/// let s1 = b.apply(Update::Reset(vec![EndpointSpec::new("a:1")]), Timestamp::ZERO);
/// let s2 = b.apply(Update::Add(vec![EndpointSpec::new("b:1")]), Timestamp::ZERO);
/// assert_eq!(s2.version(), s1.version() + 1);
/// assert!(Arc::ptr_eq(s1.endpoints()[0].stats_arc(), s2.endpoints()[0].stats_arc()));
/// ```
#[derive(Debug)]
pub struct SnapshotBuilder {
    version: u64,
    current: Vec<Endpoint>,
    ewma_decay: Duration,
}

impl Default for SnapshotBuilder {
    fn default() -> Self {
        SnapshotBuilder::new()
    }
}

// === impl SnapshotBuilder ===

impl SnapshotBuilder {
    /// An empty builder; statistics use [`DEFAULT_EWMA_DECAY`].
    pub fn new() -> Self {
        SnapshotBuilder {
            version: 0,
            current: Vec::new(),
            ewma_decay: DEFAULT_EWMA_DECAY,
        }
    }

    /// Use `decay` as the peak-EWMA time constant for new endpoints.
    pub fn with_ewma_decay(mut self, decay: Duration) -> Self {
        self.ewma_decay = decay;
        self
    }

    /// Apply one update and build the next snapshot.
    pub fn apply(&mut self, update: Update, now: Timestamp) -> Arc<Snapshot> {
        self.apply_all(std::iter::once(update), now)
    }

    /// Apply a batch of updates and build one snapshot for all of them.
    pub fn apply_all(
        &mut self,
        updates: impl IntoIterator<Item = Update>,
        now: Timestamp,
    ) -> Arc<Snapshot> {
        let mut specs: Vec<EndpointSpec> = Vec::new();
        let mut changed_set = false;
        for update in updates {
            if !changed_set {
                specs = self.current_specs();
                changed_set = true;
            }
            apply_to(&mut specs, update);
        }
        if changed_set {
            self.current = self.rebuild(specs, now);
        }
        self.version += 1;
        Arc::new(Snapshot::new(self.version, self.current.clone()))
    }

    /// The endpoints of the last snapshot.
    pub fn current(&self) -> &[Endpoint] {
        &self.current
    }

    fn current_specs(&self) -> Vec<EndpointSpec> {
        self.current.iter().map(spec_of).collect()
    }

    fn rebuild(&self, specs: Vec<EndpointSpec>, now: Timestamp) -> Vec<Endpoint> {
        let old: HashMap<&EndpointKey, &Endpoint> =
            self.current.iter().map(|e| (e.key(), e)).collect();
        specs
            .into_iter()
            .map(|spec| match old.get(&spec.key) {
                Some(prev) => Endpoint::new(spec, prev.stats_arc().clone(), prev.added_at()),
                None => Endpoint::new(spec, Arc::new(EndpointStats::new(self.ewma_decay)), now),
            })
            .collect()
    }
}

/// Apply one update to an ordered list of specs. Keys stay unique: a later spec with a key
/// already present replaces the earlier one in place.
fn apply_to(specs: &mut Vec<EndpointSpec>, update: Update) {
    match update {
        Update::Reset(new) => {
            specs.clear();
            add_or_replace(specs, new);
        }
        Update::Add(new) => add_or_replace(specs, new),
        Update::Remove(keys) => specs.retain(|s| !keys.contains(&s.key)),
    }
}

fn add_or_replace(specs: &mut Vec<EndpointSpec>, new: Vec<EndpointSpec>) {
    let mut pos: HashMap<EndpointKey, usize> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| (s.key.clone(), i))
        .collect();
    for spec in new {
        match pos.get(&spec.key) {
            Some(&i) => specs[i] = spec,
            None => {
                pos.insert(spec.key.clone(), specs.len());
                specs.push(spec);
            }
        }
    }
}

fn spec_of(e: &Endpoint) -> EndpointSpec {
    EndpointSpec {
        key: e.key().clone(),
        address: e.address().to_owned(),
        weight: e.weight(),
        zone: e.zone().map(str::to_owned),
        metadata: e.metadata().clone(),
        registered_at: e.registered_at(),
        warmup: (e.registered_at().is_some() || !e.warmup().is_zero()).then(|| e.warmup()),
        healthy: e.is_healthy(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec(a: &str, w: u32) -> EndpointSpec {
        EndpointSpec::new(a).with_weight(w)
    }

    #[test]
    fn eligibility_and_errors() {
        let s = Snapshot::from_specs(
            vec![
                spec("a:1", 0),
                spec("b:1", 5).with_healthy(false),
                spec("c:1", 1),
            ],
            Timestamp::ZERO,
        );
        assert_eq!(s.eligible(), &[EndpointIdx::new(2)]);
        let none = Snapshot::from_specs(
            vec![spec("a:1", 0), spec("b:1", 5).with_healthy(false)],
            Timestamp::ZERO,
        );
        assert_eq!(
            none.empty_error(),
            PickError::AllIneligible {
                unhealthy: 1,
                drained: 1
            }
        );
        assert_eq!(
            Snapshot::from_specs(vec![], Timestamp::ZERO).empty_error(),
            PickError::NoEndpoints
        );
    }

    #[test]
    fn builder_keeps_stats_and_first_seen_time_of_staying_keys() {
        let mut b = SnapshotBuilder::new();
        let s1 = b.apply(
            Update::Reset(vec![spec("a:1", 1), spec("b:1", 1)]),
            Timestamp::from_millis(1),
        );
        let s2 = b.apply_all(
            [
                Update::Add(vec![spec("a:1", 7), spec("c:1", 1)]),
                Update::Remove(vec![EndpointKey::from("b:1")]),
            ],
            Timestamp::from_millis(2),
        );
        let addrs: Vec<_> = s2
            .endpoints()
            .iter()
            .map(|e| (e.address(), e.weight()))
            .collect();
        assert_eq!(addrs, vec![("a:1", 7), ("c:1", 1)]);
        assert!(Arc::ptr_eq(
            s1.endpoints()[0].stats_arc(),
            s2.endpoints()[0].stats_arc()
        ));
        assert_eq!(s2.endpoints()[0].added_at(), Timestamp::from_millis(1));
        assert_eq!(s2.endpoints()[1].added_at(), Timestamp::from_millis(2));
        // A key that leaves and comes back starts fresh.
        let s3 = b.apply(Update::Add(vec![spec("b:1", 1)]), Timestamp::from_millis(3));
        assert!(!Arc::ptr_eq(
            s1.endpoints()[1].stats_arc(),
            s3.endpoints()[2].stats_arc()
        ));
    }

    proptest! {
        /// Stateful run of random updates: keys stay unique, and every key present in two
        /// consecutive snapshots shares one stats object.
        #[test]
        fn builder_invariants(ops in proptest::collection::vec((0u8..3, proptest::collection::vec(0u8..8, 0..5)), 1..30)) {
            let mut b = SnapshotBuilder::new();
            let mut prev = b.apply(Update::Reset(vec![]), Timestamp::ZERO);
            for (kind, keys) in ops {
                let specs: Vec<_> = keys.iter().map(|k| spec(&format!("h{k}:1"), u32::from(*k))).collect();
                let update = match kind {
                    0 => Update::Reset(specs),
                    1 => Update::Add(specs),
                    _ => Update::Remove(keys.iter().map(|k| EndpointKey::from(format!("h{k}:1"))).collect()),
                };
                let next = b.apply(update, Timestamp::ZERO);
                let mut seen = std::collections::HashSet::new();
                for e in next.endpoints() {
                    prop_assert!(seen.insert(e.key().clone()), "duplicate key");
                    if let Some(i) = prev.find(e.key()) {
                        prop_assert!(Arc::ptr_eq(prev.endpoint(i).stats_arc(), e.stats_arc()));
                    }
                }
                prop_assert!(next.version() > prev.version());
                prev = next;
            }
        }
    }
}
