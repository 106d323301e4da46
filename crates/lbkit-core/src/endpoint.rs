//! The endpoint model: [`EndpointSpec`] (what a source says) and [`Endpoint`] (what a snapshot
//! holds), plus Dubbo's warm-up rule.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::live::LiveStats;
use crate::stats::EndpointStats;
use crate::time::Timestamp;

/// Weight of an endpoint that does not say (Dubbo's default).
pub const DEFAULT_WEIGHT: u32 = 100;

/// Warm-up window when a registration time is known and no window is given (Dubbo's default,
/// `warmup = 10 * 60 * 1000` ms).
pub const DEFAULT_WARMUP: Duration = Duration::from_secs(10 * 60);

/// Free-form metadata (version, group, tags), ordered by key. Opaque to the core.
///
/// Read it as the map it is (`Deref` to `BTreeMap<String, String>`). Its clones share one map:
/// a registry source hands over whole endpoint sets on every change, and a Dubbo provider
/// carries a dozen URL parameters, so copying a set of 10 000 providers costs 10 000 reference
/// counts instead of 250 000 allocations (scale of configuration, BENCHMARKS.md). A write to a
/// shared map copies it first.
///
/// ```
/// use lbkit_core::Metadata;
/// let mut m = Metadata::new();
/// m.insert("version", "1.2");
/// let shared = m.clone();
/// m.insert("group", "blue"); // copies: `shared` keeps one entry
/// assert_eq!(shared.len(), 1);
/// assert_eq!(m.get("group").map(String::as_str), Some("blue"));
/// ```
#[derive(Clone, Default)]
pub struct Metadata(Option<Arc<BTreeMap<String, String>>>);

/// What an endpoint without metadata reads (no allocation for the common case).
static EMPTY: BTreeMap<String, String> = BTreeMap::new();

// === impl Metadata ===

impl Metadata {
    /// No entries (allocates nothing).
    pub const fn new() -> Self {
        Metadata(None)
    }

    /// Set `key` to `value`; returns the value it had.
    pub fn insert(&mut self, key: impl Into<String>, value: impl Into<String>) -> Option<String> {
        self.to_mut().insert(key.into(), value.into())
    }

    /// Remove `key`; returns the value it had.
    pub fn remove(&mut self, key: &str) -> Option<String> {
        if !self.contains_key(key) {
            return None; // no copy of a shared map for nothing
        }
        self.to_mut().remove(key)
    }

    /// The map, to change in place (copied first when shared).
    pub fn to_mut(&mut self) -> &mut BTreeMap<String, String> {
        Arc::make_mut(self.0.get_or_insert_with(Arc::default))
    }
}

impl std::ops::Deref for Metadata {
    type Target = BTreeMap<String, String>;

    fn deref(&self) -> &Self::Target {
        self.0.as_deref().unwrap_or(&EMPTY)
    }
}

impl PartialEq for Metadata {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (Some(a), Some(b)) if Arc::ptr_eq(a, b) => true,
            _ => **self == **other,
        }
    }
}

impl Eq for Metadata {}

impl PartialOrd for Metadata {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Metadata {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (**self).cmp(&**other)
    }
}

impl std::hash::Hash for Metadata {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (**self).hash(state);
    }
}

impl fmt::Debug for Metadata {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (**self).fmt(f)
    }
}

impl From<BTreeMap<String, String>> for Metadata {
    fn from(map: BTreeMap<String, String>) -> Self {
        Metadata((!map.is_empty()).then(|| Arc::new(map)))
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for Metadata {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Metadata::from(
            iter.into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect::<BTreeMap<_, _>>(),
        )
    }
}

impl<'a> IntoIterator for &'a Metadata {
    type Item = (&'a String, &'a String);
    type IntoIter = std::collections::btree_map::Iter<'a, String, String>;

