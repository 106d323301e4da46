//! Dubbo provider URLs, as stored under `/dubbo/<interface>/providers` in ZooKeeper.
//!
//! A provider registers `URL.encode(url.toFullString())`, for example
//! `dubbo%3A%2F%2F10.0.0.1%3A20880%2Fcom.acme.Greeter%3Fweight%3D200%26timestamp%3D1700000000000`,
//! which decodes to `dubbo://10.0.0.1:20880/com.acme.Greeter?weight=200&timestamp=1700000000000`.
//! Both Java's encoding (`URLEncoder`: a space as `+`, `~` as `%7E`) and Python's (`quote`:
//! `%20`, bare `~`), as the official Python implementation writes it, decode alike.
//! Parsing follows Dubbo's `URL.valueOf`: `protocol://[user[:password]@]host:port/path?k=v&…`,
//! query values taken verbatim. The consumer reads `weight` (default 100), `timestamp` (epoch ms,
//! for warm-up) and `warmup` (ms, default 10 min) as `AbstractLoadBalance.getWeight` does;
//! `enabled=false` or `disabled=true` drains the provider (weight 0).

use std::collections::BTreeMap;
use std::time::Duration;

use lbkit_core::{EndpointSpec, Timestamp};
use percent_encoding::percent_decode_str;

use crate::address::check_address;
use crate::error::UrlError;

/// A parsed provider URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderUrl {
    /// `dubbo`, `tri`, `rest`, …
    pub protocol: String,
    /// `host:port` exactly as written.
    pub address: String,
    /// The path: the service interface.
    pub path: String,
    /// Query parameters in order of appearance (later duplicates win).
    pub params: BTreeMap<String, String>,
}

// === impl ProviderUrl ===

impl ProviderUrl {
    /// Parse one URL, plain or URL-encoded as ZooKeeper stores it.
    ///
    /// # Errors
    /// A missing protocol, host or port, or undecodable text.
    ///
    /// ```
    /// use lbkit_discovery::dubbo::ProviderUrl;
    /// let u = ProviderUrl::parse("dubbo%3A%2F%2F10.0.0.1%3A20880%2Fcom.acme.Greeter%3Fweight%3D200").unwrap();
    /// assert_eq!((u.protocol.as_str(), u.address.as_str(), u.path.as_str()), ("dubbo", "10.0.0.1:20880", "com.acme.Greeter"));
    /// assert_eq!(u.params["weight"], "200");
    /// ```
    pub fn parse(text: &str) -> Result<Self, UrlError> {
        parse_plain(&decode_url_text(text)?)
    }

    /// The endpoint this provider describes, with Dubbo's weight and warm-up parameters.
    ///
    /// # Errors
    /// A `weight`, `timestamp` or `warmup` that is not a non-negative integer.
    pub fn to_spec(&self) -> Result<EndpointSpec, UrlError> {
        let mut spec = EndpointSpec::new(self.address.clone());
        if let Some(w) = self.param_u64("weight")? {
            // Dubbo's weight is a Java int: negative weights are rejected by the parse above,
            // larger ones clamp to u32.
            spec.weight = u32::try_from(w).unwrap_or(u32::MAX);
        }
        if let Some(ts) = self.param_u64("timestamp")? {
            if ts > 0 {
                spec.registered_at = Some(Timestamp::from_millis(ts));
            }
        }
        if let Some(ms) = self.param_u64("warmup")? {
            spec.warmup = Some(Duration::from_millis(ms));
        }
        // Disabled by an operator: no traffic (weight 0), which — unlike a failed health
        // check — no panic threshold ever overrides.
        let off = self.params.get("enabled").is_some_and(|v| v == "false")
            || self.params.get("disabled").is_some_and(|v| v == "true");
        if off {
            spec.weight = 0;
        }
        if let Some(zone) = self.params.get("zone") {
            spec.zone = Some(zone.clone());
        }
        spec.metadata.insert("protocol", self.protocol.clone());
        for (k, v) in &self.params {
            if !matches!(k.as_str(), "weight" | "timestamp" | "warmup" | "zone") {
                spec.metadata.insert(k.clone(), v.clone());
            }
        }
        // The interface: the `interface` parameter (Java Dubbo writes it), else the path, else
        // the `service` parameter (the official Python implementation registers
        // `tri://127.0.0.1:50051?service=NAME`, with neither of the other two).
        if !spec.metadata.contains_key("interface") {
            let from_path = Some(self.path.as_str()).filter(|p| !p.is_empty());
            let interface = from_path.or(self.params.get("service").map(String::as_str));
            spec.metadata
                .insert("interface", interface.unwrap_or_default());
        }
        Ok(spec)
    }

