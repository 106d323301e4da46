//! The pool's control loop: lbkit-discovery's [`Controller`] (the one every lbkit user runs:
//! batches, empty-push protection, outlier ejection, slow start, ticks) publishing into the
//! pool, which makes and releases the endpoints' client services around each publish: only
//! those of the endpoints that came, went or moved, found by diffing the snapshot against the
//! last one published ([`diff::between`]); a set out of key order is matched whole.

use std::sync::{Arc, Weak};

use futures_core::Stream;
use futures_util::{FutureExt, StreamExt};
use lbkit_core::{diff, Balancer, EndpointKey, Snapshot, Strategy, Timestamp, Update};
use lbkit_discovery::{Controller, ControllerConfig, DiscoveryError, Target};
use tokio::sync::watch;

use super::{Entry, MakeEndpoint, Pool, PoolBuilder, PoolInner, PoolStatus, ServiceMap};
use crate::error::BoxError;
use crate::telemetry::PoolMetrics;

/// Most updates applied in one batch before the task starts: bounds the work done in
/// `spawn` when a source floods.
const MAX_BATCH: usize = 1024;

/// The controller's target: the pool's services and balancer.
struct PoolTarget<Svc, S: Strategy, M> {
    inner: Weak<PoolInner<Svc, S>>,
    make: M,
    /// The last snapshot published whose endpoints are exactly the services held: the next is
    /// diffed against it ([`diff::between`]), and only what changed is made or released.
    last: Option<Arc<Snapshot>>,
}

/// The services of a publish: all of them, and those made, released and left out.
struct Services<Svc> {
    /// The services held while the balancer takes the snapshot: the old ones and the new.
    union: ServiceMap<Svc>,
    /// The services of the snapshot's endpoints.
    next: ServiceMap<Svc>,
    rejected: Vec<EndpointKey>,
    made: u64,
    released: u64,
}

pub(super) fn start<Svc, S, St, E, M>(config: PoolBuilder<S>, source: St, make: M) -> Pool<Svc, S>
where
    Svc: Send + Sync + 'static,
    S: Strategy,
    St: Stream<Item = Result<Update, E>> + Send + 'static,
    E: Into<BoxError> + 'static,
    M: MakeEndpoint<Svc>,
{
    let now = config.clock.now();
    let balancer = Balancer::new(config.strategy, Arc::new(Snapshot::new(0, Vec::new())), now)
        .with_availability(config.availability)
        .with_clock(config.clock.clone())
        .with_stages(config.stages, now);
    let balancer = match &config.trace {
        Some(recorder) => recorder.attach(balancer, &config.name),
        None => balancer,
    };
    if let Some((label, strategy)) = config.shadow {
        balancer.start_shadow(label, strategy, now);
    }
    let (status, _) = watch::channel(PoolStatus::default());
    let mut controller = Controller::new(ControllerConfig {
        policy: config.policy,
        outlier: config.outlier,
        removal_protection: config.removal,
        refresh: Some(config.tick),
        ..ControllerConfig::default()
    })
    .with_clock(config.clock);
    let inner = Arc::new(PoolInner {
        metrics: Arc::new(PoolMetrics::default()),
        ejections: Default::default(),
        discovery: controller.metrics(),
        name: config.name,
        balancer,
        services: arc_swap::ArcSwap::from_pointee(ServiceMap::default()),
        probes: config.probes,
        status,
        trace: config.trace,
    });
    #[cfg(feature = "health-checks")]
    if let Some(hc) = config.health {
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        controller = controller.with_health(rx);
        let weak = Arc::downgrade(&inner);
        let current = Box::new(move || weak.upgrade().map(|i| i.balancer.snapshot()));
        tokio::spawn(hc.probe.run(hc.check, current, tx));
    }
    let mut target = PoolTarget {
        inner: Arc::downgrade(&inner),
        make,
        last: None,
    };
    let mut source =
        Box::pin(source.map(|item| item.map_err(|e| DiscoveryError::Source(e.into()))));
    apply_ready(&mut controller, &mut source, &mut target);
    tokio::spawn(controller.run(source, target));
    Pool { inner }
}

