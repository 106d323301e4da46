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

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use futures_core::Stream;
use futures_util::{FutureExt, StreamExt};
use lbkit_core::{
    Balancer, Clock, EndpointKey, EndpointSpec, HealthOverlay, Snapshot, SnapshotBuilder,
    SnapshotPolicy, Strategy, Update,
};

use crate::error::DiscoveryError;

/// How a [`Controller`] turns updates into snapshots.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// **Empty-push protection** (Dubbo's `enable-empty-protection`): an update that would empty
    /// a non-empty set is held back — the last set stays published — and counted in
    /// [`ControllerMetrics::empty_held`]. The next non-empty update is published as usual.
    /// Default `true`: a registry glitch that briefly lists nothing must not fail every call.
    pub empty_protection: bool,
    /// After the first update of a batch, keep collecting updates for this long before the one
    /// rebuild. Default zero: a batch is whatever is already queued when the first arrives, so
    /// a burst (a registry relist, a deploy) costs one rebuild without adding latency.
    pub batch_window: Duration,
    /// Policy for every published snapshot (panic threshold, slow start). Default: none.
    pub policy: SnapshotPolicy,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            empty_protection: true,
            batch_window: Duration::ZERO,
            policy: SnapshotPolicy::default(),
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
    source_errors: AtomicU64,
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
    /// Errors reported by the source (the last good snapshot stayed published).
    pub fn source_errors(&self) -> u64 {
        self.source_errors.load(Relaxed)
    }
}

/// Consumes one source and publishes snapshots. Owned by one task; not on the pick path.
///
/// It keeps the set the source last described (the *desired* set) apart from the set last
/// published: empty-push protection holds the published set while the desired one is empty,
/// and later incremental updates apply to the desired set, so nothing held back leaks into the
/// next snapshot. Each batch becomes one [`SnapshotBuilder`] reset, which diffs by key and
/// keeps the statistics of endpoints that stay.
#[derive(Debug)]
pub struct Controller {
    config: ControllerConfig,
    clock: Clock,
    builder: SnapshotBuilder,
    desired: Vec<EndpointSpec>,
    /// Whether `desired` changed since the last publish.
    dirty: bool,
    /// Size of the last published set (`None` before the first publish).
    published_len: Option<usize>,
    metrics: Arc<ControllerMetrics>,
}

// === impl Controller ===

impl Controller {
    /// A controller with `config`, reading [`Clock::System`].
    pub fn new(config: ControllerConfig) -> Self {
        Controller {
            config,
            clock: Clock::System,
            builder: SnapshotBuilder::new(),
            desired: Vec::new(),
            dirty: false,
            published_len: None,
            metrics: Arc::default(),
        }
    }

    /// Use `clock` for first-seen times and preparation.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The counters (cheap to clone, readable from anywhere).
    pub fn metrics(&self) -> Arc<ControllerMetrics> {
        self.metrics.clone()
    }

    /// The set the source last described (may differ from the published one while an empty
    /// push is held back).
    pub fn desired(&self) -> &[EndpointSpec] {
        &self.desired
    }

    /// Apply one batch. Returns the snapshot to publish, or `None` when the batch changed
    /// nothing or was held back by empty-push protection.
    ///
    /// # Complexity
    /// O(n + u) for n endpoints and u updated specs, plus one snapshot build.
    pub fn apply_batch(&mut self, updates: Vec<Update>) -> Option<Arc<Snapshot>> {
        self.metrics.batches.fetch_add(1, Relaxed);
        for update in updates {
            self.metrics.updates.fetch_add(1, Relaxed);
            self.dirty |= apply(&mut self.desired, update);
        }
        let published_len = self.published_len;
        if !self.dirty && published_len.is_some() {
            self.metrics.unchanged.fetch_add(1, Relaxed);
            return None;
        }
        if self.config.empty_protection && self.desired.is_empty() && published_len > Some(0) {
            self.metrics.empty_held.fetch_add(1, Relaxed);
            tracing::warn!(
                held = published_len.unwrap_or(0),
                "empty-push protection: the source listed no endpoints; keeping the last set"
            );
            return None;
        }
        let now = self.clock.now();
        let snapshot = self.builder.apply(Update::Reset(self.desired.clone()), now);
        self.published_len = Some(self.desired.len());
        self.dirty = false;
        let snapshot = if self.config.policy == SnapshotPolicy::default() {
            snapshot
        } else {
            let overlay = HealthOverlay::default();
            Arc::new(snapshot.derive(snapshot.version(), &self.config.policy, &overlay))
        };
        self.metrics.published.fetch_add(1, Relaxed);
        Some(snapshot)
    }

