//! What keeps one service's endpoint set current: its source, its active health checks and
//! its outlier detection feed lbkit-discovery's [`Controller`] (and, with `orca_oob_ms`, the
//! endpoints' load-report streams run beside it) — the one control loop, with
//! empty-push and mass-removal protection, the health overlay and `Balancer::tick` every [`REFRESH_TICK`] —
//! which publishes on the service's balancer.
//!
//! Everything here runs off the request path, in one task per service (plus one for active
//! checks).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use lbkit_core::{EndpointKey, EndpointSpec, Snapshot, Timestamp};
use lbkit_discovery::source::{self, UpdateStream};
use lbkit_discovery::{file::FileSource, Controller, ControllerConfig, Target};
use lbkit_health::OutlierConfig;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::check;
use crate::config::ServiceConfig;
use crate::error::ProxyError;
use crate::service::Service;

/// How often `Balancer::tick` runs (re-prepares strategies whose weights follow time:
/// response-time weights, warm-up; builds a Maglev table patched within its rebuild interval).
/// 250 ms keeps warm-up curves smooth at negligible cost.
pub const REFRESH_TICK: Duration = Duration::from_millis(250);

/// Start the service's endpoint source, its health checks and its control loop. The service
/// serves its first set from now on, not from whenever the control loop first runs (a request
/// that came first found no endpoints: a 503, or a TCP connection closed unanswered): `initial`
/// (a reload's predecessor's set) or else its static list, until the source speaks.
///
/// # Errors
/// [`ProxyError::Source`] when the source cannot start (an unwatchable file directory).
pub(crate) fn spawn(
    service: &Arc<Service>,
    initial: Option<Vec<EndpointSpec>>,
) -> Result<Vec<JoinHandle<()>>, ProxyError> {
    let (listed, source) = source_of(service.name(), service.config())?;
    let initial = initial.or(listed);
    if let Some(specs) = &initial {
        let now = service.clock().now();
        service.publish(Arc::new(Snapshot::from_specs(specs.clone(), now)));
    }
    let mut tasks = Vec::new();
    let (tx, rx) = mpsc::channel(64);
    tasks.extend(check::spawn(service, tx));
    tasks.extend(crate::oob::spawn(service));
    tasks.extend(peers(service));
    let mut controller = Controller::new(ControllerConfig {
        outlier: outlier_config(service),
        refresh: Some(REFRESH_TICK),
        removal_protection: service.config().removal_protection(),
        ..ControllerConfig::default()
    })
    .with_clock(service.clock().clone())
    .with_health(rx);
    if let Some(specs) = initial {
        controller = controller.with_initial(specs);
    }
    service.set_discovery(controller.metrics());
    let target = ServiceTarget(service.clone());
    tasks.push(tokio::spawn(controller.run(source, target)));
    Ok(tasks)
}

/// The service's `outlier_detection` as lbkit-health's settings.
fn outlier_config(service: &Service) -> Option<OutlierConfig> {
    let od = &service.config().outlier_detection;
    let base_ejection = Duration::from_millis(od.base_ejection_ms);
    od.enabled.then(|| OutlierConfig {
        interval: Duration::from_millis(od.interval_ms),
        base_ejection_time: base_ejection,
        // Envoy's defaults keep the longest ejection at 10 × the first (30 s → 300 s).
        max_ejection_time: base_ejection * 10,
        max_ejection_percent: od.max_ejection_percent,
        consecutive_failures: Some(od.consecutive_failures),
        ..OutlierConfig::default()
    })
}