impl<Svc, S, M> Target for PoolTarget<Svc, S, M>
where
    Svc: Send + Sync + 'static,
    S: Strategy,
    M: MakeEndpoint<Svc>,
{
    fn publish(&mut self, snapshot: Arc<Snapshot>, now: Timestamp) -> Vec<EndpointKey> {
        let Some(inner) = self.inner.upgrade() else {
            return Vec::new();
        };
        let old = inner.services.load_full();
        // `diff::between` walks the last set by key: one out of key order is matched whole.
        let last = (self.last.take()).filter(|l| l.len() == old.len() && l.in_key_order());
        let changes = last.as_ref().and_then(|l| {
            let d = diff::between(l.endpoints(), snapshot.endpoints(), None)?;
            Some((l, d))
        });
        let services = match changes {
            Some((last, d)) => self.services_changed(&inner, &snapshot, last, &old, &d),
            None => self.services_for(&inner, &snapshot, &old),
        };
        let Services {
            union,
            next,
            rejected,
            made,
            released,
        } = services;
        // New services first, then the snapshot that names them, then drop the old ones.
        inner.services.store(Arc::new(union));
        inner.status.send_modify(|s| s.services_made += made);
        if !rejected.is_empty() {
            // The controller leaves these out and publishes again (the services made stay).
            return rejected;
        }
        inner.balancer.publish(snapshot.clone(), now);
        inner.services.store(Arc::new(next));
        self.last = Some(snapshot.clone());
        inner.status.send_modify(|s| {
            s.version = snapshot.version();
            s.endpoints = snapshot.len();
            s.services_released += released;
        });
        Vec::new()
    }

    fn tick(&mut self, now: Timestamp) {
        if let Some(inner) = self.inner.upgrade() {
            inner.balancer.tick(now);
        }
    }

    fn source_error(&mut self, error: &DiscoveryError) {
        if let Some(inner) = self.inner.upgrade() {
            // A wrapped error of the pool's own stream reads as itself.
            let text = match error {
                DiscoveryError::Source(e) => lbkit_discovery::error_chain(&**e),
                other => lbkit_discovery::error_chain(other),
            };
            tracing::warn!(pool = %inner.name, error = %text, "discovery error; keeping the last good endpoints");
            inner.status.send_modify(|s| {
                s.source_errors += 1;
                s.last_error = Some(text);
            });
        }
    }

    fn ejections(&mut self, counts: &std::collections::HashMap<EndpointKey, u64>) {
        if let Some(inner) = self.inner.upgrade() {
            inner.ejections.store(Arc::new(counts.clone()));
        }
    }

    fn empty_held(&mut self) {
        if let Some(inner) = self.inner.upgrade() {
            inner.status.send_modify(|s| s.empty_held += 1);
        }
    }

    fn removal(&mut self, event: &lbkit_discovery::RemovalEvent) {
        use lbkit_discovery::RemovalEvent;
        let Some(inner) = self.inner.upgrade() else {
            return;
        };
        inner.status.send_modify(|s| match event {
            RemovalEvent::Held { keys, .. } => {
                s.removals_held += keys.len() as u64;
                s.held += keys.len();
            }
            RemovalEvent::Confirmed { .. } => s.held = s.held.saturating_sub(1),
        });
    }

    fn source_ended(&mut self) {
        if let Some(inner) = self.inner.upgrade() {
            inner.status.send_modify(|s| s.source_ended = true);
        }
    }

    fn alive(&self) -> bool {
        self.inner.strong_count() > 0
    }
}

/// Apply what the source has ready now (at most [`MAX_BATCH`] updates), so a static list is in
/// place before the first call.
fn apply_ready<St, T>(controller: &mut Controller, source: &mut St, target: &mut T)
where
    St: Stream<Item = Result<Update, DiscoveryError>> + Unpin,
    T: Target,
{
    let mut ready = Vec::new();
    while ready.len() < MAX_BATCH {
        match source.next().now_or_never() {
            Some(Some(Ok(u))) => ready.push(u),
            Some(Some(Err(e))) => {
                controller.source_error(&e);
                target.source_error(&e);
            }
            Some(None) => {
                target.source_ended();
                break;
            }
            None => break,
        }
    }
    if !ready.is_empty() {
        controller.apply_into(ready, target);
    }
}

