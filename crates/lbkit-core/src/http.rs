//! HTTP semantics that every lbkit driver shares (the tower layer, both proxy engines), as
//! plain functions of bytes and numbers: no HTTP library needed.
//!
//! * Which methods are idempotent ([`is_idempotent_method`]), so failover may send them again
//!   after they reached a server.
//! * What a status code means for the endpoint and for retries: [`Observed::Status`] in the
//!   attempt table ([`crate::Attempts`]), with [`status_failure`] its failure kind.
//!
//! Where a hash key comes from (header, cookie, path, query, source address) is
//! `lbkit_strategy::KeySource`'s contract, next to the extractors that read it.
//!
//! [`Observed::Status`]: crate::Observed::Status

pub use crate::attempt::status_failure;

/// The idempotent methods of RFC 9110 §9.2.2, uppercase as they go on the wire.
pub const IDEMPOTENT_METHODS: [&str; 6] = ["GET", "HEAD", "PUT", "DELETE", "OPTIONS", "TRACE"];

/// Whether `method` (its name as on the wire; methods are case-sensitive) is idempotent by
/// RFC 9110 §9.2.2: GET, HEAD, PUT, DELETE, OPTIONS and TRACE.
///
/// ```
/// use lbkit_core::http::is_idempotent_method;
/// assert!(is_idempotent_method(b"GET") && is_idempotent_method(b"PUT"));
/// assert!(!is_idempotent_method(b"POST") && !is_idempotent_method(b"get"));
/// ```
#[inline]
pub fn is_idempotent_method(method: &[u8]) -> bool {
    matches!(
        method,
        b"GET" | b"HEAD" | b"PUT" | b"DELETE" | b"OPTIONS" | b"TRACE"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_and_the_predicate_agree() {
        for m in IDEMPOTENT_METHODS {
            assert!(is_idempotent_method(m.as_bytes()), "{m}");
        }
        for m in ["POST", "PATCH", "CONNECT", ""] {
            assert!(!is_idempotent_method(m.as_bytes()), "{m}");
        }
    }
}
