//! `lbkit xds`'s configuration file: `[xds]` (where it listens) and `[service.NAME]` tables in
//! exactly `lbkit proxy`'s format, read and validated by the proxy's own parser
//! ([`lbkit_proxy::config`]).
//!
//! ```toml
//! [xds]
//! bind = "127.0.0.1:18000"   # the ADS gRPC listener (default)
//! admin = "127.0.0.1:18001"  # /metrics (default)
//!
//! [service.greeter]
//! zookeeper = { zk = "127.0.0.1:2181", interface = "org.example.Greeter" }
//! strategy = "ketama"
//!
//! [[route]]                  # optional, the proxy's format: routes of the Listener `greeter`
//! service = "greeter"
//! path_prefix = "/"          # default "/"
//! hash_key = "header:x-user" # the route's hash_policy: what a ring hash or Maglev cluster
//!                            # hashes (without one, clients hash each request at random)
//! ```
//!
//! A `[[route]]`'s `service`, `path_prefix` and `hash_key` are sent; its other fields (`host`,
//! timeouts, `hedge`) are not, and `--check` says so.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use lbkit_proxy::config::{from_toml, Route, ServiceConfig};
use lbkit_proxy::ConfigError;
use lbkit_strategy::hash::KeyExtractor;
use serde::Deserialize;

use envoy_types::pb::envoy::config::cluster::v3::cluster::LbPolicy;

use crate::resources::{hash_policy, lb_policy, ListenerRoute};

/// A whole `lbkit xds` file, validated.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct XdsConfig {
    /// `[xds]`.
    #[serde(default)]
    pub xds: XdsTable,
    /// The services served, by name (each becomes a Listener, a Cluster and a
    /// ClusterLoadAssignment of that name).
    #[serde(default, rename = "service")]
    pub services: BTreeMap<String, ServiceConfig>,
    /// `[[route]]`, in the proxy's format: each becomes a route of the Listener of its
    /// service, in file order (see [`routes_of`](Self::routes_of)).
    #[serde(default, rename = "route")]
    pub routes: Vec<Route>,
}

/// `[xds]`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct XdsTable {
    /// The ADS listener. Default `127.0.0.1:18000`.
    #[serde(default = "default_bind")]
    pub bind: SocketAddr,
    /// The admin listener (`/metrics`). Default `127.0.0.1:18001`.
    #[serde(default = "default_admin")]
    pub admin: SocketAddr,
    /// Largest request a client may send, bytes. Default 4 MiB (gRPC's default).
    #[serde(default = "default_max_request")]
    pub max_request_bytes: usize,
}

impl Default for XdsTable {
    fn default() -> Self {
        XdsTable {
            bind: default_bind(),
            admin: default_admin(),
            max_request_bytes: default_max_request(),
        }
    }
}

fn default_bind() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 18000))
}

fn default_admin() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 18001))
}

fn default_max_request() -> usize {
    4 << 20
}

impl XdsConfig {
    /// Read and validate `path`.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the file and the field.
    pub fn load(path: &Path) -> Result<XdsConfig, ConfigError> {
        XdsConfig::parse(&lbkit_proxy::config::read(path)?, path)
    }

    /// Parse and validate `text`; `path` names it in errors (and anchors relative files).
    ///
    /// # Errors
    /// A [`ConfigError`] naming the field.
    pub fn parse(text: &str, path: &Path) -> Result<XdsConfig, ConfigError> {
        let mut config: XdsConfig = from_toml(text, path)?;
        let dir = path.parent().unwrap_or(Path::new("."));
        if config.services.is_empty() {
            return Err(ConfigError::new(path, "service", "no [service.NAME] table"));
        }
        for (name, svc) in &mut config.services {
            let reserved = name == "*" || name.starts_with("xdstp:");
            if reserved || name.is_empty() || name.chars().any(|c| c.is_whitespace() || c == '/') {
                let why = "a resource name: give one without spaces or '/' (not `*`, the \
                           wildcard, nor an `xdstp:` name)";
                return Err(ConfigError::new(path, format!("service.{name}"), why));
            }
            svc.anchor(dir);
            svc.check(name, path)?;
        }
        config.check_routes(path)?;
        if config.xds.max_request_bytes < 1024 {
            let why = "at least 1024";
            return Err(ConfigError::new(path, "xds.max_request_bytes", why));
        }
        Ok(config)
    }

