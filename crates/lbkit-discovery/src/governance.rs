//! Dubbo's override rules: how operators steer a fleet through the registry.
//!
//! dubbo-admin (and any Dubbo operator tool) writes an *override rule* as a URL-encoded node
//! under `/dubbo/<interface>/configurators`, for example
//!
//! ```text
//! override://10.20.153.10:20880/com.acme.Greeter?category=configurators&dynamic=false&weight=200
//! override://0.0.0.0/com.acme.Greeter?category=configurators&dynamic=false&disabled=true
//! ```
//!
//! The first doubles one provider's weight, the second takes every provider out of rotation.
//! A consumer rewrites each provider's URL with the rules before it reads the weight, as Dubbo's
//! `AbstractConfigurator` does (`configureDeprecated` and `configureIfMatch`, the 2.6 reading
//! that dubbo-admin's override URLs use):
//!
//! * **Whom a rule targets.** A host and port: that provider (the host may be `0.0.0.0`: any
//!   host with that port). `0.0.0.0` without a port: every provider. A host without a port
//!   names a *consumer* (Dubbo's reading): it is not applied here, and [`Explained`] says so.
//! * **Conditions** (each must hold): `providerAddresses=a:1,b:2` (the provider's address is
//!   listed, or `0.0.0.0` is); `application=NAME`, or `NAME@` before the host (the consumer's
//!   application, or the provider's own; `*` = any); `~key=value` (the provider's URL has `key=value`). `enabled=false` switches
//!   the rule off.
//! * **Effect.** `override://` sets each of its other parameters on the provider's URL,
//!   `absent://` only those the URL lacks. The consumer reads `weight` and `disabled=true`
//!   (no traffic) from the result, as from any provider URL ([`ProviderUrl::to_spec`]).
//!   Parameters that only place or describe the rule (`category`, `dynamic`, `enabled`,
//!   `check`, `group`, `version`, `application`, `side`, `configVersion`, `compatible_config`,
//!   `interfaces`, `providerAddresses`, `priority`, `anyhost`, the `~` conditions) are not
//!   copied.
//! * **Order.** Rules apply in Dubbo's order (`Configurator.compareTo`): by host text (so
//!   `0.0.0.0` before any address, and a rule for one provider wins over one for all), then by
//!   `priority` (default 0), later ones winning. Ties keep the nodes' name order.
//! * An `empty://` node clears every rule (Dubbo's "no configurators" push). A rule with no
//!   parameter to apply changes nothing.
//!
//! A node that is not such a URL (another protocol, an undecodable name, a `weight` that is not
//! a non-negative integer) is a [`UrlError`]: the ZooKeeper consumer skips, logs and counts it.
//!
//! Dubbo 3 keeps the same rules as YAML documents in its config center
//! (`/dubbo/config/dubbo/<interface>.configurators`, and `<application>.configurators` for an
//! application's): [`parse_yaml_configurators`] turns one into override rules exactly as
//! Dubbo's `ConfigParser` does, and the ZooKeeper consumer obeys them beside the URL nodes. A
//! document that does not parse is skipped, logged and counted, and the last good rules of
//! that node stay in force. Dubbo also reads `side`: its providers apply provider-side rules to
//! themselves and register again, its consumers apply consumer-side ones. lbkit, a consumer,
//! applies both kinds to the providers they name, so providers that do not re-register
//! (Python's, Rust's) are steered too; weight and disabled are set, not added, so a Java
//! provider that re-registered gives the same result. Dubbo 3.1's `match` conditions are not
//! read.
//!
//! ```
//! use lbkit_discovery::dubbo::ProviderUrl;
//! use lbkit_discovery::governance::{Overrides, RuleNode};
//! let provider = ProviderUrl::parse("dubbo://10.0.0.1:20880/com.acme.Greeter?weight=100").unwrap();
//! let rule = RuleNode::parse("override%3A%2F%2F10.0.0.1%3A20880%2Fcom.acme.Greeter%3Fweight%3D200").unwrap();
//! let rules = Overrides::new([rule]);
//! let (url, applied) = rules.apply(&provider, None);
//! assert_eq!(url.to_spec().unwrap().weight, 200);
//! assert_eq!(applied.len(), 1);
//! ```

use std::cmp::Ordering;