    fn into_iter(self) -> Self::IntoIter {
        (**self).iter()
    }
}

/// Stable identity of an endpoint across snapshots, e.g. `"10.0.0.7:20880"` or a registry id.
///
/// Statistics follow the key: an endpoint that stays in the set keeps its [`EndpointStats`].
///
/// Equal when the text is; two clones of one key compare by pointer, without reading the
/// text (the tower pool checks each pick's service entry against the endpoint's key). Ordered
/// by the text, the same way: a snapshot builder's merge of a set with the last one compares
/// the keys of unchanged endpoints without reading them.
#[derive(Clone, Debug, Eq)]
pub struct EndpointKey(Arc<str>);

impl Ord for EndpointKey {
    #[inline]
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        if Arc::ptr_eq(&self.0, &other.0) {
            return std::cmp::Ordering::Equal;
        }
        self.0.cmp(&other.0)
    }
}

impl PartialOrd for EndpointKey {
    #[inline]
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for EndpointKey {
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || *self.0 == *other.0
    }
}

// By hand beside the hand-written `eq`: the same hash as the text's, as before.
impl std::hash::Hash for EndpointKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

// === impl EndpointKey ===

impl EndpointKey {
    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for EndpointKey {
    fn from(s: &str) -> Self {
        EndpointKey(Arc::from(s))
    }
}

impl From<String> for EndpointKey {
    fn from(s: String) -> Self {
        EndpointKey(Arc::from(s))
    }
}

impl fmt::Display for EndpointKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a source (config, file, registry) says about one endpoint.
///
/// ```
/// use lbkit_core::{EndpointSpec, Timestamp};
/// let spec = EndpointSpec::new("10.0.0.1:20880")
///     .with_weight(200)
///     .with_zone("eu-1")
///     .with_registered_at(Timestamp::from_millis(1_700_000_000_000));
/// assert_eq!(spec.key.as_str(), "10.0.0.1:20880");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointSpec {
    /// Identity across snapshots. Defaults to the address.
    pub key: EndpointKey,
    /// `host:port` exactly as configured or registered; hash rings hash this text.
    pub address: String,
    /// Configured weight; [`DEFAULT_WEIGHT`] unless set; 0 = receives no traffic.
    pub weight: u32,
    /// Zone (availability zone, data centre) the endpoint runs in.
    pub zone: Option<String>,
    /// Free-form metadata.
    pub metadata: Metadata,
    /// When the endpoint registered (wall clock, as registries store it), for warm-up.
    pub registered_at: Option<Timestamp>,
    /// Warm-up window; [`DEFAULT_WARMUP`] when `registered_at` is known and this is `None`.
    pub warmup: Option<Duration>,
    /// `false` when marked down (health check, registry `disabled`): never picked.
    pub healthy: bool,
    /// Priority tier, 0 the highest (Envoy's priority levels; nginx's and HAProxy's `backup`
    /// is tier 1): traffic spills to a lower tier only as the tiers above lose health
    /// ([`stage`](crate::stage)).
    pub priority: u32,
}

// === impl EndpointSpec ===

impl EndpointSpec {
    /// An endpoint at `address` with the default weight, healthy, no zone or warm-up.
    pub fn new(address: impl Into<String>) -> Self {
        let address = address.into();
        EndpointSpec {
            key: EndpointKey::from(address.as_str()),
            address,
            weight: DEFAULT_WEIGHT,
            zone: None,
            metadata: Metadata::new(),
            registered_at: None,
            warmup: None,
            healthy: true,
            priority: 0,
        }
    }

    /// Set the identity (defaults to the address).
    pub fn with_key(mut self, key: impl Into<EndpointKey>) -> Self {
        self.key = key.into();
        self
    }

    /// Set the configured weight.
    pub fn with_weight(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }

    /// Set the zone.
    pub fn with_zone(mut self, zone: impl Into<String>) -> Self {
        self.zone = Some(zone.into());
        self
    }

    /// Add one metadata entry.
    pub fn with_meta(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.insert(key, value);
        self
    }

