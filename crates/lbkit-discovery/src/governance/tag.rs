//! Dubbo 3's tag rules: a YAML document under `/dubbo/config/dubbo/<application>.tag-router`,
//! keyed by the *providers'* application, that gives tags to provider addresses (grey
//! releases, blue-green):
//!
//! ```yaml
//! force: false
//! runtime: true
//! enabled: true
//! key: demo-provider
//! tags:
//!   - name: gray
//!     addresses: ["10.0.0.7:20880"]
//!   - name: blue
//!     addresses: ["10.0.1.*", "10.0.2.0/24"]
//! ```
//!
//! [`parse_tag_rule`] reads it as Dubbo's `TagRuleParser` does (`enabled` defaults to true,
//! `force` to false; a tag with `addresses: null`, `~` or `[]` lists none; a document without
//! tags is not valid and Dubbo then routes by the providers' own `dubbo.tag` only), and
//! [`TagRule::annotate`] writes what the rule says about one provider into its metadata, where
//! [`lbkit_core::route`] reads it at pick time.
//!
//! Addresses match as Dubbo's `NetUtils.matchIpExpression` matches them (with its check that
//! `0.0.0.0:PORT` is any host on that port): `*`; `HOST` (any port) or `HOST:PORT`; IPv4
//! segments with `*` or ranges `1-10` (IPv6: all eight hex segments, the same way); CIDR blocks `10.0.0.0/8` (IPv4 or IPv6, no port);
//! `[IPv6]:PORT`. Dubbo resolves a host name in a pattern through DNS; lbkit compares names as
//! text (no lookups while applying a rule). Dubbo 3.2's `match` conditions and multi-level
//! tags (`a|b`) are not read: a tag with only `match` lists no addresses.

use std::net::{IpAddr, Ipv4Addr};

use lbkit_core::route::{
    TAG_GROUPS_KEY, TAG_RULE_FORCE_KEY, TAG_RULE_KEY, TAG_RULE_LISTED_KEY, TAG_RULE_NAMES_KEY,
};
use lbkit_core::EndpointSpec;

/// Where Dubbo 3 keeps an application's tag rule in ZooKeeper:
/// `/ROOT/config/ROOT/APPLICATION.tag-router`.
pub fn tag_rule_path(root: &str, application: &str) -> String {
    format!("/{root}/config/{root}/{application}.tag-router")
}

/// A tag rule, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TagRule {
    /// The application it is for (`key`).
    pub key: String,
    /// Whether it applies (`enabled`, default true).
    pub enabled: bool,
    /// A tag whose listed addresses are all gone gets no fall back (`force`, default false).
    pub force: bool,
    /// The tags, in document order.
    pub tags: Vec<Tag>,
}

/// One tag of a rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tag {
    /// Its name.
    pub name: String,
    /// Whether the rule lists addresses for it (even ones that do not parse: Dubbo then
    /// matches none of them, and does not fall back to the providers' own tags).
    pub listed: bool,
    /// Its addresses that parse.
    pub addresses: Vec<AddressPattern>,
}

#[derive(Debug, serde::Deserialize)]
struct Doc {
    #[serde(default)]
    key: Option<String>,
    #[serde(default = "yes")]
    enabled: bool,
    #[serde(default)]
    force: bool,
    #[serde(default)]
    tags: Option<Vec<DocTag>>,
}

#[derive(Debug, serde::Deserialize)]
struct DocTag {
    name: String,
    #[serde(default)]
    addresses: Option<Vec<String>>,
}

fn yes() -> bool {
    true
}

/// What parsing a tag rule document gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedTagRule {
    /// The rule; `None` when the document has no tags (not valid: Dubbo routes by the
    /// providers' own tags).
    pub rule: Option<TagRule>,
    /// Addresses that do not parse, with why (Dubbo logs each one and matches no provider
    /// with it).
    pub bad_addresses: Vec<String>,
}

