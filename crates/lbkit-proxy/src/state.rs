//! The running configuration: routes and services, swapped whole on reload (`ArcSwap`), so a
//! request sees one configuration from start to end.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use lbkit_core::AttemptPolicy;
use lbkit_strategy::KeyExtractor;
use tokio::task::JoinHandle;

use crate::config::{Config, Protocol};
use crate::error::{ConfigError, ProxyError};
use crate::service::Service;
use crate::upkeep;

/// A route, resolved.
#[derive(Debug)]
pub(crate) struct RouteEntry {
    host: Option<String>,
    prefix: String,
    pub(crate) service: Arc<Service>,
    /// The route's limits and the service's retries: what a call's `Attempts` follow.
    pub(crate) policy: AttemptPolicy,
    pub(crate) hash_key: Option<KeyExtractor>,
    /// When idempotent requests are hedged (`hedge`), learned from the service's endpoints.
    pub(crate) hedge: Option<lbkit_core::HedgeTimer>,
}

/// A service and its background tasks, which stop when the last configuration using it goes.
#[derive(Debug)]
pub(crate) struct Running {
    pub(crate) service: Arc<Service>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// One configuration, live.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) config: Config,
    pub(crate) routes: Vec<RouteEntry>,
    pub(crate) services: BTreeMap<String, Arc<Running>>,
}

// === impl State ===

impl State {
    /// Build `config` for `workers` worker threads, reusing the running services of `previous` whose configuration did not
    /// change (they keep their statistics, health and ejections).
    ///
    /// # Errors
    /// A source that cannot start.
    pub(crate) fn build(
        config: Config,
        previous: Option<&State>,
        workers: usize,
    ) -> Result<State, ProxyError> {
        let mut services = BTreeMap::new();
        for (name, cfg) in &config.services {
            let reused = previous
                .and_then(|p| p.services.get(name))
                .filter(|r| r.service.config() == cfg);
            let running = match reused {
                Some(r) => r.clone(),
                None => {
                    let predecessor = previous.and_then(|p| p.service(name));
                    Arc::new(start_service(name, cfg, workers, predecessor)?)
                }
            };
            services.insert(name.clone(), running);
        }
        let mut routes = Vec::new();
        for r in &config.routes {
            let Some(running) = services.get(&r.service) else {
                continue; // validated: cannot happen
            };
            routes.push(RouteEntry {
                host: r.host.as_ref().map(|h| h.to_ascii_lowercase()),
                prefix: r.path_prefix.clone(),
                service: running.service.clone(),
                policy: AttemptPolicy {
                    retries: running.service.config().retries,
                    per_try: r.per_try_timeout_ms.map(Duration::from_millis),
                    overall: Some(Duration::from_millis(r.timeout_ms)),
                },
                hash_key: r.hash_key.as_ref().and_then(|k| k.parse().ok()),
                hedge: r
                    .hedge
                    .as_deref()
                    .and_then(lbkit_core::HedgeDelay::parse)
                    .map(lbkit_core::HedgeTimer::new),
            });
        }
        Ok(State {
            config,
            routes,
            services,
        })
    }

    /// The first route matching `host` (without port) and `path`.
    pub(crate) fn route(&self, host: Option<&str>, path: &str) -> Option<&RouteEntry> {
        let host = host.map(strip_port);
        self.routes.iter().find(|r| {
            let host_ok = match (&r.host, host) {
                (None, _) => true,
                (Some(want), Some(got)) => want.eq_ignore_ascii_case(got),
                (Some(_), None) => false,
            };
            host_ok && path.starts_with(&r.prefix)
        })
    }

    /// The service of the tcp listener at index `i` of the configuration.
    pub(crate) fn tcp_service(&self, i: usize) -> Option<&Arc<Service>> {
        let l = self.config.listeners.get(i)?;
        if l.protocol != Protocol::Tcp {
            return None;
        }
        Some(&self.services.get(l.service.as_deref()?)?.service)
    }

    /// A service by name.
    pub(crate) fn service(&self, name: &str) -> Option<&Arc<Service>> {
        self.services.get(name).map(|r| &r.service)
    }
}

/// Start service `name`. A service that replaces `predecessor` (a reload changed its
/// configuration) serves the predecessor's endpoints from the moment it goes live until its
/// own source has produced its first set, so a reload never answers 503 while a source loads.
fn start_service(
    name: &str,
    cfg: &crate::config::ServiceConfig,
    workers: usize,
    predecessor: Option<&Arc<Service>>,
) -> Result<Running, ProxyError> {
    // A reloaded service keeps its predecessor's recorder when the trace table is unchanged
    // (two recorders on one file would rotate it under each other).
    let trace = match &cfg.trace {
        None => None,
        Some(t) => match predecessor.filter(|old| old.config().trace.as_ref() == Some(t)) {
            Some(old) => old.trace().cloned(),
            None => Some(Arc::new(lbkit_trace::Recorder::open(&t.config()).map_err(
                |e| {
                    ConfigError::new(
                        std::path::Path::new("-"),
                        format!("service.{name}.trace"),
                        e.to_string(),
                    )
                },
            )?)),
        },
    };
    let service = Service::with_trace(name, cfg, workers, trace).map_err(|e| {
        ConfigError::new(
            std::path::Path::new("-"),
            format!("service.{name}.strategy"),
            e.to_string(),
        )
    })?;
    let service = Arc::new(service);
    let initial = predecessor.map(|old| {
        let snapshot = old.active().balancer.snapshot();
        snapshot.endpoints().iter().map(|e| e.to_spec()).collect()
    });
    let tasks = upkeep::spawn(&service, initial)?;
    Ok(Running { service, tasks })
}

fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host.split_once(']').map_or(host, |(h, _)| &h[1..]);
    }
    host.rsplit_once(':').map_or(host, |(h, _)| h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_ignored_in_hosts() {
        assert_eq!(strip_port("api.test:8080"), "api.test");
        assert_eq!(strip_port("api.test"), "api.test");
        assert_eq!(strip_port("[::1]:80"), "::1");
    }
}
