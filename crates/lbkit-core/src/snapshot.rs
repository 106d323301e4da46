//! [`Snapshot`]: the immutable endpoint set a picker is prepared for, and [`SnapshotBuilder`],
//! which turns source updates into snapshots while keeping the live statistics of endpoints that
//! stay.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use crate::endpoint::{Endpoint, EndpointKey, EndpointSpec};
use crate::error::PickError;
use crate::live::LiveStats;
use crate::policy::{HealthOverlay, SnapshotPolicy};
use crate::stats::{EndpointStats, DEFAULT_EWMA_DECAY};
use crate::time::Timestamp;

mod endpoints;

use endpoints::Tally;
pub use endpoints::{Endpoints, EndpointsIter};

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
    // Shared with the restrictions of this snapshot a tag table prepares (a restriction copies
    // only its eligibility) and with the snapshots derived from it under another policy; its
    // parts with the builder's next snapshots, as far as they stay unchanged.
    endpoints: Endpoints,
    eligible: Box<[EndpointIdx]>,
    // Per endpoint, indexed like `endpoints`. Each line belongs to the endpoint's stats, which
    // `endpoints` keeps alive: a dense index so a pick reads no `Endpoint` at all.
    live: Arc<[&'static LiveStats]>,
    // Per endpoint, indexed like `endpoints`; immutable.
    is_eligible: Box<[bool]>,
    /// `None` when no endpoint is ejected.
    ejected_until: Option<Arc<[Option<Timestamp>]>>,
    /// Start of each endpoint's slow-start ramp (present only with a slow-start policy).
    ramp_from: Option<Arc<[Timestamp]>>,
    policy: SnapshotPolicy,
    panic: bool,
    /// 0 for a whole snapshot; for a restriction, an id of the set (see [`scope`](Self::scope)).
    scope: u64,
    /// A deterministic aperture's coverage of each endpoint, when it covers some members
    /// partly (see [`coverage`](Self::coverage)).
    coverage: Option<Arc<[u32]>>,
    unhealthy: u32,
    drained: u32,
    ejected: u32,
    /// Endpoints whose metadata carries tags or a tag rule ([`Endpoint::is_tagged`]).
    tagged: u32,
    /// The end of the latest warm-up window of an endpoint with weight (eligible or not):
    /// no endpoint is warming at or after it ([`any_ramping`](Self::any_ramping)).
    warm_until: Timestamp,
    /// Whether its endpoints have more than one priority ([`Endpoint::priority`]).
    tiered: bool,
    /// Whether its endpoints are known to be in strictly ascending key order (a builder's
    /// snapshot of a set in key order); `false` when unknown.
    in_key_order: bool,
}

// === impl Snapshot ===

impl Snapshot {
    /// A snapshot of `endpoints` with no policy: endpoints that are down or have weight 0 are
    /// kept but not eligible.
    pub fn new(version: u64, endpoints: Vec<Endpoint>) -> Self {
        Snapshot::with_policy(
            version,
            endpoints,
            &SnapshotPolicy::default(),
            &HealthOverlay::default(),
        )
    }

    /// A snapshot of `endpoints` under `policy`, with the ejections and readmissions of
    /// `overlay` (keys not in `endpoints` are ignored).
    pub fn with_policy(
        version: u64,
        endpoints: Vec<Endpoint>,
        policy: &SnapshotPolicy,
        overlay: &HealthOverlay,
    ) -> Self {
        Snapshot::over(version, Endpoints::from(endpoints), policy, overlay)
    }

    /// [`with_policy`](Self::with_policy) over endpoints already shared (another snapshot's,
    /// or a builder's).
    fn over(
        version: u64,
        endpoints: Endpoints,
        policy: &SnapshotPolicy,
        overlay: &HealthOverlay,
    ) -> Self {
        let facts = Facts::of(&endpoints, overlay);
        Snapshot::assemble(version, endpoints, facts, policy, overlay)
    }

    /// The snapshot of `endpoints` from what was read of them ([`Facts`]): the rest works on
    /// the dense arrays it filled.
    fn assemble(
        version: u64,
        endpoints: Endpoints,
        facts: Facts,
        policy: &SnapshotPolicy,
        overlay: &HealthOverlay,
    ) -> Self {
        let t = facts.tally;
        let panic = policy.panic_threshold > 0.0
            && t.weighted > 0
            && (t.serving as f64) < policy.panic_threshold * t.weighted as f64;
        let want = if panic {
            Tally::WEIGHTED
        } else {
            Tally::SERVING
        };
        let is_eligible: Box<[bool]> = facts.flags.iter().map(|f| f & want != 0).collect();
        let eligible = (0..endpoints.len())
            .filter(|&i| is_eligible[i])
            .map(EndpointIdx::new)
            .collect();
        let ramp_from = policy.slow_start.map(|_| ramps(&endpoints, overlay));
        Snapshot {
            version,
            unhealthy: saturating_u32(t.unhealthy),
            drained: saturating_u32(t.drained),
            ejected: saturating_u32(t.ejected),
            tagged: saturating_u32(t.tagged),
            warm_until: t.warm_until,
            tiered: t.priorities.0 < t.priorities.1,
            in_key_order: false,
            live: facts.live.into(),
            endpoints,
            eligible,
            is_eligible,
            ejected_until: facts.ejected_until,
            ramp_from,
            policy: *policy,
            panic,
            scope: 0,
            coverage: None,
        }
    }

    /// The same endpoints (and statistics) under a new policy or overlay, as version `version`.
    pub fn derive(&self, version: u64, policy: &SnapshotPolicy, overlay: &HealthOverlay) -> Self {
        let mut derived = Snapshot::over(version, self.endpoints.clone(), policy, overlay);
        derived.in_key_order = self.in_key_order;
        derived
    }

