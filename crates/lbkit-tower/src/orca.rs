//! Load reports on the wire: ORCA's `endpoint-load-metrics` response header or trailer, read
//! into an endpoint's statistics ([`EndpointStats::report_load`]), where the `adaptive`
//! strategy weighs it. The one reader for the tower layer (HTTP and gRPC) and both engines of
//! `lbkit proxy`.
//!
//! What a server may send, as Envoy reads it (`source/common/orca/orca_parser.cc`) and gRPC's
//! servers write it:
//!
//! | header | value |
//! |---|---|
//! | `endpoint-load-metrics` | `TEXT cpu_utilization=0.3, rps_fractional=120, eps=2` (`:` works for `=`) |
//! | `endpoint-load-metrics` | `JSON {"cpu_utilization": 0.3, "rps_fractional": 120}` (proto3 JSON: `cpuUtilization` too) |
//! | `endpoint-load-metrics` | `BIN ` and a base64 `xds.data.orca.v3.OrcaLoadReport` |
//! | `endpoint-load-metrics-bin` | a base64 `OrcaLoadReport` (gRPC's binary metadata; padding optional, as grpc-go omits it) |
//!
//! When both headers are present the binary one wins (Envoy's order). Metrics named
//! `named_metrics.*`, `utilization.*` and `request_cost.*` are accepted and not used. A report
//! with an unknown metric, a duplicate, a value that is not a finite non-negative number, or
//! bytes that do not decode is rejected whole: nothing is recorded, the call is unaffected.
//!
//! What is recorded: utilisation is `application_utilization` when it is above zero, else
//! `cpu_utilization` (gRPC's weighted round robin, gRFC A58); queries per second are
//! `rps_fractional`, else the deprecated integer `rps`; errors per second are `eps`.
//!
//! ```
//! use lbkit_tower::orca::{parse_header, parse_bin};
//! let r = parse_header(b"TEXT cpu_utilization=0.9, rps_fractional=100").unwrap();
//! assert_eq!((r.utilization(), r.qps()), (0.9, 100.0));
//! // grpc-go's binary header: cpu 0.5, rps_fractional 100, eps 2, a named metric.
//! let r = parse_bin(b"CQAAAAAAAOA/MQAAAAAAAFlAOQAAAAAAAABAQg4KA3JpZhEAAAAAAAAQQA").unwrap();
//! assert_eq!((r.utilization(), r.qps(), r.eps), (0.5, 100.0, 2.0));
//! ```

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;
use http::HeaderMap;
use lbkit_core::{Clock, EndpointStats, Timestamp};

/// The header (or trailer) with a report in one of three encodings.
pub const HEADER: &str = "endpoint-load-metrics";
/// gRPC's binary header: a base64 `OrcaLoadReport`.
pub const HEADER_BIN: &str = "endpoint-load-metrics-bin";

/// Most named, utilisation and cost metrics a TEXT report may carry (they are checked for
/// duplicates, and not used): a peer cannot make the check quadratic.
const MAX_MAP_METRICS: usize = 64;

/// Base64 with or without padding (grpc-go sends none).
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_encode_padding(true)
        .with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// The fields of ORCA's `OrcaLoadReport` that lbkit reads (tags as in
/// `xds/data/orca/v3/orca_load_report.proto`; its maps, tags 4, 5 and 8, are skipped).
#[derive(Clone, Copy, PartialEq, prost::Message)]
struct WireReport {
    #[prost(double, tag = "1")]
    cpu_utilization: f64,
    #[prost(double, tag = "2")]
    mem_utilization: f64,
    #[prost(uint64, tag = "3")]
    rps: u64,
    #[prost(double, tag = "6")]
    rps_fractional: f64,
    #[prost(double, tag = "7")]
    eps: f64,
    #[prost(double, tag = "9")]
    application_utilization: f64,
}

/// A server's load report, as far as lbkit uses it. Zero is "not reported", as in the proto.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OrcaReport {
    /// `cpu_utilization`.
    pub cpu_utilization: f64,
    /// `mem_utilization` (shown, not weighed).
    pub mem_utilization: f64,
    /// `application_utilization`.
    pub application_utilization: f64,
    /// `rps_fractional`, or the deprecated `rps` when that is all there is.
    pub rps_fractional: f64,
    /// `eps`: errors per second.
    pub eps: f64,
}

/// Why a report was not used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OrcaError {
    /// The `endpoint-load-metrics` value starts with none of `TEXT `, `JSON `, `BIN `.
    #[error("unsupported ORCA header format: {0}")]
    Format(String),
    /// A metric lbkit does not know.
    #[error("unsupported metric name: {0}")]
    Unknown(String),
    /// The same metric twice.
    #[error("{HEADER} contains duplicate metric: {0}")]
    Duplicate(String),
    /// A metric whose value is missing, not a number, not finite or negative.
    #[error("bad value of metric {0}: {1}")]
    Value(String, String),
    /// Not base64, or not an `OrcaLoadReport`.
    #[error("unable to decode an ORCA binary report: {0}")]
    Binary(String),
    /// Not a JSON object of the report's fields.
    #[error("invalid JSON ORCA report: {0}")]
    Json(String),
}

