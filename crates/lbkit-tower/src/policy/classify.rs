//! Default classification of errors and gRPC status codes.

use std::io;

use lbkit_core::{FailureKind, Outcome};

use crate::error::Error;

/// The outcome of a call that returned `err`, looking through its `source()` chain:
///
/// * an lbkit [`Error`] keeps its kind;
/// * `std::io::Error` `ConnectionRefused`, `AddrNotAvailable`, `HostUnreachable`,
///   `NetworkUnreachable` and `NotConnected` are [`FailureKind::Connect`] (the request never
///   left: hyper-util's and tonic's connection errors carry one), `TimedOut` is
///   [`FailureKind::Timeout`];
/// * an HTTP/2 stream the server did not process (feature `http`, see
///   [`http2_unprocessed`]) is [`FailureKind::Connect`] too;
/// * tokio's and tower's timeout errors are [`FailureKind::Timeout`];
/// * a `tonic::Status` (feature `tonic`) is a failure classified by [`grpc_code_kind`] when its
///   code is in [`GrpcCodes::DEFAULT`], and otherwise an answer ([`Outcome::Success`] for the
///   endpoint's statistics: NOT_FOUND is not the server's fault), though still an error for the
///   caller;
/// * anything else is a failure of kind [`FailureKind::Other`].
pub fn default_error_outcome(err: &(dyn std::error::Error + 'static)) -> Outcome {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(outcome) = outcome_of(e) {
            return outcome;
        }
        cur = e.source();
    }
    Outcome::Failure(FailureKind::Other)
}