// === impl PoolTarget ===

impl<Svc: Send + Sync + 'static, S: Strategy, M: MakeEndpoint<Svc>> PoolTarget<Svc, S, M> {
    /// The service map for `snapshot`: kept entries for unchanged endpoints, new ones made.
    /// Returns the map, the keys whose service could not be made, and how many were made.
    /// Every endpoint's service, found by key and address in `old` or made: O(n) lookups.
    fn services_for(
        &mut self,
        inner: &PoolInner<Svc, S>,
        snapshot: &Snapshot,
        old: &ServiceMap<Svc>,
    ) -> Services<Svc> {
        let mut next = ServiceMap::default();
        let (mut rejected, mut made) = (Vec::new(), 0);
        for ep in snapshot.endpoints() {
            let h = ep.key_hash();
            if let Some(e) = old
                .get(&h)
                .filter(|e| e.key == *ep.key() && *e.address == *ep.address())
            {
                next.insert(h, e.clone());
                continue;
            }
            match self.make(inner, ep) {
                Some(entry) => {
                    made += 1;
                    next.insert(h, entry);
                }
                None => rejected.push(ep.key().clone()),
            }
        }
        let mut union: ServiceMap<Svc> = old.clone();
        for (h, e) in next.iter() {
            union.insert(h, e.clone());
        }
        union.settle();
        next.settle();
        let released = old
            .iter()
            .filter(|(h, e)| next.get(h).is_none_or(|n| !Arc::ptr_eq(n, e)))
            .count() as u64;
        Services {
            union,
            next,
            rejected,
            made,
            released,
        }
    }

    /// The services of `snapshot` when `old` holds exactly those of `last` and `d` is what
    /// changed between them: only the endpoints new, readdressed or gone are looked at (O(k)
    /// hash operations, each copying the shard it falls in: O(k·√n)).
    fn services_changed(
        &mut self,
        inner: &PoolInner<Svc, S>,
        snapshot: &Snapshot,
        last: &Snapshot,
        old: &ServiceMap<Svc>,
        d: &diff::Diff,
    ) -> Services<Svc> {
        let mut union = old.clone();
        let gone: Vec<u64> = d
            .gone
            .iter()
            .map(|&o| last.endpoints()[o].key_hash())
            .collect();
        let (mut rejected, mut made, mut replaced) = (Vec::new(), 0, 0);
        for &(i, prev) in &d.changed {
            let ep = &snapshot.endpoints()[i];
            let prev = prev.map(|p| &last.endpoints()[p]);
            if prev.is_some_and(|p| p.address() == ep.address()) {
                continue; // the same key at the same address: the same service
            }
            match self.make(inner, ep) {
                Some(entry) => {
                    made += 1;
                    replaced += u64::from(prev.is_some());
                    union.insert(ep.key_hash(), entry);
                }
                None => rejected.push(ep.key().clone()),
            }
        }
        union.settle();
        let mut next = union.clone();
        for h in &gone {
            next.remove(h);
        }
        next.settle();
        let released = gone.len() as u64 + replaced;
        Services {
            union,
            next,
            rejected,
            made,
            released,
        }
    }

    /// A new client service for `ep`, or `None` (logged) when it cannot be made.
    fn make(
        &mut self,
        inner: &PoolInner<Svc, S>,
        ep: &lbkit_core::Endpoint,
    ) -> Option<Arc<Entry<Svc>>> {
        match self.make.make(ep) {
            Ok(svc) => Some(Arc::new(Entry {
                key: ep.key().clone(),
                address: Arc::from(ep.address()),
                svc,
            })),
            Err(e) => {
                tracing::warn!(pool = %inner.name, endpoint = %ep.key(), error = %e, "cannot make a client service; endpoint left out");
                None
            }
        }
    }
}
