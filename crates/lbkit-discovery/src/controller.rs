//! The [`Controller`]: consumes a source, rebuilds one snapshot per batch of updates, guards
//! against empty pushes, and publishes.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use std::sync::Arc;
//! use lbkit_core::{Balancer, BoxStrategy, Clock, Snapshot};
//! use lbkit_discovery::{parse_static_list, source, Controller, ControllerConfig};
//! # use lbkit_core::{EndpointIdx, PickContext, PickError, Picker, Strategy, Timestamp};
//! # struct First;
//! # impl Strategy for First {
//! #     type Picker = FirstPicker;
//! #     fn name(&self) -> &str { "first" }
//! #     fn prepare(&self, s: &Arc<Snapshot>, _: Timestamp) -> FirstPicker { FirstPicker }
//! # }
//! # struct FirstPicker;
//! # impl Picker for FirstPicker {
//! #     fn pick(&self, _: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> { Ok(EndpointIdx::new(0)) }
//! # }
//! let clock = Clock::System;
//! let balancer = Arc::new(Balancer::new(First, Arc::new(Snapshot::new(0, vec![])), clock.now()));
//! let specs = parse_static_list("10.0.0.1:80=5,10.0.0.2:80", "--endpoints").unwrap();
//! let controller = Controller::new(ControllerConfig::default());
//! // Runs until the source ends (a static list ends after its one update).
//! controller.run(source::static_source(specs), lbkit_discovery::publisher(balancer.clone(), clock)).await;
//! assert_eq!(balancer.snapshot().len(), 2);
//! # });
//! ```

use std::borrow::{Borrow, Cow};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use futures_core::Stream;
use futures_util::{FutureExt, StreamExt};
use lbkit_core::{
    Balancer, Clock, EndpointKey, EndpointSpec, Snapshot, SnapshotBuilder, SnapshotPolicy,
    Strategy, Timestamp, Update,
};
use lbkit_health::{OutlierConfig, OutlierDetector};
use tokio::sync::mpsc;
use tokio::time::MissedTickBehavior;

use crate::error::DiscoveryError;
use crate::source::Pace;

mod removal;

use removal::Held;
pub use removal::{Confirmed, RemovalProtection};

/// What mass-removal protection did, told to the [`Target`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RemovalEvent {
    /// The source removed `keys` with more than the protection's share of the set: they stay
    /// served (`serving` endpoints now) until confirmed gone.
    Held {
        /// The endpoints held.
        keys: Vec<EndpointKey>,
        /// The endpoints served now, held ones included.
        serving: usize,
    },
    /// A held endpoint was confirmed gone and left the set.
    Confirmed {
        /// The endpoint.
        key: EndpointKey,
        /// How.
        by: Confirmed,
    },
}

/// How a [`Controller`] turns updates into snapshots.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// **Empty-push protection** (Dubbo's `enable-empty-protection`): an update that would empty
    /// a non-empty set is held back — the last set stays published, through health changes,
    /// ejections and ticks too — and counted in [`ControllerMetrics::empty_held`]. The next
    /// non-empty update is published as usual. Default `true`: a registry glitch that briefly
    /// lists nothing must not fail every call.
    pub empty_protection: bool,
    /// After the first update of a batch, keep collecting updates for this long before the one
    /// rebuild. Default zero: a batch is whatever is already queued when the first arrives, so
    /// a burst (a registry relist, a deploy) costs one rebuild without adding latency. Either
    /// way, a batch that took `c` to apply holds the next one back until `c` after it ended
    /// (updates arriving meanwhile join it): a source that changes faster than sets are built
    /// (thousands of endpoints, a change every few milliseconds) costs at most about half a
    /// core here, not all of it.
    pub batch_window: Duration,
    /// **Mass-removal protection** ([`RemovalProtection`]): when the set shrinks by more than
    /// half within 10 s, its removals are held back, the endpoints served until each is confirmed gone
    /// (a failed health check, an ejection, or 120 s), and counted in
    /// [`ControllerMetrics::removals_held`]. Default on; `None` turns it off.
    pub removal_protection: Option<RemovalProtection>,
    /// Policy for every published snapshot (panic threshold, slow start). Default: none.
    pub policy: SnapshotPolicy,
    /// Passive outlier detection (lbkit-health's detector), ticked every `interval` by
    /// [`Controller::run`]. Default: none.
    pub outlier: Option<OutlierConfig>,
    /// How often [`Controller::run`] ticks its [`Target`] (re-prepares time-driven pickers:
    /// warm-up, slow start, response-time weights, and builds the Maglev table the catalog's
    /// `maglev` patches between builds: `rebuild_interval_ms`; the same for the changes a
    /// `consistent-hash` or `ketama` ring holds when its `rebuild_interval_ms` is set).
    /// Default `None`: no ticks, and
    /// a picker that asked to be prepared again waits for the next change; `run` ends
    /// when its source ends (unless health checks or outlier detection keep it going).
    pub refresh: Option<Duration>,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            empty_protection: true,
            batch_window: Duration::ZERO,
            removal_protection: Some(RemovalProtection::default()),
            policy: SnapshotPolicy::default(),
            outlier: None,
            refresh: None,
        }
    }
}

/// Counters of a [`Controller`], shared with whoever wants to read them (atomics, `Relaxed`).
#[derive(Debug, Default)]
pub struct ControllerMetrics {
    updates: AtomicU64,
    batches: AtomicU64,
    published: AtomicU64,
    unchanged: AtomicU64,
    empty_held: AtomicU64,
    removals_held: AtomicU64,
    removals_confirmed: AtomicU64,
    held: AtomicU64,
    source_errors: AtomicU64,
    health_changes: AtomicU64,
    ejections: AtomicU64,
}