use crate::dubbo::{decode_url_text, query_params, split_url, ProviderUrl};
use crate::error::UrlError;

/// The metadata key naming the override rules that changed an endpoint, and what each set:
/// `RULE sets k=v,k=v; RULE sets …`, in the order they applied (the ZooKeeper consumer sets it).
pub const RULES_METADATA: &str = "dubbo.rules";

/// The rules named in an endpoint's [`RULES_METADATA`], one `RULE sets k=v` each, in the order
/// they applied (none when no rule changed it): what `lbkit watch`, `pick --explain` and the
/// proxy's admin API show.
pub fn applied_rules(metadata: &lbkit_core::Metadata) -> Vec<&str> {
    metadata
        .get(RULES_METADATA)
        .map(|r| r.split("; ").collect())
        .unwrap_or_default()
}

/// The host that means "any".
pub const ANY_HOST: &str = "0.0.0.0";

/// Parameters that place or describe a rule rather than configure the provider.
const CONDITION_KEYS: &[&str] = &[
    "anyhost",
    "application",
    "category",
    "check",
    "compatible_config",
    "configVersion",
    "dynamic",
    "enabled",
    "group",
    "interfaces",
    "priority",
    "providerAddresses",
    "side",
    "version",
];

/// What a rule does to the parameters it carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `override://`: set them.
    Override,
    /// `absent://`: set those the provider's URL lacks.
    Absent,
}

/// One override rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverrideRule {
    /// `override://` or `absent://`.
    pub mode: Mode,
    /// The host it names (`0.0.0.0` = any).
    pub host: String,
    /// The port it names, if any.
    pub port: Option<u16>,
    /// Its path: the interface.
    pub interface: String,
    /// All its parameters.
    pub params: std::collections::BTreeMap<String, String>,
    /// `priority` (default 0).
    pub priority: i64,
    /// The rule as text (decoded), to show which rule did what.
    pub text: String,
}

/// A node of the configurators directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuleNode {
    /// A rule.
    Rule(OverrideRule),
    /// `empty://`: no rules at all.
    Clear,
}

impl RuleNode {
    /// Parse a configurators node name (URL-encoded, as dubbo-admin writes it, or plain).
    ///
    /// # Errors
    /// Another protocol than `override`, `absent` or `empty`; no host, or one with other
    /// characters than a host name's or address's; a port, `priority`, `weight`, `warmup` or
    /// `timestamp` that is not a number; undecodable text.
    pub fn parse(name: &str) -> Result<RuleNode, UrlError> {
        let text = decode_url_text(name)?;
        let err = |reason: String| UrlError {
            url: text.clone(),
            reason,
        };
        let parts = split_url(&text, "override://host[:port]/interface?…").map_err(err)?;
        let mode = match parts.protocol {
            "override" => Mode::Override,
            "absent" => Mode::Absent,
            "empty" => return Ok(RuleNode::Clear),
            other => {
                return Err(err(format!(
                    "{other:?} is not a rule protocol (override, absent, empty)"
                )))
            }
        };
        let (host, port) = rule_host(parts.host_port).map_err(err)?;
        let mut params = query_params(parts.query).map_err(err)?;
        // Dubbo reads a rule's application from `user@` when it has no `application=`.
        if let Some(user) = parts.user.filter(|u| !u.is_empty()) {
            params
                .entry("application".to_owned())
                .or_insert_with(|| user.to_owned());
        }
        let priority = match params.get("priority") {
            Some(p) => p
                .parse::<i64>()
                .map_err(|_| err(format!("priority={p:?} is not an integer")))?,
            None => 0,
        };
        // What a consumer reads as numbers from the rewritten URL must be numbers: a rule
        // that would make a provider unusable is malformed itself.
        if let Some(w) = params.get("weight") {
            if w.parse::<u32>().is_err() {
                return Err(err(format!("weight={w:?} is not a non-negative integer")));
            }
        }
        for key in ["warmup", "timestamp"] {
            if let Some(v) = params.get(key).filter(|v| v.parse::<u64>().is_err()) {
                return Err(err(format!("{key}={v:?} is not a non-negative integer")));
            }
        }
        Ok(RuleNode::Rule(OverrideRule {
            mode,
            host: host.to_owned(),
            port,
            interface: parts.path.to_owned(),
            params,
            priority,
            text: text.clone(),
        }))
    }
}