/// Parse a tag rule document (YAML, as dubbo-admin writes it).
///
/// # Errors
/// Text that is not such a document: not YAML, a tag without a name, an empty tag name, one
/// with a comma (lbkit lists tags comma-separated in endpoint metadata), or two tags of the
/// same name.
///
/// ```
/// use lbkit_discovery::governance::tag::parse_tag_rule;
/// let yaml = "force: false\nenabled: true\nkey: demo-provider\ntags:\n  - name: gray\n    addresses: [\"10.0.0.7:20880\"]\n";
/// let rule = parse_tag_rule(yaml).unwrap().rule.unwrap();
/// assert_eq!(rule.tags[0].name, "gray");
/// assert!(rule.tags[0].addresses[0].matches("10.0.0.7", 20880));
/// ```
pub fn parse_tag_rule(text: &str) -> Result<ParsedTagRule, String> {
    let doc: Doc =
        serde_norway::from_str(text).map_err(|e| format!("not a tag rule document: {e}"))?;
    let mut tags: Vec<Tag> = Vec::new();
    let mut bad_addresses = Vec::new();
    for (n, t) in doc.tags.unwrap_or_default().into_iter().enumerate() {
        if t.name.is_empty() || t.name.contains(',') {
            return Err(format!(
                "tags[{n}]: tag name {:?} is empty or has a comma",
                t.name
            ));
        }
        if tags.iter().any(|known| known.name == t.name) {
            return Err(format!("tags[{n}]: tag {:?} appears twice", t.name));
        }
        let listed = t.addresses.as_ref().is_some_and(|a| !a.is_empty());
        let mut addresses = Vec::new();
        for a in t.addresses.unwrap_or_default() {
            match AddressPattern::parse(&a) {
                Ok(p) => addresses.push(p),
                Err(reason) => bad_addresses.push(format!("tag {}: {a:?}: {reason}", t.name)),
            }
        }
        tags.push(Tag {
            name: t.name,
            listed,
            addresses,
        });
    }
    let rule = (!tags.is_empty()).then(|| TagRule {
        key: doc.key.unwrap_or_default(),
        enabled: doc.enabled,
        force: doc.force,
        tags,
    });
    Ok(ParsedTagRule {
        rule,
        bad_addresses,
    })
}

// === impl TagRule ===

impl TagRule {
    /// The tags whose addresses match a provider at `host:port`.
    pub fn groups(&self, host: &str, port: u16) -> Vec<&str> {
        self.tags
            .iter()
            .filter(|t| t.addresses.iter().any(|a| a.matches(host, port)))
            .map(|t| t.name.as_str())
            .collect()
    }

    /// Write the rule and what it says about `spec` (by its `host:port` address) into its
    /// metadata, as [`lbkit_core::route`] reads it. A disabled rule writes nothing.
    pub fn annotate(&self, spec: &mut EndpointSpec) {
        if !self.enabled {
            return;
        }
        let names: Vec<&str> = self.tags.iter().map(|t| t.name.as_str()).collect();
        let listed: Vec<&str> = self
            .tags
            .iter()
            .filter(|t| t.listed)
            .map(|t| t.name.as_str())
            .collect();
        let groups = split_host_port(&spec.address)
            .map(|(h, p)| self.groups(h, p))
            .unwrap_or_default();
        let m = &mut spec.metadata;
        m.insert(TAG_RULE_KEY, self.key.clone());
        m.insert(TAG_RULE_FORCE_KEY, self.force.to_string());
        m.insert(TAG_RULE_NAMES_KEY, names.join(","));
        m.insert(TAG_RULE_LISTED_KEY, listed.join(","));
        if groups.is_empty() {
            m.remove(TAG_GROUPS_KEY);
        } else {
            m.insert(TAG_GROUPS_KEY, groups.join(","));
        }
    }
}

