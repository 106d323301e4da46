//! Errors of the proxy library.

use std::fmt;
use std::path::{Path, PathBuf};

/// A configuration problem: the file, the field (`service.api.strategy`, `line 7`) and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    path: PathBuf,
    field: String,
    reason: String,
}

// === impl ConfigError ===

impl ConfigError {
    /// A problem with `field` of the file at `path`.
    pub fn new(path: &Path, field: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError {
            path: path.to_path_buf(),
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The field (or `line N` for syntax errors, `-` when unknown).
    pub fn field(&self) -> &str {
        &self.field
    }

    /// What is wrong.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let reason = self
            .reason
            .lines()
            .map(str::trim)
            .collect::<Vec<_>>()
            .join(" ");
        write!(f, "{}: {}: {}", self.path.display(), self.field, reason)
    }
}

impl std::error::Error for ConfigError {}

/// Why the proxy could not start or reload.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A listener could not bind.
    #[error("cannot bind {addr}")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// An endpoint source could not start.
    #[error("service {service}: cannot start its endpoint source")]
    Source {
        /// The service.
        service: String,
        /// The cause.
        #[source]
        source: lbkit_discovery::DiscoveryError,
    },
}
