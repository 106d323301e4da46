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