    /// Set the registration time (enables warm-up).
    pub fn with_registered_at(mut self, at: Timestamp) -> Self {
        self.registered_at = Some(at);
        self
    }

    /// Set the warm-up window.
    pub fn with_warmup(mut self, warmup: Duration) -> Self {
        self.warmup = Some(warmup);
        self
    }

    /// Mark the endpoint up or down.
    pub fn with_healthy(mut self, healthy: bool) -> Self {
        self.healthy = healthy;
        self
    }

    /// Set the priority tier (0 the highest).
    pub fn with_priority(mut self, priority: u32) -> Self {
        self.priority = priority;
        self
    }
}

/// One endpoint of a [`Snapshot`](crate::Snapshot). Cheap to clone (one `Arc`).
///
/// Immutable except for its [`EndpointStats`], which are shared atomics that survive snapshot
/// swaps for as long as the key stays in the set.
#[derive(Clone)]
pub struct Endpoint(crate::sync::Arc<EndpointInner>);

// Immutable after construction (the statistics' atomics aside). In declaration order: what
// building a snapshot and weighing an endpoint read (live line, weight, priority, health, tags,
// registration, warm-up) comes first, so that with the `Arc`'s two counts it is the first 64
// bytes of the allocation (one cache line or two, by where the allocator put it), and a snapshot
// of n endpoints reads nothing else of them, nor their statistics, unless endpoints are ejected
// or a slow start is set (then their keys too).
#[repr(C)]
struct EndpointInner {
    /// `stats.live_line()`, kept here: valid while `stats` is.
    live: &'static LiveStats,
    weight: u32,
    priority: u32,
    healthy: bool,
    /// Whether the metadata carries a tag, tag groups or a tag rule (read once, here).
    tagged: bool,
    /// Whether `registered_at` is known (an `Option` would take 16 bytes, and the line).
    registered: bool,
    registered_at: Timestamp,
    warmup: Duration,
    key_hash: u64,
    key: EndpointKey,
    address: Arc<str>,
    zone: Option<Arc<str>>,
    metadata: Arc<Metadata>,
    /// Monotonic time this process first saw the key (kept across snapshots).
    added_at: Timestamp,
    // Atomics, shared with every snapshot that holds this key.
    stats: Arc<EndpointStats>,
}

// === impl Endpoint ===

impl Endpoint {
    /// Build an endpoint from a spec, with the given stats and first-seen time.
    pub fn new(spec: EndpointSpec, stats: Arc<EndpointStats>, added_at: Timestamp) -> Self {
        let warmup = warmup_of(&spec);
        Endpoint(crate::sync::Arc::new(EndpointInner {
            live: stats.live_line(),
            key_hash: key_hash(&spec.key),
            key: spec.key,
            address: Arc::from(spec.address),
            weight: spec.weight,
            zone: spec.zone.map(Arc::from),
            tagged: carries_tags(&spec.metadata),
            metadata: Arc::new(spec.metadata),
            registered: spec.registered_at.is_some(),
            registered_at: spec.registered_at.unwrap_or(Timestamp::ZERO),
            warmup,
            healthy: spec.healthy,
            priority: spec.priority,
            added_at,
            stats,
        }))
    }

    /// Whether this endpoint is what `Endpoint::new(spec, ..)` would build (its statistics and
    /// first-seen time aside): a snapshot builder keeps such an endpoint as it is instead of
    /// building it again.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use lbkit_core::{Endpoint, EndpointSpec, EndpointStats, Timestamp};
    /// let spec = EndpointSpec::new("10.0.0.1:80").with_weight(7);
    /// let e = Endpoint::new(spec.clone(), Arc::new(EndpointStats::default()), Timestamp::ZERO);
    /// assert!(e.describes(&spec));
    /// assert!(!e.describes(&spec.with_weight(8)));
    /// ```
    pub fn describes(&self, spec: &EndpointSpec) -> bool {
        let e = &self.0;
        e.key == spec.key
            && *e.address == *spec.address
            && e.weight == spec.weight
            && e.zone.as_deref() == spec.zone.as_deref()
            && self.registered_at() == spec.registered_at
            && e.warmup == warmup_of(spec)
            && e.healthy == spec.healthy
            && e.priority == spec.priority
            && *e.metadata == spec.metadata
    }

