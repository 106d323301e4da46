//! Service configuration: which strategy each service — and optionally each method — uses.
//!
//! Like Dubbo's `loadbalance` (per service, overridable per method) and Ribbon's per-client
//! `NFLoadBalancerRuleClassName`, in one TOML file:
//!
//! ```toml
//! [defaults]                       # optional; built-in default: weighted-random (Dubbo's random)
//! strategy = "weighted-round-robin"
//!
//! [service."com.acme.Greeter"]
//! strategy = "weighted-response-time"
//! params = { interval_ms = 10000 }
//! availability = { max_in_flight = 200 }
//!
//! [service."com.acme.Greeter".method.sayHello]
//! strategy = "sticky-round-robin"
//! params = { n = 5 }
//! ```
//!
//! Fields of a strategy entry (`[defaults]`, a service, or a method):
//!
//! | field | default | meaning |
//! |---|---|---|
//! | `strategy` | inherited (method → service → defaults → `weighted-random`) | a name from `lbkit pick --list` |
//! | `params` | `{}` (a method without `strategy` inherits the service's and overrides them key by key) | the strategy's parameters |
//! | `availability.circuit_breaker` | `true` | pass over endpoints whose Ribbon breaker is tripped |
//! | `availability.breaker_threshold` | `3` | consecutive failures that trip it |
//! | `availability.breaker_base_ms` | `10000` | first blackout, doubled per further failure |
//! | `availability.breaker_max_ms` | `30000` | longest blackout |
//! | `availability.max_in_flight` | unlimited | pass over endpoints with this many calls in flight |
//! | `availability.pushback` | `true` | pass over endpoints that answered `429`, `503` with `Retry-After` or `grpc-retry-pushback-ms`, for the time asked (at most 60 s) |
//!
//! Snapshot-wide policies, per service (inherited from `[defaults]`, not per method):
//!
//! | field | default | meaning |
//! |---|---|---|
//! | `policy.panic_threshold_percent` | `50` | Envoy's panic threshold (0 = off) |
//! | `policy.slow_start_ms` | off | Envoy slow start window for new and readmitted endpoints |
//! | `policy.slow_start_aggression` | `1.0` | slow-start curve (1.0 linear) |
//! | `policy.slow_start_min_percent` | `10` | slow-start floor, percent of the weight |
//! | `policy.outlier_detection` | `true` | Envoy's outlier detection with its default rules |
//! | `policy.zone` | none | the caller's zone: prefer endpoints there (zone-aware wrapper) |
//!
//! Call settings, per service (inherited from `[defaults]` key by key), for the layer that
//! sends the calls: [`Resolved::call`] is an [`lbkit_core::CallPolicy`], which lbkit-tower's
//! `BalanceLayer::call_policy` applies (each as the method shown; the deadline header is the
//! request policy's). `lbkit proxy` has the same settings in its own file (`retries` and
//! `deadline_header` per service; `timeout_ms`, `per_try_timeout_ms` and `hedge` per route):
//!
//! | field | default | meaning | lbkit-tower |
//! |---|---|---|---|
//! | `call.retries` | the layer's | further attempts, each on an endpoint not tried yet | `.failover(n)` |
//! | `call.timeout_ms` | the layer's | the whole call, retries and hedges included | `.deadline(d)` |
//! | `call.per_try_timeout_ms` | the layer's | one attempt | `.timeout(d)` |
//! | `call.hedge` | none | hedge idempotent calls after a quantile of recent latency (`"p95"`) or a delay (`"20ms"`); a hedge is an attempt, so it needs `retries` ≥ 1 | `.hedge(delay)` |
//! | `call.deadline_header` | none | a request header of whole milliseconds carrying the caller's deadline (`grpc-timeout` is always read) | `HttpRequests::default().deadline_header(name)` |
//!
//! Which endpoints may serve a request, per service (inherited from `[defaults]` table by
//! table): `stages.overprovisioning`, `stages.subsets`, `stages.localities` and
//! `stages.aperture`, as `lbkit_discovery::stages` documents them (the proxy reads the same
//! table). Priority tiers follow the endpoints' `priority` with no table.
//!
//! Unknown fields, unknown strategy names and unknown or invalid parameters are errors that
//! name the field, checked when the file is loaded.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::Duration;