// === impl ControllerMetrics ===

impl ControllerMetrics {
    /// Updates received.
    pub fn updates(&self) -> u64 {
        self.updates.load(Relaxed)
    }
    /// Batches applied (each at most one rebuild).
    pub fn batches(&self) -> u64 {
        self.batches.load(Relaxed)
    }
    /// Snapshots published.
    pub fn published(&self) -> u64 {
        self.published.load(Relaxed)
    }
    /// Batches that left the set as it was (nothing published).
    pub fn unchanged(&self) -> u64 {
        self.unchanged.load(Relaxed)
    }
    /// Batches held back by empty-push protection.
    pub fn empty_held(&self) -> u64 {
        self.empty_held.load(Relaxed)
    }
    /// Endpoints whose removal mass-removal protection held back ([`RemovalProtection`]).
    pub fn removals_held(&self) -> u64 {
        self.removals_held.load(Relaxed)
    }
    /// Held endpoints confirmed gone since (health check, ejection, time) and let go.
    pub fn removals_confirmed(&self) -> u64 {
        self.removals_confirmed.load(Relaxed)
    }
    /// Endpoints held now: removed by the source, still served.
    pub fn held(&self) -> u64 {
        self.held.load(Relaxed)
    }
    /// Errors reported by the source (the last good snapshot stayed published).
    pub fn source_errors(&self) -> u64 {
        self.source_errors.load(Relaxed)
    }
    /// Health changes applied (an endpoint marked down or up by active checks).
    pub fn health_changes(&self) -> u64 {
        self.health_changes.load(Relaxed)
    }
    /// Ejections by outlier detection.
    pub fn ejections(&self) -> u64 {
        self.ejections.load(Relaxed)
    }
}

/// Where a [`Controller`] publishes: a [`Balancer`] ([`publisher`]), a tower `Pool`, the
/// proxy's services. Owned by the controller's task.
pub trait Target: Send {
    /// Make `snapshot` the one calls pick from. Returns the keys of endpoints that cannot be
    /// served (no client could be made for them): the controller leaves them out until the
    /// source sends them again.
    fn publish(&mut self, snapshot: Arc<Snapshot>, now: Timestamp) -> Vec<EndpointKey>;

    /// Re-prepare pickers that asked for it ([`Balancer::tick`]).
    fn tick(&mut self, now: Timestamp) {
        let _ = now;
    }

    /// The source reported `error` (the last good set stays published).
    fn source_error(&mut self, error: &DiscoveryError) {
        let _ = error;
    }

    /// The source ended.
    fn source_ended(&mut self) {}

    /// Empty-push protection held back an update that would have emptied the set.
    fn empty_held(&mut self) {}

    /// Mass-removal protection held endpoints back, or let one go ([`RemovalEvent`]).
    fn removal(&mut self, event: &RemovalEvent) {
        let _ = event;
    }

    /// Outlier detection ejected an endpoint: how often each was ejected so far.
    fn ejections(&mut self, counts: &HashMap<EndpointKey, u64>) {
        let _ = counts;
    }

    /// Whether anyone still uses the target; [`Controller::run`] ends when not.
    fn alive(&self) -> bool {
        true
    }
}

/// A closure that takes each snapshot (tests, custom publishing); it is never ticked.
impl<F: FnMut(Arc<Snapshot>) + Send> Target for F {
    fn publish(&mut self, snapshot: Arc<Snapshot>, _now: Timestamp) -> Vec<EndpointKey> {
        self(snapshot);
        Vec::new()
    }
}

/// The [`Target`] of one [`Balancer`]: publishes into it and ticks it (with
/// [`ControllerConfig::refresh`] set).
#[derive(Debug)]
pub struct Publisher<S: Strategy> {
    balancer: Arc<Balancer<S>>,
}

impl<S: Strategy> Publisher<S> {
    /// Publish into `balancer` and tick it.
    pub fn new(balancer: Arc<Balancer<S>>) -> Self {
        Publisher { balancer }
    }
}

impl<S: Strategy> Target for Publisher<S> {
    fn publish(&mut self, snapshot: Arc<Snapshot>, now: Timestamp) -> Vec<EndpointKey> {
        self.balancer.publish(snapshot, now);
        Vec::new()
    }

    fn tick(&mut self, now: Timestamp) {
        self.balancer.tick(now);
    }
}

/// A publish callback for [`Controller::run`] that prepares each snapshot for `balancer` and
/// swaps it in, reading `clock` once per publish (no ticks: use [`Publisher`] and
/// [`ControllerConfig::refresh`] for warm-up, response-time weights and the catalog's `maglev`,
/// whose table patched between builds is built at a tick, as are the changes a ring with
/// `rebuild_interval_ms` holds).
pub fn publisher<S: Strategy>(
    balancer: Arc<Balancer<S>>,
    clock: Clock,
) -> impl FnMut(Arc<Snapshot>) + Send {
    move |snapshot| balancer.publish(snapshot, clock.now())
}

