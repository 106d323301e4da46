//! Znode layouts: where providers live, how a node decodes to an endpoint, and what a provider
//! registers. Pure functions; the tasks in the sibling modules do the I/O.

use std::collections::BTreeMap;

use lbkit_core::{EndpointSpec, Metadata};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::{Deserialize, Serialize};

use crate::address::check_address;
use crate::dubbo::ProviderUrl;
use crate::error::DiscoveryError;

/// Protocols a Dubbo provider URL may carry; any other is a malformed node (rejected and
/// counted). Dubbo's RPC protocols plus the HTTP family that Dubbo's `rest` and gRPC bridges use.
pub const KNOWN_PROTOCOLS: &[&str] = &[
    "dubbo",
    "tri",
    "grpc",
    "rest",
    "http",
    "https",
    "hessian",
    "rmi",
    "webservice",
    "thrift",
];

/// Java's `URLEncoder.encode(s, "UTF-8")` (how Dubbo names provider nodes): everything but
/// ASCII letters, digits and `.-*_` is percent-encoded.
pub(crate) const JAVA_URL_ENCODE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'.')
    .remove(b'-')
    .remove(b'*')
    .remove(b'_');

/// How providers are laid out in ZooKeeper.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Layout {
    /// Dubbo's: `/<root>/<interface>/providers/<URL-encoded provider URL>`, no data.
    #[default]
    Dubbo,
    /// For non-Dubbo services: `/<root>/<service>/<host:port>`, with optional JSON data
    /// `{"weight": 100, "zone": "eu-1", "metadata": {"k": "v"}}` (all fields optional; unknown
    /// fields are ignored so newer writers do not break older readers).
    Plain,
}

/// A service under a root in one layout: names the directory of its provider nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePath {
    root: String,
    service: String,
    layout: Layout,
}

// === impl ServicePath ===

impl ServicePath {
    /// The service `service` (a Dubbo interface name) under `/<root>`.
    ///
    /// # Errors
    /// [`DiscoveryError::Config`] for an empty service, a service containing `/`, or a root
    /// with empty segments.
    ///
    /// ```
    /// use lbkit_discovery::zookeeper::{Layout, ServicePath};
    /// let p = ServicePath::new("dubbo", "com.acme.Greeter", Layout::Dubbo).unwrap();
    /// assert_eq!(p.dir(), "/dubbo/com.acme.Greeter/providers");
    /// let p = ServicePath::new("/services", "greeter", Layout::Plain).unwrap();
    /// assert_eq!(p.dir(), "/services/greeter");
    /// ```
    pub fn new(root: &str, service: &str, layout: Layout) -> Result<Self, DiscoveryError> {
        let root = root.trim_matches('/');
        if root.is_empty()
            || root
                .split('/')
                .any(|s| s.is_empty() || s == "." || s == "..")
        {
            return Err(config_err("root", format!("{root:?} is not a znode path")));
        }
        if service.is_empty() || service.contains('/') || service.chars().any(char::is_whitespace) {
            return Err(config_err(
                "interface",
                format!("{service:?} must be non-empty, without '/' or white space"),
            ));
        }
        Ok(ServicePath {
            root: root.to_owned(),
            service: service.to_owned(),
            layout,
        })
    }

    /// The root, without slashes.
    pub fn root(&self) -> &str {
        &self.root
    }

    /// The service (interface) name.
    pub fn service(&self) -> &str {
        &self.service
    }

    /// The layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The znode whose children are the providers.
    pub fn dir(&self) -> String {
        match self.layout {
            Layout::Dubbo => format!("/{}/{}/providers", self.root, self.service),
            Layout::Plain => format!("/{}/{}", self.root, self.service),
        }
    }

    /// The znode whose children are the service's override rules (Dubbo layout:
    /// `/ROOT/INTERFACE/configurators`, see [`governance`](crate::governance)); the plain
    /// layout has none.
    pub fn rules_dir(&self) -> Option<String> {
        match self.layout {
            Layout::Dubbo => Some(format!("/{}/{}/configurators", self.root, self.service)),
            Layout::Plain => None,
        }
    }
}

pub(crate) fn config_err(field: &'static str, reason: impl Into<String>) -> DiscoveryError {
    DiscoveryError::Config {
        field,
        reason: reason.into(),
    }
}

