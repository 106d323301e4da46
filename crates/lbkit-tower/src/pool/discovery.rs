//! The pool task: discovery updates in batches, endpoint services made and released, ticks.

use std::sync::{Arc, Weak};

use arc_swap::ArcSwap;
use futures_core::Stream;
use futures_util::{FutureExt, StreamExt};
use lbkit_core::{Balancer, Snapshot, SnapshotBuilder, Strategy, Timestamp, Update};
use lbkit_health::OutlierDetector;
use tokio::sync::watch;

use super::{Entry, MakeEndpoint, Pool, PoolBuilder, PoolInner, PoolStatus, ServiceMap};
use crate::error::BoxError;
use crate::telemetry::{EndpointMetrics, PoolMetrics};

/// Most updates applied in one batch (one snapshot per batch): bounds the work between two
/// publishes when a source floods.
const MAX_BATCH: usize = 1024;

/// State owned by the pool task alone.
struct Worker<Svc, M> {
    make: M,
    builder: SnapshotBuilder,
    policy: lbkit_core::SnapshotPolicy,
    outlier: Option<OutlierDetector>,
    last_outlier_tick: Option<Timestamp>,
    _svc: std::marker::PhantomData<fn() -> Svc>,
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
        .with_clock(config.clock);
    let (status, _) = watch::channel(PoolStatus::default());
    let inner = Arc::new(PoolInner {
        metrics: PoolMetrics::register(&config.name),
        name: config.name,
        balancer,
        services: ArcSwap::from_pointee(ServiceMap::default()),
        probes: config.probes,
        status,
    });
    let mut worker = Worker {
        make,
        builder: SnapshotBuilder::new(),
        policy: config.policy,
        outlier: config.outlier.map(OutlierDetector::new),
        last_outlier_tick: None,
        _svc: std::marker::PhantomData,
    };
    let mut source = Box::pin(source);
    // Apply what is ready now, so a static list is in place before the first call.
    worker.apply(&inner, drain_ready(&mut source, Vec::new()));
    let weak = Arc::downgrade(&inner);
    let ended = inner.status.borrow().source_ended;
    tokio::spawn(run(weak, worker, source, ended, config.tick));
    Pool { inner }
}

/// Updates drained from the source in one go.
struct Batch {
    updates: Vec<Update>,
    errors: Vec<BoxError>,
    ended: bool,
}

fn drain_ready<St, E>(source: &mut std::pin::Pin<Box<St>>, first: Vec<Update>) -> Batch
where
    St: Stream<Item = Result<Update, E>>,
    E: Into<BoxError> + 'static,
{
    let mut batch = Batch {
        updates: first,
        errors: Vec::new(),
        ended: false,
    };
    while batch.updates.len() < MAX_BATCH {
        match source.next().now_or_never() {
            Some(Some(Ok(u))) => batch.updates.push(u),
            Some(Some(Err(e))) => batch.errors.push(e.into()),
            Some(None) => {
                batch.ended = true;
                break;
            }
            None => break,
        }
    }
    batch
}

async fn run<Svc, S, St, E, M>(
    weak: Weak<PoolInner<Svc, S>>,
    mut worker: Worker<Svc, M>,
    mut source: std::pin::Pin<Box<St>>,
    mut ended: bool,
    tick: std::time::Duration,
) where
    Svc: Send + Sync + 'static,
    S: Strategy,
    St: Stream<Item = Result<Update, E>> + Send + 'static,
    E: Into<BoxError> + 'static,
    M: MakeEndpoint<Svc>,
{
    let mut ticks = tokio::time::interval(tick);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            item = source.next(), if !ended => {
                let Some(inner) = weak.upgrade() else { return };
                let batch = match item {
                    Some(Ok(u)) => drain_ready(&mut source, vec![u]),
                    Some(Err(e)) => {
                        let mut b = drain_ready(&mut source, Vec::new());
                        b.errors.insert(0, e.into());
                        b
                    }
                    None => Batch { updates: Vec::new(), errors: Vec::new(), ended: true },
                };
                ended |= batch.ended;
                worker.apply(&inner, batch);
            }
            _ = ticks.tick() => {
                let Some(inner) = weak.upgrade() else { return };
                worker.tick(&inner);
            }
        }
    }
}

// === impl Worker ===