/// The endpoint source `[service.NAME]` names (its static `endpoints`, its watched `file`, its
/// `zookeeper` registry with Dubbo's governance rules, or its `xds` control plane), started; with the static list
/// parsed when there is one. The proxy and `lbkit xds` open their sources here.
///
/// # Errors
/// [`ProxyError::Source`] when the list does not parse or the source cannot start (an
/// unwatchable file directory).
pub fn source_of(
    name: &str,
    cfg: &ServiceConfig,
) -> Result<(Option<Vec<EndpointSpec>>, UpdateStream), ProxyError> {
    let err = |source| ProxyError::Source {
        service: name.to_owned(),
        source,
    };
    if let Some(list) = &cfg.endpoints {
        let specs = lbkit_discovery::parse_static_list(&list.join(","), "endpoints")
            .map_err(|e| err(e.into()))?;
        return Ok((Some(specs.clone()), source::static_source(specs)));
    }
    if let Some(path) = &cfg.file {
        let (stream, _status) = FileSource::new(path.clone()).spawn().map_err(err)?;
        return Ok((None, stream));
    }
    if let Some(xds) = &cfg.xds {
        let mut source = lbkit_discovery::xds::XdsSource::new(&xds.server, &xds.cluster);
        if let Some(node) = &xds.node {
            source = source.with_node(node);
        }
        if let Some(cache) = &xds.cache {
            source = source.with_cache(cache);
        }
        return Ok((None, source.spawn().0));
    }
    let stream = match (&cfg.zookeeper, cfg.zk_path()) {
        (Some(zk), Ok(Some(path))) => {
            use lbkit_discovery::zookeeper::{WatchMode, ZkConfig, ZkSource};
            // Checked by the config's validation.
            let watch = WatchMode::parse(&zk.watch).unwrap_or_default();
            let mut source = ZkSource::new(ZkConfig::new(zk.zk.clone()), path)
                .with_watch(watch)
                .with_governance(zk.rules);
            if let Some(app) = &zk.application {
                source = source.with_application(app);
            }
            if let Some(cache) = &zk.cache {
                source = source.with_cache(cache);
            }
            source.spawn().0
        }
        _ => source::static_source(Vec::new()),
    };
    Ok((None, stream))
}

/// Register the proxy as a Dubbo consumer of a ZooKeeper source's interface
/// ([`ServiceConfig::registers_consumer`](crate::config::ServiceConfig::registers_consumer)),
/// and with an aperture that takes its coordinates from the registry (`stages.aperture`
/// without `client_index`/`client_count`) follow the coordinates the consumer nodes give
/// (`ZkPeers`), setting them on the service's stages. Aborting the task (a reload, a stop)
/// drops the registration.
fn peers(service: &Arc<Service>) -> Option<JoinHandle<()>> {
    let cfg = service.config();
    let (Some(zk), Ok(Some(path))) = (&cfg.zookeeper, cfg.zk_path()) else {
        return None;
    };
    if !cfg.registers_consumer() {
        return None;
    }
    let follow = cfg.stages.aperture_from_registry();
    use lbkit_discovery::zookeeper::{ZkConfig, ZkPeers};
    let mut peers = ZkPeers::new(ZkConfig::new(zk.zk.clone()), path);
    if let Some(app) = &zk.application {
        peers = peers.with_application(app);
    }
    if !follow {
        // Registered, but no place in any aperture: clients that number themselves from
        // the consumers do not count a proxy that takes no slice.
        peers = peers.register_only();
    }
    let service = service.clone();
    Some(tokio::spawn(async move {
        let handle = peers.spawn();
        let mut coordinates = handle.coordinates();
        while coordinates.changed().await.is_ok() {
            let Some(at) = *coordinates.borrow_and_update() else {
                continue;
            };
            let mut stages = (*service.active().balancer.stages()).clone();
            if let Some(a) = &mut stages.aperture {
                a.coordinates = Some(at);
            }
            tracing::info!(service = %service.name(), index = at.index, count = at.count, "aperture coordinates from the registry");
            service.set_stages(stages);
        }
        drop(handle);
    }))
}

/// The controller's target: the service's current balancer (whichever strategy the admin API
/// last set).
struct ServiceTarget(Arc<Service>);

impl Target for ServiceTarget {
    fn publish(&mut self, snapshot: Arc<Snapshot>, _now: Timestamp) -> Vec<EndpointKey> {
        self.0.publish(snapshot);
        Vec::new()
    }

    fn tick(&mut self, now: Timestamp) {
        self.0.active().balancer.tick(now);
    }

    fn ejections(&mut self, counts: &HashMap<EndpointKey, u64>) {
        self.0.set_ejections(counts.clone());
    }
}