/// Which Dubbo providers a consumer wants, after Dubbo's `UrlUtils.isMatch`. Applies to the
/// Dubbo layout only.
///
/// `None` matches anything (a difference from Dubbo, where a consumer without a group sees
/// only providers without one: ask for that with `Some("")`). `"*"` matches anything; a group
/// may list alternatives, `"a,b"`. A provider that does not match is skipped silently — it is
/// someone else's, not malformed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProviderFilter {
    /// Provider `group`.
    pub group: Option<String>,
    /// Provider `version`.
    pub version: Option<String>,
    /// Protocols, comma-separated (`dubbo`, `tri`, …). `None`: any of [`KNOWN_PROTOCOLS`].
    pub protocol: Option<String>,
}

impl ProviderFilter {
    /// Whether `url` is one of the providers this filter wants.
    pub fn matches(&self, url: &ProviderUrl) -> bool {
        let param = |k: &str| url.params.get(k).map_or("", String::as_str);
        let group_ok = self.group.as_deref().is_none_or(|g| {
            g == "*" || g == param("group") || g.split(',').any(|one| one == param("group"))
        });
        let version_ok = self
            .version
            .as_deref()
            .is_none_or(|v| v == "*" || v == param("version"));
        let protocol_ok = self
            .protocol
            .as_deref()
            .is_none_or(|p| p.split(',').any(|one| one.trim() == url.protocol));
        group_ok && version_ok && protocol_ok
    }
}

/// What one provider node means to a consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decoded {
    /// A provider to balance over.
    Endpoint(EndpointSpec),
    /// A valid provider the filter does not want.
    Filtered,
    /// A malformed node, and why.
    Rejected(String),
}

/// Decode one provider node as the consumer does: `Ok(Some(spec))` for a provider,
/// `Ok(None)` for one `filter` does not want (Dubbo layout), `Err(reason)` for a malformed node
/// (the consumer skips, logs and counts it).
///
/// # Errors
/// Why the node is malformed.
///
/// ```
/// use lbkit_discovery::zookeeper::{decode_node, Layout, ProviderFilter};
/// let any = ProviderFilter::default();
/// let spec = decode_node(Layout::Plain, "10.0.0.1:80", br#"{"weight": 5}"#, &any).unwrap().unwrap();
/// assert_eq!((spec.address.as_str(), spec.weight), ("10.0.0.1:80", 5));
/// assert!(decode_node(Layout::Dubbo, "not a url", b"", &any).is_err());
/// ```
pub fn decode_node(
    layout: Layout,
    name: &str,
    data: &[u8],
    filter: &ProviderFilter,
) -> Result<Option<EndpointSpec>, String> {
    match decode(layout, name, data, filter) {
        Decoded::Endpoint(spec) => Ok(Some(spec)),
        Decoded::Filtered => Ok(None),
        Decoded::Rejected(reason) => Err(reason),
    }
}

/// Decode one provider node of `layout` (its name, and its data in the plain layout).
pub(crate) fn decode(layout: Layout, name: &str, data: &[u8], filter: &ProviderFilter) -> Decoded {
    match layout {
        Layout::Dubbo => decode_dubbo(name, filter),
        Layout::Plain => decode_plain(name, data),
    }
}

/// Decode a Dubbo-layout node name (the URL-encoded provider URL).
pub(crate) fn decode_dubbo(name: &str, filter: &ProviderFilter) -> Decoded {
    let url = match ProviderUrl::parse(name) {
        Ok(u) => u,
        Err(e) => return Decoded::Rejected(e.to_string()),
    };
    if !KNOWN_PROTOCOLS.contains(&url.protocol.as_str()) {
        return Decoded::Rejected(format!("unknown protocol {:?}", url.protocol));
    }
    if !filter.matches(&url) {
        return Decoded::Filtered;
    }
    match url.to_spec() {
        Ok(spec) => Decoded::Endpoint(spec),
        Err(e) => Decoded::Rejected(e.to_string()),
    }
}

/// The JSON data of a plain-layout node.
#[derive(Debug, Default, Deserialize, Serialize)]
pub(crate) struct PlainData {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) weight: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) zone: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) metadata: BTreeMap<String, String>,
}