/// A rule's host and port (`None` for none or 0): any host name or address, `0.0.0.0` for
/// every provider. The reason when the host is missing or not a host, or the port not a number.
fn rule_host(host_port: &str) -> Result<(&str, Option<u16>), String> {
    let (host, port) = match host_port.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || host_port.starts_with('[') => {
            let port = p
                .parse::<u16>()
                .map_err(|_| format!("port {p:?} is not a number"))?;
            (h, (port != 0).then_some(port))
        }
        _ => (host_port, None),
    };
    if host.is_empty() {
        return Err("no host (0.0.0.0 = every provider)".into());
    }
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let host_ok = bare
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'));
    if !host_ok {
        return Err(format!("{host:?} is not a host name or address"));
    }
    Ok((host, port))
}

/// Why a rule did or did not apply to one provider.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Explained {
    /// It applied, setting these parameters.
    Applied(Vec<(String, String)>),
    /// It did not: why.
    Skipped(&'static str),
}

impl OverrideRule {
    /// Whether the rule applies to `provider` (for a consumer of application `consumer_app`),
    /// and what it sets.
    pub fn explain(&self, provider: &ProviderUrl, consumer_app: Option<&str>) -> Explained {
        if self.params.get("enabled").is_some_and(|v| v == "false") {
            return Explained::Skipped("switched off (enabled=false)");
        }
        let (p_host, p_port) = split_address(&provider.address);
        match self.port {
            Some(port) if Some(port) != p_port => return Explained::Skipped("another port"),
            Some(_) if self.host != ANY_HOST && self.host != p_host => {
                return Explained::Skipped("another host")
            }
            None if self.host != ANY_HOST => {
                return Explained::Skipped("names a consumer address (a host without a port)")
            }
            _ => {}
        }
        if let Some(list) = self
            .params
            .get("providerAddresses")
            .filter(|l| !l.is_empty())
        {
            let listed = list
                .split(',')
                .map(str::trim)
                .any(|a| a == provider.address || a == ANY_HOST);
            if !listed {
                return Explained::Skipped("provider not in providerAddresses=");
            }
        }
        if let Some(app) = self.params.get("application").filter(|a| *a != "*") {
            let ours = consumer_app == Some(app.as_str());
            let theirs = provider.params.get("application") == Some(app);
            if !ours && !theirs {
                return Explained::Skipped("another application");
            }
        }
        for (k, v) in &self.params {
            if let Some(key) = k.strip_prefix('~') {
                if v != "*" && provider.params.get(key) != Some(v) {
                    return Explained::Skipped("a ~condition does not hold");
                }
            }
        }
        let sets: Vec<(String, String)> = self
            .params
            .iter()
            .filter(|(k, _)| !k.starts_with('~') && !CONDITION_KEYS.contains(&k.as_str()))
            .filter(|(k, _)| self.mode == Mode::Override || !provider.params.contains_key(*k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Explained::Applied(sets)
    }

    fn order(&self, other: &Self) -> Ordering {
        self.host
            .cmp(&other.host)
            .then(self.priority.cmp(&other.priority))
    }
}

/// `host:port` split; the port `None` when absent or not a number.
fn split_address(address: &str) -> (&str, Option<u16>) {
    match address.rsplit_once(':') {
        Some((h, p)) => (
            h.trim_start_matches('[').trim_end_matches(']'),
            p.parse().ok(),
        ),
        None => (address, None),
    }
}

/// A rule that applied to a provider, and the parameters it set there.
pub type Applied<'a> = (&'a OverrideRule, Vec<(String, String)>);

/// The rules of one service, in the order they apply.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overrides {
    rules: Vec<OverrideRule>,
}

impl Overrides {
    /// The rules of `nodes` (in the configurators directory's name order), sorted in Dubbo's
    /// order; an `empty://` node clears them all.
    pub fn new(nodes: impl IntoIterator<Item = RuleNode>) -> Self {
        let mut rules = Vec::new();
        for node in nodes {
            match node {
                RuleNode::Rule(r) => rules.push(r),
                RuleNode::Clear => return Overrides::default(),
            }
        }
        rules.sort_by(OverrideRule::order);
        Overrides { rules }
    }