    /// Whether `self` and `other` are the same endpoint object (as a snapshot builder keeps
    /// an unchanged endpoint across snapshots): a cheap "unchanged" test for whoever compares
    /// two snapshots.
    pub fn ptr_eq(&self, other: &Endpoint) -> bool {
        crate::sync::Arc::ptr_eq(&self.0, &other.0)
    }

    /// The spec this endpoint describes (its warm-up window made explicit): what a service that
    /// takes over this endpoint's set (a reload's successor) starts from.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use lbkit_core::{Endpoint, EndpointSpec, EndpointStats, Timestamp};
    /// let spec = EndpointSpec::new("10.0.0.1:80").with_weight(7).with_zone("eu-1");
    /// let e = Endpoint::new(spec.clone(), Arc::new(EndpointStats::default()), Timestamp::ZERO);
    /// assert_eq!(e.to_spec().with_warmup(std::time::Duration::ZERO), spec.with_warmup(std::time::Duration::ZERO));
    /// ```
    pub fn to_spec(&self) -> EndpointSpec {
        let e = &self.0;
        EndpointSpec {
            key: e.key.clone(),
            address: e.address.to_string(),
            weight: e.weight,
            zone: e.zone.as_deref().map(str::to_owned),
            metadata: (*e.metadata).clone(),
            registered_at: self.registered_at(),
            warmup: Some(e.warmup),
            healthy: e.healthy,
            priority: e.priority,
        }
    }

    /// Priority tier, 0 the highest.
    pub fn priority(&self) -> u32 {
        self.0.priority
    }

    /// Stable identity.
    pub fn key(&self) -> &EndpointKey {
        &self.0.key
    }

    /// A 64-bit hash of the key, stable for the process (used for retry exclusion).
    pub fn key_hash(&self) -> u64 {
        self.0.key_hash
    }

    /// `host:port` exactly as given.
    pub fn address(&self) -> &str {
        &self.0.address
    }

    /// Configured weight (0 = drained).
    pub fn weight(&self) -> u32 {
        self.0.weight
    }

    /// Zone, if known.
    pub fn zone(&self) -> Option<&str> {
        self.0.zone.as_deref()
    }

    /// Metadata.
    pub fn metadata(&self) -> &Metadata {
        &self.0.metadata
    }

    /// Whether the metadata carries a Dubbo tag ([`TAG_KEY`](crate::route::TAG_KEY), not
    /// empty), tag groups or a tag rule: what tag routing reads. Known from construction, so a
    /// snapshot without tags skips tag routing without reading any metadata.
    pub fn is_tagged(&self) -> bool {
        self.0.tagged
    }

    /// Registration time (wall clock), if known.
    pub fn registered_at(&self) -> Option<Timestamp> {
        self.0.registered.then_some(self.0.registered_at)
    }

    /// Warm-up window (zero when no registration time is known and none was set).
    pub fn warmup(&self) -> Duration {
        self.0.warmup
    }

    /// Marked up (`true`) or down.
    pub fn is_healthy(&self) -> bool {
        self.0.healthy
    }

    /// Whether a strategy may pick it at all: healthy and weight > 0.
    pub fn is_eligible(&self) -> bool {
        self.0.healthy && self.0.weight > 0
    }

    /// When this process first saw the key.
    pub fn added_at(&self) -> Timestamp {
        self.0.added_at
    }

    /// Live statistics.
    pub fn stats(&self) -> &EndpointStats {
        &self.0.stats
    }

