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
//! strategy = "least-request"
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use lbkit_proxy::config::{from_toml, ServiceConfig};
use lbkit_proxy::ConfigError;
use serde::Deserialize;

use crate::resources::lb_policy;

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
        if config.xds.max_request_bytes < 1024 {
            let why = "at least 1024";
            return Err(ConfigError::new(path, "xds.max_request_bytes", why));
        }
        Ok(config)
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
            // lbkit's own round-robin ignores weights as gRPC's does: nothing to say then.
            if let Some(why) = mapping.grpc.filter(|_| svc.strategy != "round-robin") {
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
        notes
    }
}
