//! Endpoint files, the formats `lbkit pick --endpoints-file` and the file source read.
//!
//! The format follows the extension:
//! * `.toml`: an array of tables `[[endpoint]]`;
//! * `.json`: an array of objects;
//! * `.txt`: Dubbo provider URLs, one per line, plain or URL-encoded as ZooKeeper stores them;
//!   blank lines and lines starting with `#` are skipped.
//!
//! TOML and JSON entries take these fields (unknown fields are errors):
//!
//! | field | type | default | meaning |
//! |---|---|---|---|
//! | `address` | string | required | `host:port` |
//! | `weight` | integer | 100 | configured weight, 0 = no traffic |
//! | `zone` | string | none | zone of the endpoint |
//! | `registered_at_ms` | integer | none | registration time, Unix epoch ms (enables warm-up) |
//! | `warmup_ms` | integer | 600000 with `registered_at_ms` | warm-up window, ms |
//! | `healthy` | bool | true | `false` = marked down |
//! | `priority` | integer | 0 | priority tier, 0 the highest: traffic spills to a lower tier as the ones above lose health (Envoy's priority levels) |
//! | `backup` | bool | false | `true` = priority 1 (nginx's and HAProxy's `backup`); not with `priority` |
//! | `metadata` | table of strings | empty | free-form tags |
//! | `in_flight` | integer | 0 | observed calls in flight |
//! | `avg_response_ms` | number | none | observed average successful response time, ms |
//! | `ewma_ms` | number | none | observed peak-EWMA latency, ms |
//! | `successes` | integer | 0 | observed successful calls |
//! | `failures` | integer | 0 | observed failed calls |
//! | `consecutive_failures` | integer | 0 | observed failures since the last success |
//! | `last_failure_ms` | integer | now, when failures are given | time of the last failure, epoch ms |
//! | `utilization` | number | none | server-reported utilisation (ORCA), usually 0..1 |
//! | `qps` | number | none | server-reported queries per second |
//! | `eps` | number | none | server-reported errors per second |
//! | `load_since_ms` | integer | an hour before now | since when load reports have flowed, epoch ms |
//!
//! The observed statistics let load-aware strategies be tried offline.
//!
//! With feature `runtime`, `FileSource` watches such a file and reloads it when it changes (a
//! broken file keeps the previous set and is reported).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use lbkit_core::{EndpointSpec, StatsSeed, Timestamp};
use serde::Deserialize;

use crate::address::check_address;
use crate::dubbo::ProviderUrl;
use crate::error::SourceError;

#[cfg(feature = "runtime")]
mod dirs;
#[cfg(feature = "runtime")]
mod watch;
#[cfg(feature = "runtime")]
pub use dirs::{subscribe, Change, Subscription};
#[cfg(feature = "runtime")]
pub use watch::{FileSource, FileStatus, WatchedPath, DEFAULT_DEBOUNCE};

/// One endpoint read from a file, with the statistics observed for it.
#[derive(Debug, Clone, PartialEq)]
pub struct FileEndpoint {
    /// The endpoint.
    pub spec: EndpointSpec,
    /// Observed statistics (all zero when the file gives none).
    pub observed: StatsSeed,
}

/// The formats of endpoint files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `[[endpoint]]` tables.
    Toml,
    /// An array of objects.
    Json,
    /// Dubbo provider URLs, one per line.
    DubboUrls,
}

// === impl Format ===

impl Format {
    /// The format of `path`, by extension.
    ///
    /// # Errors
    /// An extension other than `.toml`, `.json` or `.txt`.
    pub fn from_path(path: &Path) -> Result<Format, SourceError> {
        match path.extension().and_then(|e| e.to_str()) {
            Some("toml") => Ok(Format::Toml),
            Some("json") => Ok(Format::Json),
            Some("txt") => Ok(Format::DubboUrls),
            _ => Err(SourceError::new(
                path.display().to_string(),
                None,
                "unknown endpoints file type (expected .toml, .json or .txt)",
            )),
        }
    }
}

/// Read and parse an endpoints file. `now` stands in for a missing `last_failure_ms`.
///
/// # Errors
/// An unreadable file, or any malformed entry (the error names the file, the line where known,
/// and the field).
pub fn load(path: &Path, now: Timestamp) -> Result<Vec<FileEndpoint>, SourceError> {
    let origin = path.display().to_string();
    let format = Format::from_path(path)?;
    let text = std::fs::read_to_string(path)
        .map_err(|e| SourceError::new(origin.clone(), None, format!("cannot read: {e}")))?;
    parse(&text, format, &origin, now)
}