    /// No rules.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// How many rules.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// The rules, in the order they apply.
    pub fn rules(&self) -> &[OverrideRule] {
        &self.rules
    }

    /// `provider`'s URL rewritten by the rules that apply to it, and those rules (with what
    /// each set), in order.
    pub fn apply<'a>(
        &'a self,
        provider: &ProviderUrl,
        consumer_app: Option<&str>,
    ) -> (ProviderUrl, Vec<Applied<'a>>) {
        let mut url = provider.clone();
        let mut applied = Vec::new();
        for rule in &self.rules {
            if let Explained::Applied(sets) = rule.explain(&url, consumer_app) {
                for (k, v) in &sets {
                    url.params.insert(k.clone(), v.clone());
                }
                applied.push((rule, sets));
            }
        }
        (url, applied)
    }
}

/// Where Dubbo 3 keeps a service's YAML configurators in ZooKeeper (its config center):
/// `/ROOT/config/ROOT/KEY.configurators`, KEY the interface (or, for application-scoped
/// rules, the application).
pub fn yaml_configurators_path(root: &str, key: &str) -> String {
    format!("/{root}/config/{root}/{key}.configurators")
}

/// A Dubbo 3 YAML configurator (dubbo-admin's "dynamic config", `ConfiguratorConfig`).
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct YamlConfig {
    #[serde(default)]
    config_version: Option<String>,
    #[serde(default)]
    scope: Option<String>,
    key: String,
    #[serde(default = "yes")]
    enabled: bool,
    #[serde(default)]
    configs: Vec<YamlItem>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct YamlItem {
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    enabled: Option<bool>,
    #[serde(default)]
    addresses: Vec<String>,
    #[serde(default)]
    provider_addresses: Vec<String>,
    #[serde(default)]
    services: Vec<String>,
    #[serde(default)]
    applications: Vec<String>,
    #[serde(default)]
    parameters: std::collections::BTreeMap<String, serde_norway::Value>,
    #[serde(default)]
    side: Option<String>,
}

fn yes() -> bool {
    true
}

/// The override rules of a Dubbo 3 configurator document (YAML, or the older JSON array of
/// override URLs), as Dubbo's `ConfigParser.parseConfigurators` makes them: one
/// `override://ADDRESS/SERVICE?category=dynamicconfigurators&…` rule per address (default
/// `0.0.0.0`) and application of each item, its `parameters` set, `providerAddresses` as the
/// providers condition (a provider-side item's addresses when it names none), `enabled` from
/// the item (typed items) or the document. Only the rules for `interface` (or for `*`, in an
/// application-scoped document) are returned. `match` conditions (Dubbo 3.1) are not read:
/// such an item applies unconditionally, which the `lbkit watch` line shows.
///
/// # Errors
/// Text that is neither form, a document without `key`, an item without parameters, a
/// parameter that is not a scalar, or a rule that does not parse.
///
/// ```
/// use lbkit_discovery::governance::parse_yaml_configurators;
/// let yaml = "configVersion: v3.0\nscope: service\nkey: com.acme.Greeter\nenabled: true\nconfigs:\n  - addresses: [\"10.0.0.1:20880\"]\n    side: provider\n    parameters:\n      weight: 200\n";
/// let rules = parse_yaml_configurators(yaml, "com.acme.Greeter").unwrap();
/// assert_eq!(rules.len(), 1);
/// ```
pub fn parse_yaml_configurators(text: &str, interface: &str) -> Result<Vec<RuleNode>, String> {
    if let Ok(urls) = serde_json::from_str::<Vec<String>>(text) {
        return urls
            .iter()
            .map(|u| RuleNode::parse(u).map_err(|e| e.to_string()))
            .collect();
    }
    let config: YamlConfig =
        serde_norway::from_str(text).map_err(|e| format!("not a configurator document: {e}"))?;
    if config.key.is_empty() {
        return Err("the document has no key".into());
    }
    let mut rules = Vec::new();
    for (n, item) in config.configs.iter().enumerate() {
        let params = item_parameters(item).map_err(|e| format!("configs[{n}]: {e}"))?;
        item_rules(&config, item, &params, interface, &mut rules)?;
    }
    Ok(rules)
}

/// The override rules one item of `config` stands for, into `rules`: one for each of its
/// addresses (any host when none) and services (those of `interface`, or `*`), and each of
/// its applications (the document's key in application scope). `params`: the item's
/// parameters as `&k=v`.
fn item_rules(
    config: &YamlConfig,
    item: &YamlItem,
    params: &str,
    interface: &str,
    rules: &mut Vec<RuleNode>,
) -> Result<(), String> {
    let application_scope = config.scope.as_deref() == Some("application");
    let version = config.config_version.as_deref().unwrap_or("v2.7");
    let enabled = match item.kind.as_deref() {
        None | Some("general") => config.enabled,
        Some(_) => item.enabled.unwrap_or(true),
    };
    let addresses: Vec<&str> = if item.addresses.is_empty() {
        vec![ANY_HOST]
    } else {
        item.addresses.iter().map(String::as_str).collect()
    };
    let services = item_services(config, item, application_scope);
    let providers = provider_addresses(item, &addresses);
    let apps: Vec<&str> = if application_scope {
        vec![config.key.as_str()]
    } else {
        item.applications.iter().map(String::as_str).collect()
    };
    for addr in &addresses {
        for service in &services {
            let (path, placed) = service_key(service);
            if path != interface && path != "*" {
                continue;
            }
            let mut url = format!("override://{addr}/{path}?{placed}category=dynamicconfigurators");
            if let Some(side) = &item.side {
                url += &format!("&side={side}");
            }
            url += params;
            if !providers.is_empty() {
                url += &format!("&providerAddresses={providers}");
            }
            url += &format!("&enabled={enabled}&configVersion={version}");
            if apps.is_empty() {
                rules.push(parse_rule(&url)?);
            }
            for app in &apps {
                rules.push(parse_rule(&format!("{url}&application={app}"))?);
            }
        }
    }
    Ok(())
}

/// The services an item applies to: the document's key in service scope; in application
/// scope the item's `services`, or every one.
fn item_services<'a>(
    config: &'a YamlConfig,
    item: &'a YamlItem,
    application_scope: bool,
) -> Vec<&'a str> {
    if !application_scope {
        vec![config.key.as_str()]
    } else if item.services.is_empty() {
        vec!["*"]
    } else {
        item.services.iter().map(String::as_str).collect()
    }
}

