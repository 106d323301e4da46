//! The registry cache (Dubbo's `dubbo-registry-*.cache`): the last known provider set of one
//! service, saved so a consumer that starts while the registry (ZooKeeper, an xDS control
//! plane) is down still has endpoints.
//!
//! **Format**: a JSON endpoints file (an array of `{address, weight, zone, registered_at_ms,
//! warmup_ms, healthy, metadata}` objects — see [`file`](crate::file)), so
//! `lbkit pick --endpoints-file CACHE.json` reads it too. **One file per service**: the path
//! is the consumer's option (`ZkSource::with_cache`, `XdsSource::with_cache`,
//! `lbkit watch --cache FILE`). **Atomic**: written to a temporary file in the same directory,
//! flushed, then renamed over the old one, so a crash never leaves half a file.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lbkit_core::{EndpointSpec, Timestamp};
use serde::Serialize;
use tokio::sync::watch;

use crate::error::DiscoveryError;
use crate::file::{parse, Format};

#[derive(Serialize)]
struct Entry<'a> {
    address: &'a str,
    weight: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    zone: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    registered_at_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    warmup_ms: Option<u64>,
    #[serde(skip_serializing_if = "is_true")]
    healthy: bool,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    metadata: &'a BTreeMap<String, String>,
}

fn is_true(b: &bool) -> bool {
    *b
}

fn cache_err(path: &Path, reason: impl Into<String>) -> DiscoveryError {
    DiscoveryError::Cache {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Save `specs` to `path` atomically (temporary file + rename). Save non-empty sets only:
/// endpoints files (and so [`read_cache`]) reject an empty list.
///
/// # Errors
/// [`DiscoveryError::Cache`] when the file cannot be written.
pub fn write_cache(path: &Path, specs: &[EndpointSpec]) -> Result<(), DiscoveryError> {
    let entries: Vec<Entry<'_>> = specs
        .iter()
        .map(|s| Entry {
            address: &s.address,
            weight: s.weight,
            zone: s.zone.as_deref(),
            registered_at_ms: s.registered_at.map(Timestamp::as_millis),
            warmup_ms: s
                .warmup
                .map(|w| u64::try_from(w.as_millis()).unwrap_or(u64::MAX)),
            healthy: s.healthy,
            metadata: &s.metadata,
        })
        .collect();
    let json = serde_json::to_vec_pretty(&entries).map_err(|e| cache_err(path, e.to_string()))?;
    let tmp = temp_path(path);
    let write = || -> std::io::Result<()> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&json)?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        cache_err(path, format!("cannot write: {e}"))
    })
}

/// Read a cache file. `Ok(None)` when there is none.
///
/// # Errors
/// [`DiscoveryError::Cache`] when it exists but cannot be read or parsed.
pub fn read_cache(path: &Path) -> Result<Option<Vec<EndpointSpec>>, DiscoveryError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(cache_err(path, format!("cannot read: {e}"))),
    };
    let origin = path.display().to_string();
    let entries = parse(&text, Format::Json, &origin, Timestamp::ZERO)
        .map_err(|e| cache_err(path, e.to_string()))?;
    Ok(Some(entries.into_iter().map(|e| e.spec).collect()))
}

/// What one write of the cache came to: the endpoints written, or why not.
#[cfg_attr(not(any(feature = "zookeeper", feature = "xds")), allow(dead_code))] // their sources write it
pub(crate) type Written = Result<usize, DiscoveryError>;

/// A task that writes every set sent to the returned sender (the latest one, when sets come
/// faster than writes), off the async threads; `written` hears how each write went. The first
/// failure is logged, later ones only reported to `written`, until a write succeeds again.
#[cfg_attr(not(any(feature = "zookeeper", feature = "xds")), allow(dead_code))] // their sources write it
pub(crate) fn spawn_writer(
    path: PathBuf,
    written: impl Fn(Written) + Send + 'static,
) -> watch::Sender<Arc<Vec<EndpointSpec>>> {
    let (tx, mut rx) = watch::channel(Arc::new(Vec::new()));
    tokio::spawn(async move {
        let mut failing = false;
        while rx.changed().await.is_ok() {
            let specs = rx.borrow_and_update().clone();
            let n = specs.len();
            let p = path.clone();
            let result = tokio::task::spawn_blocking(move || write_cache(&p, &specs))
                .await
                .unwrap_or_else(|e| Err(cache_err(&path, format!("writer task failed: {e}"))));
            match &result {
                Ok(()) if std::mem::take(&mut failing) => {
                    tracing::info!(path = %path.display(), "registry cache written again");
                }
                Err(e) if !std::mem::replace(&mut failing, true) => {
                    tracing::error!(
                        error = %e,
                        "registry cache not written; serving goes on from memory, \
                         later failures are counted (cache_failures), not logged"
                    );
                }
                _ => {}
            }
            written(result.map(|()| n));
        }
    });
    tx
}

fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map_or_else(|| "cache".into(), |n| n.to_string_lossy().into_owned());
    path.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn round_trips_and_replaces_atomically() {
        let tmp = tempfile::Builder::new()
            .prefix("lbkit-cache-")
            .tempdir()
            .unwrap();
        // A directory that does not exist yet: writing the cache creates it.
        let dir = tmp.path().join("cache");
        let path = dir.join("svc.cache.json");
        assert_eq!(read_cache(&path).unwrap(), None);
        let specs = vec![
            EndpointSpec::new("10.0.0.1:20880")
                .with_weight(200)
                .with_zone("eu-1")
                .with_registered_at(Timestamp::from_millis(1_700_000_000_000))
                .with_warmup(Duration::from_secs(60))
                .with_meta("version", "1.0"),
            EndpointSpec::new("10.0.0.2:20880").with_weight(0),
        ];
        write_cache(&path, &specs).unwrap();
        assert_eq!(read_cache(&path).unwrap(), Some(specs.clone()));
        write_cache(&path, &specs[1..]).unwrap();
        assert_eq!(read_cache(&path).unwrap(), Some(specs[1..].to_vec()));
        let leftovers = std::fs::read_dir(&dir).unwrap().count();
        assert_eq!(leftovers, 1, "no temporary file left behind");
        std::fs::write(&path, "{ not json").unwrap();
        let e = read_cache(&path).unwrap_err().to_string();
        assert!(
            e.starts_with("registry cache ") && e.contains("svc.cache.json"),
            "{e}"
        );
    }
}
