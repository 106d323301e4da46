//! Deadlines and pushback in HTTP heads: lbkit-core's [`signal`](lbkit_core::signal) rules
//! over `http::HeaderMap`, for the tower layer and both proxy engines.

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use lbkit_core::signal::{self, GrpcTimeout, Pushback};
use lbkit_core::{Clock, EndpointStats, Timestamp};

/// gRPC's deadline header.
pub static GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");
/// gRPC's pushback trailer (gRFC A6).
pub static GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// Whether a request is gRPC (its `content-type` is `application/grpc`, with or without a
/// subtype): its upstream gets the time left in `grpc-timeout`.
pub fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| GrpcKind::of(v.as_bytes()).is_some())
}

/// Which gRPC a content type names: the one reading of `application/grpc…` for every driver.
///
/// ```
/// use lbkit_tower::http::GrpcKind;
/// assert_eq!(GrpcKind::of(b"application/grpc+proto"), Some(GrpcKind::Grpc));
/// assert_eq!(GrpcKind::of(b"application/grpc-web+proto"), Some(GrpcKind::Web));
/// assert_eq!(GrpcKind::of(b"application/grpc-web-text"), Some(GrpcKind::WebText));
/// assert_eq!(GrpcKind::of(b"application/json"), None);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrpcKind {
    /// gRPC over HTTP/2 (`application/grpc`, `+proto`, `+json`).
    Grpc,
    /// gRPC-web, binary (`application/grpc-web`, `+proto`).
    Web,
    /// gRPC-web, base64 (`application/grpc-web-text`).
    WebText,
}

impl GrpcKind {
    /// The kind `content_type` names, if it is gRPC's.
    pub fn of(content_type: &[u8]) -> Option<GrpcKind> {
        let rest = content_type.strip_prefix(b"application/grpc")?;
        Some(if rest.starts_with(b"-web-text") {
            GrpcKind::WebText
        } else if rest.starts_with(b"-web") {
            GrpcKind::Web
        } else {
            GrpcKind::Grpc
        })
    }

    /// The content type of an answer the proxy makes itself for this kind of caller.
    pub fn content_type(self) -> &'static str {
        match self {
            GrpcKind::Grpc => "application/grpc",
            GrpcKind::Web => "application/grpc-web",
            GrpcKind::WebText => "application/grpc-web-text",
        }
    }
}

/// The caller's deadline a request carries, from its start: the shorter of `grpc-timeout`
/// and `header` (whole milliseconds, `x-request-timeout`) when configured. A malformed value
/// is no deadline (the route's own applies).
///
/// ```
/// use std::time::Duration;
/// use http::{HeaderMap, HeaderName};
/// use lbkit_tower::http::deadline;
/// let mut h = HeaderMap::new();
/// h.insert("grpc-timeout", "300m".parse().unwrap());
/// h.insert("x-request-timeout", "200".parse().unwrap());
/// let name = HeaderName::from_static("x-request-timeout");
/// assert_eq!(deadline(&h, Some(&name)), Some(Duration::from_millis(200)));
/// assert_eq!(deadline(&h, None), Some(Duration::from_millis(300)));
/// ```
pub fn deadline(headers: &HeaderMap, header: Option<&HeaderName>) -> Option<Duration> {
    let grpc = headers
        .get(&GRPC_TIMEOUT)
        .and_then(|v| signal::parse_grpc_timeout(v.as_bytes()));
    let http = header
        .and_then(|h| headers.get(h))
        .and_then(|v| signal::parse_timeout_ms(v.as_bytes()));
    match (grpc, http) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Tell the upstream how long it has: the deadline headers the caller sent — `grpc-timeout`,
/// and `header` (whole milliseconds, rounded down) when configured — rewritten to `left`.
/// A request without one gets none: a route's own timeout is no deadline for the upstream
/// (a server-streaming call may outlive it).
pub fn propagate_deadline(headers: &mut HeaderMap, left: Duration, header: Option<&HeaderName>) {
    if headers.contains_key(&GRPC_TIMEOUT) {
        let value = GrpcTimeout::new(left);
        if let Ok(v) = HeaderValue::from_bytes(value.as_bytes()) {
            headers.insert(GRPC_TIMEOUT.clone(), v);
        }
    }
    if let Some(h) = header.filter(|h| headers.contains_key(*h)) {
        let ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
        headers.insert(h.clone(), HeaderValue::from(ms));
    }
}

/// The pushback an answer's head (or trailers) carries: `grpc-retry-pushback-ms`, or
/// `Retry-After` on a `429` or `503` ([`signal::pushback`]).
pub fn pushback(status: StatusCode, headers: &HeaderMap, now: Timestamp) -> Option<Pushback> {
    let grpc = headers
        .get(&GRPC_RETRY_PUSHBACK_MS)
        .map(HeaderValue::as_bytes);
    let retry_after = headers
        .get(http::header::RETRY_AFTER)
        .map(HeaderValue::as_bytes);
    if grpc.is_none() && retry_after.is_none() {
        return None;
    }
    signal::pushback(status.as_u16(), retry_after, grpc, now)
}

/// [`pushback`], recorded against the endpoint whose answer it is (picks pass it over for
/// the time asked): what the driver then gives the call's attempts. `clock` is read only when
/// the answer asks for a pushback (most carry none: a proxy checks every gRPC call's trailers).
pub fn record_pushback(
    status: StatusCode,
    headers: &HeaderMap,
    stats: &EndpointStats,
    clock: &Clock,
) -> Option<Pushback> {
    if !headers.contains_key(&GRPC_RETRY_PUSHBACK_MS)
        && !headers.contains_key(http::header::RETRY_AFTER)
    {
        return None;
    }
    let now = clock.now();
    let p = pushback(status, headers, now)?;
    p.record(stats, now);
    Some(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn propagation_writes_what_is_left() {
        let mut h = HeaderMap::new();
        let name = HeaderName::from_static("x-request-timeout");
        // Nothing sent, nothing told.
        propagate_deadline(&mut h, Duration::from_secs(1), Some(&name));
        assert!(h.is_empty());
        h.insert("grpc-timeout", HeaderValue::from_static("5S"));
        h.insert("x-request-timeout", HeaderValue::from_static("5000"));
        propagate_deadline(&mut h, Duration::from_micros(1_500_700), Some(&name));
        assert_eq!(h["grpc-timeout"], "1500700u");
        assert_eq!(h["x-request-timeout"], "1500");
        assert_eq!(deadline(&h, None), Some(Duration::from_micros(1_500_700)));
    }

    #[test]
    fn pushback_is_recorded_against_the_endpoint() {
        let stats = EndpointStats::default();
        let mut h = HeaderMap::new();
        let now = Timestamp::from_millis(10_000);
        let (clock, _) = Clock::manual(now);
        assert_eq!(record_pushback(StatusCode::OK, &h, &stats, &clock), None);
        h.insert(http::header::RETRY_AFTER, HeaderValue::from_static("2"));
        let p = record_pushback(StatusCode::TOO_MANY_REQUESTS, &h, &stats, &clock);
        assert_eq!(p, Some(Pushback::Wait(Duration::from_secs(2))));
        assert_eq!(
            stats.pushed_back_until(now),
            Some(Timestamp::from_millis(12_000))
        );
    }
}