    /// The same snapshot (endpoints, indices, policy, version) with only the eligible endpoints
    /// for which `keep` holds still eligible: what a decorator (zone preference) prepares its
    /// inner strategy on. Indices stay valid in `self`.
    pub fn restrict(&self, keep: impl Fn(EndpointIdx) -> bool) -> Snapshot {
        let is_eligible: Box<[bool]> = (0..self.len())
            .map(|i| self.is_eligible[i] && keep(EndpointIdx::new(i)))
            .collect();
        let eligible: Box<[EndpointIdx]> = self
            .eligible
            .iter()
            .copied()
            .filter(|&i| is_eligible[i.get()])
            .collect();
        Snapshot {
            version: self.version,
            endpoints: self.endpoints.clone(),
            live: self.live.clone(),
            scope: self.scope_of(&eligible),
            eligible,
            is_eligible,
            ejected_until: self.ejected_until.clone(),
            ramp_from: self.ramp_from.clone(),
            policy: self.policy,
            panic: self.panic,
            coverage: self.coverage.clone(),
            unhealthy: self.unhealthy,
            drained: self.drained,
            ejected: self.ejected,
            tagged: self.tagged,
            warm_until: self.warm_until,
            tiered: self.tiered,
            in_key_order: self.in_key_order,
        }
    }

    /// The same snapshot with exactly `members` eligible (sorted by index; down ones too, when
    /// a priority tier in panic admits them), and `panic` as its panic flag: what a stage
    /// ([`stage`](crate::stage)) prepares its leaf's strategy on, with the aperture's
    /// `coverage` of each endpoint when it covers some partly. Indices stay valid in `self`.
    pub(crate) fn scoped(
        &self,
        members: &[EndpointIdx],
        panic: bool,
        coverage: Option<Arc<[u32]>>,
    ) -> Snapshot {
        let mut is_eligible = vec![false; self.len()].into_boxed_slice();
        for &i in members {
            is_eligible[i.get()] = true;
        }
        Snapshot {
            version: self.version,
            endpoints: self.endpoints.clone(),
            live: self.live.clone(),
            scope: self.scope_of(members),
            eligible: members.into(),
            is_eligible,
            ejected_until: self.ejected_until.clone(),
            ramp_from: self.ramp_from.clone(),
            policy: self.policy,
            panic,
            coverage,
            unhealthy: self.unhealthy,
            drained: self.drained,
            ejected: self.ejected,
            tagged: self.tagged,
            warm_until: self.warm_until,
            tiered: self.tiered,
            in_key_order: self.in_key_order,
        }
    }

    /// Which set of a snapshot this is: 0 for a whole snapshot; for a restriction (a tag's set,
    /// a stage's leaf, a zone), a nonzero id of its eligible endpoints' keys, the same in the
    /// next snapshot while those stay the same (in any order). A strategy keeps per-set state across snapshot
    /// changes by it: round robin's turn, one per set, so requests alternating between two
    /// subsets do not each land on the same endpoint every time.
    pub fn scope(&self) -> u64 {
        self.scope
    }