use lbkit_core::{
    Availability, BoxStrategy, CallPolicy, CircuitBreaker, HedgeDelay, SlowStart, SnapshotPolicy,
    DEFAULT_PANIC_THRESHOLD, MAX_RETRIES,
};
use lbkit_discovery::stages::StagesConfig;
use lbkit_strategy::catalog::{self, Params};
use lbkit_strategy::ZoneAware;
use serde::Deserialize;

/// The strategy used when nothing is configured (Dubbo's default `random`, which is weighted).
pub const DEFAULT_STRATEGY: &str = "weighted-random";

/// A configuration problem, with the file and the field it concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file (or other origin) of the configuration.
    pub origin: String,
    /// The field, as a dotted TOML path (empty for syntax errors).
    pub field: String,
    /// What is wrong.
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}: {}", self.origin, self.reason)
        } else {
            write!(f, "{}: {}: {}", self.origin, self.field, self.reason)
        }
    }
}

impl std::error::Error for ConfigError {}

/// A parsed, validated configuration.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    defaults: ServiceEntry,
    #[serde(default)]
    service: BTreeMap<String, ServiceEntry>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServiceEntry {
    strategy: Option<String>,
    #[serde(default)]
    params: BTreeMap<String, toml::Value>,
    #[serde(default)]
    availability: AvailabilityEntry,
    #[serde(default)]
    policy: PolicyEntry,
    #[serde(default)]
    call: CallEntry,
    #[serde(default)]
    stages: StagesConfig,
    #[serde(default)]
    method: BTreeMap<String, Entry>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CallEntry {
    retries: Option<u32>,
    timeout_ms: Option<u64>,
    per_try_timeout_ms: Option<u64>,
    hedge: Option<String>,
    deadline_header: Option<String>,
}

impl CallEntry {
    /// `self` where set, else `parent`.
    fn or(&self, parent: &CallEntry) -> CallEntry {
        CallEntry {
            retries: self.retries.or(parent.retries),
            timeout_ms: self.timeout_ms.or(parent.timeout_ms),
            per_try_timeout_ms: self.per_try_timeout_ms.or(parent.per_try_timeout_ms),
            hedge: self.hedge.clone().or_else(|| parent.hedge.clone()),
            deadline_header: self
                .deadline_header
                .clone()
                .or_else(|| parent.deadline_header.clone()),
        }
    }

    /// The field at fault and why, if any (checked on the settings a service ends up with).
    fn check(&self) -> Result<(), (&'static str, String)> {
        if self.retries.is_some_and(|r| r > MAX_RETRIES) {
            return Err(("retries", format!("at most {MAX_RETRIES}")));
        }
        if self.timeout_ms == Some(0) {
            return Err(("timeout_ms", "must be positive".into()));
        }
        if self.per_try_timeout_ms == Some(0) {
            return Err(("per_try_timeout_ms", "must be positive".into()));
        }
        if let Some(h) = &self.hedge {
            h.parse::<HedgeDelay>().map_err(|why| ("hedge", why))?;
            if self.retries == Some(0) {
                let why = "a hedge is an attempt: it needs retries >= 1".into();
                return Err(("hedge", why));
            }
        }
        if let Some(name) = &self.deadline_header {
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(("deadline_header", format!("{name:?} is not a header name")));
            }
        }
        Ok(())
    }

    fn build(&self) -> CallPolicy {
        CallPolicy {
            retries: self.retries,
            overall: self.timeout_ms.map(Duration::from_millis),
            per_try: self.per_try_timeout_ms.map(Duration::from_millis),
            hedge: self.hedge.as_deref().and_then(HedgeDelay::parse),
            deadline_header: self.deadline_header.clone(),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyEntry {
    panic_threshold_percent: Option<f64>,
    slow_start_ms: Option<u64>,
    slow_start_aggression: Option<f64>,
    slow_start_min_percent: Option<f64>,
    outlier_detection: Option<bool>,
    zone: Option<String>,
}

impl PolicyEntry {
    /// `self` where set, else `parent`.
    fn or(&self, parent: &PolicyEntry) -> PolicyEntry {
        PolicyEntry {
            panic_threshold_percent: self
                .panic_threshold_percent
                .or(parent.panic_threshold_percent),
            slow_start_ms: self.slow_start_ms.or(parent.slow_start_ms),
            slow_start_aggression: self.slow_start_aggression.or(parent.slow_start_aggression),
            slow_start_min_percent: self
                .slow_start_min_percent
                .or(parent.slow_start_min_percent),
            outlier_detection: self.outlier_detection.or(parent.outlier_detection),
            zone: self.zone.clone().or_else(|| parent.zone.clone()),
        }
    }

    fn check(&self) -> Result<(), (&'static str, String)> {
        if let Some(p) = self.panic_threshold_percent {
            if !(0.0..=100.0).contains(&p) {
                return Err((
                    "panic_threshold_percent",
                    format!("{p} is not a percentage (0-100)"),
                ));
            }
        }
        if self.slow_start_ms == Some(0) {
            return Err(("slow_start_ms", "must be positive".into()));
        }
        if let Some(a) = self.slow_start_aggression {
            if !(a.is_finite() && a > 0.0) {
                return Err((
                    "slow_start_aggression",
                    format!("{a} must be a positive number"),
                ));
            }
        }
        if let Some(m) = self.slow_start_min_percent {
            if !(0.0..=100.0).contains(&m) {
                return Err((
                    "slow_start_min_percent",
                    format!("{m} is not a percentage (0-100)"),
                ));
            }
        }
        Ok(())
    }

    fn policy(&self) -> SnapshotPolicy {
        SnapshotPolicy {
            panic_threshold: self
                .panic_threshold_percent
                .unwrap_or(DEFAULT_PANIC_THRESHOLD * 100.0)
                / 100.0,
            slow_start: self.slow_start_ms.map(|ms| SlowStart {
                window: Duration::from_millis(ms),
                aggression: self.slow_start_aggression.unwrap_or(1.0),
                min_weight_percent: self.slow_start_min_percent.unwrap_or(10.0),
            }),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    strategy: Option<String>,
    #[serde(default)]
    params: BTreeMap<String, toml::Value>,
    #[serde(default)]
    availability: AvailabilityEntry,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AvailabilityEntry {
    circuit_breaker: Option<bool>,
    breaker_threshold: Option<u32>,
    breaker_base_ms: Option<u64>,
    breaker_max_ms: Option<u64>,
    max_in_flight: Option<u32>,
    /// Pass over endpoints that pushed back (429, 503 with Retry-After,
    /// grpc-retry-pushback-ms) until the time they asked for; default true.
    pushback: Option<bool>,
}

impl AvailabilityEntry {
    /// `self` where set, else `parent`.
    fn or(self, parent: AvailabilityEntry) -> AvailabilityEntry {
        AvailabilityEntry {
            circuit_breaker: self.circuit_breaker.or(parent.circuit_breaker),
            breaker_threshold: self.breaker_threshold.or(parent.breaker_threshold),
            breaker_base_ms: self.breaker_base_ms.or(parent.breaker_base_ms),
            breaker_max_ms: self.breaker_max_ms.or(parent.breaker_max_ms),
            max_in_flight: self.max_in_flight.or(parent.max_in_flight),
            pushback: self.pushback.or(parent.pushback),
        }
    }

    fn build(self) -> Availability {
        let d = CircuitBreaker::default();
        let breaker = CircuitBreaker {
            threshold: self.breaker_threshold.unwrap_or(d.threshold),
            base: self.breaker_base_ms.map_or(d.base, Duration::from_millis),
            max: self.breaker_max_ms.map_or(d.max, Duration::from_millis),
        };
        Availability {
            circuit_breaker: self.circuit_breaker.unwrap_or(true).then_some(breaker),
            max_in_flight: self.max_in_flight,
            pushback: self.pushback.unwrap_or(true),
        }
    }
}

/// What a service (or method) resolves to: a strategy name, its parameters, the filter.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// Strategy name.
    pub strategy: String,
    /// Its parameters.
    pub params: Params,
    /// The availability filter.
    pub availability: Availability,
    /// The TOML path the strategy name came from (for error messages).
    pub field: String,
    /// Panic threshold and slow start for the service's snapshots.
    pub policy: SnapshotPolicy,
    /// Whether Envoy's outlier detection runs (default rules).
    pub outlier_detection: bool,
    /// The caller's zone, when zone preference is on.
    pub zone: Option<String>,
    /// The service's call settings (retries, timeout, hedging, deadline header).
    pub call: CallPolicy,
    /// Which endpoints may serve a request (`stages`: subsets, localities, aperture), as
    /// configured; [`StagesConfig::build`] makes the balancer's [`lbkit_core::stage::Stages`]
    /// and [`StagesConfig::attr_headers`] says which headers carry the subsets' attributes.
    pub stages: StagesConfig,
}

// === impl Resolved ===

impl Resolved {
    /// Build the strategy.
    ///
    /// # Errors
    /// An unknown strategy or parameter (never after [`Config::from_toml`] validated it).
    /// With a `zone`, the strategy is wrapped in zone preference ([`ZoneAware`]).
    pub fn build(&self) -> Result<BoxStrategy, catalog::ParamError> {
        let strategy = catalog::build(&self.strategy, self.params.clone())?;
        Ok(match &self.zone {
            Some(zone) => BoxStrategy::new(ZoneAware::new(strategy, zone.as_str())),
            None => strategy,
        })
    }
}

// === impl Config ===

impl Config {
    /// Read and validate a configuration file.
    ///
    /// # Errors
    /// An unreadable file, a TOML error, an unknown field, strategy or parameter.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            origin: origin.clone(),
            field: String::new(),
            reason: format!("cannot read: {e}"),
        })?;
        Config::from_toml(&text, &origin)
    }

    /// Parse and validate configuration text; `origin` names it in errors.
    ///
    /// # Errors
    /// A TOML error, an unknown field, strategy or parameter.
    ///
    /// ```
    /// let c = lbkit::config::Config::from_toml(
    ///     "[service.greeter]\nstrategy = \"round-robin\"\n[service.greeter.method.hello]\nstrategy = \"random\"\n",
    ///     "inline",
    /// ).unwrap();
    /// assert_eq!(c.resolve("greeter", Some("hello")).strategy, "random");
    /// assert_eq!(c.resolve("greeter", Some("bye")).strategy, "round-robin");
    /// assert_eq!(c.resolve("other", None).strategy, "weighted-random");
    /// ```
    pub fn from_toml(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| {
            let line = e
                .span()
                .map(|s| text[..s.start.min(text.len())].lines().count().max(1));
            ConfigError {
                origin: line.map_or(origin.to_owned(), |l| format!("{origin}:{l}")),
                field: String::new(),
                reason: e.message().to_owned(),
            }
        })?;
        config.validate(origin)?;
        Ok(config)
    }

    /// The services configured, in name order.
    pub fn services(&self) -> impl Iterator<Item = &str> {
        self.service.keys().map(String::as_str)
    }

    /// The strategy of `service`, or of one of its methods.
    pub fn resolve(&self, service: &str, method: Option<&str>) -> Resolved {
        let defaults = &self.defaults;
        let mut r = Resolved {
            strategy: defaults
                .strategy
                .clone()
                .unwrap_or_else(|| DEFAULT_STRATEGY.to_owned()),
            params: params(&defaults.params),
            availability: defaults.availability.build(),
            field: "defaults.strategy".to_owned(),
            policy: defaults.policy.policy(),
            outlier_detection: defaults.policy.outlier_detection.unwrap_or(true),
            zone: defaults.policy.zone.clone(),
            call: defaults.call.build(),
            stages: defaults.stages.clone(),
        };
        let Some(svc) = self.service.get(service) else {
            return r;
        };
        r.call = svc.call.or(&defaults.call).build();
        r.stages = svc.stages.or(&defaults.stages);
        let policy = svc.policy.or(&defaults.policy);
        r.policy = policy.policy();
        r.outlier_detection = policy.outlier_detection.unwrap_or(true);
        r.zone = policy.zone;
        let svc_field = format!("service.{}", quote(service));
        let mut avail = svc.availability.or(defaults.availability);
        let strategy_params = if let Some(name) = &svc.strategy {
            r.strategy = name.clone();
            r.field = format!("{svc_field}.strategy");
            svc.params.clone()
        } else {
            merge(&defaults.params, &svc.params)
        };
        if let Some(m) = method.and_then(|m| svc.method.get(m)) {
            avail = m.availability.or(avail);
            let field = format!("{svc_field}.method.{}", quote(method.unwrap_or_default()));
            if let Some(name) = &m.strategy {
                r.strategy = name.clone();
                r.field = format!("{field}.strategy");
                r.params = params(&m.params);
            } else {
                r.params = params(&merge(&strategy_params, &m.params));
            }
        } else {
            r.params = params(&strategy_params);
        }
        r.availability = avail.build();
        r
    }

    fn validate(&self, origin: &str) -> Result<(), ConfigError> {
        if !self.defaults.method.is_empty() {
            return Err(ConfigError {
                origin: origin.to_owned(),
                field: "defaults.method".to_owned(),
                reason: "methods belong to a service, not to [defaults]".to_owned(),
            });
        }
        let policies = std::iter::once(("defaults".to_owned(), &self.defaults.policy)).chain(
            self.service
                .iter()
                .map(|(n, s)| (format!("service.{}", quote(n)), &s.policy)),
        );
        for (at, policy) in policies {
            policy.check().map_err(|(field, reason)| ConfigError {
                origin: origin.to_owned(),
                field: format!("{at}.policy.{field}"),
                reason,
            })?;
        }
        self.check_calls(origin)?;
        self.check_stages(origin)?;
        let mut targets: Vec<(String, Option<String>)> = vec![(String::new(), None)];
        for (name, svc) in &self.service {
            targets.push((name.clone(), None));
            targets.extend(svc.method.keys().map(|m| (name.clone(), Some(m.clone()))));
        }
        for (service, method) in targets {
            let r = self.resolve(&service, method.as_deref());
            r.build().map_err(|e| ConfigError {
                origin: origin.to_owned(),
                field: r.field.clone(),
                reason: e.to_string(),
            })?;
        }
        Ok(())
    }
}

impl Config {
    /// Each service's stages as it ends up with them (and the defaults'), checked.
    fn check_stages(&self, origin: &str) -> Result<(), ConfigError> {
        let d = &self.defaults.stages;
        let all = std::iter::once(("defaults".to_owned(), d.clone())).chain(
            self.service
                .iter()
                .map(|(n, s)| (format!("service.{}", quote(n)), s.stages.or(d))),
        );
        for (at, stages) in all {
            stages.build().map_err(|(field, reason)| ConfigError {
                origin: origin.to_owned(),
                field: format!("{at}.stages.{field}"),
                reason,
            })?;
        }
        Ok(())
    }

    /// Each service's call settings as it ends up with them (and the defaults'), checked; the
    /// error names the table that set the field at fault.
    fn check_calls(&self, origin: &str) -> Result<(), ConfigError> {
        let d = &self.defaults.call;
        let calls = std::iter::once(("defaults".to_owned(), d.clone(), d)).chain(
            self.service
                .iter()
                .map(|(n, s)| (format!("service.{}", quote(n)), s.call.or(d), &s.call)),
        );
        for (at, call, own) in calls {
            call.check().map_err(|(mut field, mut reason)| {
                if field == "hedge" && own.hedge.is_none() && own.retries == Some(0) {
                    field = "retries";
                    reason =
                        "0, but the hedge it inherits from [defaults] needs retries >= 1".into();
                }
                let set_here = match field {
                    "retries" => own.retries.is_some(),
                    "timeout_ms" => own.timeout_ms.is_some(),
                    "per_try_timeout_ms" => own.per_try_timeout_ms.is_some(),
                    "hedge" => own.hedge.is_some(),
                    _ => own.deadline_header.is_some(),
                };
                let at = if set_here { at.as_str() } else { "defaults" };
                ConfigError {
                    origin: origin.to_owned(),
                    field: format!("{at}.call.{field}"),
                    reason,
                }
            })?;
        }
        Ok(())
    }
}

fn params(map: &BTreeMap<String, toml::Value>) -> Params {
    Params::from_pairs(map.iter().map(|(k, v)| {
        let text = match v {
            toml::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        (k.clone(), text)
    }))
}

fn merge(
    base: &BTreeMap<String, toml::Value>,
    over: &BTreeMap<String, toml::Value>,
) -> BTreeMap<String, toml::Value> {
    let mut m = base.clone();
    m.extend(over.iter().map(|(k, v)| (k.clone(), v.clone())));
    m
}

fn quote(name: &str) -> String {
    let bare = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare {
        name.to_owned()
    } else {
        format!("{name:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        Config::from_toml(text, "lbkit.toml")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn resolution_order_and_inheritance() {
        let c = Config::from_toml(
            r#"
[defaults]
strategy = "sticky-round-robin"
params = { n = 4 }
availability = { max_in_flight = 50 }

[service."com.acme.Greeter"]
availability = { circuit_breaker = false }

[service."com.acme.Greeter".method.sayHello]
params = { n = 9 }

[service."com.acme.Greeter".method.sayBye]
strategy = "weighted-response-time"
"#,
            "lbkit.toml",
        )
        .unwrap();
        let svc = c.resolve("com.acme.Greeter", None);
        assert_eq!(
            (svc.strategy.as_str(), &svc.params),
            ("sticky-round-robin", &Params::from_pairs([("n", "4")]))
        );
        assert_eq!(
            svc.availability,
            Availability {
                circuit_breaker: None,
                max_in_flight: Some(50),
                pushback: true,
            }
        );
        let hello = c.resolve("com.acme.Greeter", Some("sayHello"));
        assert_eq!(hello.params, Params::from_pairs([("n", "9")]));
        let bye = c.resolve("com.acme.Greeter", Some("sayBye"));
        assert_eq!(
            (bye.strategy.as_str(), &bye.params),
            ("weighted-response-time", &Params::new())
        );
        assert_eq!(c.resolve("unknown", None).strategy, "sticky-round-robin");
        assert_eq!(
            Config::default().resolve("x", None).strategy,
            DEFAULT_STRATEGY
        );
    }

    #[test]
    fn policies_inherit_from_defaults() {
        let c = Config::from_toml(
            "[defaults.policy]\npanic_threshold_percent = 30\nzone = \"eu-1\"\n\
             [service.a.policy]\nslow_start_ms = 60000\noutlier_detection = false\n\
             [service.b]\nstrategy = \"round-robin\"\n",
            "lbkit.toml",
        )
        .unwrap();
        let a = c.resolve("a", None);
        assert_eq!(a.policy.panic_threshold, 0.3);
        assert_eq!(a.policy.slow_start.unwrap().window, Duration::from_secs(60));
        assert!(!a.outlier_detection);
        assert_eq!(a.zone.as_deref(), Some("eu-1"));
        let b = c.resolve("b", None);
        assert!(b.outlier_detection && b.policy.slow_start.is_none());
        assert_eq!(
            Config::default().resolve("x", None).policy,
            SnapshotPolicy::envoy()
        );
    }

    #[test]
    fn call_settings_inherit_key_by_key_and_are_checked() {
        let c = Config::from_toml(
            "[defaults.call]\nretries = 1\ndeadline_header = \"x-request-timeout\"\n\
             [service.a]\ncall = { hedge = \"p95\", timeout_ms = 800 }\n\
             [service.b.call]\nretries = 3\nhedge = \"20ms\"\n",
            "lbkit.toml",
        )
        .unwrap();
        let a = c.resolve("a", Some("m")).call;
        assert_eq!(a.retries, Some(1));
        assert_eq!(a.overall, Some(Duration::from_millis(800)));
        assert_eq!(a.per_try, None);
        assert_eq!(a.hedge, HedgeDelay::parse("p95"));
        assert_eq!(a.deadline_header.as_deref(), Some("x-request-timeout"));
        let b = c.resolve("b", None).call;
        assert_eq!(
            (b.retries, b.hedge),
            (Some(3), Some(HedgeDelay::Fixed(Duration::from_millis(20))))
        );
        assert_eq!(c.resolve("other", None).call.hedge, None);
        assert_eq!(
            Config::default().resolve("x", None).call,
            CallPolicy::default()
        );
        for (text, want) in [
            (
                "[service.a.call]\nhedge = \"soon\"\n",
                "service.a.call.hedge: \"soon\": a quantile (p95) or a delay (20ms, 1.5s)",
            ),
            // The retries come from the defaults; the hedge that needs them is the service's.
            (
                "[defaults.call]\nretries = 0\n[service.a.call]\nhedge = \"p99\"\n",
                "service.a.call.hedge: a hedge is an attempt: it needs retries >= 1",
            ),
            (
                "[defaults.call]\nhedge = \"p99\"\n[service.a.call]\nretries = 0\n",
                "service.a.call.retries: 0, but the hedge it inherits from [defaults] needs retries >= 1",
            ),
            ("[defaults.call]\nretries = 16\n", "defaults.call.retries: at most 15"),
            (
                "[service.a.call]\ntimeout_ms = 0\n",
                "service.a.call.timeout_ms: must be positive",
            ),
            (
                "[service.a.call]\ndeadline_header = \"x timeout\"\n",
                "service.a.call.deadline_header: \"x timeout\" is not a header name",
            ),
        ] {
            assert_eq!(err(text), format!("lbkit.toml: {want}"), "{text}");
        }
    }

    #[test]
    fn errors_name_the_field() {
        assert_eq!(
            err("[service.a.policy]\npanic_threshold_percent = 150\n"),
            "lbkit.toml: service.a.policy.panic_threshold_percent: 150 is not a percentage (0-100)"
        );
        assert!(err("[defaults.method.m]\nstrategy = \"random\"\n")
            .contains("defaults.method: methods belong to a service"));
        assert_eq!(
            err("[service.greeter]\nstrategy = \"fastest\"\n")
                .split(" (known")
                .next()
                .unwrap(),
            "lbkit.toml: service.greeter.strategy: unknown strategy \"fastest\""
        );
        assert!(err("[service.\"a.B\".method.m]\nstrategy = \"random\"\nparams = { n = 1 }\n")
            .starts_with("lbkit.toml: service.\"a.B\".method.m.strategy: strategy \"random\" has no parameter \"n\""));
        assert!(
            err("[service.g]\nstrategy = \"sticky-round-robin\"\nparams = { n = 0 }\n")
                .contains("must be at least 1")
        );
        let e = err("[service.g]\nstrategee = \"random\"\n");
        assert!(
            e.starts_with("lbkit.toml:1: unknown field `strategee`"),
            "{e}"
        ); // line of the table
        assert!(err("[defaults]\nstrategy = \"nope\"\n")
            .contains("defaults.strategy: unknown strategy"));
        assert!(
            err("[service.g]\navailability = { max_in_flight = -1 }\n").contains("lbkit.toml:2")
        );
    }
}