/// Parse endpoints from `text` in `format`; `origin` names the input in errors.
///
/// # Errors
/// Any malformed entry; an empty list; a duplicate address.
pub fn parse(
    text: &str,
    format: Format,
    origin: &str,
    now: Timestamp,
) -> Result<Vec<FileEndpoint>, SourceError> {
    let (entries, lines): (Vec<FileEndpoint>, Vec<Option<usize>>) = match format {
        Format::Toml => {
            let doc: TomlDoc = toml::from_str(text).map_err(|e| toml_error(origin, text, &e))?;
            let n = doc.endpoint.len();
            (convert(doc.endpoint, origin, now)?, vec![None; n])
        }
        Format::Json => {
            let list: Vec<Entry> = serde_json::from_str(text)
                .map_err(|e| SourceError::new(origin, Some(e.line()), json_reason(&e)))?;
            let n = list.len();
            (convert(list, origin, now)?, vec![None; n])
        }
        Format::DubboUrls => dubbo_lines(text, origin)?.into_iter().unzip(),
    };
    if entries.is_empty() {
        return Err(SourceError::new(origin, None, "no endpoints in the file"));
    }
    check_unique(&entries, &lines, origin)?;
    Ok(entries)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TomlDoc {
    #[serde(default)]
    endpoint: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    address: String,
    weight: Option<u32>,
    zone: Option<String>,
    registered_at_ms: Option<u64>,
    warmup_ms: Option<u64>,
    healthy: Option<bool>,
    priority: Option<u32>,
    backup: Option<bool>,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
    #[serde(default)]
    in_flight: u32,
    avg_response_ms: Option<f64>,
    ewma_ms: Option<f64>,
    #[serde(default)]
    successes: u64,
    #[serde(default)]
    failures: u64,
    #[serde(default)]
    consecutive_failures: u32,
    last_failure_ms: Option<u64>,
    utilization: Option<f64>,
    qps: Option<f64>,
    eps: Option<f64>,
    load_since_ms: Option<u64>,
}

fn convert(
    list: Vec<Entry>,
    origin: &str,
    now: Timestamp,
) -> Result<Vec<FileEndpoint>, SourceError> {
    list.into_iter()
        .enumerate()
        .map(|(i, e)| {
            entry(e, now).map_err(|reason| {
                SourceError::new(origin, None, format!("endpoint #{}: {reason}", i + 1))
            })
        })
        .collect()
}

fn entry(e: Entry, now: Timestamp) -> Result<FileEndpoint, String> {
    check_address(&e.address)?;
    let load = load_report(&e, now)?;
    let ms = |field: &str, v: Option<f64>| -> Result<Option<Duration>, String> {
        v.map(|ms| {
            if (0.0..1e12).contains(&ms) {
                Ok(Duration::from_secs_f64(ms / 1e3))
            } else {
                Err(format!(
                    "{field} = {ms} is not a duration in ms (expected 0 or more)"
                ))
            }
        })
        .transpose()
    };
    let mut spec = EndpointSpec::new(e.address);
    spec.weight = e.weight.unwrap_or(spec.weight);
    spec.zone = e.zone;
    spec.metadata = e.metadata.into();
    spec.registered_at = e.registered_at_ms.map(Timestamp::from_millis);
    spec.warmup = e.warmup_ms.map(Duration::from_millis);
    spec.healthy = e.healthy.unwrap_or(true);
    spec.priority = match (e.priority, e.backup) {
        (Some(_), Some(_)) => {
            return Err("give priority or backup, not both (backup = true is priority 1)".into())
        }
        (Some(p), None) => p,
        (None, b) => u32::from(b.unwrap_or(false)),
    };
    let observed = StatsSeed {
        in_flight: e.in_flight,
        avg_response: ms("avg_response_ms", e.avg_response_ms)?,
        ewma: ms("ewma_ms", e.ewma_ms)?,
        successes: e.successes,
        failures: e.failures,
        consecutive_failures: e.consecutive_failures,
        last_failure_at: e
            .last_failure_ms
            .map(Timestamp::from_millis)
            .or_else(|| (e.failures > 0 || e.consecutive_failures > 0).then_some(now)),
        load,
    };
    Ok(FileEndpoint { spec, observed })
}

/// A load report from `utilization`, `qps` and `eps`; reports are taken to have flowed for an
/// hour unless `load_since_ms` says otherwise, so blackout periods do not hide them.
fn load_report(e: &Entry, now: Timestamp) -> Result<Option<(f64, f64, f64, Timestamp)>, String> {
    if e.utilization.is_none() && e.qps.is_none() && e.eps.is_none() {
        return Ok(None);
    }
    let check = |field: &str, v: Option<f64>| match v {
        None => Ok(0.0),
        Some(v) if v.is_finite() && v >= 0.0 => Ok(v),
        Some(v) => Err(format!(
            "{field} = {v} is invalid (expected a number, 0 or more)"
        )),
    };
    let since = e
        .load_since_ms
        .map_or(now - Duration::from_secs(3600), Timestamp::from_millis);
    Ok(Some((
        check("utilization", e.utilization)?,
        check("qps", e.qps)?,
        check("eps", e.eps)?,
        since,
    )))
}

fn dubbo_lines(
    text: &str,
    origin: &str,
) -> Result<Vec<(FileEndpoint, Option<usize>)>, SourceError> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .map(|(i, line)| {
            let at =
                |e: crate::error::UrlError| SourceError::new(origin, Some(i + 1), e.to_string());
            let spec = ProviderUrl::parse(line)
                .and_then(|u| u.to_spec())
                .map_err(at)?;
            Ok((
                FileEndpoint {
                    spec,
                    observed: StatsSeed::default(),
                },
                Some(i + 1),
            ))
        })
        .collect()
}

fn check_unique(
    entries: &[FileEndpoint],
    lines: &[Option<usize>],
    origin: &str,
) -> Result<(), SourceError> {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, e) in entries.iter().enumerate() {
        if let Some(&first) = seen.get(e.spec.address.as_str()) {
            let (what, line) = match lines[i] {
                Some(l) => (format!("line {}", lines[first].unwrap_or(0)), Some(l)),
                None => (format!("endpoint #{}", first + 1), None),
            };
            return Err(SourceError::new(
                origin,
                line,
                format!(
                    "duplicate address {} (first given at {what})",
                    e.spec.address
                ),
            ));
        }
        seen.insert(&e.spec.address, i);
    }
    Ok(())
}

fn toml_error(origin: &str, text: &str, e: &toml::de::Error) -> SourceError {
    let line = e
        .span()
        .map(|s| text[..s.start.min(text.len())].lines().count().max(1));
    SourceError::new(origin, line, e.message().to_owned())
}

fn json_reason(e: &serde_json::Error) -> String {
    // serde_json appends " at line L column C"; the line is already in the prefix.
    let msg = e.to_string();
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_owned(),
        None => msg,
    }
}

#[cfg(test)]
mod tests;