    fn param_u64(&self, key: &str) -> Result<Option<u64>, UrlError> {
        self.params
            .get(key)
            .map(|v| {
                v.parse::<u64>().map_err(|_| UrlError {
                    url: self.to_string(),
                    reason: format!("{key}={v:?} is not a non-negative integer"),
                })
            })
            .transpose()
    }
}

impl std::fmt::Display for ProviderUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}://{}/{}", self.protocol, self.address, self.path)?;
        for (i, (k, v)) in self.params.iter().enumerate() {
            write!(f, "{}{k}={v}", if i == 0 { '?' } else { '&' })?;
        }
        Ok(())
    }
}

fn err(url: &str, reason: impl Into<String>) -> UrlError {
    UrlError {
        url: url.to_owned(),
        reason: reason.into(),
    }
}

/// A URL as a registry node name stores it, decoded: plain text (it has `://`) is taken as it
/// is, anything else is percent-decoded.
pub(crate) fn decode_url_text(text: &str) -> Result<String, UrlError> {
    let text = text.trim();
    if text.contains("://") {
        return Ok(text.to_owned());
    }
    // Java's `URLEncoder` (what Dubbo's `URL.encode` calls) writes a space as `+` and a literal
    // `+` as `%2B`; Python's `quote` writes `%20` and `%2B`: `+` is a space either way. `~`
    // comes bare or as `%7E`, which decoding takes alike.
    let spaced = text.replace('+', " ");
    Ok(percent_decode_str(&spaced)
        .decode_utf8()
        .map_err(|_| err(text, "percent-encoding does not decode to UTF-8"))?
        .into_owned())
}

/// The parts of a URL as Dubbo's `URL.valueOf` reads them:
/// `protocol://[user[:password]@]host[:port]/path?k=v&…`, query values taken verbatim.
pub(crate) struct UrlParts<'a> {
    pub(crate) protocol: &'a str,
    /// The user name before `@` (without `:password`), when there is one.
    pub(crate) user: Option<&'a str>,
    /// `host[:port]` as written.
    pub(crate) host_port: &'a str,
    pub(crate) path: &'a str,
    /// What follows `?` ([`query_params`] reads it).
    pub(crate) query: &'a str,
}

/// Split `url` into its [`UrlParts`]; `shape` is what the error for a URL without `://`
/// says is expected. The reason when there is no protocol.
pub(crate) fn split_url<'a>(url: &'a str, shape: &str) -> Result<UrlParts<'a>, String> {
    let (protocol, rest) = url
        .split_once("://")
        .ok_or_else(|| format!("no protocol (expected {shape})"))?;
    let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, path) = before_query.split_once('/').unwrap_or((before_query, ""));
    let (user, host_port) = match authority.rsplit_once('@') {
        Some((user, hp)) => (Some(user.split(':').next().unwrap_or(user)), hp),
        None => (None, authority),
    };
    Ok(UrlParts {
        protocol,
        user,
        host_port,
        path,
        query,
    })
}

/// A URL's query parameters, values verbatim (a name given twice: the last value). The
/// reason when a parameter has no name.
pub(crate) fn query_params(query: &str) -> Result<BTreeMap<String, String>, String> {
    let mut params = BTreeMap::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k.is_empty() {
            return Err(format!("query parameter {pair:?} has no name"));
        }
        params.insert(k.to_owned(), v.to_owned());
    }
    Ok(params)
}