// === impl OrcaReport ===

impl OrcaReport {
    /// The utilisation that weighs: `application_utilization` above zero, else
    /// `cpu_utilization`.
    pub fn utilization(&self) -> f64 {
        if self.application_utilization > 0.0 {
            self.application_utilization
        } else {
            self.cpu_utilization
        }
    }

    /// Queries per second.
    pub fn qps(&self) -> f64 {
        self.rps_fractional
    }

    /// Record this report as `stats`' last, received at `now`.
    pub fn record(&self, stats: &EndpointStats, now: Timestamp) {
        stats.report_load(now, self.utilization(), self.qps(), self.eps);
    }

    /// Set metric `name` (a TEXT or JSON name) to `value`, once.
    fn set(&mut self, name: &str, value: f64, seen: &mut u8) -> Result<(), OrcaError> {
        let (slot, bit) = match name {
            "cpu_utilization" | "cpuUtilization" => (&mut self.cpu_utilization, 1),
            "mem_utilization" | "memUtilization" => (&mut self.mem_utilization, 2),
            "application_utilization" | "applicationUtilization" => {
                (&mut self.application_utilization, 4)
            }
            "rps_fractional" | "rpsFractional" => (&mut self.rps_fractional, 8),
            "eps" => (&mut self.eps, 16),
            _ => return Err(OrcaError::Unknown(name.to_owned())),
        };
        if *seen & bit != 0 {
            return Err(OrcaError::Duplicate(name.to_owned()));
        }
        *seen |= bit;
        *slot = checked(name, value)?;
        Ok(())
    }
}

/// `value` when it is a finite, non-negative number.
fn checked(name: &str, value: f64) -> Result<f64, OrcaError> {
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(OrcaError::Value(name.to_owned(), value.to_string()))
    }
}

/// A metric in one of ORCA's maps (named metrics, utilisation, request cost): used by nobody
/// here, but its key must not be empty.
fn map_metric(name: &str) -> Option<Result<(), OrcaError>> {
    let key = ["named_metrics.", "utilization.", "request_cost."]
        .iter()
        .find_map(|p| name.strip_prefix(p))?;
    Some(if key.is_empty() {
        Err(OrcaError::Unknown(name.to_owned()))
    } else {
        Ok(())
    })
}

/// Parse an `endpoint-load-metrics` value (`TEXT `, `JSON ` or `BIN ` and the report).
///
/// # Errors
/// Why the report is not used; see [`OrcaError`].
pub fn parse_header(value: &[u8]) -> Result<OrcaReport, OrcaError> {
    if let Some(rest) = value.strip_prefix(b"TEXT ") {
        parse_text(rest)
    } else if let Some(rest) = value.strip_prefix(b"JSON ") {
        parse_json(rest)
    } else if let Some(rest) = value.strip_prefix(b"BIN ") {
        parse_bin(rest)
    } else {
        let head = &value[..value.len().min(5)];
        let head = head.split(|b| *b == b' ').next().unwrap_or_default();
        Err(OrcaError::Format(
            String::from_utf8_lossy(head).into_owned(),
        ))
    }
}

/// Parse a base64 `OrcaLoadReport` (`endpoint-load-metrics-bin`, or after `BIN `).
///
/// # Errors
/// [`OrcaError::Binary`] when it is not base64 or not the message; [`OrcaError::Value`] for a
/// negative or non-finite number in it.
pub fn parse_bin(value: &[u8]) -> Result<OrcaReport, OrcaError> {
    let bytes = BASE64
        .decode(value.trim_ascii())
        .map_err(|e| OrcaError::Binary(e.to_string()))?;
    if bytes.is_empty() {
        return Err(OrcaError::Binary("empty".into()));
    }
    let wire = <WireReport as prost::Message>::decode(&bytes[..])
        .map_err(|e| OrcaError::Binary(e.to_string()))?;
    OrcaReport::from_wire(wire)
}

impl OrcaReport {
    /// A decoded `OrcaLoadReport`, checked: every number finite and non-negative.
    fn from_wire(wire: WireReport) -> Result<OrcaReport, OrcaError> {
        let rps = if wire.rps_fractional > 0.0 {
            wire.rps_fractional
        } else {
            wire.rps as f64
        };
        Ok(OrcaReport {
            cpu_utilization: checked("cpu_utilization", wire.cpu_utilization)?,
            mem_utilization: checked("mem_utilization", wire.mem_utilization)?,
            application_utilization: checked(
                "application_utilization",
                wire.application_utilization,
            )?,
            rps_fractional: checked("rps_fractional", rps)?,
            eps: checked("eps", wire.eps)?,
        })
    }
}