impl<Svc: Send + Sync + 'static, M: MakeEndpoint<Svc>> Worker<Svc, M> {
    fn apply<S: Strategy>(&mut self, inner: &PoolInner<Svc, S>, batch: Batch) {
        let now = inner.balancer.clock().now();
        for e in &batch.errors {
            tracing::warn!(pool = %inner.name, error = %e, "discovery error; keeping the last good endpoints");
        }
        inner.status.send_modify(|s| {
            s.source_errors += batch.errors.len() as u64;
            if let Some(e) = batch.errors.last() {
                s.last_error = Some(e.to_string());
            }
            s.source_ended |= batch.ended;
        });
        if batch.updates.is_empty() {
            return;
        }
        let mut snapshot = self.builder.apply_all(batch.updates, now);
        let old = inner.services.load_full();
        let (next, rejected, made) = self.services_for(inner, &snapshot, &old);
        if !rejected.is_empty() {
            snapshot = self.builder.apply(Update::Remove(rejected), now);
        }
        let released = old
            .iter()
            .filter(|(h, e)| next.get(*h).is_none_or(|n| !Arc::ptr_eq(n, e)))
            .count() as u64;
        // New services first, then the snapshot that names them, then drop the old ones.
        let mut union: ServiceMap<Svc> = (*old).clone();
        union.extend(next.iter().map(|(h, e)| (*h, e.clone())));
        inner.services.store(Arc::new(union));
        self.publish(inner, snapshot.clone(), now);
        inner.metrics.endpoints.set(next.len() as f64);
        inner.services.store(Arc::new(next));
        inner.status.send_modify(|s| {
            s.version = snapshot.version();
            s.endpoints = snapshot.len();
            s.services_made += made;
            s.services_released += released;
        });
    }

    /// The service map for `snapshot`: kept entries for unchanged endpoints, new ones made.
    /// Returns the map, the keys whose service could not be made, and how many were made.
    fn services_for<S: Strategy>(
        &mut self,
        inner: &PoolInner<Svc, S>,
        snapshot: &Snapshot,
        old: &ServiceMap<Svc>,
    ) -> (ServiceMap<Svc>, Vec<lbkit_core::EndpointKey>, u64) {
        let mut next = ServiceMap::default();
        let mut rejected = Vec::new();
        let mut made = 0;
        for ep in snapshot.endpoints() {
            let h = ep.key_hash();
            if let Some(e) = old
                .get(&h)
                .filter(|e| e.key == *ep.key() && *e.address == *ep.address())
            {
                next.insert(h, e.clone());
                continue;
            }
            match self.make.make(ep) {
                Ok(svc) => {
                    made += 1;
                    let entry = Entry {
                        key: ep.key().clone(),
                        address: Arc::from(ep.address()),
                        svc,
                        metrics: Arc::new(EndpointMetrics::register(
                            &inner.name,
                            ep.key().as_str(),
                        )),
                    };
                    next.insert(h, Arc::new(entry));
                }
                Err(e) => {
                    tracing::warn!(pool = %inner.name, endpoint = %ep.key(), error = %e, "cannot make a client service; endpoint left out");
                    rejected.push(ep.key().clone());
                }
            }
        }
        (next, rejected, made)
    }

    fn publish<S: Strategy>(
        &self,
        inner: &PoolInner<Svc, S>,
        snapshot: Arc<Snapshot>,
        now: Timestamp,
    ) {
        let overlay = self.outlier.as_ref().map(|d| d.overlay().clone());
        let plain = self.policy == lbkit_core::SnapshotPolicy::default() && overlay.is_none();
        let snapshot = if plain {
            snapshot
        } else {
            let overlay = overlay.unwrap_or_default();
            Arc::new(snapshot.derive(snapshot.version(), &self.policy, &overlay))
        };
        inner.balancer.publish(snapshot, now);
    }

    fn tick<S: Strategy>(&mut self, inner: &PoolInner<Svc, S>) {
        let now = inner.balancer.clock().now();
        if let Some(detector) = self.outlier.as_mut() {
            let due = detector.config().interval;
            let snapshot = inner.balancer.snapshot();
            let last = self.last_outlier_tick.get_or_insert(now);
            if now.saturating_duration_since(*last) >= due {
                *last = now;
                if detector.tick(&snapshot, now) {
                    let plain = Arc::new(Snapshot::new(
                        snapshot.version(),
                        self.builder.current().to_vec(),
                    ));
                    self.publish(inner, plain, now);
                    return;
                }
            }
        }
        inner.balancer.tick(now);
    }
}
