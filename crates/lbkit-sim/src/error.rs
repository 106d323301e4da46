//! Errors of the simulator.

use std::fmt;

/// A scenario or option that cannot be used, or an output that cannot be written.
#[derive(Debug)]
#[non_exhaustive]
pub enum SimError {
    /// Bad input, naming where (scenario file, field, strategy).
    Input {
        /// File, scenario or option.
        origin: String,
        /// What is wrong.
        reason: String,
    },
    /// Writing a report or plot failed.
    Output {
        /// The path.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
}

impl SimError {
    pub(crate) fn input(origin: impl Into<String>, reason: impl Into<String>) -> Self {
        SimError::Input {
            origin: origin.into(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimError::Input { origin, reason } => write!(f, "{origin}: {reason}"),
            SimError::Output { path, source } => write!(f, "cannot write {path}: {source}"),
        }
    }
}

impl std::error::Error for SimError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SimError::Output { source, .. } => Some(source),
            SimError::Input { .. } => None,
        }
    }
}