/// Decode a plain-layout node: its name is `host:port`, its data optional JSON.
pub(crate) fn decode_plain(name: &str, data: &[u8]) -> Decoded {
    if let Err(reason) = check_address(name) {
        return Decoded::Rejected(reason);
    }
    let text = match std::str::from_utf8(data) {
        Ok(t) => t.trim(),
        Err(_) => return Decoded::Rejected("node data is not UTF-8".into()),
    };
    let parsed: PlainData = if text.is_empty() {
        PlainData::default()
    } else {
        match serde_json::from_str(text) {
            Ok(d) => d,
            Err(e) => return Decoded::Rejected(format!("node data is not valid JSON: {e}")),
        }
    };
    let mut spec = EndpointSpec::new(name);
    spec.weight = parsed.weight.unwrap_or(spec.weight);
    spec.zone = parsed.zone;
    spec.metadata = parsed.metadata.into();
    Decoded::Endpoint(spec)
}

/// What a provider registers about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Provider {
    /// `host:port` consumers call.
    pub address: String,
    /// Weight (Dubbo's default 100).
    pub weight: u32,
    /// Protocol of the Dubbo URL (default `dubbo`).
    pub protocol: String,
    /// Dubbo `group`, if any.
    pub group: Option<String>,
    /// Dubbo `version`, if any.
    pub version: Option<String>,
    /// Zone, if any.
    pub zone: Option<String>,
    /// Dubbo `application` (default `lbkit`).
    pub application: String,
    /// Further parameters (Dubbo layout: URL parameters; plain layout: `metadata`).
    pub metadata: Metadata,
}

// === impl Provider ===

impl Provider {
    /// A provider at `address` with weight 100, protocol `dubbo`, application `lbkit`.
    pub fn new(address: impl Into<String>) -> Self {
        Provider {
            address: address.into(),
            weight: lbkit_core::DEFAULT_WEIGHT,
            protocol: "dubbo".into(),
            group: None,
            version: None,
            zone: None,
            application: "lbkit".into(),
            metadata: Metadata::new(),
        }
    }

    /// Check what a node name or URL cannot carry.
    ///
    /// # Errors
    /// A bad address, an unknown protocol, or a value containing `&`, `=`, `?` or white space.
    pub fn validate(&self) -> Result<(), DiscoveryError> {
        check_address(&self.address).map_err(|r| config_err("address", r))?;
        if !KNOWN_PROTOCOLS.contains(&self.protocol.as_str()) {
            return Err(config_err(
                "protocol",
                format!("unknown protocol {:?}", self.protocol),
            ));
        }
        let opt = [&self.group, &self.version, &self.zone];
        let values = opt
            .into_iter()
            .flatten()
            .chain(std::iter::once(&self.application))
            .chain(self.metadata.iter().flat_map(|(k, v)| [k, v]));
        for v in values {
            if v.chars()
                .any(|c| matches!(c, '&' | '=' | '?') || c.is_whitespace())
            {
                return Err(config_err(
                    "metadata",
                    format!("{v:?} cannot go into a provider URL"),
                ));
            }
        }
        Ok(())
    }

    /// The Dubbo provider URL registered for `service`, registered at `timestamp_ms`.
    pub fn dubbo_url(&self, service: &str, timestamp_ms: u64) -> ProviderUrl {
        let mut params: BTreeMap<String, String> = (*self.metadata).clone();
        let mut set = |k: &str, v: String| params.insert(k.to_owned(), v);
        set("anyhost", "false".into());
        set("application", self.application.clone());
        set("dynamic", "true".into());
        set("interface", service.to_owned());
        set("side", "provider".into());
        set("timestamp", timestamp_ms.to_string());
        set("weight", self.weight.to_string());
        for (k, v) in [
            ("group", &self.group),
            ("version", &self.version),
            ("zone", &self.zone),
        ] {
            if let Some(v) = v {
                set(k, v.clone());
            }
        }
        ProviderUrl {
            protocol: self.protocol.clone(),
            address: self.address.clone(),
            path: service.to_owned(),
            params,
        }
    }

    /// The node name and data to register under `path.dir()`.
    pub fn node(&self, path: &ServicePath, timestamp_ms: u64) -> (String, Vec<u8>) {
        match path.layout() {
            Layout::Dubbo => {
                let url = self.dubbo_url(path.service(), timestamp_ms).to_string();
                (
                    utf8_percent_encode(&url, JAVA_URL_ENCODE).to_string(),
                    Vec::new(),
                )
            }
            Layout::Plain => {
                let data = PlainData {
                    weight: Some(self.weight),
                    zone: self.zone.clone(),
                    metadata: (*self.metadata).clone(),
                };
                // Serializing a struct of strings and integers cannot fail.
                let json = serde_json::to_vec(&data).unwrap_or_default();
                (self.address.clone(), json)
            }
        }
    }
}

#[cfg(test)]
mod tests;
