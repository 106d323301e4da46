//! Reading and validating a configuration file.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use lbkit_strategy::catalog::{self, Params};
use lbkit_strategy::KeyExtractor;

use super::{Config, Protocol, ServiceConfig, MIN_HEADER_BYTES};
use crate::error::ConfigError;

// === impl Config ===

impl Config {
    /// Read and validate `path`.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the file and the field.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Config::parse(&read(path)?, path)
    }

    /// Parse and validate `text`; `path` names it in errors (and anchors relative files).
    ///
    /// # Errors
    /// A [`ConfigError`] naming the field.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let mut config: Config = from_toml(text, path)?;
        let dir = path.parent().unwrap_or(Path::new("."));
        for svc in config.services.values_mut() {
            svc.anchor(dir);
        }
        config.validate(path)?;
        Ok(config)
    }

    fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let err = |field: String, reason: String| ConfigError::new(path, field, reason);
        self.validate_limits(&err)?;
        self.validate_listeners(&err)?;
        self.validate_routes(&err)?;
        for (name, svc) in &self.services {
            svc.check(name, path)?;
        }
        Ok(())
    }

    /// The limits and the admin API's exposure.
    fn validate_limits(
        &self,
        err: &dyn Fn(String, String) -> ConfigError,
    ) -> Result<(), ConfigError> {
        if self.limits.max_header_bytes < MIN_HEADER_BYTES {
            return Err(err(
                "limits.max_header_bytes".into(),
                format!("must be at least {MIN_HEADER_BYTES}"),
            ));
        }
        if self.limits.max_connections == 0 || self.limits.max_headers == 0 {
            return Err(err(
                "limits".into(),
                "max_connections and max_headers must be > 0".into(),
            ));
        }
        let open_admin = !self.admin.bind.ip().is_loopback() && self.admin.token.is_none();
        if open_admin && !self.admin.allow_unauthenticated {
            return Err(err(
                "admin.token".into(),
                format!(
                    "the admin API binds {} (beyond loopback) without a token: set admin.token, \
                     bind 127.0.0.1, or set admin.allow_unauthenticated = true",
                    self.admin.bind
                ),
            ));
        }
        for (field, v) in [
            ("header_read_timeout_ms", self.limits.header_read_timeout_ms),
            ("idle_timeout_ms", self.limits.idle_timeout_ms),
            ("stream_idle_timeout_ms", self.limits.stream_idle_timeout_ms),
            ("tunnel_idle_timeout_ms", self.limits.tunnel_idle_timeout_ms),
            ("tcp_idle_timeout_ms", self.limits.tcp_idle_timeout_ms),
        ] {
            if v == 0 {
                return Err(err(format!("limits.{field}"), "must be > 0".into()));
            }
        }
        for p in &self.limits.upgrade_protocols {
            let token = !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_graphic() && !b"\"(),/:;<=>?@[\\]{}".contains(&b));
            if !token || p.eq_ignore_ascii_case("h2c") {
                return Err(err(
                    "limits.upgrade_protocols".into(),
                    format!("{p:?}: a protocol name (a token without a version), and not h2c"),
                ));
            }
        }
        Ok(())
    }

    /// Listeners: at least one, a TCP one with a known service, an HTTP one without.
    fn validate_listeners(
        &self,
        err: &dyn Fn(String, String) -> ConfigError,
    ) -> Result<(), ConfigError> {
        if self.listeners.is_empty() {
            return Err(err(
                "listener".into(),
                "at least one [[listener]] is required".into(),
            ));
        }
        for (i, l) in self.listeners.iter().enumerate() {
            match (l.protocol, &l.service) {
                (Protocol::Tcp, None) => {
                    return Err(err(
                        format!("listener[{i}].service"),
                        "a tcp listener needs a service".into(),
                    ))
                }
                (Protocol::Http, Some(_)) => {
                    return Err(err(
                        format!("listener[{i}].service"),
                        "http listeners route with [[route]]".into(),
                    ))
                }
                (_, Some(s)) if !self.services.contains_key(s) => {
                    return Err(err(
                        format!("listener[{i}].service"),
                        format!("no [service.{s}]"),
                    ))
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Routes: a known service, a path prefix, timeouts, hash keys, hedges.
    fn validate_routes(
        &self,
        err: &dyn Fn(String, String) -> ConfigError,
    ) -> Result<(), ConfigError> {
        for (i, r) in self.routes.iter().enumerate() {
            if !self.services.contains_key(&r.service) {
                return Err(err(
                    format!("route[{i}].service"),
                    format!("no [service.{}]", r.service),
                ));
            }
            if !r.path_prefix.starts_with('/') {
                return Err(err(
                    format!("route[{i}].path_prefix"),
                    "must start with '/'".into(),
                ));
            }
            if r.timeout_ms == 0 || r.per_try_timeout_ms == Some(0) {
                return Err(err(
                    format!("route[{i}].timeout_ms"),
                    "timeout_ms and per_try_timeout_ms must be > 0".into(),
                ));
            }
            if let Some(key) = &r.hash_key {
                key.parse::<KeyExtractor>()
                    .map_err(|e| err(format!("route[{i}].hash_key"), e.to_string()))?;
            }
            if let Some(h) = &r.hedge {
                h.parse::<lbkit_core::HedgeDelay>()
                    .map_err(|why| err(format!("route[{i}].hedge"), why))?;
                if self.services[&r.service].retries == 0 {
                    let why = format!(
                        "a hedge is an attempt: service {:?} has retries = 0",
                        r.service
                    );
                    return Err(err(format!("route[{i}].hedge"), why));
                }
            }
        }
        Ok(())
    }

    /// The drain bound.
    pub fn drain_timeout(&self) -> Duration {
        Duration::from_millis(self.limits.drain_timeout_ms)
    }
}

/// The text of the configuration file at `path`.
///
/// # Errors
/// A [`ConfigError`] naming the file when it cannot be read.
pub fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new(path, "-", format!("cannot read: {e}")))
}

/// Deserialize a TOML file's `text` into `T`; a syntax or type error names `path` and the line.
///
/// # Errors
/// A [`ConfigError`] with field `line N` (`-` when the parser gives no position).
pub fn from_toml<T: serde::de::DeserializeOwned>(
    text: &str,
    path: &Path,
) -> Result<T, ConfigError> {
    toml::from_str(text).map_err(|e| {
        let reason = e.message().to_owned();
        let field = match e.span() {
            Some(span) => format!("line {}", text[..span.start].lines().count().max(1)),
            None => "-".to_owned(),
        };
        ConfigError::new(path, field, reason)
    })
}

// === impl ServiceConfig ===

impl ServiceConfig {
    /// Make the service's relative files (`file`, `zookeeper.cache`, `xds.cache`, `trace.path`) relative to
    /// `dir`, the directory of the file that names them.
    pub fn anchor(&mut self, dir: &Path) {
        let cache = self.zookeeper.as_mut().and_then(|zk| zk.cache.as_mut());
        let xds_cache = self.xds.as_mut().and_then(|x| x.cache.as_mut());
        let trace = self.trace.as_mut().map(|t| &mut t.path);
        for file in [self.file.as_mut(), cache, xds_cache, trace]
            .into_iter()
            .flatten()
        {
            if file.is_relative() {
                *file = dir.join(&*file);
            }
        }
    }

    /// Validate `[service.NAME]` of the file at `path`.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the field as `service.NAME.FIELD`.
    pub fn check(&self, name: &str, path: &Path) -> Result<(), ConfigError> {
        self.validate(&|field: &str, reason: String| {
            ConfigError::new(path, format!("service.{name}.{field}"), reason)
        })
    }

    fn validate(&self, err: &dyn Fn(&str, String) -> ConfigError) -> Result<(), ConfigError> {
        self.validate_source(err)?;
        catalog::build(&self.strategy, self.strategy_params())
            .map_err(|e| err("strategy", e.to_string()))?;
        if self.retries > super::MAX_RETRIES {
            return Err(err(
                "retries",
                format!("at most {} (one attempt per endpoint)", super::MAX_RETRIES),
            ));
        }
        if !(0.0..=1000.0).contains(&self.retry_budget_percent) {
            return Err(err("retry_budget_percent", "must be within 0-1000".into()));
        }
        if self.connect_timeout_ms == 0 {
            return Err(err("connect_timeout_ms", "must be > 0".into()));
        }
        if self.upstream_max_idle == 0 {
            return Err(err("upstream_max_idle", "must be > 0".into()));
        }
        if self.upstream_idle_timeout_ms == 0 {
            return Err(err("upstream_idle_timeout_ms", "must be > 0".into()));
        }
        self.validate_protection(err)?;
        self.validate_extras(err)
    }

    /// The one endpoint source: a static list, a file, ZooKeeper or an xDS control plane.
    fn validate_source(
        &self,
        err: &dyn Fn(&str, String) -> ConfigError,
    ) -> Result<(), ConfigError> {
        let sources = [
            self.endpoints.is_some(),
            self.file.is_some(),
            self.zookeeper.is_some(),
            self.xds.is_some(),
        ];
        if sources.iter().filter(|&&s| s).count() != 1 {
            return Err(err(
                "endpoints",
                "give exactly one of endpoints, file, zookeeper, xds".into(),
            ));
        }
        if let Some(xds) = &self.xds {
            lbkit_discovery::check_address(&xds.server)
                .map_err(|reason| err("xds.server", reason))?;
            if xds.cluster.is_empty() {
                return Err(err("xds.cluster", "empty".into()));
            }
        }
        if let Some(list) = &self.endpoints {
            lbkit_discovery::parse_static_list(&list.join(","), "endpoints")
                .map_err(|e| err("endpoints", e.reason().to_owned()))?;
        }
        if let Some(zk) = &self.zookeeper {
            lbkit_discovery::zookeeper::ZkConfig::new(zk.zk.clone())
                .validate()
                .map_err(|e| err("zookeeper.zk", e.to_string()))?;
            lbkit_discovery::zookeeper::WatchMode::parse(&zk.watch)
                .map_err(|reason| err("zookeeper.watch", reason))?;
            self.zk_path().map_err(|reason| err("zookeeper", reason))?;
            if zk.register == Some(false) && self.stages.aperture_from_registry() {
                let why = "false, but stages.aperture takes its client index and count from \
                           the registry's consumers (give client_index and client_count, or \
                           register)";
                return Err(err("zookeeper.register", why.into()));
            }
        }
        Ok(())
    }

    /// Removal protection and outlier detection.
    fn validate_protection(
        &self,
        err: &dyn Fn(&str, String) -> ConfigError,
    ) -> Result<(), ConfigError> {
        let rp = &self.removal_protection;
        if !(rp.max_share > 0.0 && rp.max_share <= 1.0) {
            return Err(err(
                "removal_protection.max_share",
                "must be above 0 and at most 1".into(),
            ));
        }
        if rp.window_ms == 0 || rp.confirm_ms == 0 {
            let field = if rp.window_ms == 0 {
                "removal_protection.window_ms"
            } else {
                "removal_protection.confirm_ms"
            };
            return Err(err(field, "must be > 0".into()));
        }
        let od = &self.outlier_detection;
        for (field, value) in [
            ("interval_ms", od.interval_ms),
            ("base_ejection_ms", od.base_ejection_ms),
        ] {
            if value == 0 {
                return Err(err(
                    &format!("outlier_detection.{field}"),
                    "must be > 0".into(),
                ));
            }
        }
        if od.max_ejection_percent > 100 {
            return Err(err(
                "outlier_detection.max_ejection_percent",
                "at most 100".into(),
            ));
        }
        Ok(())
    }

    /// Header names, load reports, the trace and the health check.
    fn validate_extras(
        &self,
        err: &dyn Fn(&str, String) -> ConfigError,
    ) -> Result<(), ConfigError> {
        for (field, name) in [
            ("tags.header", &self.tags.header),
            ("tags.force_header", &self.tags.force_header),
        ] {
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(err(field, format!("{name:?} is not a header name")));
            }
        }
        if let Some(name) = &self.deadline_header {
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                let why = format!("{name:?} is not a header name");
                return Err(err("deadline_header", why));
            }
        }
        match self.orca_oob_ms {
            Some(0) => return Err(err("orca_oob_ms", "must be > 0".into())),
            Some(_) if !self.h2c => {
                let why = "needs h2c = true: the reports come on a gRPC stream".into();
                return Err(err("orca_oob_ms", why));
            }
            _ => {}
        }
        if let Err((field, why)) = self.stages.build() {
            return Err(err(&format!("stages.{field}"), why));
        }
        if let Some(t) = &self.trace {
            if let Err(lbkit_trace::TraceError::Config { field, reason }) = t.config().validate() {
                return Err(err(&format!("trace.{field}"), reason));
            }
        }
        if let Some(hc) = &self.health_check {
            if hc.interval_ms == 0 || hc.timeout_ms == 0 || hc.rise == 0 || hc.fall == 0 {
                return Err(err(
                    "health_check",
                    "interval_ms, timeout_ms, rise and fall must be > 0".into(),
                ));
            }
        }
        Ok(())
    }

    /// The service's mass-removal protection for its control loop (`None` when off).
    pub fn removal_protection(&self) -> Option<lbkit_discovery::RemovalProtection> {
        let rp = &self.removal_protection;
        rp.enabled.then(|| lbkit_discovery::RemovalProtection {
            max_share: rp.max_share,
            window: Duration::from_millis(rp.window_ms),
            confirm_after: Duration::from_millis(rp.confirm_ms),
        })
    }

    /// How long an idle upstream connection stays pooled (`upstream_idle_timeout_ms`).
    pub fn upstream_idle(&self) -> Duration {
        Duration::from_millis(self.upstream_idle_timeout_ms)
    }

    /// The strategy parameters as catalog text pairs.
    pub fn strategy_params(&self) -> Params {
        params_from(&self.params)
    }

    /// Whether the proxy registers as a consumer under the ZooKeeper source's interface:
    /// `zookeeper.register`, by default in the Dubbo layout, and always for an aperture that
    /// takes its coordinates from the registry.
    pub fn registers_consumer(&self) -> bool {
        let Some(zk) = &self.zookeeper else {
            return false;
        };
        let dubbo = matches!(
            self.zk_path(),
            Ok(Some(p)) if p.layout() == lbkit_discovery::zookeeper::Layout::Dubbo
        );
        zk.register.unwrap_or(dubbo) || self.stages.aperture_from_registry()
    }

    /// The ZooKeeper service path.
    ///
    /// # Errors
    /// A bad layout or path, as text.
    pub fn zk_path(&self) -> Result<Option<lbkit_discovery::zookeeper::ServicePath>, String> {
        use lbkit_discovery::zookeeper::{Layout, ServicePath};
        let Some(zk) = &self.zookeeper else {
            return Ok(None);
        };
        let layout = match zk.layout.as_str() {
            "dubbo" => Layout::Dubbo,
            "plain" => Layout::Plain,
            other => {
                return Err(format!(
                    "unknown layout {other:?} (expected dubbo or plain)"
                ))
            }
        };
        ServicePath::new(&zk.root, &zk.interface, layout)
            .map(Some)
            .map_err(|e| e.to_string())
    }
}

/// Catalog parameters from a TOML or JSON-like table (strings unquoted).
pub fn params_from(map: &BTreeMap<String, toml::Value>) -> Params {
    Params::from_pairs(map.iter().map(|(k, v)| {
        let text = match v {
            toml::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        (k.clone(), text)
    }))
}
