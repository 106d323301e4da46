//! Errors at the tower boundary: a [`BoxError`] holding an [`Error`] (or a caller's own error),
//! and [`is_caused_by`] to look through the chain.
//!
//! [`Error`] is an opaque struct with a [`kind`](Error::kind), the [endpoint](Error::endpoint) it
//! concerns, the attempt it happened on, and the underlying error as its
//! [`source`](std::error::Error::source) (hyper's and linkerd's shape). Whether a failed call may
//! be retried on another endpoint is a method ([`Error::reached_server`]), after pingora's
//! `RetryType`/`ErrorSource`.

use std::fmt;
use std::time::Duration;

use lbkit_core::{EndpointKey, FailureKind, PickError};

/// The error type of every tower service (`Box<dyn Error + Send + Sync>`).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// No endpoint could be picked (none known, none eligible).
    NoEndpoint(PickError),
    /// The picked endpoint has no client service yet (it was just added or just removed).
    NoService,
    /// The endpoint's service failed; the source is its error.
    Failed(FailureKind),
    /// The endpoint answered, and the answer was classified as a failure (broadcast, forking).
    FailureResponse(FailureKind),
    /// The endpoint's service returned an error that does not count against the endpoint (a
    /// gRPC `NOT_FOUND` from a typed client); the source is that error.
    Service,
    /// The endpoint did not answer within the per-request timeout.
    Timeout(Duration),
    /// A retry was due but the retry budget was empty; the source is the last failure.
    BudgetExhausted,
    /// The caller's deadline (`RequestPolicy::deadline`) had passed before an attempt could
    /// start: nothing was sent.
    DeadlineExceeded,
    /// The request cannot be copied, so the mode (forking, broadcast) cannot send it twice.
    NotReplayable,
    /// Broadcast: this many of `total` endpoints failed; the source is the first failure.
    Broadcast {
        /// Endpoints that failed.
        failed: u32,
        /// Endpoints called.
        total: u32,
    },
}

/// An lbkit call error. `Display` names the endpoint when there is one.
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    endpoint: Option<EndpointKey>,
    attempt: u32,
    source: Option<BoxError>,
}

// === impl Error ===

impl Error {
    pub(crate) fn new(kind: ErrorKind) -> Self {
        Error {
            kind,
            endpoint: None,
            attempt: 0,
            source: None,
        }
    }

    pub(crate) fn pick(e: PickError) -> Self {
        Error::new(ErrorKind::NoEndpoint(e))
    }

    pub(crate) fn at(mut self, endpoint: &EndpointKey, attempt: u32) -> Self {
        self.endpoint = Some(endpoint.clone());
        self.attempt = attempt;
        self
    }

    pub(crate) fn with_source(mut self, source: BoxError) -> Self {
        self.source = Some(source);
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The endpoint concerned, if any.
    pub fn endpoint(&self) -> Option<&EndpointKey> {
        self.endpoint.as_ref()
    }

    /// The attempt it happened on (0 = the first try).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// How the call failed, as recorded in the endpoint's statistics.
    pub fn failure_kind(&self) -> Option<FailureKind> {
        match self.kind {
            ErrorKind::Failed(k) | ErrorKind::FailureResponse(k) => Some(k),
            ErrorKind::Timeout(_) => Some(FailureKind::Timeout),
            _ => None,
        }
    }

    /// Whether the request reached a server: `Some(false)` when it certainly did not (no
    /// endpoint, no service, connection refused), so it may be sent elsewhere even when it is not
    /// idempotent; `Some(true)` when it did; `None` when unknown (a timeout).
    pub fn reached_server(&self) -> Option<bool> {
        match self.kind {
            ErrorKind::NoEndpoint(_)
            | ErrorKind::NoService
            | ErrorKind::NotReplayable
            | ErrorKind::DeadlineExceeded => Some(false),
            ErrorKind::Failed(FailureKind::Connect) => Some(false),
            ErrorKind::Failed(FailureKind::Timeout) | ErrorKind::Timeout(_) => None,
            _ => Some(true),
        }
    }

    /// Whether the call was given up because the retry budget was empty.
    pub fn is_budget_exhausted(&self) -> bool {
        self.kind == ErrorKind::BudgetExhausted
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(e) = &self.endpoint {
            write!(f, "endpoint {e}: ")?;
        }
        match self.kind {
            ErrorKind::NoEndpoint(p) => write!(f, "no endpoint to call: {p}")?,
            ErrorKind::NoService => f.write_str("no client service for this endpoint")?,
            ErrorKind::Failed(k) => write!(f, "call failed ({})", kind_name(k))?,
            ErrorKind::FailureResponse(k) => {
                write!(f, "answered with a failure ({})", kind_name(k))?;
            }
            ErrorKind::Service => f.write_str("the service returned an error")?,
            ErrorKind::Timeout(d) => write!(f, "no answer within {d:?}")?,
            ErrorKind::BudgetExhausted => f.write_str("retry budget exhausted")?,
            ErrorKind::DeadlineExceeded => f.write_str("the caller's deadline had passed")?,
            ErrorKind::NotReplayable => f.write_str("the request cannot be sent twice")?,
            ErrorKind::Broadcast { failed, total } => {
                write!(f, "broadcast: {failed} of {total} endpoints failed")?;
            }
        }
        if self.attempt > 0 {
            write!(f, " (attempt {})", self.attempt + 1)?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Lowercase name of a failure kind, as used in metrics labels and messages.
pub fn kind_name(kind: FailureKind) -> &'static str {
    kind.name()
}

/// Whether `err` or any error in its [`source`](std::error::Error::source) chain is an `E`
/// (linkerd's `is_caused_by`).
///
/// ```
/// use lbkit_tower::{is_caused_by, BoxError};
/// let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
/// let err: BoxError = Box::new(io);
/// assert!(is_caused_by::<std::io::Error>(&*err));
/// assert!(!is_caused_by::<std::fmt::Error>(&*err));
/// ```
pub fn is_caused_by<E: std::error::Error + 'static>(
    err: &(dyn std::error::Error + 'static),
) -> bool {
    find_cause::<E>(err).is_some()
}

/// The first `E` in the chain that starts at `err`, if any.
pub fn find_cause<'a, E: std::error::Error + 'static>(
    err: &'a (dyn std::error::Error + 'static),
) -> Option<&'a E> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(found) = e.downcast_ref::<E>() {
            return Some(found);
        }
        cur = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_the_endpoint_and_attempt() {
        let key = EndpointKey::from("10.0.0.1:80");
        let e = Error::new(ErrorKind::Failed(FailureKind::Connect)).at(&key, 1);
        assert_eq!(
            e.to_string(),
            "endpoint 10.0.0.1:80: call failed (connect) (attempt 2)"
        );
        assert_eq!(e.reached_server(), Some(false));
        let e = Error::new(ErrorKind::Timeout(Duration::from_millis(5))).at(&key, 0);
        assert_eq!(e.to_string(), "endpoint 10.0.0.1:80: no answer within 5ms");
        assert_eq!(e.reached_server(), None);
        assert_eq!(
            Error::pick(PickError::NoEndpoints).to_string(),
            "no endpoint to call: no endpoints"
        );
    }

    #[test]
    fn causes_are_found_through_the_chain() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e: BoxError =
            Box::new(Error::new(ErrorKind::Failed(FailureKind::Connect)).with_source(Box::new(io)));
        assert!(is_caused_by::<Error>(&*e));
        let io = find_cause::<std::io::Error>(&*e).unwrap();
        assert_eq!(io.kind(), std::io::ErrorKind::ConnectionRefused);
    }
}
