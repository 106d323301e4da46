//! Errors of endpoint sources. Display names the subject (file and line, URL, field).

use std::fmt;

/// Endpoint input that cannot be used, with where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceError {
    origin: String,
    line: Option<usize>,
    reason: String,
}

// === impl SourceError ===

impl SourceError {
    /// An error about `origin` (a file path, or a description such as `--endpoints`).
    pub fn new(origin: impl Into<String>, line: Option<usize>, reason: impl Into<String>) -> Self {
        SourceError {
            origin: origin.into(),
            line,
            reason: reason.into(),
        }
    }

    /// Where the input came from.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The 1-based line, when known.
    pub fn line(&self) -> Option<usize> {
        self.line
    }

    /// What is wrong.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{}: {}", self.origin, line, self.reason),
            None => write!(f, "{}: {}", self.origin, self.reason),
        }
    }
}

impl std::error::Error for SourceError {}

/// A provider URL that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed provider URL {url:?}: {reason}")]
pub struct UrlError {
    /// The URL text (decoded).
    pub url: String,
    /// What is wrong.
    pub reason: String,
}

/// Why a discovery source could not deliver an update. The controller keeps the last good
/// snapshot published whenever a source reports one of these.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DiscoveryError {
    /// An endpoints file that cannot be read or parsed (names the file and line).
    #[error(transparent)]
    File(#[from] SourceError),
    /// A file or directory that cannot be watched for changes.
    #[error("cannot watch {}: {reason}", path.display())]
    Watch {
        /// The watched path.
        path: std::path::PathBuf,
        /// What the file watcher reported.
        reason: String,
    },
    /// A configuration value that cannot be used.
    #[error("invalid {field}: {reason}")]
    Config {
        /// The option or field.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A user-written source failed (the tower `Pool` wraps its stream's errors in this).
    #[error("endpoint source failed")]
    Source(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
    /// The registry cache file cannot be read or written.
    #[error("registry cache {}: {reason}", path.display())]
    Cache {
        /// The cache file.
        path: std::path::PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// An xDS control plane that cannot be reached, or whose stream failed.
    #[cfg(feature = "xds")]
    #[error("xds {server}: {reason}")]
    Xds {
        /// The control plane's address.
        server: String,
        /// What went wrong.
        reason: String,
    },
    /// Resources an xDS control plane sent that lbkit rejected (NACKed); the last good set
    /// stays.
    #[cfg(feature = "xds")]
    #[error("xds {server}: rejected {kind}: {reason}")]
    Rejected {
        /// The control plane's address.
        server: String,
        /// `clusters` or `endpoints`.
        kind: &'static str,
        /// The `error_detail` sent back.
        reason: String,
    },
    /// No ZooKeeper session could be established in time.
    #[cfg(feature = "zookeeper")]
    #[error("zookeeper {servers} unreachable")]
    Unreachable {
        /// The connection string.
        servers: String,
        /// The client's error (`Timeout` when our own bound ran out).
        #[source]
        source: zookeeper_client::Error,
    },
    /// A ZooKeeper operation on `path` failed.
    #[cfg(feature = "zookeeper")]
    #[error("zookeeper {path}")]
    Registry {
        /// The znode path.
        path: String,
        /// The client's error.
        #[source]
        source: zookeeper_client::Error,
    },
}
