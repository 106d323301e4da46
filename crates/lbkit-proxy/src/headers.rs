//! Request and response header rewriting: hop-by-hop headers out, forwarding headers in.

use std::fmt::Write as _;
use std::net::SocketAddr;

use bytes::Bytes;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// Headers that describe one connection, not the message (RFC 9110 §7.6.1), plus `Upgrade`
/// (put back only for a tunnelled upgrade) and h2c's `HTTP2-Settings` (RFC 7540 §3.2.1):
/// removed in both directions, along with any header the `Connection` header names. Shared
/// with the HTTP/1 fast path, which compares names case-insensitively.
pub(crate) const HOP_BY_HOP: [&str; 10] = [
    "connection",
    "http2-settings",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// The comma-separated tokens of a header value, trimmed, empty ones skipped.
pub(crate) fn tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
}

/// Whether a `Connection` header names `token` (case-insensitively).
pub(crate) fn connection_names(headers: &HeaderMap, token: &str) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| tokens(v.as_bytes()))
        .any(|t| t.eq_ignore_ascii_case(token.as_bytes()))
}

/// [`HOP_BY_HOP`] as header names, compared without parsing or hashing.
const HOP_BY_HOP_NAMES: [HeaderName; 10] = [
    header::CONNECTION,
    HeaderName::from_static("http2-settings"),
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Remove hop-by-hop headers and whatever `Connection` lists.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most requests carry few or none: one pass over the names finds out, where ten removals
    // by name each parsed and hashed the name (a sixth of the header work on h2c, where every
    // request is a task of its own).
    if !headers.keys().any(|k| HOP_BY_HOP_NAMES.contains(k)) {
        return;
    }
    // `TE: trailers` is the one TE an HTTP/2 request may carry (RFC 9113 §8.2.2) and gRPC asks
    // for it end to end (Envoy keeps it, nginx's grpc_pass sends it): it goes on; any other TE
    // does not.
    let mut te = headers.get_all(header::TE).iter().peekable();
    let trailers = te.peek().is_some()
        && te.all(|v| v.as_bytes().trim_ascii().eq_ignore_ascii_case(b"trailers"));
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| tokens(v.as_bytes()))
        .filter_map(|name| HeaderName::from_bytes(name).ok())
        .collect();
    for name in listed {
        headers.remove(name);
    }
    for name in &HOP_BY_HOP_NAMES {
        headers.remove(name);
    }
    if trailers {
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
    }
}

/// `X-Forwarded-For`, prepared once: a lookup or insert by `&str` parses the name each time.
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Append the client to `X-Forwarded-For` and `Forwarded` (RFC 7239), with the protocol and
/// the request's `Host`. Each value is built in one buffer that becomes the header's bytes.
pub(crate) fn add_forwarded(headers: &mut HeaderMap, client: SocketAddr) {
    let ip = client.ip();
    let mut xff = String::with_capacity(48);
    if let Some(prev) = headers.get(&X_FORWARDED_FOR).and_then(|v| v.to_str().ok()) {
        xff.push_str(prev);
        xff.push_str(", ");
    }
    let _ = write!(xff, "{ip}");
    let mut forwarded = String::with_capacity(96);
    if let Some(prev) = headers.get(header::FORWARDED).and_then(|v| v.to_str().ok()) {
        forwarded.push_str(prev);
        forwarded.push_str(", ");
    }
    let _ = if client.is_ipv6() {
        write!(forwarded, "for=\"[{ip}]\";proto=http")
    } else {
        write!(forwarded, "for={ip};proto=http")
    };
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| h.bytes().all(|b| b.is_ascii_graphic() && b != b'"'));
    if let Some(h) = host {
        forwarded.push_str(";host=\"");
        forwarded.push_str(h);
        forwarded.push('"');
    }
    if let Ok(v) = HeaderValue::from_maybe_shared(Bytes::from(xff)) {
        headers.insert(X_FORWARDED_FOR, v);
    }
    if let Ok(v) = HeaderValue::from_maybe_shared(Bytes::from(forwarded)) {
        headers.insert(header::FORWARDED, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_names_are_the_list() {
        for (name, text) in HOP_BY_HOP_NAMES.iter().zip(HOP_BY_HOP) {
            assert_eq!(name.as_str(), text);
        }
    }

    #[test]
    fn te_trailers_stays_and_other_te_goes() {
        for (values, kept) in [
            (&["trailers"][..], true),
            (&[" Trailers "][..], true),
            (&["trailers", "trailers"][..], true),
            (&["gzip"][..], false),
            (&["trailers, gzip"][..], false),
            (&["trailers", "deflate"][..], false),
        ] {
            let mut h = HeaderMap::new();
            for v in values {
                h.append(header::TE, HeaderValue::from_static(v));
            }
            h.insert(header::CONNECTION, HeaderValue::from_static("te"));
            strip_hop_by_hop(&mut h);
            let te: Vec<_> = h.get_all(header::TE).iter().collect();
            if kept {
                assert_eq!(te, [HeaderValue::from_static("trailers")], "{values:?}");
            } else {
                assert!(te.is_empty(), "{values:?}");
            }
            assert!(h.get(header::CONNECTION).is_none());
        }
    }

    #[test]
    fn hop_by_hop_and_listed_headers_go() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("close, x-secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-kept"));
    }

    #[test]
    fn forwarded_headers_append() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("10.0.0.1"));
        h.insert(header::HOST, HeaderValue::from_static("api.test"));
        add_forwarded(&mut h, "127.0.0.1:5000".parse().unwrap());
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 127.0.0.1");
        assert_eq!(
            h[header::FORWARDED],
            "for=127.0.0.1;proto=http;host=\"api.test\""
        );
    }
}