    /// `stats().live_line()`, read from the endpoint itself (a snapshot's dense index).
    pub(crate) fn live_line(&self) -> &'static LiveStats {
        self.0.live
    }

    /// The shared statistics handle (for reuse across snapshots).
    pub fn stats_arc(&self) -> &Arc<EndpointStats> {
        &self.0.stats
    }

    /// Weight after Dubbo's warm-up rule at `now` (see [`warmup_weight`]).
    pub fn effective_weight(&self, now: Timestamp) -> u32 {
        self.weighing().at(now)
    }

    /// What its effective weight is computed from, copied out.
    pub(crate) fn weighing(&self) -> Weighing {
        let registered_ms = match self.registered_at() {
            Some(at) => at.as_millis(),
            None => Weighing::UNREGISTERED,
        };
        Weighing::new(self.0.weight, registered_ms, millis(self.0.warmup))
    }

    /// Whether the endpoint is still inside its warm-up window at `now`.
    pub fn is_warming(&self, now: Timestamp) -> bool {
        now < self.warm_end()
    }

    /// When its warm-up window ends ([`Timestamp::ZERO`] when it has none: no registration
    /// time, or weight 0).
    pub(crate) fn warm_end(&self) -> Timestamp {
        match self.registered_at() {
            Some(at) if self.0.weight > 0 => at.saturating_add(self.0.warmup),
            _ => Timestamp::ZERO,
        }
    }
}

/// The warm-up window an endpoint built from `spec` has.
fn warmup_of(spec: &EndpointSpec) -> Duration {
    match (spec.registered_at, spec.warmup) {
        (_, Some(w)) => w,
        (Some(_), None) => DEFAULT_WARMUP,
        (None, None) => Duration::ZERO,
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("key", &self.0.key)
            .field("address", &self.0.address)
            .field("weight", &self.0.weight)
            .field("zone", &self.0.zone)
            .field("healthy", &self.0.healthy)
            .field("registered_at", &self.registered_at())
            .finish_non_exhaustive()
    }
}

fn key_hash(key: &EndpointKey) -> u64 {
    crate::hash::key_hash(key.as_str().as_bytes())
}

/// The greatest common divisor of two weights (`gcd(0, b) = b`): what weighted tables divide
/// their weights by before they size themselves.
///
/// ```
/// assert_eq!(lbkit_core::weight_gcd(12, 18), 6);
/// assert_eq!(lbkit_core::weight_gcd(0, 7), 7);
/// ```
pub fn weight_gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        weight_gcd(b, a % b)
    }
}

/// What an endpoint's effective weight at any time is computed from
/// ([`Endpoint::effective_weight`]), in 24 bytes: a snapshot's parts keep one per endpoint, so
/// that a weighted strategy's preparation reads a dense array instead of every endpoint.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Weighing {
    weight: u32,
    /// Milliseconds of warm-up a unit of weight takes, `(float) warmup / weight` as Dubbo
    /// computes it: divided once here, not at every preparation.
    step: f32,
    /// Registration time in whole milliseconds, or [`UNREGISTERED`](Self::UNREGISTERED).
    registered_ms: u64,
    warmup_ms: u64,
}

impl Weighing {
    /// No registration time (a timestamp's milliseconds never reach it).
    const UNREGISTERED: u64 = u64::MAX;

    fn new(weight: u32, registered_ms: u64, warmup_ms: u64) -> Weighing {
        Weighing {
            weight,
            step: warmup_ms as f32 / weight as f32,
            registered_ms,
            warmup_ms,
        }
    }

    /// The configured weight ([`Endpoint::weight`]).
    #[inline]
    pub(crate) fn weight(&self) -> u32 {
        self.weight
    }

    /// The effective weight at `now`: Dubbo's warm-up ([`warmup_weight`]).
    #[inline]
    pub(crate) fn at(&self, now: Timestamp) -> u32 {
        let (weight, reg_ms, now_ms) = (self.weight, self.registered_ms, now.as_millis());
        if reg_ms == Weighing::UNREGISTERED || weight == 0 {
            return weight;
        }
        if now_ms < reg_ms {
            return 1;
        }
        let uptime_ms = now_ms - reg_ms;
        if uptime_ms > 0 && uptime_ms < self.warmup_ms {
            // Java: (int) (uptime / ((float) warmup / weight)); f32 -> int truncates and saturates.
            let ww = (uptime_ms as f32 / self.step) as i64;
            ww.clamp(1, i64::from(weight)) as u32
        } else {
            weight
        }
    }
}