/// An item's `providerAddresses`: its own list, else its addresses when it is provider-side,
/// else none (empty).
fn provider_addresses(item: &YamlItem, addresses: &[&str]) -> String {
    if !item.provider_addresses.is_empty() {
        item.provider_addresses.join(",")
    } else if item.side.as_deref() == Some("provider") {
        addresses.join(",")
    } else {
        String::new()
    }
}

fn parse_rule(url: &str) -> Result<RuleNode, String> {
    RuleNode::parse(url).map_err(|e| e.to_string())
}

/// `&k=v` for each of an item's parameters (at least one).
fn item_parameters(item: &YamlItem) -> Result<String, String> {
    if item.parameters.is_empty() {
        return Err("no parameters: a rule must change something".into());
    }
    let mut out = String::new();
    for (k, v) in &item.parameters {
        let v = match v {
            serde_norway::Value::String(s) => s.clone(),
            serde_norway::Value::Number(n) => n.to_string(),
            serde_norway::Value::Bool(b) => b.to_string(),
            other => return Err(format!("parameter {k}: {other:?} is not a scalar")),
        };
        out += &format!("&{k}={v}");
    }
    Ok(out)
}

/// A service key `group/interface:version` as Dubbo's `appendService` splits it: the
/// interface, and `group=…&version=…&` for the query.
fn service_key(key: &str) -> (&str, String) {
    let (group, rest) = match key.split_once('/') {
        Some((g, rest)) if !g.is_empty() => (Some(g), rest),
        _ => (None, key),
    };
    let (interface, version) = match rest.split_once(':') {
        Some((i, v)) if !i.is_empty() => (i, Some(v)),
        _ => (rest, None),
    };
    let mut placed = String::new();
    if let Some(g) = group {
        placed += &format!("group={g}&");
    }
    if let Some(v) = version {
        placed += &format!("version={v}&");
    }
    (interface, placed)
}

#[cfg(test)]
mod tests;

pub mod tag;