fn outcome_of(e: &(dyn std::error::Error + 'static)) -> Option<Outcome> {
    if let Some(e) = e.downcast_ref::<Error>() {
        return e.failure_kind().map(Outcome::Failure);
    }
    if let Some(e) = e.downcast_ref::<io::Error>() {
        return io_kind(e.kind()).map(Outcome::Failure);
    }
    #[cfg(feature = "http")]
    if http2_unprocessed(e) {
        return Some(Outcome::Failure(FailureKind::Connect));
    }
    if e.is::<tokio::time::error::Elapsed>() || e.is::<tower::timeout::error::Elapsed>() {
        return Some(Outcome::Failure(FailureKind::Timeout));
    }
    #[cfg(feature = "tonic")]
    if let Some(status) = e.downcast_ref::<tonic::Status>() {
        let code = status.code() as i32;
        return Some(
            grpc_code_kind(code, GrpcCodes::DEFAULT).map_or(Outcome::Success, Outcome::Failure),
        );
    }
    None
}

/// Whether `err` is an HTTP/2 stream error (the `h2` crate's, which hyper's and tonic's
/// HTTP/2 errors carry as their source) that says the server did not process the request, so
/// that it may be sent again anywhere whatever its method: the server refused the stream
/// (`REFUSED_STREAM`), or its `GOAWAY` named an earlier last stream, with or without an error
/// code (RFC 9113 §8.7). `h2` gives a `GOAWAY`'s error only to the streams above that last
/// stream and to those opened after the frame; the others end with their answer or, when the
/// connection closes first, a broken pipe (which may have been processed).
///
/// `lbkit proxy`'s HTTP/2 upstreams decide with this function too.
#[cfg(feature = "http")]
pub fn http2_unprocessed(err: &(dyn std::error::Error + 'static)) -> bool {
    err.downcast_ref::<h2::Error>().is_some_and(|e| {
        e.reason() == Some(h2::Reason::REFUSED_STREAM) || (e.is_go_away() && e.is_remote())
    })
}

fn io_kind(kind: io::ErrorKind) -> Option<FailureKind> {
    use io::ErrorKind as K;
    match kind {
        K::ConnectionRefused
        | K::AddrNotAvailable
        | K::HostUnreachable
        | K::NetworkUnreachable
        | K::NotConnected => Some(FailureKind::Connect),
        K::TimedOut => Some(FailureKind::Timeout),
        _ => None,
    }
}

/// A set of gRPC status codes (0–16) that count as endpoint failures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrpcCodes(u32);

// === impl GrpcCodes ===

impl GrpcCodes {
    /// The codes that Envoy maps to HTTP 5xx, and so counts against an endpoint: UNKNOWN (2),
    /// DEADLINE_EXCEEDED (4), UNIMPLEMENTED (12), INTERNAL (13), UNAVAILABLE (14) and
    /// DATA_LOSS (15). Caller errors (INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED, …) are
    /// answers, not failures of the endpoint.
    pub const DEFAULT: GrpcCodes = GrpcCodes::from_codes(&[2, 4, 12, 13, 14, 15]);

    /// The set of `codes` (values outside 0–16 are ignored).
    pub const fn from_codes(codes: &[i32]) -> Self {
        let mut bits = 0u32;
        let mut i = 0;
        while i < codes.len() {
            if codes[i] >= 0 && codes[i] <= 16 {
                bits |= 1 << codes[i];
            }
            i += 1;
        }
        GrpcCodes(bits)
    }

    /// Whether `code` is in the set.
    pub const fn contains(self, code: i32) -> bool {
        code >= 0 && code <= 16 && self.0 & (1 << code) != 0
    }
}

impl Default for GrpcCodes {
    fn default() -> Self {
        GrpcCodes::DEFAULT
    }
}

/// How a call that ended with gRPC status `code` failed, or `None` when `code` is not in
/// `failures` (OK, or a caller error). DEADLINE_EXCEEDED is a timeout, the rest a server
/// failure.
///
/// ```
/// use lbkit_core::{FailureKind, Outcome};
/// use lbkit_tower::policy::{grpc_code_kind, GrpcCodes};
/// assert_eq!(grpc_code_kind(14, GrpcCodes::DEFAULT), Some(FailureKind::Server));
/// assert_eq!(grpc_code_kind(4, GrpcCodes::DEFAULT), Some(FailureKind::Timeout));
/// assert_eq!(grpc_code_kind(5, GrpcCodes::DEFAULT), None); // NOT_FOUND is an answer
/// ```
pub fn grpc_code_kind(code: i32, failures: GrpcCodes) -> Option<FailureKind> {
    if !failures.contains(code) {
        return None;
    }
    Some(if code == 4 {
        FailureKind::Timeout
    } else {
        FailureKind::Server
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{BoxError, ErrorKind};

    fn fail(kind: FailureKind) -> Outcome {
        Outcome::Failure(kind)
    }

    #[derive(Debug, thiserror::Error)]
    #[error("wrapped")]
    struct Wrapped(#[source] BoxError);

    #[test]
    fn io_errors_in_the_chain() {
        let refused = io::Error::new(io::ErrorKind::ConnectionRefused, "refused");
        let err = Wrapped(Box::new(refused));
        assert_eq!(default_error_outcome(&err), fail(FailureKind::Connect));
        let reset = io::Error::new(io::ErrorKind::ConnectionReset, "reset");
        assert_eq!(default_error_outcome(&reset), fail(FailureKind::Other));
        let timed = io::Error::new(io::ErrorKind::TimedOut, "slow");
        assert_eq!(default_error_outcome(&timed), fail(FailureKind::Timeout));
    }

    /// A `GOAWAY` cannot be built outside `h2`; the tests `failover` (tower) and `h2c`
    /// (`lbkit proxy`) receive real ones from a raw HTTP/2 upstream.
    #[cfg(feature = "http")]
    #[test]
    fn http2_streams_refused_were_not_processed() {
        let refused = h2::Error::from(h2::Reason::REFUSED_STREAM);
        assert!(http2_unprocessed(&refused));
        let err = Wrapped(Box::new(refused));
        assert_eq!(default_error_outcome(&err), fail(FailureKind::Connect));
        let cancelled = h2::Error::from(h2::Reason::CANCEL);
        assert!(!http2_unprocessed(&cancelled));
        assert_eq!(default_error_outcome(&cancelled), fail(FailureKind::Other));
        let io = io::Error::new(io::ErrorKind::BrokenPipe, "gone");
        assert!(!http2_unprocessed(&io));
    }

    #[test]
    fn lbkit_errors_keep_their_kind() {
        let e = Error::new(ErrorKind::Failed(FailureKind::Server));
        assert_eq!(default_error_outcome(&e), fail(FailureKind::Server));
    }

    #[cfg(feature = "tonic")]
    #[test]
    fn tonic_status_by_code() {
        let s = tonic::Status::unavailable("down");
        assert_eq!(default_error_outcome(&s), fail(FailureKind::Server));
        let s = tonic::Status::deadline_exceeded("slow");
        assert_eq!(default_error_outcome(&s), fail(FailureKind::Timeout));
        let s = tonic::Status::not_found("nope");
        assert_eq!(default_error_outcome(&s), Outcome::Success, "an answer");
    }

    #[test]
    fn code_sets() {
        let c = GrpcCodes::from_codes(&[14, 99, -1]);
        assert!(c.contains(14) && !c.contains(13) && !c.contains(99));
    }
}