/// A duration in whole milliseconds, saturating.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Dubbo's warm-up weight (`AbstractLoadBalance.getWeight` and `calculateWarmupWeight`).
///
/// With `uptime = now − registered_at` in whole milliseconds:
/// * `weight == 0` stays 0 (drained);
/// * `uptime < 0` (registration time in the future, clock skew) gives 1;
/// * `0 < uptime < warmup` gives `trunc(uptime / (warmup / weight))` clamped to `[1, weight]`,
///   computed in 32-bit floating point exactly as Java does (`(int)(uptime / ((float) warmup /
///   weight))`), so lbkit and a Dubbo consumer agree on every weight;
/// * otherwise (including `uptime == 0`, as in Dubbo) the full weight.
///
/// ```
/// use lbkit_core::{warmup_weight, Timestamp};
/// use std::time::Duration;
/// let reg = Timestamp::from_millis(1_000_000);
/// let ten_min = Duration::from_secs(600);
/// // Half-way through a 10-minute warm-up, weight 100 counts as 50.
/// assert_eq!(warmup_weight(100, reg, Timestamp::from_millis(1_300_000), ten_min), 50);
/// assert_eq!(warmup_weight(100, reg, Timestamp::from_millis(999_000), ten_min), 1);
/// ```
pub fn warmup_weight(
    weight: u32,
    registered_at: Timestamp,
    now: Timestamp,
    warmup: Duration,
) -> u32 {
    Weighing::new(weight, registered_at.as_millis(), millis(warmup)).at(now)
}