/// The one control loop of lbkit: consumes a source, holds back empty pushes, lays the health
/// overlay (active checks, outlier ejections) and the snapshot policy (panic threshold, slow
/// start) over the set, rebuilds one snapshot per change and publishes it; ticks time-driven
/// pickers. The tower `Pool`, `lbkit proxy` and `lbkit watch` all run it. Owned by one task;
/// not on the pick path.
///
/// It keeps the set the source last described (the *desired* set) apart from the set behind
/// the published snapshot (the *serving* set): empty-push protection holds the serving set
/// while the desired one is empty, every later rebuild (a health change, an ejection) starts
/// from the serving set, and later incremental updates apply to the desired set, so nothing
/// held back leaks into the next snapshot.
///
/// A change costs what it changes: the controller marks the keys each update adds, removes or
/// changes (and each health result, held or confirmed removal, rejection), and the rebuild
/// patches only those endpoints ([`SnapshotBuilder::patch`]); every other endpoint is the same
/// object, with its statistics. A full listing in key order (a file source's file rewritten, a
/// registry's listing after a reconnect) is compared with the set in one walk and touches only
/// what differs; a set out of key order is diffed whole ([`SnapshotBuilder::reset_from`]).
/// Strategies then prepare the new snapshot from the last one's picker
/// ([`Strategy::prepare_next`](lbkit_core::Strategy::prepare_next): the hash rings patch).
#[derive(Debug)]
pub struct Controller {
    config: ControllerConfig,
    clock: Clock,
    builder: SnapshotBuilder,
    desired: Vec<Spec>,
    /// The set behind the published snapshot (before the health overlay) while protection
    /// keeps more than `desired` (an empty push held back, or removals held); `None` when it is
    /// `desired` (kept once, not copied per batch: a deep copy of 10 000 specs cost a
    /// millisecond a batch).
    held: Option<Vec<Spec>>,
    /// Whether `held` is an empty push held back (the whole last set).
    empty_held: bool,
    /// Mass-removal protection: the endpoints held and the window's removals.
    removal: Held,
    /// What mass-removal protection did since the target was last told.
    events: Vec<RemovalEvent>,
    /// Whether `desired` changed since the last publish.
    dirty: bool,
    /// The keys whose spec or health changed, or that came or went, since the last build: the
    /// builder changes only those endpoints.
    touched: Touched,
    /// What the last rebuild changed, for the debug line of its publish (`LBKIT_LOG=debug`).
    changed: Option<String>,
    /// Whether `desired` is in strictly ascending key order (as sources list it); updates
    /// keep it so.
    ordered: bool,
    /// No batch is applied before the last one's end plus its cost (see `batch_window`).
    pace: Pace,
    /// Whether anything was published yet.
    published: bool,
    /// Marked down by active health checks.
    down: HashSet<EndpointKey>,
    detector: Option<OutlierDetector>,
    /// The last snapshot built from `serving` and `down`, under the policy: what the outlier
    /// detector reads statistics from, and what is published while nothing is ejected.
    base: Arc<Snapshot>,
    /// Times each endpoint was ejected.
    ejected: HashMap<EndpointKey, u64>,
    health: Option<mpsc::Receiver<(EndpointKey, bool)>>,
    metrics: Arc<ControllerMetrics>,
}

// === impl Controller ===

impl Controller {
    /// A controller with `config`, reading [`Clock::System`].
    pub fn new(config: ControllerConfig) -> Self {
        Controller {
            // Built under the policy: without ejections, what is built is what is published.
            builder: SnapshotBuilder::new().with_policy(config.policy),
            detector: config.outlier.map(OutlierDetector::new),
            removal: Held::new(config.removal_protection),
            config,
            clock: Clock::System,
            desired: Vec::new(),
            held: None,
            empty_held: false,
            events: Vec::new(),
            dirty: false,
            touched: Touched::All,
            changed: None,
            ordered: true,
            pace: Pace::default(),
            published: false,
            down: HashSet::new(),
            base: Arc::new(Snapshot::new(0, Vec::new())),
            ejected: HashMap::new(),
            health: None,
            metrics: Arc::default(),
        }
    }

    /// Use `clock` for first-seen times, preparation and outlier ticks.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Take health results `(endpoint, healthy)` from `rx` (lbkit-health's active checks, or
    /// any prober): [`run`](Self::run) applies each change with [`set_health`](Self::set_health).
    pub fn with_health(mut self, rx: mpsc::Receiver<(EndpointKey, bool)>) -> Self {
        self.health = Some(rx);
        self
    }

    /// Start from `specs` as if the source had sent them and they had been published (a
    /// service replaced by a reload keeps serving its predecessor's set until its own source
    /// speaks).
    pub fn with_initial(mut self, specs: Vec<EndpointSpec>) -> Self {
        self.ordered = in_key_order(&specs);
        self.desired = specs.into_iter().map(Box::new).collect();
        self.held = None;
        self.empty_held = false;
        self.dirty = true;
        self.touched = Touched::All;
        self
    }

    /// The counters (cheap to clone, readable from anywhere).
    pub fn metrics(&self) -> Arc<ControllerMetrics> {
        self.metrics.clone()
    }

    /// The set the source last described (may differ from the published one while an empty
    /// push is held back). Boxed: an insertion or removal in a list of 10 000 in key order
    /// moves pointers, not specs.
    pub fn desired(&self) -> &[Box<EndpointSpec>] {
        &self.desired
    }

    /// The set behind the published snapshot.
    pub fn serving(&self) -> &[Box<EndpointSpec>] {
        self.held.as_deref().unwrap_or(&self.desired)
    }

    /// Times each endpoint was ejected by outlier detection.
    pub fn ejections(&self) -> &HashMap<EndpointKey, u64> {
        &self.ejected
    }

