//! What keeps the served resources current: each service's source (static, file, ZooKeeper
//! with Dubbo's governance rules, opened as `lbkit proxy` opens it) feeds lbkit-discovery's
//! [`Controller`] — the one control loop, with empty-push and mass-removal protection, and the
//! service's active health checks when it has them — whose every snapshot becomes the
//! service's resources in the [`Cache`].

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use lbkit_core::{EndpointKey, Snapshot, Timestamp};
use lbkit_discovery::{Controller, ControllerConfig, Target};
use lbkit_proxy::config::ServiceConfig;
use lbkit_proxy::ProxyError;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::cache::Cache;
use crate::resources;
use crate::server::Metrics;

/// Start service `name`'s source and control loop, publishing into `cache`.
///
/// # Errors
/// [`ProxyError::Source`] when the source cannot start.
pub fn spawn(
    name: &str,
    cfg: &ServiceConfig,
    routes: Vec<resources::ListenerRoute>,
    cache: &Cache,
    metrics: &Arc<Metrics>,
) -> Result<Vec<JoinHandle<()>>, ProxyError> {
    let (listed, source) = lbkit_proxy::source_of(name, cfg)?;
    let mut controller = Controller::new(ControllerConfig {
        removal_protection: cfg.removal_protection(),
        ..ControllerConfig::default()
    });
    if let Some(specs) = listed {
        controller = controller.with_initial(specs);
    }
    let latest = Arc::new(ArcSwapOption::<Snapshot>::empty());
    let mut tasks = Vec::new();
    if let Some(hc) = cfg.health_check.clone() {
        // The service's active checks, as the proxy runs them: their results reach the
        // assignment as UNHEALTHY endpoints.
        let (tx, rx) = mpsc::channel(64);
        let seen = latest.clone();
        let current = move || seen.load_full();
        tasks.push(tokio::spawn(lbkit_proxy::health_checks(
            hc, cfg.h2c, current, tx,
        )));
        controller = controller.with_health(rx);
    }
    let target = Feed {
        name: name.to_owned(),
        cfg: cfg.clone(),
        routes,
        cache: cache.clone(),
        metrics: metrics.clone(),
        skipped: 0,
        skipped_keys: Vec::new(),
        latest,
    };
    tasks.push(tokio::spawn(controller.run(source, target)));
    Ok(tasks)
}

/// The control loop's target: one service's resources in the cache.
struct Feed {
    name: String,
    cfg: ServiceConfig,
    /// Its Listener's routes.
    routes: Vec<resources::ListenerRoute>,
    cache: Cache,
    metrics: Arc<Metrics>,
    /// Endpoints of this service left out of its last assignment.
    skipped: i64,
    /// Their keys.
    skipped_keys: Vec<String>,
    /// The last snapshot, for the health checks.
    latest: Arc<ArcSwapOption<Snapshot>>,
}

impl Target for Feed {
    fn publish(&mut self, snapshot: Arc<Snapshot>, _now: Timestamp) -> Vec<EndpointKey> {
        self.latest.store(Some(snapshot.clone()));
        let (served, skipped) = resources::service(&self.name, &self.cfg, &self.routes, &snapshot);
        // Logged when the set left out changes, not on every publish.
        let keys: Vec<&str> = skipped.iter().map(|s| s.key.as_str()).collect();
        if keys
            != self
                .skipped_keys
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
        {
            for s in &skipped {
                tracing::warn!(service = %self.name, key = %s.key, address = %s.address,
                    "xds: endpoint left out: EDS takes IP:PORT addresses only");
            }
            self.skipped_keys = keys.into_iter().map(str::to_owned).collect();
        }
        let count = skipped.len() as i64;
        self.metrics.skipped_endpoints.inc_by(count - self.skipped);
        self.skipped = count;
        if self.cache.set(&self.name, &served) {
            tracing::info!(service = %self.name, endpoints = snapshot.len(), "xds: resources changed");
        }
        Vec::new()
    }
}