/// Whether `metadata` carries anything tag routing reads.
fn carries_tags(metadata: &Metadata) -> bool {
    use crate::route::{TAG_GROUPS_KEY, TAG_KEY, TAG_RULE_KEY};
    metadata.get(TAG_KEY).is_some_and(|t| !t.is_empty())
        || metadata.contains_key(TAG_GROUPS_KEY)
        || metadata.contains_key(TAG_RULE_KEY)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIN: u64 = 60_000;

    /// What building a snapshot and weighing an endpoint read (the live line, weight, health,
    /// tags, registration, warm-up) ends within the first 64 bytes of the allocation, after
    /// the `Arc`'s two counts.
    #[test]
    fn what_a_snapshot_reads_shares_the_counts_line() {
        let end = std::mem::offset_of!(EndpointInner, warmup) + std::mem::size_of::<Duration>();
        assert!(end <= 64 - 16, "the hot fields end at byte {end}");
    }

    #[test]
    fn keys_are_equal_by_text_whether_shared_or_not() {
        use std::hash::{BuildHasher, RandomState};
        let a = EndpointKey::from("10.0.0.1:80");
        let clone = a.clone();
        let same_text = EndpointKey::from(String::from("10.0.0.1:80"));
        let other = EndpointKey::from("10.0.0.2:80");
        let hasher = RandomState::new();
        for k in [&clone, &same_text] {
            assert_eq!(&a, k);
            assert_eq!(hasher.hash_one(&a), hasher.hash_one(k));
            assert_eq!(a.cmp(k), std::cmp::Ordering::Equal);
        }
        assert_ne!(a, other);
        assert_eq!(hasher.hash_one(&a), hasher.hash_one("10.0.0.1:80"));
    }

    #[test]
    fn metadata_compares_hashes_and_orders_by_its_entries_not_its_storage() {
        use std::hash::{BuildHasher, RandomState};
        let none = Metadata::new();
        let mut emptied = Metadata::new();
        emptied.insert("k", "v");
        assert_eq!(emptied.remove("k").as_deref(), Some("v"));
        let from_empty = Metadata::from(BTreeMap::new());
        let hasher = RandomState::new();
        for m in [&emptied, &from_empty] {
            assert_eq!(m, &none);
            assert_eq!(m.cmp(&none), std::cmp::Ordering::Equal);
            assert_eq!(hasher.hash_one(m), hasher.hash_one(&none));
            assert!(m.is_empty());
        }
        // A clone shares the map until one side writes.
        let a: Metadata = [("version", "1.2")].into_iter().collect();
        let mut b = a.clone();
        assert_eq!(a, b);
        b.insert("group", "blue");
        assert_ne!(a, b);
        assert_eq!(a.len(), 1);
        assert_eq!(a.cmp(&b), (*a).cmp(&*b), "ordered as the maps are");
        assert_eq!(format!("{a:?}"), r#"{"version": "1.2"}"#);
    }

    fn ww(weight: u32, uptime_ms: i64, warmup_ms: u64) -> u32 {
        let reg = Timestamp::from_millis(1_000_000_000);
        let now = Timestamp::from_millis((1_000_000_000i64 + uptime_ms) as u64);
        warmup_weight(weight, reg, now, Duration::from_millis(warmup_ms))
    }

    #[test]
    fn dubbo_warmup_edges() {
        // Values checked by hand against Dubbo's Java expression.
        assert_eq!(
            ww(100, 0, 10 * MIN),
            100,
            "uptime 0 is not < 0 and not > 0: full weight"
        );
        assert_eq!(ww(100, 1, 10 * MIN), 1);
        assert_eq!(ww(100, 6_000, 10 * MIN), 1);
        assert_eq!(ww(100, 12_000, 10 * MIN), 2);
        assert_eq!(ww(100, 5 * MIN as i64, 10 * MIN), 50);
        assert_eq!(ww(100, 10 * MIN as i64 - 1, 10 * MIN), 99);
        assert_eq!(ww(100, 10 * MIN as i64, 10 * MIN), 100);
        assert_eq!(ww(100, -5, 10 * MIN), 1, "registered in the future");
        assert_eq!(ww(0, 5 * MIN as i64, 10 * MIN), 0, "drained stays drained");
        assert_eq!(ww(7, 5 * MIN as i64, 0), 7, "no window");
        assert_eq!(ww(u32::MAX, 5 * MIN as i64, 10 * MIN), 2_147_483_648);
    }

    #[test]
    fn default_warmup_applies_only_with_a_registration_time() {
        let stats = Arc::new(EndpointStats::default());
        let plain = Endpoint::new(EndpointSpec::new("a:1"), stats.clone(), Timestamp::ZERO);
        assert_eq!(plain.warmup(), Duration::ZERO);
        assert_eq!(plain.effective_weight(Timestamp::from_millis(5)), 100);
        let reg = Endpoint::new(
            EndpointSpec::new("a:1").with_registered_at(Timestamp::from_millis(0)),
            stats,
            Timestamp::ZERO,
        );
        assert_eq!(reg.warmup(), DEFAULT_WARMUP);
        assert!(reg.is_warming(Timestamp::from_millis(1)));
        assert!(!reg.is_warming(Timestamp::from_millis(10 * MIN)));
    }

    proptest! {
        #[test]
        fn warmup_weight_is_bounded_and_monotonic(
            weight in 1u32..=u32::MAX,
            warmup_ms in 0u64..=7 * 24 * 3_600_000,
            a in -1_000_000i64..800_000_000,
            b in -1_000_000i64..800_000_000,
        ) {
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            let (w_lo, w_hi) = (ww(weight, lo, warmup_ms), ww(weight, hi, warmup_ms));
            prop_assert!((1..=weight).contains(&w_lo));
            prop_assert!((1..=weight).contains(&w_hi));
            if lo > 0 {
                prop_assert!(w_lo <= w_hi, "weight must grow with age");
            }
            if hi >= warmup_ms as i64 {
                prop_assert_eq!(w_hi, weight, "full weight at the window's end");
            }
        }
    }
}