    /// Apply one batch. Returns the snapshot to publish, or `None` when the batch changed
    /// nothing or was held back by empty-push protection. Removals of more than the
    /// protection's share of the set are held ([`RemovalProtection`]).
    ///
    /// # Complexity
    /// For u updated specs of a set of n in key order: O(u log n) to apply them (O(n + u) for
    /// a large batch or a reset, and O(n) moves of 8-byte pointers: a `Vec` of boxed specs in
    /// key order), and a snapshot patched in O(u log n) comparisons and O(u · 64) copies by
    /// reference, plus O(n) sequential bytes (see [`SnapshotBuilder::patch`]).
    pub fn apply_batch(&mut self, updates: Vec<Update>) -> Option<Arc<Snapshot>> {
        self.metrics.batches.fetch_add(1, Relaxed);
        self.metrics
            .updates
            .fetch_add(u64::try_from(updates.len()).unwrap_or(u64::MAX), Relaxed);
        let updates = from_last_reset(updates);
        let serving = !self.serving().is_empty();
        let before = self.keep_if_it_could_empty(&updates, serving);
        let listed = if self.empty_held {
            self.serving().len()
        } else {
            self.desired.len()
        };
        // The specs the batch removes, when removals are watched.
        let watch = self.removal.on() && self.published;
        let mut removed = Vec::new();
        for update in updates {
            let out = watch.then_some(&mut removed);
            let (specs, touched) = (&mut self.desired, &mut self.touched);
            self.dirty |= apply(specs, &mut self.ordered, update, out, touched);
        }
        if !self.dirty && self.published {
            self.metrics.unchanged.fetch_add(1, Relaxed);
            return None;
        }
        if self.config.empty_protection && self.desired.is_empty() && serving && self.published {
            return self.hold_empty(before);
        }
        if std::mem::take(&mut self.empty_held) {
            // Out of a held empty push: the set served was `held`, what follows is `desired`.
            self.touched = Touched::All;
            if watch {
                // What was served and is not listed now is removed too.
                removed.extend(self.held.take().unwrap_or_default());
            }
        }
        self.judge_removals(removed, listed);
        self.dirty = false;
        Some(self.rebuild())
    }

    /// The set served so far, kept aside when this batch could empty it and empty-push
    /// protection would then hold it (`desired` itself is changed in place). Only an empty
    /// reset, or removals of at least as many keys as the set has (after the batch's reset, if
    /// it starts with one), can empty it: a registry's churn removes a few at a time and copies
    /// nothing. Not needed while protection already keeps the serving set apart (`held`).
    fn keep_if_it_could_empty(&self, updates: &[Update], serving: bool) -> Option<Vec<Spec>> {
        if !(self.config.empty_protection && self.published && self.held.is_none() && serving) {
            return None;
        }
        let mut size = self.desired.len();
        let mut removed = 0;
        let mut could_empty = false;
        for u in updates {
            match u {
                Update::Reset(v) => {
                    // Out of key order it may repeat keys: any removal may empty it.
                    size = if in_key_order(v) { v.len() } else { 1 };
                    could_empty |= v.is_empty();
                }
                Update::Remove(keys) => removed += keys.len(),
                Update::Add(_) => {}
            }
        }
        (could_empty || removed >= size).then(|| self.desired.clone())
    }

    /// Empty-push protection: the source listed nothing; the set served so far (`before`, or
    /// what protection already kept apart) stays, whole.
    fn hold_empty(&mut self, before: Option<Vec<Spec>>) -> Option<Arc<Snapshot>> {
        if self.held.is_none() {
            self.held = before;
        }
        self.empty_held = true;
        // The whole set is held now, until the source lists endpoints again.
        self.removal.clear();
        self.metrics.held.store(0, Relaxed);
        self.metrics.empty_held.fetch_add(1, Relaxed);
        tracing::warn!(
            held = self.serving().len(),
            "empty-push protection: the source listed no endpoints; keeping the last set"
        );
        None
    }

    /// Mass-removal protection's verdict on a batch that removed `removed` from a set of
    /// `listed` (the source's set is `desired` now): the serving set is the source's plus
    /// whatever stays held.
    fn judge_removals(&mut self, removed: Vec<Spec>, listed: usize) {
        if self.removal.on() {
            let now = self.clock.now();
            let set: Option<HashSet<&EndpointKey>> =
                (!self.ordered).then(|| self.desired.iter().map(|s| &s.key).collect());
            let desired = &self.desired;
            let is_listed = |k: &EndpointKey| match &set {
                Some(set) => set.contains(k),
                None => desired.binary_search_by(|s| s.key.cmp(k)).is_ok(),
            };
            let (down, detector) = (&self.down, &self.detector);
            let confirmed = |k: &EndpointKey| {
                down.contains(k) || detector.as_ref().is_some_and(|d| d.ejection(k).is_some())
            };
            let sizes = (listed, desired.len());
            let touched = &self.touched;
            let keys = (self.removal).judge(removed, sizes, touched, &is_listed, confirmed, now);
            // Held: served again, earlier removals of the window too.
            keys.iter().for_each(|k| self.touched.key(k));
            if !keys.is_empty() {
                let n = u64::try_from(keys.len()).unwrap_or(u64::MAX);
                self.metrics.removals_held.fetch_add(n, Relaxed);
                let serving = self.desired.len() + self.removal.len();
                tracing::warn!(
                    held = keys.len(),
                    serving,
                    "mass removal held: the source removed more than the protected share of \
                     the endpoints; serving them until each is confirmed gone"
                );
                self.events.push(RemovalEvent::Held { keys, serving });
            }
        }
        self.held = self.removal.serving(&self.desired, self.ordered);
        self.metrics.held.store(self.removal.len() as u64, Relaxed);
    }