/// The tags an endpoint carries, for people (`lbkit watch`, `pick --explain`, the proxy's
/// `/endpoints`): `NAME (rule KEY)` for each tag the rule gives its address, then
/// `NAME (own)` for its own `dubbo.tag` (`NAME (own, overridden by the rule)` when the rule
/// lists addresses for that name, so its own tag no longer counts).
///
/// ```
/// use lbkit_core::EndpointSpec;
/// use lbkit_discovery::governance::tag::describe_tags;
/// let spec = EndpointSpec::new("10.0.0.1:80").with_meta("dubbo.tag", "blue");
/// assert_eq!(describe_tags(&spec.metadata), ["blue (own)"]);
/// ```
pub fn describe_tags(metadata: &lbkit_core::Metadata) -> Vec<String> {
    let list = |k: &str| lbkit_core::route::listed_tags(metadata, k);
    let mut out = Vec::new();
    let rule = metadata.get(TAG_RULE_KEY);
    if let Some(key) = rule {
        for g in list(TAG_GROUPS_KEY) {
            out.push(format!("{g} (rule {key})"));
        }
    }
    if let Some(own) = metadata
        .get(lbkit_core::route::TAG_KEY)
        .filter(|t| !t.is_empty())
    {
        let overridden = rule.is_some() && list(TAG_RULE_LISTED_KEY).contains(&own.as_str());
        out.push(if overridden {
            format!("{own} (own, overridden by the rule)")
        } else {
            format!("{own} (own)")
        });
    }
    out
}

/// `host:port` (or `[v6]:port`) split; `None` without a port.
fn split_host_port(address: &str) -> Option<(&str, u16)> {
    let (host, port) = address.rsplit_once(':')?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    Some((host, port.parse().ok()?))
}

/// One address of a tag, as Dubbo's `matchIpExpression` reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AddressPattern {
    /// `*` or `*.*.*.*`: every provider.
    Any,
    /// `0.0.0.0:PORT`: any host on that port.
    AnyHost(u16),
    /// A CIDR block (no port).
    Cidr(IpAddr, u8),
    /// An IPv4 mask: each segment a number range (`*` is 0-255), and maybe a port.
    Ipv4([(u8, u8); 4], Option<u16>),
    /// An IPv6 mask in full eight-segment form, each a hex range (`*` is 0-ffff), and maybe a
    /// port (`[…]:PORT`).
    Ipv6([(u16, u16); 8], Option<u16>),
    /// An exact host (an IPv6 address or a name, compared as text, case-insensitively), and
    /// maybe a port.
    Host(String, Option<u16>),
}

impl AddressPattern {
    /// Parse one address of a tag rule.
    ///
    /// # Errors
    /// A pattern Dubbo's `matchIpExpression` would throw on: a bad CIDR block, a port that is
    /// not a number, an IPv4 mask with a segment that is neither a number, `*` nor `a-b`, or
    /// with other than four segments.
    pub fn parse(text: &str) -> Result<AddressPattern, String> {
        let p = text.trim();
        if p == "*" || p == "*.*.*.*" {
            return Ok(AddressPattern::Any);
        }
        if p.is_empty() {
            return Err("empty address".into());
        }
        if let Some((ip, bits)) = p.split_once('/') {
            let ip: IpAddr = ip.parse().map_err(|_| "not a CIDR block".to_string())?;
            let max = if ip.is_ipv4() { 32 } else { 128 };
            let bits: u8 = bits
                .parse()
                .ok()
                .filter(|&b| b <= max)
                .ok_or_else(|| "not a CIDR prefix length".to_string())?;
            return Ok(AddressPattern::Cidr(ip, bits));
        }
        let (host, port) = host_and_port(p)?;
        if host == "0.0.0.0" {
            if let Some(port) = port {
                return Ok(AddressPattern::AnyHost(port));
            }
        }
        let looks_v4 = host.split('.').count() == 4
            && host
                .chars()
                .all(|c| c.is_ascii_digit() || c == '.' || c == '*' || c == '-');
        if looks_v4 {
            let mut mask = [(0u8, 0u8); 4];
            for (slot, seg) in mask.iter_mut().zip(host.split('.')) {
                *slot = segment(seg).ok_or_else(|| format!("bad IPv4 segment {seg:?}"))?;
            }
            return Ok(AddressPattern::Ipv4(mask, port));
        }
        if host.contains(':') && (host.contains('*') || host.contains('-')) {
            let segs: Vec<&str> = host.split(':').collect();
            if segs.len() != 8 {
                return Err("an IPv6 pattern with '*' or a range needs all eight segments".into());
            }
            let mut mask = [(0u16, 0u16); 8];
            for (slot, seg) in mask.iter_mut().zip(segs) {
                *slot = segment6(seg).ok_or_else(|| format!("bad IPv6 segment {seg:?}"))?;
            }
            return Ok(AddressPattern::Ipv6(mask, port));
        }
        if host.contains('*') {
            return Err("wildcards only in IP address patterns".into());
        }
        Ok(AddressPattern::Host(host.to_ascii_lowercase(), port))
    }

