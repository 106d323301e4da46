//! The task that keeps one service's endpoint set current: discovery updates, active health
//! check results and outlier ejections become one snapshot, published on the service's
//! balancer; `Balancer::tick` runs every [`REFRESH_TICK`].
//!
//! Everything here runs off the request path, in one task per service (plus one for active
//! checks), so it owns its state outright.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{FutureExt, StreamExt};
use lbkit_core::{EndpointKey, Snapshot, SnapshotBuilder, SnapshotPolicy, Update};
use lbkit_discovery::source::{self, UpdateStream};
use lbkit_discovery::{file::FileSource, Controller, ControllerConfig};
use lbkit_health::{OutlierConfig, OutlierDetector};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

use crate::check;
use crate::error::ProxyError;
use crate::service::Service;

/// How often `Balancer::tick` runs (re-prepares strategies whose weights follow time:
/// response-time weights, warm-up). 250 ms keeps warm-up curves smooth at negligible cost.
pub const REFRESH_TICK: Duration = Duration::from_millis(250);

/// Start the service's endpoint source and upkeep tasks.
///
/// # Errors
/// [`ProxyError::Source`] when the source cannot start (an unwatchable file directory).
pub(crate) fn spawn(service: &Arc<Service>) -> Result<Vec<JoinHandle<()>>, ProxyError> {
    let source = open_source(service)?;
    let mut tasks = Vec::new();
    let (tx, rx) = mpsc::channel(64);
    if let Some(hc) = service.config().health_check.clone() {
        tasks.push(tokio::spawn(check::run(service.clone(), hc, tx)));
    }
    tasks.push(tokio::spawn(run(service.clone(), source, rx)));
    Ok(tasks)
}

fn open_source(service: &Service) -> Result<UpdateStream, ProxyError> {
    let cfg = service.config();
    let err = |source| ProxyError::Source {
        service: service.name().to_owned(),
        source,
    };
    if let Some(list) = &cfg.endpoints {
        let specs = lbkit_discovery::parse_static_list(&list.join(","), "endpoints")
            .map_err(|e| err(e.into()))?;
        return Ok(source::static_source(specs));
    }
    if let Some(path) = &cfg.file {
        let (stream, _status) = FileSource::new(path.clone()).spawn().map_err(err)?;
        return Ok(stream);
    }
    match (&cfg.zookeeper, cfg.zk_path()) {
        (Some(zk), Ok(Some(path))) => {
            use lbkit_discovery::zookeeper::{ZkConfig, ZkSource};
            let (stream, _status) = ZkSource::new(ZkConfig::new(zk.zk.clone()), path).spawn();
            Ok(stream)
        }
        _ => Ok(source::static_source(Vec::new())),
    }
}

/// The upkeep state of one service.
struct Upkeep {
    service: Arc<Service>,
    controller: Controller,
    builder: SnapshotBuilder,
    /// Marked down by active health checks.
    down: HashSet<EndpointKey>,
    detector: Option<OutlierDetector>,
    /// The last set built from discovery and health (before ejections).
    base: Arc<Snapshot>,
    ejections: HashMap<EndpointKey, u64>,
}

async fn run(
    service: Arc<Service>,
    mut source: UpdateStream,
    mut checks: mpsc::Receiver<(EndpointKey, bool)>,
) {
    let od = service.config().outlier_detection.clone();
    let interval = Duration::from_millis(od.interval_ms);
    let detector = od.enabled.then(|| {
        let base_ejection = Duration::from_millis(od.base_ejection_ms);
        OutlierDetector::new(OutlierConfig {
            interval,
            base_ejection_time: base_ejection,
            // Envoy's defaults keep the longest ejection at 10 × the first (30 s → 300 s).
            max_ejection_time: base_ejection * 10,
            max_ejection_percent: od.max_ejection_percent,
            consecutive_failures: Some(od.consecutive_failures),
            ..OutlierConfig::default()
        })
    });
    let controller = Controller::new(ControllerConfig::default());
    service.set_discovery(controller.metrics());
    let mut up = Upkeep {
        service,
        controller,
        builder: SnapshotBuilder::new(),
        down: HashSet::new(),
        detector,
        base: Arc::new(Snapshot::new(0, Vec::new())),
        ejections: HashMap::new(),
    };
    let mut outlier = tokio::time::interval(interval);
    outlier.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut refresh = tokio::time::interval(REFRESH_TICK);
    refresh.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut source_open = true;
    let mut checks_open = true;
    loop {
        tokio::select! {
            item = source.next(), if source_open => match item {
                Some(first) => up.discovery(first, &mut source).await,
                None => source_open = false,
            },
            msg = checks.recv(), if checks_open => match msg {
                Some((key, healthy)) => up.health(key, healthy).await,
                None => checks_open = false,
            },
            _ = outlier.tick(), if up.detector.is_some() => up.outliers().await,
            _ = refresh.tick() => {
                let now = up.service.clock().now();
                up.service.active().balancer.tick(now);
            }
        }
    }
}

// === impl Upkeep ===

impl Upkeep {
    async fn discovery(&mut self, first: source::SourceItem, stream: &mut UpdateStream) {
        let mut batch = Vec::new();
        let mut item = Some(first);
        while let Some(it) = item {
            match it {
                Ok(update) => batch.push(update),
                Err(e) => self.controller.source_error(&e),
            }
            item = stream.next().now_or_never().flatten();
        }
        if !batch.is_empty() && self.controller.apply_batch(batch).is_some() {
            self.rebuild().await;
        }
    }

    async fn health(&mut self, key: EndpointKey, healthy: bool) {
        let changed = if healthy {
            self.down.remove(&key)
        } else {
            self.down.insert(key.clone())
        };
        if changed {
            tracing::info!(service = %self.service.name(), endpoint = %key, healthy, "health check");
            self.rebuild().await;
        }
    }

    async fn outliers(&mut self) {
        let now = self.service.clock().now();
        let Some(detector) = &mut self.detector else {
            return;
        };
        if !detector.tick(&self.base, now) {
            return;
        }
        for e in self.base.endpoints() {
            if let Some(ej) = detector.ejection(e.key()) {
                let count = self.ejections.entry(e.key().clone()).or_default();
                if u64::from(ej.times) > *count {
                    tracing::warn!(service = %self.service.name(), endpoint = %e.key(), rule = ?ej.rule, "ejected");
                    *count = u64::from(ej.times);
                }
            }
        }
        self.service.set_ejections(self.ejections.clone());
        self.publish().await;
    }

    async fn rebuild(&mut self) {
        let specs = self
            .controller
            .desired()
            .iter()
            .map(|s| {
                let healthy = !self.down.contains(&s.key);
                s.clone().with_healthy(healthy)
            })
            .collect();
        let now = self.service.clock().now();
        self.base = self.builder.apply(Update::Reset(specs), now);
        self.publish().await;
    }

    async fn publish(&self) {
        let snapshot = match &self.detector {
            Some(d) => Arc::new(self.base.derive(
                self.base.version(),
                &SnapshotPolicy::default(),
                d.overlay(),
            )),
            None => self.base.clone(),
        };
        self.service.publish(snapshot).await;
    }
}