    /// A held endpoint was confirmed gone (`by`): counted, logged, told; the serving set shrinks.
    fn confirmed(&mut self, key: EndpointKey, by: Confirmed) {
        self.metrics.removals_confirmed.fetch_add(1, Relaxed);
        tracing::info!(endpoint = %key, %by, "held endpoint confirmed gone");
        self.touched.key(&key);
        self.events.push(RemovalEvent::Confirmed { key, by });
        self.held = self.removal.serving(&self.desired, self.ordered);
        self.metrics.held.store(self.removal.len() as u64, Relaxed);
    }

    /// Let go of the held endpoints whose confirmation time ran out by `now`. Returns the
    /// snapshot to publish when any did.
    pub fn expire_held(&mut self, now: Timestamp) -> Option<Arc<Snapshot>> {
        let due = self.removal.expire(now);
        if due.is_empty() {
            return None;
        }
        for key in due {
            self.confirmed(key, Confirmed::Time);
        }
        Some(self.rebuild())
    }

    /// When a held endpoint is next due to be let go ([`expire_held`](Self::expire_held)).
    pub fn next_expiry(&self) -> Option<Timestamp> {
        self.removal.next_expiry()
    }

    /// An active health check says `key` is `healthy` or not. Returns the snapshot to publish
    /// when that changes what is served (built from the serving set: a held empty push stays
    /// held).
    pub fn set_health(&mut self, key: EndpointKey, healthy: bool) -> Option<Arc<Snapshot>> {
        let changed = if healthy {
            self.down.remove(&key)
        } else {
            self.down.insert(key.clone())
        };
        if !changed {
            return None;
        }
        self.metrics.health_changes.fetch_add(1, Relaxed);
        tracing::info!(endpoint = %key, healthy, "health check");
        self.touched.key(&key);
        if !healthy && self.removal.confirm(&key) {
            self.confirmed(key, Confirmed::HealthCheck);
        }
        self.published.then(|| self.rebuild())
    }

    /// Run the outlier detector over the calls since its last tick. Returns the snapshot to
    /// publish when an endpoint was ejected or readmitted.
    pub fn tick_outliers(&mut self, now: Timestamp) -> Option<Arc<Snapshot>> {
        let detector = self.detector.as_mut()?;
        if !detector.tick(&self.base, now) {
            return None;
        }
        for e in self.base.endpoints() {
            if let Some(ej) = detector.ejection(e.key()) {
                let count = self.ejected.entry(e.key().clone()).or_default();
                if u64::from(ej.times) > *count {
                    tracing::warn!(endpoint = %e.key(), rule = ?ej.rule, "ejected");
                    self.metrics.ejections.fetch_add(1, Relaxed);
                    *count = u64::from(ej.times);
                }
            }
        }
        let ejected: Vec<EndpointKey> = (self.removal.keys())
            .filter(|k| detector.ejection(k).is_some())
            .cloned()
            .collect();
        if ejected.is_empty() {
            return Some(self.overlaid());
        }
        for key in ejected {
            self.removal.confirm(&key);
            self.confirmed(key, Confirmed::Ejected);
        }
        Some(self.rebuild())
    }

    /// Leave `keys` out (their clients could not be made) until the source sends them again.
    /// Returns the snapshot to publish.
    pub fn reject(&mut self, keys: &[EndpointKey]) -> Option<Arc<Snapshot>> {
        let gone: HashSet<&EndpointKey> = keys.iter().collect();
        let before = self.serving().len();
        for key in keys {
            self.removal.confirm(key);
            self.touched.key(key);
        }
        self.metrics.held.store(self.removal.len() as u64, Relaxed);
        self.desired.retain(|s| !gone.contains(&s.key));
        if let Some(held) = &mut self.held {
            held.retain(|s| !gone.contains(&s.key));
        }
        (self.serving().len() != before).then(|| self.rebuild())
    }

    /// Record a source error: logged and counted; the last good snapshot stays published.
    pub fn source_error(&self, error: &DiscoveryError) {
        self.metrics.source_errors.fetch_add(1, Relaxed);
        tracing::warn!(error = %error_chain(error), "discovery source error; keeping the last good set");
    }

    /// The serving set with the health overlay, rebuilt (statistics kept by key), then the
    /// ejections and the policy.
    fn rebuild(&mut self) -> Arc<Snapshot> {
        let now = self.clock.now();
        let down = &self.down;
        // Borrowed: the builder copies only what is new or changed.
        let serving = self.held.as_deref().unwrap_or(&self.desired);
        let touched = std::mem::replace(&mut self.touched, Touched::none());
        self.changed = tracing::enabled!(tracing::Level::DEBUG).then(|| touched.describe());
        self.base = match touched {
            // A change of k keys to a set in key order: k lookups, k specs compared.
            Touched::Keys(keys) if self.ordered => {
                let spec = |k: &EndpointKey| {
                    let at = serving.binary_search_by(|s| s.key.cmp(k));
                    at.ok().map(|i| overlay(down, &serving[i]))
                };
                let changes = keys.into_iter().map(|k| {
                    let now_served = spec(&k);
                    (k, now_served)
                });
                self.builder.patch(changes.collect(), now)
            }
            _ => self
                .builder
                .reset_from(serving.iter().map(|s| overlay(down, s)), now),
        };
        self.published = true;
        self.overlaid()
    }