    /// The scope of a restriction to `members`: a sum of their keys' mixed hashes, so the
    /// order the source lists them in does not matter.
    fn scope_of(&self, members: &[EndpointIdx]) -> u64 {
        let mix = |h: u64| {
            // splitmix64's finaliser.
            let z = (h ^ (h >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        members
            .iter()
            .map(|&i| {
                mix(crate::hash::key_hash(
                    self.endpoint(i).key().as_str().as_bytes(),
                ))
            })
            .fold(0u64, u64::wrapping_add)
            .max(1)
    }

    /// A snapshot built from specs with fresh statistics, all first seen at `now`.
    pub fn from_specs(specs: Vec<EndpointSpec>, now: Timestamp) -> Self {
        let endpoints = specs
            .into_iter()
            .map(|s| Endpoint::new(s, Arc::new(EndpointStats::default()), now))
            .collect();
        Snapshot::new(0, endpoints)
    }

    /// Whether the endpoint at `idx` may be picked.
    #[inline]
    pub fn is_eligible(&self, idx: EndpointIdx) -> bool {
        self.is_eligible.get(idx.get()).copied().unwrap_or(false)
    }

    /// Until when the endpoint at `idx` is ejected, if it is.
    pub fn ejected_until(&self, idx: EndpointIdx) -> Option<Timestamp> {
        (self.ejected_until.as_ref()?.get(idx.get()).copied()).flatten()
    }

    /// Whether the panic threshold made every weighted endpoint eligible.
    pub fn in_panic(&self) -> bool {
        self.panic
    }

    /// The policy this snapshot was built with.
    pub fn policy(&self) -> &SnapshotPolicy {
        &self.policy
    }

    /// The weight strategies use for `idx` at `now`: the configured weight after Dubbo's warm-up
    /// and, with a slow-start policy, Envoy's slow start (see [`SlowStart`](crate::SlowStart)).
    /// Under a deterministic aperture that covers `idx` partly, that weight times its
    /// [`coverage`](Self::coverage) (saturating), so the weighted strategies draw an edge
    /// server in proportion to the share of it the aperture covers.
    #[inline]
    pub fn effective_weight(&self, idx: EndpointIdx, now: Timestamp) -> u32 {
        self.adjusted(idx, self.endpoint(idx).effective_weight(now), now)
    }

    /// The sum of the eligible endpoints' configured weights ([`Endpoint::weight`]), read
    /// from the same dense copies as [`eligible_weights`](Self::eligible_weights): no
    /// endpoint is read (ketama scales its ring by it at every change).
    ///
    /// ```
    /// use lbkit_core::{EndpointSpec, Snapshot, Timestamp};
    /// let snap = Snapshot::from_specs(
    ///     vec![
    ///         EndpointSpec::new("a:1").with_weight(3),
    ///         EndpointSpec::new("b:1").with_weight(5).with_healthy(false),
    ///     ],
    ///     Timestamp::ZERO,
    /// );
    /// assert_eq!(snap.eligible_weight_total(), 3);
    /// ```
    pub fn eligible_weight_total(&self) -> u64 {
        self.endpoints.weight_total(&self.eligible)
    }

    /// [`effective_weight`](Self::effective_weight) of each eligible endpoint at `now`, in
    /// [`eligible`](Self::eligible) order: what a weighted strategy prepares from. Computed
    /// from dense copies of each endpoint's weight and warm-up, made once per part of the
    /// endpoints (about 64), so no endpoint is read: at 10 000 endpoints, sequential reads
    /// instead of 10 000 cache misses.
    ///
    /// ```
    /// use lbkit_core::{EndpointIdx, EndpointSpec, Snapshot, Timestamp};
    /// let snap = Snapshot::from_specs(
    ///     vec![EndpointSpec::new("a:1").with_weight(3), EndpointSpec::new("b:1").with_weight(0)],
    ///     Timestamp::ZERO,
    /// );
    /// assert_eq!(snap.eligible_weights(Timestamp::ZERO), [(EndpointIdx::new(0), 3)]);
    /// ```
    pub fn eligible_weights(&self, now: Timestamp) -> Vec<(EndpointIdx, u32)> {
        let mut weights = self.endpoints.effective_weights(&self.eligible, now);
        if self.coverage.is_some() || self.ramp_from.is_some() {
            for (idx, w) in &mut weights {
                *w = self.adjusted(*idx, *w, now);
            }
        }
        weights
    }

    /// Weight `w` of `idx` (after warm-up) with slow start and an aperture's coverage applied.
    #[inline]
    fn adjusted(&self, idx: EndpointIdx, w: u32, now: Timestamp) -> u32 {
        let w = match (&self.policy.slow_start, &self.ramp_from) {
            (Some(ramp), Some(from)) => {
                ramp.apply(w, now.saturating_duration_since(from[idx.get()]))
            }
            _ => w,
        };
        match &self.coverage {
            Some(c) => w.saturating_mul(c[idx.get()]),
            None => w,
        }
    }

    /// How much of each endpoint (by index) the deterministic aperture this set was cut by
    /// covers, when it covers some of its members only partly (Finagle's `Ring.weight`): in
    /// units where the most covered member has the largest value, divided by their common
    /// divisor; 0 outside the aperture. `None` when every member counts fully (no aperture, a
    /// random one, or slices that start and end on server boundaries).
    ///
    /// [`effective_weight`](Self::effective_weight) includes it, and `p2c` draws its two
    /// candidates by it, as Finagle's aperture does (`Ring.pick2`): a server at the edge of a
    /// client's slice takes only the share of that client's load its overlap is worth, so load
    /// over all clients comes out even. The product saturates at `u32::MAX` (a weight of
    /// 10⁶ with thousands of clients), where proportions would be off.
    pub fn coverage(&self) -> Option<&[u32]> {
        self.coverage.as_deref()
    }

    /// Whether its endpoints are known to be in strictly ascending key order: a
    /// [`SnapshotBuilder`]'s snapshot of a set in key order (and what is derived or restricted
    /// from one). [`diff::between`](crate::diff::between) needs the last set in that order.
    pub fn in_key_order(&self) -> bool {
        self.in_key_order
    }

    /// Whether its endpoints (eligible or not) have more than one priority: then they form
    /// tiers ([`stage`](crate::stage)). Read once, when the snapshot was built.
    pub fn is_tiered(&self) -> bool {
        self.tiered
    }

    /// Whether the weight of some eligible endpoint still changes with time at `now` (warm-up
    /// or slow start): O(1) once every warm-up window has ended and no slow start is set; with
    /// slow start a scan that stops at the first; else a scan of only the parts of the
    /// endpoints (about 64 each) with a warm-up still running, which stops at the first
    /// eligible one warming (a settled fleet with a few new providers reads a few parts, not
    /// every endpoint).
    pub fn any_ramping(&self, now: Timestamp) -> bool {
        if self.ramp_from.is_some() {
            return self.eligible.iter().any(|&i| self.is_ramping(i, now));
        }
        let warming = |(start, part): (usize, &[Endpoint])| {
            let mut each = part.iter().enumerate();
            each.any(|(j, e)| self.is_eligible[start + j] && e.is_warming(now))
        };
        now < self.warm_until && self.endpoints.warming_parts(now).any(warming)
    }

    /// Whether the weight of `idx` still changes with time at `now` (warm-up or slow start).
    pub fn is_ramping(&self, idx: EndpointIdx, now: Timestamp) -> bool {
        let slow = match (&self.policy.slow_start, &self.ramp_from) {
            (Some(ramp), Some(from)) => now < from[idx.get()].saturating_add(ramp.window),
            _ => false,
        };
        slow || self.endpoint(idx).is_warming(now)
    }

    /// Version, increasing with every snapshot a builder makes.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// All endpoints, in source order.
    pub fn endpoints(&self) -> &Endpoints {
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

    /// The hot statistics line of the endpoint at `idx` (in flight, failure run, successes,
    /// peak EWMA): the same atomics as `endpoint(idx).stats().live()`, read through one dense
    /// array instead of the endpoint and its statistics. Load-aware pickers read this.
    ///
    /// # Panics
    /// When `idx` comes from another, larger snapshot.
    #[inline]
    pub fn live(&self, idx: EndpointIdx) -> &LiveStats {
        self.live[idx.get()]
    }

    /// Indices of the endpoints a strategy may pick, in source order: healthy, weight > 0 and
    /// not ejected — or, in panic, every endpoint with weight > 0.
    #[inline]
    pub fn eligible(&self) -> &[EndpointIdx] {
        &self.eligible
    }

    /// How many endpoints carry a Dubbo tag, tag groups or a tag rule
    /// ([`Endpoint::is_tagged`]); a restriction reports its whole snapshot's count. When 0, a
    /// strategy's preparation builds no tag table.
    pub fn tagged(&self) -> usize {
        self.tagged as usize
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
                ejected: self.ejected,
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

/// Where each endpoint's slow-start ramp starts: its first sighting, or its readmission after
/// an ejection when later.
fn ramps(endpoints: &Endpoints, overlay: &HealthOverlay) -> Arc<[Timestamp]> {
    endpoints
        .iter()
        .map(|e| {
            overlay
                .readmitted
                .get(e.key())
                .map_or(e.added_at(), |&r| r.max(e.added_at()))
        })
        .collect()
}

/// What [`Snapshot::with_policy`] reads of its endpoints: a flag byte each, the statistics
/// lines, the ejections, and the counts.
struct Facts {
    flags: Vec<u8>,
    live: Vec<&'static LiveStats>,
    /// `None` when nothing is ejected.
    ejected_until: Option<Arc<[Option<Timestamp>]>>,
    tally: Tally,
}

impl Facts {
    /// With no ejection, what each part of `endpoints` read when it was made (no endpoint is
    /// read again); else a pass over every endpoint with its ejection.
    fn of(endpoints: &Endpoints, overlay: &HealthOverlay) -> Facts {
        if overlay.ejected.is_empty() {
            let (flags, live, tally) = endpoints.read();
            return Facts {
                flags,
                live,
                ejected_until: None,
                tally,
            };
        }
        let ejected_until: Arc<[Option<Timestamp>]> = endpoints
            .iter()
            .map(|e| overlay.ejected.get(e.key()).copied())
            .collect();
        let mut tally = Tally::EMPTY;
        let flags = (endpoints.iter().zip(ejected_until.iter()))
            .map(|(e, until)| tally.read(e, until.is_some()))
            .collect();
        Facts {
            flags,
            live: endpoints.iter().map(Endpoint::live_line).collect(),
            ejected_until: Some(ejected_until),
            tally,
        }
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
/// time of every endpoint whose key stays, and the [`Endpoint`] itself when its spec is
/// unchanged (no allocation for it; [`Endpoint::ptr_eq`] tells a comparer it is unchanged). Not
/// on the hot path; owned by one task.
///
/// ```
/// use std::sync::Arc;
/// use lbkit_core::{EndpointSpec, SnapshotBuilder, Timestamp, Update};
/// let mut b = SnapshotBuilder::new();
/// let s1 = b.apply(Update::Reset(vec![EndpointSpec::new("a:1")]), Timestamp::ZERO);
/// let s2 = b.apply(Update::Add(vec![EndpointSpec::new("b:1")]), Timestamp::ZERO);
/// assert_eq!(s2.version(), s1.version() + 1);
/// assert!(Arc::ptr_eq(s1.endpoints()[0].stats_arc(), s2.endpoints()[0].stats_arc()));
/// // An endpoint whose spec did not change is the same object.
/// assert!(s1.endpoints()[0].ptr_eq(&s2.endpoints()[0]));
/// ```
#[derive(Debug)]
pub struct SnapshotBuilder {
    version: u64,
    current: Endpoints,
    /// Whether `current` is in strictly ascending key order (then a set in that order too is
    /// matched to it by a merge, not a hash map).
    ascending: bool,
    ewma_decay: Duration,
    /// The policy every snapshot it builds is under.
    policy: SnapshotPolicy,
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
            current: Endpoints::default(),
            ascending: true,
            ewma_decay: DEFAULT_EWMA_DECAY,
            policy: SnapshotPolicy::default(),
        }
    }

    /// Use `decay` as the peak-EWMA time constant for new endpoints.
    pub fn with_ewma_decay(mut self, decay: Duration) -> Self {
        self.ewma_decay = decay;
        self
    }

    /// Build every snapshot under `policy` (panic threshold, slow start), so an owner without
    /// a health overlay of its own publishes what it builds rather than deriving it again.
    pub fn with_policy(mut self, policy: SnapshotPolicy) -> Self {
        self.policy = policy;
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
                // A batch that starts with a full set needs no copy of the current one.
                if !matches!(update, Update::Reset(_)) {
                    specs = self.current_specs();
                }
                changed_set = true;
            }
            apply_to(&mut specs, update);
        }
        if changed_set {
            let ascending = ascending(specs.iter().map(|s| &s.key));
            self.rebuild(specs.into_iter().map(Cow::Owned), ascending, now);
        }
        self.next()
    }

    /// Build the next snapshot from the full set `specs` (as [`Update::Reset`] would, a later
    /// spec with a key already listed replacing the earlier in place), borrowing them: only the
    /// specs of new or changed endpoints are copied. For an owner that keeps the set it serves.
    ///
    /// ```
    /// use std::borrow::Cow;
    /// use lbkit_core::{EndpointSpec, SnapshotBuilder, Timestamp};
    /// let serving = vec![EndpointSpec::new("a:1"), EndpointSpec::new("b:1")];
    /// let mut b = SnapshotBuilder::new();
    /// let s1 = b.reset_from(serving.iter().map(Cow::Borrowed), Timestamp::ZERO);
    /// let s2 = b.reset_from(serving.iter().map(Cow::Borrowed), Timestamp::ZERO);
    /// assert!(s1.endpoints()[1].ptr_eq(&s2.endpoints()[1]));
    /// ```
    pub fn reset_from<'a>(
        &mut self,
        specs: impl IntoIterator<Item = Cow<'a, EndpointSpec>>,
        now: Timestamp,
    ) -> Arc<Snapshot> {
        let specs: Vec<Cow<'a, EndpointSpec>> = specs.into_iter().collect();
        if ascending(specs.iter().map(|s| &s.key)) {
            // Keys in ascending order are unique: nothing to replace (the common case: sources
            // list in key order).
            self.rebuild(specs.into_iter(), true, now);
        } else {
            let mut specs: Vec<Option<Cow<'a, EndpointSpec>>> =
                specs.into_iter().map(Some).collect();
            // Keys stay unique: a later spec takes the first one's place.
            let mut first: FastMap<&EndpointKey, usize> = FastMap::default();
            let mut moves = Vec::new();
            for (i, spec) in specs.iter().enumerate() {
                if let Some(spec) = spec {
                    match first.entry(&spec.key) {
                        std::collections::hash_map::Entry::Occupied(at) => {
                            moves.push((*at.get(), i))
                        }
                        std::collections::hash_map::Entry::Vacant(v) => {
                            v.insert(i);
                        }
                    }
                }
            }
            drop(first);
            for (to, from) in moves {
                specs.swap(to, from);
                specs[from] = None;
            }
            self.rebuild(specs.into_iter().flatten(), false, now);
        }
        self.next()
    }

    /// Build the next snapshot by changing only the endpoints of the keys in `changes`, in
    /// strictly ascending key order: `(key, Some(spec))` adds the key or sets its spec (an
    /// unchanged spec keeps its endpoint), `(key, None)` removes it. For an owner that knows
    /// what changed since the last build: a change of k endpoints costs O(k log n) key
    /// comparisons and k spec comparisons, where [`reset_from`] compares all n (a Dubbo
    /// provider's spec is a URL's worth of metadata: that was most of the cost of one change
    /// among 10 000 providers). The endpoints are held in parts of about 64 ([`Endpoints`]):
    /// the parts no change falls in are shared with the last snapshot, each changed part is
    /// copied and read again, O(64) each. What stays O(n) is sequential, a few bytes an
    /// endpoint: the position index and the dense arrays picks read (no endpoint is read).
    ///
    /// Falls back to comparing the whole set when the last one was not in key order (then
    /// the endpoints changed are appended, in `changes`' order).
    ///
    /// [`reset_from`]: Self::reset_from
    ///
    /// ```
    /// use std::borrow::Cow;
    /// use lbkit_core::{EndpointKey, EndpointSpec, SnapshotBuilder, Timestamp};
    /// let mut b = SnapshotBuilder::new();
    /// let set = [EndpointSpec::new("a:1"), EndpointSpec::new("b:1"), EndpointSpec::new("c:1")];
    /// let s1 = b.reset_from(set.iter().map(Cow::Borrowed), Timestamp::ZERO);
    /// let heavier = EndpointSpec::new("b:1").with_weight(7);
    /// let s2 = b.patch(
    ///     vec![(EndpointKey::from("a:1"), None), (EndpointKey::from("b:1"), Some(Cow::Borrowed(&heavier)))],
    ///     Timestamp::ZERO,
    /// );
    /// assert_eq!(s2.len(), 2);
    /// assert_eq!(s2.endpoints()[0].weight(), 7);
    /// assert!(s1.endpoints()[2].ptr_eq(&s2.endpoints()[1]));
    /// ```
    pub fn patch<'a>(
        &mut self,
        changes: Vec<(EndpointKey, Option<Cow<'a, EndpointSpec>>)>,
        now: Timestamp,
    ) -> Arc<Snapshot> {
        debug_assert!(
            ascending(changes.iter().map(|(k, _)| k)),
            "changes out of key order"
        );
        if !self.ascending {
            let mut specs: Vec<Cow<'_, EndpointSpec>> = self
                .current
                .iter()
                .map(|e| Cow::Owned(spec_of(e)))
                .collect();
            let keys: HashSet<&EndpointKey> = changes.iter().map(|(k, _)| k).collect();
            specs.retain(|s| !keys.contains(&s.key));
            specs.extend(changes.iter().filter_map(|(_, s)| s.clone()));
            return self.reset_from(specs, now);
        }
        let next = (self.current).patch(changes, |spec, prev| self.endpoint(spec, prev, now));
        self.current = next;
        self.next()
    }

    /// The next snapshot of the current endpoints.
    fn next(&mut self) -> Arc<Snapshot> {
        self.version += 1;
        let overlay = HealthOverlay::default();
        let mut next = Snapshot::over(self.version, self.current.clone(), &self.policy, &overlay);
        next.in_key_order = self.ascending;
        Arc::new(next)
    }

    /// The endpoints of the last snapshot.
    pub fn current(&self) -> &Endpoints {
        &self.current
    }

    fn current_specs(&self) -> Vec<EndpointSpec> {
        self.current.iter().map(spec_of).collect()
    }

    /// Build the current endpoints from `specs` (unique keys; `ascending`: in strictly
    /// ascending key order), keeping the statistics of staying keys and the endpoints of
    /// unchanged specs.
    fn rebuild<'a>(
        &mut self,
        specs: impl Iterator<Item = Cow<'a, EndpointSpec>>,
        ascending: bool,
        now: Timestamp,
    ) {
        let current = std::mem::take(&mut self.current);
        self.current = if ascending && self.ascending {
            // Both in key order: a merge finds each key's predecessor.
            let mut walk = current.iter().peekable();
            self.build(
                specs,
                |key| {
                    while walk.next_if(|e| e.key() < key).is_some() {}
                    walk.peek().copied().filter(|e| e.key() == key)
                },
                now,
            )
        } else {
            let old: FastMap<&EndpointKey, &Endpoint> =
                current.iter().map(|e| (e.key(), e)).collect();
            self.build(specs, |key| old.get(key).copied(), now)
        };
        self.ascending = ascending;
    }

    /// The endpoints of `specs`, each matched by `previous` to the last build's endpoint of its
    /// key.
    fn build<'a, 'b>(
        &self,
        specs: impl Iterator<Item = Cow<'a, EndpointSpec>>,
        mut previous: impl FnMut(&EndpointKey) -> Option<&'b Endpoint>,
        now: Timestamp,
    ) -> Endpoints {
        specs
            .map(|spec| {
                let prev = previous(&spec.key);
                self.endpoint(spec, prev, now)
            })
            .collect()
    }

    /// The endpoint of `spec`: `prev` itself when it describes it (no allocation; comparisons
    /// of two snapshots can tell it with `Endpoint::ptr_eq`), a new one with `prev`'s
    /// statistics and first-seen time when it does not, a new one when there is none.
    fn endpoint(
        &self,
        spec: Cow<'_, EndpointSpec>,
        prev: Option<&Endpoint>,
        now: Timestamp,
    ) -> Endpoint {
        match prev {
            Some(prev) if prev.describes(&spec) => prev.clone(),
            Some(prev) => {
                Endpoint::new(spec.into_owned(), prev.stats_arc().clone(), prev.added_at())
            }
            None => Endpoint::new(
                spec.into_owned(),
                Arc::new(EndpointStats::new(self.ewma_decay)),
                now,
            ),
        }
    }
}

/// Whether `keys` are in strictly ascending order (so unique).
fn ascending<'a>(keys: impl Iterator<Item = &'a EndpointKey>) -> bool {
    let mut last: Option<&EndpointKey> = None;
    for key in keys {
        if last.is_some_and(|l| l >= key) {
            return false;
        }
        last = Some(key);
    }
    true
}

/// Maps keyed by endpoint keys: foldhash, several times faster than SipHash on keys this
/// short (builds of 10 000-endpoint sets hash every key a few times), seeded per process.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

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
    let mut pos: FastMap<EndpointKey, usize> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| (s.key.clone(), i))
        .collect();
    pos.reserve(new.len());
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
        priority: e.priority(),
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
                drained: 1,
                ejected: 0
            }
        );
        assert_eq!(
            Snapshot::from_specs(vec![], Timestamp::ZERO).empty_error(),
            PickError::NoEndpoints
        );
    }

    fn five(down: usize) -> Vec<Endpoint> {
        let specs = (0..5)
            .map(|i| spec(&format!("h{i}:1"), 10).with_healthy(i >= down))
            .collect();
        Snapshot::from_specs(specs, Timestamp::ZERO)
            .endpoints()
            .to_vec()
    }

    #[test]
    fn panic_threshold_switches_to_all_weighted_endpoints() {
        let policy = SnapshotPolicy::envoy();
        let calm = Snapshot::with_policy(1, five(2), &policy, &HealthOverlay::default());
        assert!(!calm.in_panic(), "3 of 5 healthy = 60 % ≥ 50 %");
        assert_eq!(calm.eligible().len(), 3);
        let mut overlay = HealthOverlay::default();
        overlay
            .ejected
            .insert(EndpointKey::from("h2:1"), Timestamp::from_millis(30_000));
        let panic = Snapshot::with_policy(2, five(2), &policy, &overlay);
        assert!(panic.in_panic(), "2 of 5 = 40 % < 50 %");
        assert_eq!(panic.eligible().len(), 5, "balance across all of them");
        assert_eq!(
            panic.ejected_until(EndpointIdx::new(2)),
            Some(Timestamp::from_millis(30_000))
        );
        let off = Snapshot::with_policy(
            3,
            five(4),
            &SnapshotPolicy::default(),
            &HealthOverlay::default(),
        );
        assert!(
            !off.in_panic() && off.eligible().len() == 1,
            "no policy, no panic"
        );
    }

    #[test]
    fn ejected_endpoints_are_not_eligible_and_counted() {
        let mut overlay = HealthOverlay::default();
        for i in 0..5 {
            overlay.ejected.insert(
                EndpointKey::from(format!("h{i}:1")),
                Timestamp::from_millis(1),
            );
        }
        let s = Snapshot::with_policy(1, five(0), &SnapshotPolicy::default(), &overlay);
        assert_eq!(
            s.empty_error(),
            PickError::AllIneligible {
                unhealthy: 0,
                drained: 0,
                ejected: 5
            }
        );
        assert!(!s.is_eligible(EndpointIdx::new(0)));
    }

    /// A 100 s slow start, and an overlay that readmitted `h1:1` at 50 s.
    fn slow_start_readmitting_h1() -> (SnapshotPolicy, HealthOverlay) {
        let policy = SnapshotPolicy {
            slow_start: Some(crate::SlowStart::new(std::time::Duration::from_secs(100))),
            ..SnapshotPolicy::default()
        };
        let mut overlay = HealthOverlay::default();
        overlay
            .readmitted
            .insert(EndpointKey::from("h1:1"), Timestamp::from_millis(50_000));
        (policy, overlay)
    }

    #[test]
    fn slow_start_ramps_from_addition_or_readmission() {
        let (policy, overlay) = slow_start_readmitting_h1();
        let s = Snapshot::with_policy(1, five(0), &policy, &overlay);
        let at = |ms| Timestamp::from_millis(ms);
        assert_eq!(
            s.effective_weight(EndpointIdx::new(0), at(50_000)),
            5,
            "half-way: 10 × 0.5"
        );
        assert_eq!(
            s.effective_weight(EndpointIdx::new(1), at(50_000)),
            1,
            "just readmitted: floor 10 %"
        );
        assert_eq!(s.effective_weight(EndpointIdx::new(0), at(100_000)), 10);
        assert!(s.is_ramping(EndpointIdx::new(1), at(100_000)));
        assert!(!s.is_ramping(EndpointIdx::new(1), at(150_000)));
        assert!(s.any_ramping(at(149_999)) && !s.any_ramping(at(150_000)));
    }

    /// `eligible_weights` answers as `effective_weight` of each eligible endpoint does, with
    /// Dubbo's warm-up, slow start and an aperture's coverage together, members out of order.
    #[test]
    fn eligible_weights_are_each_effective_weight() {
        let (policy, overlay) = slow_start_readmitting_h1();
        let specs = (0..300u64).map(|i| {
            let spec = EndpointSpec::new(format!("h{i}:1")).with_weight(10 + i as u32 % 7);
            match i % 3 {
                0 => spec.with_registered_at(Timestamp::from_millis(i * 500)),
                _ => spec,
            }
        });
        let built = Endpoints::from_iter(
            specs.map(|s| Endpoint::new(s, Arc::new(EndpointStats::default()), Timestamp::ZERO)),
        );
        let s = Snapshot::over(1, built.clone(), &policy, &overlay);
        let plain = Snapshot::over(1, built, &SnapshotPolicy::default(), &overlay);
        let members: Vec<EndpointIdx> = [299, 3, 0, 1, 150, 64, 63].map(EndpointIdx::new).into();
        let cover: Arc<[u32]> = (0..300u32).map(|i| 1 + i % 4).collect();
        let scoped = s.scoped(&members, false, Some(cover.clone()));
        let covered = plain.scoped(&members, false, Some(cover));
        for ms in [0, 50_000, 100_000, 149_999, 200_000, 1_000_000] {
            let now = Timestamp::from_millis(ms);
            for snap in [&s, &plain, &scoped, &covered] {
                let each: Vec<(EndpointIdx, u32)> = (snap.eligible().iter())
                    .map(|&i| (i, snap.effective_weight(i, now)))
                    .collect();
                assert_eq!(snap.eligible_weights(now), each, "at {ms} ms");
            }
        }
    }

    /// `any_ramping` answers as a scan of the eligible endpoints would: a warming endpoint
    /// that is down does not count, and every window's end is seen.
    #[test]
    fn any_ramping_sees_eligible_warm_ups_only() {
        let at = |ms| Timestamp::from_millis(ms);
        let warming = |addr: &str, from: u64| {
            spec(addr, 100)
                .with_registered_at(at(from))
                .with_warmup(std::time::Duration::from_secs(60))
        };
        let s = Snapshot::from_specs(
            vec![
                spec("a:1", 100),
                warming("b:1", 0),
                warming("c:1", 30_000).with_healthy(false),
                warming("d:1", 10_000).with_weight(0),
            ],
            Timestamp::ZERO,
        );
        let scan = |now| s.eligible().iter().any(|&i| s.is_ramping(i, now));
        for ms in [0, 59_999, 60_000, 69_999, 89_999, 90_000, 200_000] {
            assert_eq!(s.any_ramping(at(ms)), scan(at(ms)), "at {ms} ms");
        }
        assert!(s.any_ramping(at(59_999)) && !s.any_ramping(at(60_000)));
    }

    /// Over many parts, `any_ramping` (which skips the parts with no warm-up running) answers
    /// as a scan of the eligible endpoints, in a snapshot and in restrictions of it.
    #[test]
    fn any_ramping_skips_only_parts_with_nothing_warming() {
        let at = |ms| Timestamp::from_millis(ms);
        // 1 000 endpoints; every 97th warming (windows ending 10 s apart), every 3rd of those down.
        let specs = (0..1_000u64).map(|i| {
            let s = spec(&format!("h{i:04}:1"), 100);
            match i % 97 {
                0 => (s.with_registered_at(at(i * 10)))
                    .with_warmup(std::time::Duration::from_secs(60))
                    .with_healthy(i % 3 != 0),
                _ => s,
            }
        });
        let s = Snapshot::from_specs(specs.collect(), Timestamp::ZERO);
        let odd = s.restrict(|i| i.get() % 2 == 1);
        for snap in [&s, &odd] {
            let scan = |now| snap.eligible().iter().any(|&i| snap.is_ramping(i, now));
            for ms in (0..80_000).step_by(2_500).chain([69_699, 69_700, 69_701]) {
                assert_eq!(snap.any_ramping(at(ms)), scan(at(ms)), "at {ms} ms");
            }
        }
        assert!(s.any_ramping(at(69_699)) && !s.any_ramping(at(69_700)));
    }

    #[test]
    fn tiers_are_seen_across_every_endpoint() {
        let of = |p: &[u32]| {
            let specs = p.iter().enumerate();
            let specs = specs.map(|(i, &p)| spec(&format!("h{i}:1"), 1).with_priority(p));
            Snapshot::from_specs(specs.collect(), Timestamp::ZERO)
        };
        assert!(!of(&[]).is_tiered() && !of(&[3]).is_tiered() && !of(&[1, 1, 1]).is_tiered());
        assert!(of(&[0, 0, 1]).is_tiered() && of(&[2, 0]).is_tiered());
        let down = Snapshot::from_specs(
            vec![
                spec("a:1", 1),
                spec("b:1", 1).with_priority(1).with_healthy(false),
            ],
            Timestamp::ZERO,
        );
        assert!(down.is_tiered(), "a down endpoint's tier still counts");
    }

    #[test]
    fn a_restrictions_scope_follows_its_members_across_snapshots() {
        let mut b = SnapshotBuilder::new();
        let now = Timestamp::from_millis(1);
        let s1 = b.apply(Update::Reset(vec![spec("a:1", 1), spec("b:1", 1)]), now);
        let s2 = b.apply(
            Update::Reset(vec![spec("a:1", 1), spec("b:1", 1), spec("c:1", 1)]),
            now,
        );
        assert_eq!((s1.scope(), s2.scope()), (0, 0), "whole snapshots");
        let only_a = |s: &Snapshot| s.restrict(|i| s.endpoint(i).key().as_str() == "a:1");
        let (r1, r2) = (only_a(&s1), only_a(&s2));
        assert_ne!(r1.scope(), 0);
        assert_eq!(r1.scope(), r2.scope(), "same members, same scope");
        let b_only = s2.restrict(|i| s2.endpoint(i).key().as_str() == "b:1");
        assert_ne!(b_only.scope(), r2.scope());
        let a = [EndpointIdx::new(0)];
        assert_eq!(
            s2.scoped(&a, false, None).scope(),
            r2.scope(),
            "a stage leaf alike"
        );
    }

    #[test]
    fn live_lines_are_the_endpoints_stats_in_every_derived_snapshot() {
        let mut b = SnapshotBuilder::new();
        let now = Timestamp::from_millis(1);
        let s1 = b.apply(Update::Reset(vec![spec("a:1", 1), spec("b:1", 1)]), now);
        let same = |s: &Snapshot| {
            (0..s.len()).all(|i| {
                let idx = EndpointIdx::new(i);
                std::ptr::eq(s.live(idx), s.endpoint(idx).stats().live())
            })
        };
        assert!(same(&s1));
        let s2 = b.apply(Update::Add(vec![spec("c:1", 1)]), now);
        assert!(same(&s2) && same(&s2.restrict(|i| i.get() == 0)));
        assert!(same(&s2.derive(
            9,
            &SnapshotPolicy::default(),
            &HealthOverlay::default()
        )));
        // A call started through the old snapshot ends on the line the new one reads.
        s1.endpoints()[1].stats().start();
        assert_eq!(s2.live(EndpointIdx::new(1)).in_flight(), 1);
        s2.endpoints()[1]
            .stats()
            .finish(now, now, crate::Outcome::Success);
        assert_eq!(
            (
                s1.live(EndpointIdx::new(1)).in_flight(),
                s2.live(EndpointIdx::new(1)).successes()
            ),
            (0, 1)
        );
        // Distinct endpoints never share a line.
        let lines: std::collections::HashSet<_> = (0..s2.len())
            .map(|i| s2.live(EndpointIdx::new(i)) as *const LiveStats)
            .collect();
        assert_eq!(lines.len(), 3);
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
        /// `reset_from` (borrowed specs, in or out of key order, with duplicate keys) builds
        /// what `apply(Update::Reset(..))` builds, and keeps the statistics of staying keys
        /// whichever way the last set was matched (merge or hash map).
        #[test]
        fn reset_from_builds_what_a_reset_builds(sets in proptest::collection::vec(proptest::collection::vec((0u8..12, 0u32..3), 0..10), 1..8), sort in proptest::collection::vec(any::<bool>(), 8)) {
            let (mut borrowed, mut owned) = (SnapshotBuilder::new(), SnapshotBuilder::new());
            let mut prev: Option<Arc<Snapshot>> = None;
            for (set, sorted) in sets.into_iter().zip(sort) {
                let mut specs: Vec<EndpointSpec> = set.iter().map(|(k, w)| spec(&format!("h{k:02}:1"), *w)).collect();
                if sorted {
                    specs.sort_by(|a, b| a.key.cmp(&b.key));
                    specs.dedup_by(|a, b| a.key == b.key);
                }
                let a = borrowed.reset_from(specs.iter().map(Cow::Borrowed), Timestamp::ZERO);
                let b = owned.apply(Update::Reset(specs), Timestamp::ZERO);
                let shown = |s: &Snapshot| s.endpoints().iter().map(|e| (e.key().clone(), e.weight())).collect::<Vec<_>>();
                prop_assert_eq!(shown(&a), shown(&b));
                if let Some(prev) = &prev {
                    for e in a.endpoints() {
                        if let Some(i) = prev.find(e.key()) {
                            prop_assert!(Arc::ptr_eq(prev.endpoint(i).stats_arc(), e.stats_arc()));
                            prop_assert_eq!(prev.endpoint(i).ptr_eq(e), prev.endpoint(i).weight() == e.weight());
                        }
                    }
                }
                prev = Some(a);
            }
        }

        /// Stateful run of random updates: keys stay unique, every key present in two
        /// consecutive snapshots shares one stats object, and its endpoint is the same object
        /// exactly when its spec (here: its weight) did not change.
        #[test]
        fn builder_invariants(ops in proptest::collection::vec((0u8..3, proptest::collection::vec((0u8..8, 0u32..3), 0..5)), 1..30)) {
            let mut b = SnapshotBuilder::new();
            let mut prev = b.apply(Update::Reset(vec![]), Timestamp::ZERO);
            for (kind, keys) in ops {
                let specs: Vec<_> = keys.iter().map(|(k, w)| spec(&format!("h{k}:1"), *w)).collect();
                let update = match kind {
                    0 => Update::Reset(specs),
                    1 => Update::Add(specs),
                    _ => Update::Remove(keys.iter().map(|(k, _)| EndpointKey::from(format!("h{k}:1"))).collect()),
                };
                let next = b.apply(update, Timestamp::ZERO);
                let mut seen = std::collections::HashSet::new();
                for e in next.endpoints() {
                    prop_assert!(seen.insert(e.key().clone()), "duplicate key");
                    if let Some(i) = prev.find(e.key()) {
                        let before = prev.endpoint(i);
                        prop_assert!(Arc::ptr_eq(before.stats_arc(), e.stats_arc()));
                        prop_assert_eq!(before.ptr_eq(e), before.weight() == e.weight());
                        prop_assert_eq!(before.added_at(), e.added_at());
                    }
                }
                prop_assert!(next.version() > prev.version());
                prev = next;
            }
        }
    }
}