fn parse_plain(url: &str) -> Result<ProviderUrl, UrlError> {
    let parts = split_url(url, "protocol://host:port/interface").map_err(|r| err(url, r))?;
    let protocol = parts.protocol;
    let protocol_ok = !protocol.is_empty()
        && protocol
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !protocol_ok {
        return Err(err(url, format!("invalid protocol {protocol:?}")));
    }
    check_address(parts.host_port).map_err(|reason| err(url, reason))?;
    Ok(ProviderUrl {
        protocol: protocol.to_owned(),
        address: parts.host_port.to_owned(),
        path: parts.path.to_owned(),
        params: query_params(parts.query).map_err(|r| err(url, r))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minimal_python_registration() {
        // What apache-dubbo (Python) 3.0.0b1 names its provider node: no path, `interface`,
        // `weight` or `timestamp`.
        let u = ProviderUrl::parse(
            "tri%3A%2F%2F127.0.0.1%3A50051%3Fservice%3Dorg.apache.dubbo.samples.data.Greeter",
        )
        .unwrap();
        let s = u.to_spec().unwrap();
        assert_eq!(
            (u.protocol.as_str(), s.address.as_str()),
            ("tri", "127.0.0.1:50051")
        );
        assert_eq!(
            s.metadata["interface"],
            "org.apache.dubbo.samples.data.Greeter"
        );
        assert_eq!(
            (s.weight, s.registered_at),
            (lbkit_core::DEFAULT_WEIGHT, None)
        );
        // Java Dubbo's `interface` parameter wins over the path.
        let java = ProviderUrl::parse(
            "dubbo://10.0.0.1:20880/com.acme.Greeter2?interface=com.acme.Greeter",
        )
        .unwrap()
        .to_spec()
        .unwrap();
        assert_eq!(java.metadata["interface"], "com.acme.Greeter");
    }

    #[test]
    fn java_and_python_encodings_decode_alike() {
        let plain = "dubbo://10.0.0.1:20880/com.acme.Greeter?application=my app&tag=~grey&k=a+b";
        let java = "dubbo%3A%2F%2F10.0.0.1%3A20880%2Fcom.acme.Greeter%3Fapplication%3Dmy+app%26tag%3D%7Egrey%26k%3Da%2Bb";
        let python = "dubbo%3A%2F%2F10.0.0.1%3A20880%2Fcom.acme.Greeter%3Fapplication%3Dmy%20app%26tag%3D~grey%26k%3Da%2Bb";
        let want = ProviderUrl::parse(plain).unwrap();
        assert_eq!(want.params["application"], "my app");
        assert_eq!(want.params["k"], "a+b", "a plain URL is taken verbatim");
        for encoded in [java, python] {
            assert_eq!(ProviderUrl::parse(encoded).unwrap(), want, "{encoded}");
        }
    }

    #[test]
    fn reads_weight_timestamp_warmup_and_state() {
        let u = ProviderUrl::parse(
            "dubbo://admin:pw@10.0.0.1:20880/com.acme.Greeter?anyhost=true&weight=200&timestamp=1700000000000&warmup=60000&enabled=false&version=1.0",
        )
        .unwrap();
        let s = u.to_spec().unwrap();
        assert_eq!(s.address, "10.0.0.1:20880");
        assert_eq!(s.weight, 0, "enabled=false drains the provider");
        assert_eq!(
            s.registered_at,
            Some(Timestamp::from_millis(1_700_000_000_000))
        );
        assert_eq!(s.warmup, Some(Duration::from_secs(60)));
        assert!(s.healthy);
        assert_eq!(s.metadata["version"], "1.0");
        let on = ProviderUrl::parse("dubbo://10.0.0.1:20880/x?weight=200").unwrap();
        assert_eq!(on.to_spec().unwrap().weight, 200);
        assert_eq!(s.metadata["interface"], "com.acme.Greeter");
    }

    #[test]
    fn encoded_and_plain_agree() {
        let plain = "dubbo://10.0.0.1:20880/com.acme.Greeter?weight=5&side=provider";
        let encoded =
            percent_encoding::utf8_percent_encode(plain, percent_encoding::NON_ALPHANUMERIC)
                .to_string();
        assert_eq!(
            ProviderUrl::parse(plain).unwrap(),
            ProviderUrl::parse(&encoded).unwrap()
        );
    }

    #[test]
    fn malformed() {
        for (bad, why) in [
            ("10.0.0.1:20880/x", "no protocol"),
            ("dubbo://10.0.0.1/x", "no port"),
            ("dubbo://:20880/x", "no valid host"),
            ("dub bo://a:1/x", "invalid protocol"),
            ("dubbo://a:1/x?=3", "has no name"),
            ("dubbo%3A%2F%2F%FF", "UTF-8"),
        ] {
            let e = ProviderUrl::parse(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
        let e = ProviderUrl::parse("dubbo://a:1/x?weight=-5")
            .unwrap()
            .to_spec()
            .unwrap_err();
        assert!(e.to_string().contains("weight=\"-5\""), "{e}");
    }
}