    /// `base` under the outlier overlay and the policy.
    fn overlaid(&self) -> Arc<Snapshot> {
        self.metrics.published.fetch_add(1, Relaxed);
        let overlay = self.detector.as_ref().map(OutlierDetector::overlay);
        let Some(overlay) = overlay.filter(|o| !o.ejected.is_empty() || !o.readmitted.is_empty())
        else {
            // Built under the policy already, and nothing to overlay.
            return self.base.clone();
        };
        Arc::new(
            self.base
                .derive(self.base.version(), &self.config.policy, overlay),
        )
    }

    /// Apply `updates` as one batch and publish the result on `target` (what
    /// [`run`](Self::run) does per batch; for updates at hand before the loop starts).
    pub fn apply_into<T: Target>(&mut self, updates: Vec<Update>, target: &mut T) {
        let held = self.metrics.empty_held();
        if let Some(snapshot) = self.apply_batch(updates) {
            self.publish(target, snapshot);
        } else if self.metrics.empty_held() != held {
            target.empty_held();
        }
    }

    /// Publish `snapshot` on `target`, leaving out what it cannot serve.
    fn publish<T: Target>(&mut self, target: &mut T, snapshot: Arc<Snapshot>) {
        let now = self.clock.now();
        let endpoints = snapshot.len();
        let rejected = target.publish(snapshot, now);
        if let Some(changed) = self.changed.take() {
            // After the target took it: its strategy is prepared, picks see the change.
            tracing::debug!(endpoints, %changed, "published");
        }
        for event in self.events.drain(..) {
            target.removal(&event);
        }
        if !rejected.is_empty() {
            if let Some(next) = self.reject(&rejected) {
                // Everything left has a client now: nothing more is rejected.
                let _ = target.publish(next, self.clock.now());
            }
        }
    }

    /// Consume `source`, publishing each new snapshot on `target`; apply health results
    /// ([`with_health`](Self::with_health)); tick the outlier detector every
    /// `outlier.interval` and `target` every `refresh`.
    ///
    /// Updates that are already queued when one arrives (plus those arriving within
    /// [`ControllerConfig::batch_window`]) form one batch and one rebuild. Ends when the source
    /// has ended and nothing else is configured (no health results, no outlier detection, no
    /// refresh), or when the target is no longer [`alive`](Target::alive).
    pub async fn run<S, T>(mut self, source: S, mut target: T)
    where
        S: Stream<Item = Result<Update, DiscoveryError>> + Send,
        T: Target,
    {
        let mut source = std::pin::pin!(source);
        let mut source_open = true;
        let mut health = self.health.take();
        let mut outliers = every(self.config.outlier.map(|o| o.interval));
        let mut refresh = every(self.config.refresh);
        let ticking = self.config.refresh.is_some() || self.detector.is_some();
        self.publish_initial(&mut target);
        while target.alive()
            && (source_open || health.is_some() || ticking || self.removal.len() > 0)
        {
            let expiry = self.expiry();
            tokio::select! {
                item = source.next(), if source_open => {
                    let ended = match item {
                        Some(first) => self.batch(first, &mut source, &mut target).await,
                        None => true,
                    };
                    if ended {
                        source_open = false;
                        target.source_ended();
                    }
                }
                msg = recv(&mut health), if health.is_some() => match msg {
                    Some((key, healthy)) => {
                        if let Some(s) = self.set_health(key, healthy) {
                            self.publish(&mut target, s);
                        }
                    }
                    None => health = None,
                },
                _ = outliers.tick(), if self.detector.is_some() => self.on_outlier_tick(&mut target),
                _ = refresh.tick(), if self.config.refresh.is_some() => {
                    target.tick(self.clock.now());
                }
                () = sleep_until(expiry), if expiry.is_some() => {
                    if let Some(s) = self.expire_held(self.clock.now()) {
                        self.publish(&mut target, s);
                    }
                }
            }
        }
    }

    /// An initial set (a reload's hand-over) is served before the source speaks.
    fn publish_initial<T: Target>(&mut self, target: &mut T) {
        if self.dirty {
            self.dirty = false;
            let s = self.rebuild();
            self.publish(target, s);
        }
    }

    /// The outlier detector's tick: publish what it ejected or readmitted, and tell `target`
    /// of the ejections when there are new ones.
    fn on_outlier_tick<T: Target>(&mut self, target: &mut T) {
        let ejections = self.metrics.ejections();
        if let Some(s) = self.tick_outliers(self.clock.now()) {
            self.publish(target, s);
            if self.metrics.ejections() != ejections {
                target.ejections(&self.ejected);
            }
        }
    }

    /// When the next held endpoint is due to be let go, on tokio's clock.
    fn expiry(&self) -> Option<tokio::time::Instant> {
        let left = self
            .next_expiry()?
            .saturating_duration_since(self.clock.now());
        Some(tokio::time::Instant::now() + left)
    }