/// `name=value` (or `name:value`) pairs separated by commas.
fn parse_text(text: &[u8]) -> Result<OrcaReport, OrcaError> {
    let text = std::str::from_utf8(text).map_err(|_| OrcaError::Format("TEXT".into()))?;
    let (mut report, mut seen) = (OrcaReport::default(), 0u8);
    let mut maps: Vec<&str> = Vec::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, value) = pair
            .split_once(['=', ':'])
            .map_or((pair, ""), |(n, v)| (n.trim(), v.trim()));
        if value.is_empty() {
            return Err(OrcaError::Value(name.to_owned(), String::new()));
        }
        let number: f64 = value
            .parse()
            .map_err(|_| OrcaError::Value(name.to_owned(), value.to_owned()))?;
        if let Some(ok) = map_metric(name) {
            ok?;
            checked(name, number)?;
            if maps.contains(&name) {
                return Err(OrcaError::Duplicate(name.to_owned()));
            }
            if maps.len() >= MAX_MAP_METRICS {
                return Err(OrcaError::Unknown(format!(
                    "{name} (more than {MAX_MAP_METRICS} map metrics)"
                )));
            }
            maps.push(name);
            continue;
        }
        report.set(name, number, &mut seen)?;
    }
    Ok(report)
}

/// A JSON object of the report's fields (proto3 JSON: snake or lower camel case names).
fn parse_json(text: &[u8]) -> Result<OrcaReport, OrcaError> {
    let value: serde_json::Value =
        serde_json::from_slice(text).map_err(|e| OrcaError::Json(e.to_string()))?;
    let object = value
        .as_object()
        .ok_or_else(|| OrcaError::Json("not an object".into()))?;
    let (mut report, mut seen) = (OrcaReport::default(), 0u8);
    for (name, value) in object {
        match name.as_str() {
            "named_metrics" | "namedMetrics" | "utilization" | "request_cost" | "requestCost" => {
                json_map(name, value)?;
            }
            "rps" => {
                let n = json_number(name, value)?;
                if report.rps_fractional == 0.0 {
                    report.rps_fractional = n;
                }
            }
            _ => report.set(name, json_number(name, value)?, &mut seen)?,
        }
    }
    Ok(report)
}

/// A JSON number (or a decimal string, as proto3 JSON writes 64-bit integers).
fn json_number(name: &str, value: &serde_json::Value) -> Result<f64, OrcaError> {
    let n = match value {
        serde_json::Value::Number(n) => n.as_f64(),
        serde_json::Value::String(s) if name == "rps" => s.parse().ok(),
        _ => None,
    };
    let n = n.ok_or_else(|| OrcaError::Json(format!("{name}: not a number: {value}")))?;
    checked(name, n)
}

/// One of the report's maps: an object of numbers.
fn json_map(name: &str, value: &serde_json::Value) -> Result<(), OrcaError> {
    let object = value
        .as_object()
        .ok_or_else(|| OrcaError::Json(format!("{name}: not an object")))?;
    for (key, v) in object {
        json_number(&format!("{name}.{key}"), v)?;
    }
    Ok(())
}

/// The report in `headers` (a response's head or its trailers), if any: the binary header
/// first, then `endpoint-load-metrics`.
pub fn from_headers(headers: &HeaderMap) -> Option<Result<OrcaReport, OrcaError>> {
    static BIN: http::HeaderName = http::HeaderName::from_static(HEADER_BIN);
    static TEXT: http::HeaderName = http::HeaderName::from_static(HEADER);
    if let Some(v) = headers.get(&BIN) {
        return Some(parse_bin(v.as_bytes()));
    }
    headers.get(&TEXT).map(|v| parse_header(v.as_bytes()))
}

/// Record the report in `headers` (an answer's head or trailers), if there is a usable one, as
/// `stats`' last, at the time `clock` says (read only when there is a report): the rule every
/// HTTP driver follows. A rejected report is logged at debug level and dropped; the last good
/// one stays.
pub fn record(headers: &HeaderMap, stats: &EndpointStats, clock: &Clock) {
    if let Some(parsed) = from_headers(headers) {
        keep(parsed, stats, clock);
    }
}

/// [`record`] for a driver that found the header itself: `value` of
/// `endpoint-load-metrics-bin` when `bin`, else of `endpoint-load-metrics` (the proxy's
/// HTTP/1.1 fast path, which reads heads without `http`'s types).
pub fn record_value(bin: bool, value: &[u8], stats: &EndpointStats, clock: &Clock) {
    let parsed = if bin {
        parse_bin(value)
    } else {
        parse_header(value)
    };
    keep(parsed, stats, clock);
}

fn keep(parsed: Result<OrcaReport, OrcaError>, stats: &EndpointStats, clock: &Clock) {
    match parsed {
        Ok(report) => report.record(stats, clock.now()),
        Err(e) => tracing::debug!(error = %e, "load report rejected"),
    }
}

#[cfg(feature = "tonic")]
pub mod oob;

#[cfg(test)]
mod tests;