    /// Whether a provider at `host:port` matches.
    pub fn matches(&self, host: &str, port: u16) -> bool {
        match self {
            AddressPattern::Any => true,
            AddressPattern::AnyHost(p) => *p == port,
            AddressPattern::Cidr(net, bits) => host
                .parse::<IpAddr>()
                .is_ok_and(|ip| in_block(ip, *net, *bits)),
            AddressPattern::Ipv4(mask, p) => {
                p.is_none_or(|p| p == port)
                    && host.parse::<Ipv4Addr>().is_ok_and(|ip| {
                        ip.octets()
                            .iter()
                            .zip(mask)
                            .all(|(o, (lo, hi))| (lo..=hi).contains(&o))
                    })
            }
            AddressPattern::Ipv6(mask, p) => {
                p.is_none_or(|p| p == port)
                    && host.parse::<std::net::Ipv6Addr>().is_ok_and(|ip| {
                        ip.segments()
                            .iter()
                            .zip(mask)
                            .all(|(s, (lo, hi))| (lo..=hi).contains(&s))
                    })
            }
            AddressPattern::Host(h, p) => {
                p.is_none_or(|p| p == port)
                    && match (h.parse::<IpAddr>(), host.parse::<IpAddr>()) {
                        (Ok(a), Ok(b)) => a == b,
                        _ => h.eq_ignore_ascii_case(host),
                    }
            }
        }
    }
}

/// A pattern's host and port: `[v6]:port`, `[v6]`, a bare IPv6 address (no port), `host:port`
/// or `host`.
fn host_and_port(p: &str) -> Result<(&str, Option<u16>), String> {
    let port = |s: &str| {
        s.parse::<u16>()
            .map_err(|_| format!("port {s:?} is not a number"))
    };
    if let Some(rest) = p.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| "unclosed [".to_string())?;
        return match after.strip_prefix(':') {
            Some(pt) => Ok((host, Some(port(pt)?))),
            None if after.is_empty() => Ok((host, None)),
            None => Err(format!("junk after ]: {after:?}")),
        };
    }
    if p.matches(':').count() > 1 {
        return Ok((p, None)); // a bare IPv6 address
    }
    match p.split_once(':') {
        Some((h, pt)) => Ok((h, Some(port(pt)?))),
        None => Ok((p, None)),
    }
}

/// An IPv4 mask segment: `*`, `N` or `LO-HI`.
fn segment(seg: &str) -> Option<(u8, u8)> {
    if seg == "*" {
        return Some((0, 255));
    }
    match seg.split_once('-') {
        Some((lo, hi)) => {
            let (lo, hi) = (lo.parse().ok()?, hi.parse().ok()?);
            (lo <= hi).then_some((lo, hi))
        }
        None => seg.parse().ok().map(|n| (n, n)),
    }
}

/// An IPv6 mask segment: `*`, `HEX` or `LO-HI`.
fn segment6(seg: &str) -> Option<(u16, u16)> {
    let hex = |s: &str| u16::from_str_radix(s, 16).ok();
    if seg == "*" {
        return Some((0, u16::MAX));
    }
    match seg.split_once('-') {
        Some((lo, hi)) => {
            let (lo, hi) = (hex(lo)?, hex(hi)?);
            (lo <= hi).then_some((lo, hi))
        }
        None => hex(seg).map(|n| (n, n)),
    }
}

fn in_block(ip: IpAddr, net: IpAddr, bits: u8) -> bool {
    let (a, b, width) = match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(b)) => (u128::from(u32::from(a)), u128::from(u32::from(b)), 32),
        (IpAddr::V6(a), IpAddr::V6(b)) => (u128::from(a), u128::from(b), 128),
        _ => return false,
    };
    let shift = width - u32::from(bits);
    if shift >= 128 {
        return true;
    }
    (a >> shift) == (b >> shift)
}

#[cfg(test)]
mod tests;