    /// One batch starting with `first`; returns whether the source ended.
    async fn batch<S, T>(
        &mut self,
        first: Result<Update, DiscoveryError>,
        source: &mut std::pin::Pin<&mut S>,
        target: &mut T,
    ) -> bool
    where
        S: Stream<Item = Result<Update, DiscoveryError>> + Send,
        T: Target,
    {
        let mut batch = Vec::new();
        self.take(first, &mut batch, target);
        let mut ended = false;
        let now = tokio::time::Instant::now();
        let deadline = (now + self.config.batch_window).max(self.pace.ready_at().unwrap_or(now));
        while !ended {
            let next = if deadline <= now {
                match source.next().now_or_never() {
                    Some(item) => item,
                    None => break,
                }
            } else {
                match tokio::time::timeout_at(deadline, source.next()).await {
                    Ok(item) => item,
                    Err(_) => break,
                }
            };
            match next {
                Some(item) => self.take(item, &mut batch, target),
                None => ended = true,
            }
        }
        if !batch.is_empty() {
            let began = tokio::time::Instant::now();
            self.apply_into(batch, target);
            self.pace.done(began);
        }
        ended
    }

    fn take<T: Target>(
        &self,
        item: Result<Update, DiscoveryError>,
        batch: &mut Vec<Update>,
        target: &mut T,
    ) {
        match item {
            Ok(update) => batch.push(update),
            Err(e) => {
                self.source_error(&e);
                target.source_error(&e);
            }
        }
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A tick every `d` (hourly when `None`: the branch it drives is off), late ticks delayed, not
/// bunched.
fn every(d: Option<Duration>) -> tokio::time::Interval {
    let mut i = tokio::time::interval(d.unwrap_or(Duration::from_secs(3_600)));
    i.set_missed_tick_behavior(MissedTickBehavior::Delay);
    i
}

async fn recv(rx: &mut Option<mpsc::Receiver<(EndpointKey, bool)>>) -> Option<(EndpointKey, bool)> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// `error: cause: cause`, for one log line.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// `updates` from the last reset on: a reset replaces the whole set, so what came before the
/// batch's last one is moot (a lagging consumer's queue of full listings costs one comparison,
/// not one each).
fn from_last_reset(mut updates: Vec<Update>) -> Vec<Update> {
    let from = updates
        .iter()
        .rposition(|u| matches!(u, Update::Reset(_)))
        .unwrap_or(0);
    updates.drain(..from);
    updates
}

fn in_key_order<S: Borrow<EndpointSpec>>(specs: &[S]) -> bool {
    specs
        .windows(2)
        .all(|w| w[0].borrow().key < w[1].borrow().key)
}

/// A spec in the Controller's lists: boxed, so that an insertion or removal in a list of
/// 10 000 in key order moves 8-byte pointers, not 120-byte specs (6 % of the proxy's samples
/// under churn when it moved specs).
type Spec = Box<EndpointSpec>;

/// Updates of at most this many specs or keys go into a list in key order one binary search
/// each (a move of the tail per insertion or removal); larger ones take one pass over it.
const FEW: usize = 8;

/// Apply one update to the spec list; keys stay unique, a replaced spec keeps its place.
/// `ordered` says whether the list is in strictly ascending key order, which every update
/// keeps (an added spec goes to its place); a reset out of order is taken in its own order,
/// and later additions are appended. Returns whether the list changed. O(n + u), or
/// O(u log n + u moves of the tail) for a few changes to an ordered list; nothing is cloned.
fn apply(
    specs: &mut Vec<Spec>,
    ordered: &mut bool,
    update: Update,
    removed: Option<&mut Vec<Spec>>,
    touched: &mut Touched,
) -> bool {
    match update {
        Update::Reset(new) => {
            if *ordered && in_key_order(&new) {
                touch_differences(specs, &new, touched);
            } else {
                touched.all();
            }
            reset(specs, ordered, new, removed)
        }
        Update::Add(new) if *ordered && new.len() <= FEW => {
            let mut changed = false;
            for spec in new {
                touched.key(&spec.key);
                match specs.binary_search_by(|s| s.key.cmp(&spec.key)) {
                    Ok(i) if *specs[i] == spec => continue,
                    Ok(i) => *specs[i] = spec,
                    Err(i) => specs.insert(i, Box::new(spec)),
                }
                changed = true;
            }
            changed
        }
        Update::Add(new) if *ordered => merge_ordered(specs, new, touched),
        Update::Add(new) => add_or_replace(specs, new, touched),
        Update::Remove(keys) => {
            keys.iter().for_each(|k| touched.key(k));
            remove(specs, *ordered, &keys, removed)
        }
    }
}

/// Mark in `touched` the keys whose spec differs between `old` and `new`, both in strictly
/// ascending key order, in one merge walk: a full listing (a file source's file rewritten, a
/// registry's listing after a reconnect) then touches what changed, and the set is patched,
/// not rebuilt. All of it when more than half changed.
fn touch_differences(old: &[Spec], new: &[EndpointSpec], touched: &mut Touched) {
    let (mut i, mut j) = (0, 0);
    let mut keys = Vec::new();
    loop {
        let key = match (old.get(i), new.get(j)) {
            (Some(a), Some(b)) if a.key == b.key => {
                (i, j) = (i + 1, j + 1);
                if **a == *b {
                    continue;
                }
                &a.key
            }
            (Some(a), b) if b.is_none_or(|b| a.key < b.key) => {
                i += 1;
                &a.key
            }
            (_, Some(b)) => {
                j += 1;
                &b.key
            }
            (None, None) | (Some(_), None) => break,
        };
        keys.push(key);
    }
    if keys.len() * 2 > new.len().max(old.len()) {
        touched.all();
    } else {
        keys.into_iter().for_each(|k| touched.key(k));
    }
}

/// Replace the list with `new`; what left it goes to `removed`, when given.
fn reset(
    specs: &mut Vec<Spec>,
    ordered: &mut bool,
    new: Vec<EndpointSpec>,
    removed: Option<&mut Vec<Spec>>,
) -> bool {
    if specs.len() == new.len() && specs.iter().zip(&new).all(|(a, b)| **a == *b) {
        return false;
    }
    let old = std::mem::take(specs);
    *ordered = in_key_order(&new);
    if *ordered {
        // In key order, so unique (sources list so): taken as it is.
        *specs = new.into_iter().map(Box::new).collect();
    } else {
        add_or_replace(specs, new, &mut Touched::All);
    }
    if let Some(out) = removed {
        let now: HashSet<&EndpointKey, foldhash::fast::RandomState> =
            specs.iter().map(|s| &s.key).collect();
        out.extend(old.into_iter().filter(|s| !now.contains(&s.key)));
    }
    true
}

/// Remove `keys` from the list; what left it goes to `removed`, when given.
fn remove(
    specs: &mut Vec<Spec>,
    ordered: bool,
    keys: &[EndpointKey],
    mut removed: Option<&mut Vec<Spec>>,
) -> bool {
    let before = specs.len();
    if ordered && keys.len() <= FEW {
        for key in keys {
            if let Ok(i) = specs.binary_search_by(|s| s.key.cmp(key)) {
                let spec = specs.remove(i);
                if let Some(out) = removed.as_deref_mut() {
                    out.push(spec);
                }
            }
        }
        return specs.len() != before;
    }
    let gone: HashSet<&EndpointKey, foldhash::fast::RandomState> = keys.iter().collect();
    match removed {
        Some(out) => {
            let (left, kept) = std::mem::take(specs)
                .into_iter()
                .partition(|s| gone.contains(&s.key));
            *specs = kept;
            out.extend::<Vec<_>>(left);
        }
        None => specs.retain(|s| !gone.contains(&s.key)),
    }
    specs.len() != before
}

/// Add or replace `new` (later wins among its duplicates) in `specs`, which is in key order
/// and stays so: one merge.
fn merge_ordered(specs: &mut Vec<Spec>, mut new: Vec<EndpointSpec>, touched: &mut Touched) -> bool {
    // Stable: of equal keys the later stays later, and is the one kept.
    new.sort_by(|a, b| a.key.cmp(&b.key));
    new.reverse();
    new.dedup_by(|a, b| a.key == b.key);
    new.reverse();
    let mut old = std::mem::take(specs).into_iter().peekable();
    let mut out = Vec::with_capacity(old.len() + new.len());
    let mut changed = false;
    for spec in new {
        out.extend(std::iter::from_fn(|| old.next_if(|o| o.key < spec.key)));
        match old.next_if(|o| o.key == spec.key) {
            Some(o) if *o == spec => out.push(o),
            _ => {
                touched.key(&spec.key);
                out.push(Box::new(spec));
                changed = true;
            }
        }
    }
    out.extend(old);
    *specs = out;
    changed
}

/// Maps keyed by endpoint keys in per-batch diffs: foldhash, several times faster than SipHash
/// on keys this short, seeded per process.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

fn add_or_replace(specs: &mut Vec<Spec>, new: Vec<EndpointSpec>, touched: &mut Touched) -> bool {
    let mut pos: FastMap<EndpointKey, usize> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| (s.key.clone(), i))
        .collect();
    pos.reserve(new.len());
    let mut changed = false;
    for spec in new {
        match pos.get(&spec.key) {
            Some(&i) if *specs[i] == spec => {}
            Some(&i) => {
                touched.key(&spec.key);
                *specs[i] = spec;
                changed = true;
            }
            None => {
                touched.key(&spec.key);
                pos.insert(spec.key.clone(), specs.len());
                specs.push(Box::new(spec));
                changed = true;
            }
        }
    }
    changed
}

/// `spec` as served: down when a health check says so.
fn overlay<'s>(down: &HashSet<EndpointKey>, spec: &'s EndpointSpec) -> Cow<'s, EndpointSpec> {
    if down.is_empty() || !spec.healthy || !down.contains(&spec.key) {
        Cow::Borrowed(spec)
    } else {
        Cow::Owned(spec.clone().with_healthy(false))
    }
}

/// The keys added, removed, or changed in spec or health overlay since the last build (in key
/// order), or all of them.
#[derive(Debug)]
enum Touched {
    All,
    Keys(BTreeSet<EndpointKey>),
}

impl Touched {
    fn none() -> Self {
        Touched::Keys(BTreeSet::new())
    }

    fn all(&mut self) {
        *self = Touched::All;
    }

    fn key(&mut self, key: &EndpointKey) {
        if let Touched::Keys(keys) = self {
            keys.insert(key.clone());
        }
    }

    #[cfg(test)]
    fn contains(&self, key: &EndpointKey) -> bool {
        match self {
            Touched::All => true,
            Touched::Keys(keys) => keys.contains(key),
        }
    }

    /// The keys, or how many when there are more than a line's worth, or "all".
    fn describe(&self) -> String {
        match self {
            Touched::All => "all".into(),
            Touched::Keys(keys) if keys.len() > 64 => format!("{} keys", keys.len()),
            Touched::Keys(keys) => keys
                .iter()
                .map(EndpointKey::as_str)
                .collect::<Vec<_>>()
                .join(" "),
        }
    }
}

#[cfg(test)]
mod tests;