    /// Each `[[route]]` names a service of the file and, when it has one, a hash key the
    /// proxy's parser takes.
    fn check_routes(&self, path: &Path) -> Result<(), ConfigError> {
        for (i, r) in self.routes.iter().enumerate() {
            if !self.services.contains_key(&r.service) {
                let why = format!("no [service.{}] in this file", r.service);
                return Err(ConfigError::new(path, format!("route[{i}].service"), why));
            }
            if !r.path_prefix.starts_with('/') {
                let why = "must start with '/' (a request path always does)";
                return Err(ConfigError::new(
                    path,
                    format!("route[{i}].path_prefix"),
                    why,
                ));
            }
            if let Some(key) = &r.hash_key {
                key.parse::<KeyExtractor>().map_err(|e| {
                    ConfigError::new(path, format!("route[{i}].hash_key"), e.to_string())
                })?;
            }
        }
        Ok(())
    }

    /// The routes of service `name`'s Listener: its `[[route]]`s in file order (a path prefix,
    /// a hash key).
    pub fn routes_of(&self, name: &str) -> Vec<ListenerRoute> {
        self.routes
            .iter()
            .filter(|r| r.service == name)
            .map(|r| ListenerRoute {
                prefix: r.path_prefix.clone(),
                hash: r.hash_key.as_deref().and_then(|k| k.parse().ok()),
            })
            .collect()
    }

    /// What of each service's settings Envoy and gRPC do not get as lbkit runs it, one line
    /// per setting (`service.NAME.FIELD: why`): `lbkit xds --check` prints them, and the docs
    /// list them. Empty when everything configured is expressed.
    pub fn notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        for (name, svc) in &self.services {
            let mut note =
                |field: &str, why: &str| notes.push(format!("service.{name}.{field}: {why}"));
            let mapping = lb_policy(&svc.strategy);
            if let Some(why) = mapping.differs {
                note("strategy", &format!("{}: {why}", svc.strategy));
            }
            // lbkit's own round-robin ignores weights as gRPC's does, and a ring hash with a
            // header to hash is gRPC's own: nothing to say then.
            let hashed = mapping.policy == LbPolicy::RingHash && self.hashes_headers(name);
            let said = svc.strategy == "round-robin" || hashed;
            if let Some(why) = mapping.grpc.filter(|_| !said) {
                note(
                    "strategy",
                    &format!("{} for proxyless gRPC: {why}", svc.strategy),
                );
            }
            if !svc.params.is_empty() {
                note(
                    "params",
                    "strategy parameters are not sent (Envoy's policies take their own defaults)",
                );
            }
            if svc.stages != Default::default() {
                note("stages", "subsets, aperture and locality weights are not sent; priorities and zones are (as EDS priorities and localities)");
            }
            if svc.zone.is_some() {
                note("zone", "not sent: Envoy prefers its own node's zone (zone-aware routing), gRPC has no zone preference");
            }
        }
        notes.extend(self.route_notes());
        notes
    }

    /// Whether a `[[route]]` to service `name` hashes on a header (which gRPC reads).
    fn hashes_headers(&self, name: &str) -> bool {
        self.routes_of(name)
            .iter()
            .any(|r| matches!(r.hash, Some(KeyExtractor::Header(_))))
    }

    /// What of each `[[route]]` is not sent, or not read by everyone (`route[I].FIELD: why`).
    fn route_notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        for (i, r) in self.routes.iter().enumerate() {
            let mut note =
                |field: &str, why: &str| notes.push(format!("route[{i}].{field}: {why}"));
            if r.host.is_some() {
                note(
                    "host",
                    "not sent: the Listener's routes match any authority",
                );
            }
            let default = lbkit_proxy::config::Route::default_timeout_ms();
            if r.timeout_ms != default || r.per_try_timeout_ms.is_some() || r.hedge.is_some() {
                note("timeout_ms", "timeouts, per-try timeouts and hedging are not sent: they stay the clients' own");
            }
            let Some(key) = r
                .hash_key
                .as_deref()
                .and_then(|k| k.parse::<KeyExtractor>().ok())
            else {
                continue;
            };
            let strategy = self.services.get(&r.service).map(|s| s.strategy.as_str());
            if !matches!(
                strategy.map(|s| lb_policy(s).policy),
                Some(LbPolicy::RingHash | LbPolicy::Maglev)
            ) {
                note(
                    "hash_key",
                    "sent, but the service's strategy does not hash: the clients do not read it",
                );
            }
            match (&key, hash_policy(&key)) {
                (_, None) => note("hash_key", "RPC arguments cannot be said in xDS: requests hash at random"),
                (KeyExtractor::Header(_), _) => {}
                (KeyExtractor::Path | KeyExtractor::Uri, _) => note("hash_key", "sent as the :path header, which Envoy hashes with its query; proxyless gRPC hashes headers it is sent (gRFC A42), not :path"),
                _ => note("hash_key", "reaches Envoy only: proxyless gRPC hashes on headers (gRFC A42), so its requests hash at random"),
            }
        }
        notes
    }
}
