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
//! * **Conditions** (each must hold): `providers=a:1,b:2` (the provider's address is listed, or
//!   `0.0.0.0` is); `application=NAME`, or `NAME@` before the host (the consumer's
//!   application, or the provider's own; `*` = any); `~key=value` (the provider's URL has `key=value`). `enabled=false` switches
//!   the rule off.
//! * **Effect.** `override://` sets each of its other parameters on the provider's URL,
//!   `absent://` only those the URL lacks. The consumer reads `weight` and `disabled=true`
//!   (no traffic) from the result, as from any provider URL ([`ProviderUrl::to_spec`]).
//!   Parameters that only place or describe the rule (`category`, `dynamic`, `enabled`,
//!   `check`, `group`, `version`, `application`, `side`, `configVersion`, `compatible_config`,
//!   `interfaces`, `providers`, `priority`, `anyhost`, the `~` conditions) are not copied.
//! * **Order.** Rules apply in Dubbo's order (`Configurator.compareTo`): by host text (so
//!   `0.0.0.0` before any address, and a rule for one provider wins over one for all), then by
//!   `priority` (default 0), later ones winning. Ties keep the nodes' name order.
//! * An `empty://` node clears every rule (Dubbo's "no configurators" push). A rule with no
//!   parameter to apply changes nothing.
//!
//! A node that is not such a URL (another protocol, an undecodable name, a `weight` that is not
//! a non-negative integer) is a [`UrlError`]: the ZooKeeper consumer skips, logs and counts it.
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

use crate::dubbo::{decode_url_text, ProviderUrl};
use crate::error::UrlError;

/// The metadata key naming the override rules that changed an endpoint, and what each set:
/// `RULE sets k=v,k=v; RULE sets …`, in the order they applied (the ZooKeeper consumer sets it).
pub const RULES_METADATA: &str = "dubbo.rules";

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
    "providers",
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
    /// Another protocol than `override`, `absent` or `empty`; no host; a port, `priority` or
    /// `weight` that is not a number; undecodable text.
    pub fn parse(name: &str) -> Result<RuleNode, UrlError> {
        let text = decode_url_text(name)?;
        let err = |reason: String| UrlError {
            url: text.clone(),
            reason,
        };
        let (protocol, rest) = text.split_once("://").ok_or_else(|| {
            err("no protocol (expected override://host[:port]/interface?…)".into())
        })?;
        let mode = match protocol {
            "override" => Mode::Override,
            "absent" => Mode::Absent,
            "empty" => return Ok(RuleNode::Clear),
            other => {
                return Err(err(format!(
                    "{other:?} is not a rule protocol (override, absent, empty)"
                )))
            }
        };
        let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = before_query.split_once('/').unwrap_or((before_query, ""));
        // Dubbo reads a rule's application from `user@` when it has no `application=`.
        let (user, host_port) = match authority.rsplit_once('@') {
            Some((user, hp)) => (Some(user.split(':').next().unwrap_or(user)), hp),
            None => (None, authority),
        };
        let (host, port) = match host_port.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || host_port.starts_with('[') => {
                let port = p
                    .parse::<u16>()
                    .map_err(|_| err(format!("port {p:?} is not a number")))?;
                (h, (port != 0).then_some(port))
            }
            _ => (host_port, None),
        };
        if host.is_empty() {
            return Err(err("no host (0.0.0.0 = every provider)".into()));
        }
        let mut params = std::collections::BTreeMap::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            if k.is_empty() {
                return Err(err(format!("query parameter {pair:?} has no name")));
            }
            params.insert(k.to_owned(), v.to_owned());
        }
        if let Some(user) = user.filter(|u| !u.is_empty()) {
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
        if let Some(w) = params.get("weight") {
            if w.parse::<u32>().is_err() {
                return Err(err(format!("weight={w:?} is not a non-negative integer")));
            }
        }
        Ok(RuleNode::Rule(OverrideRule {
            mode,
            host: host.to_owned(),
            port,
            interface: path.to_owned(),
            params,
            priority,
            text: text.clone(),
        }))
    }
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
        if let Some(list) = self.params.get("providers").filter(|l| !l.is_empty()) {
            let listed = list
                .split(',')
                .map(str::trim)
                .any(|a| a == provider.address || a == ANY_HOST);
            if !listed {
                return Explained::Skipped("provider not in providers=");
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

#[cfg(test)]
mod tests;