    /// Record a source error: logged and counted; the last good snapshot stays published.
    pub fn source_error(&self, error: &DiscoveryError) {
        self.metrics.source_errors.fetch_add(1, Relaxed);
        tracing::warn!(error = %error_chain(error), "discovery source error; keeping the last good set");
    }

    /// Consume `source` until it ends, calling `publish` with each new snapshot.
    ///
    /// Updates that are already queued when one arrives (plus those arriving within
    /// [`ControllerConfig::batch_window`]) form one batch and one rebuild.
    pub async fn run<S, F>(mut self, source: S, mut publish: F)
    where
        S: Stream<Item = Result<Update, DiscoveryError>> + Send,
        F: FnMut(Arc<Snapshot>),
    {
        let mut source = std::pin::pin!(source);
        while let Some(first) = source.next().await {
            let mut batch = Vec::new();
            self.take(first, &mut batch);
            let mut ended = false;
            let deadline = tokio::time::Instant::now() + self.config.batch_window;
            while !ended {
                let next = if self.config.batch_window.is_zero() {
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
                    Some(item) => self.take(item, &mut batch),
                    None => ended = true,
                }
            }
            if !batch.is_empty() {
                if let Some(snapshot) = self.apply_batch(batch) {
                    publish(snapshot);
                }
            }
            if ended {
                break;
            }
        }
    }

    fn take(&self, item: Result<Update, DiscoveryError>, batch: &mut Vec<Update>) {
        match item {
            Ok(update) => batch.push(update),
            Err(e) => self.source_error(&e),
        }
    }
}

/// A publish callback for [`Controller::run`] that prepares each snapshot for `balancer` and
/// swaps it in, reading `clock` once per publish.
pub fn publisher<S: Strategy>(
    balancer: Arc<Balancer<S>>,
    clock: Clock,
) -> impl FnMut(Arc<Snapshot>) + Send {
    move |snapshot| balancer.publish(snapshot, clock.now())
}

/// `error: cause: cause`, for one log line.
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// Apply one update to an ordered spec list; keys stay unique, a replaced spec keeps its place.
/// Returns whether the list changed. O(n + u); nothing is cloned.
fn apply(specs: &mut Vec<EndpointSpec>, update: Update) -> bool {
    match update {
        Update::Reset(new) => {
            if *specs == new {
                return false;
            }
            specs.clear();
            add_or_replace(specs, new);
            true
        }
        Update::Add(new) => add_or_replace(specs, new),
        Update::Remove(keys) => {
            let gone: HashSet<&EndpointKey> = keys.iter().collect();
            let before = specs.len();
            specs.retain(|s| !gone.contains(&s.key));
            specs.len() != before
        }
    }
}

fn add_or_replace(specs: &mut Vec<EndpointSpec>, new: Vec<EndpointSpec>) -> bool {
    let mut pos: HashMap<EndpointKey, usize> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| (s.key.clone(), i))
        .collect();
    let mut changed = false;
    for spec in new {
        match pos.get(&spec.key) {
            Some(&i) if specs[i] == spec => {}
            Some(&i) => {
                specs[i] = spec;
                changed = true;
            }
            None => {
                pos.insert(spec.key.clone(), specs.len());
                specs.push(spec);
                changed = true;
            }
        }
    }
    changed
}

#[cfg(test)]
mod tests;
