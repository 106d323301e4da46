//! Request and response header rewriting: hop-by-hop headers out, forwarding headers in.

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use bytes::Bytes;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::config::ForwardedHeaders;

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

/// [`HOP_BY_HOP`] as header names, for removal without parsing or hashing.
static HOP_BY_HOP_NAMES: [HeaderName; 10] = [
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
    // Most requests carry none, or only gRPC's `TE: trailers` (one value, exactly `trailers`,
    // which stays as it is): one pass over the names finds out, where ten removals by name each
    // parsed and hashed the name (a sixth of the header work on h2c).
    let mut only_te = true;
    let mut any = false;
    for k in headers.keys() {
        if is_hop_by_hop(k) {
            any = true;
            only_te &= k == header::TE;
        }
    }
    if !any || (only_te && is_one_trailers(headers)) {
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

/// Whether `name` is one of [`HOP_BY_HOP`]: a match on its text, which compiles to a few
/// length and word comparisons (an array of `HeaderName`s compared one by one cost several times
/// more, and as a `const` it was built and dropped at each use).
fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "http2-settings"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

/// Whether `headers` has exactly one `TE`, and it is `trailers` as written.
fn is_one_trailers(headers: &HeaderMap) -> bool {
    let mut te = headers.get_all(header::TE).iter();
    te.next().is_some_and(|v| v == "trailers") && te.next().is_none()
}

/// `X-Forwarded-For`, prepared once: a lookup or insert by `&str` parses the name each time.
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Append the client to `X-Forwarded-For` and `Forwarded` (RFC 7239), with the protocol and
/// the request's host: its `Host`, else `authority` (an HTTP/2 request's `:authority`); to
/// those of the two that `which` names.
pub(crate) fn add_forwarded(
    headers: &mut HeaderMap,
    client: SocketAddr,
    authority: Option<&str>,
    which: ForwardedHeaders,
) {
    if which == ForwardedHeaders::NONE {
        return;
    }
    let text = IpText::new(client.ip());
    let ip = text.as_str();
    if which.x_forwarded_for {
        let xff = joined(text_of(headers, &X_FORWARDED_FOR), &[ip]);
        if let Ok(v) = HeaderValue::from_maybe_shared(xff) {
            headers.insert(X_FORWARDED_FOR, v);
        }
    }
    if !which.forwarded {
        return;
    }
    let (before, after) = if client.is_ipv6() {
        ("for=\"[", "]\";proto=http")
    } else {
        ("for=", ";proto=http")
    };
    let host = match headers.get(header::HOST) {
        Some(h) => h.to_str().ok(),
        None => authority,
    }
    .filter(|h| h.bytes().all(|b| b.is_ascii_graphic() && b != b'"'));
    let forwarded = match host {
        Some(h) => [before, ip, after, ";host=\"", h, "\""],
        None => [before, ip, after, "", "", ""],
    };
    let forwarded = joined(text_of(headers, &header::FORWARDED), &forwarded);
    if let Ok(v) = HeaderValue::from_maybe_shared(forwarded) {
        headers.insert(header::FORWARDED, v);
    }
}

/// The text of `name`'s (first) value, if it is text.
fn text_of<'h>(headers: &'h HeaderMap, name: &HeaderName) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// `earlier, ` (when there is one) then `parts`, in a buffer of exactly that length, which
/// becomes a header value's bytes as it is (a buffer with room to spare would cost `Bytes` a
/// second allocation).
fn joined(earlier: Option<&str>, parts: &[&str]) -> Bytes {
    let len = earlier.map_or(0, |e| e.len() + 2) + parts.iter().map(|p| p.len()).sum::<usize>();
    let mut out = Vec::with_capacity(len);
    if let Some(e) = earlier {
        out.extend_from_slice(e.as_bytes());
        out.extend_from_slice(b", ");
    }
    for p in parts {
        out.extend_from_slice(p.as_bytes());
    }
    Bytes::from(out)
}

/// An address as text, on the stack (the longest, an IPv6 address ending in IPv4 form, is 45
/// characters). IPv4 is written without `core::fmt`, whose two formatted writes cost a gRPC
/// call a fifth of its header rewriting (~2 000 instructions).
struct IpText {
    buf: [u8; 48],
    len: usize,
}

impl IpText {
    fn new(ip: IpAddr) -> IpText {
        let mut text = IpText {
            buf: [0; 48],
            len: 0,
        };
        let IpAddr::V4(v4) = ip else {
            let _ = write!(text, "{ip}");
            return text;
        };
        for (i, octet) in v4.octets().into_iter().enumerate() {
            if i > 0 {
                text.push(b'.');
            }
            if octet >= 100 {
                text.push(b'0' + octet / 100);
            }
            if octet >= 10 {
                text.push(b'0' + octet / 10 % 10);
            }
            text.push(b'0' + octet % 10);
        }
        text
    }

    /// One byte of an IPv4 address (at most 15, within the buffer).
    fn push(&mut self, b: u8) {
        self.buf[self.len] = b;
        self.len += 1;
    }

    fn as_str(&self) -> &str {
        // ASCII only: digits and dots, or what `Ipv6Addr`'s `Display` wrote.
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or_default()
    }
}

impl std::fmt::Write for IpText {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        let to = self.buf.get_mut(self.len..end).ok_or(std::fmt::Error)?;
        to.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_names_are_the_list() {
        assert_eq!(HOP_BY_HOP_NAMES.len(), HOP_BY_HOP.len());
        for (name, text) in HOP_BY_HOP_NAMES.iter().zip(HOP_BY_HOP) {
            assert_eq!(name.as_str(), text);
            assert!(is_hop_by_hop(name), "{text}");
        }
        for other in [
            "content-type",
            "host",
            "tea",
            "t",
            "upgrade-insecure-requests",
            "grpc-status",
        ] {
            assert!(!is_hop_by_hop(&HeaderName::from_static(other)), "{other}");
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
    fn addresses_are_written_as_display_writes_them() {
        let mut addresses: Vec<IpAddr> = (0..=255u8)
            .flat_map(|o| {
                [
                    IpAddr::from([o, 0, 9, 10]),
                    IpAddr::from([1, o, 99, 100]),
                    IpAddr::from([255, 200, o, 7]),
                    IpAddr::from([10, 0, 0, o]),
                ]
            })
            .collect();
        addresses.extend(
            [
                "::1",
                "fe80::1:2",
                "::ffff:10.1.2.3",
                "2001:db8::ff00:42:8329",
            ]
            .map(|a| a.parse::<IpAddr>().unwrap()),
        );
        for ip in addresses {
            assert_eq!(IpText::new(ip).as_str(), ip.to_string());
        }
    }

    #[test]
    fn forwarded_names_an_ipv6_client_in_brackets_and_the_authority_as_host() {
        let mut h = HeaderMap::new();
        let both = ForwardedHeaders::BOTH;
        add_forwarded(&mut h, "[2001:db8::1]:5000".parse().unwrap(), None, both);
        assert_eq!(h["x-forwarded-for"], "2001:db8::1");
        assert_eq!(h[header::FORWARDED], "for=\"[2001:db8::1]\";proto=http");
        // Without `Host`, an HTTP/2 request's `:authority` names the host.
        let mut h = HeaderMap::new();
        add_forwarded(
            &mut h,
            "10.1.2.3:5000".parse().unwrap(),
            Some("svc.test:8080"),
            both,
        );
        assert_eq!(
            h[header::FORWARDED],
            "for=10.1.2.3;proto=http;host=\"svc.test:8080\""
        );
    }

    #[test]
    fn te_trailers_alone_stays_as_it_is() {
        let mut h = HeaderMap::new();
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 2);
        assert_eq!(h[header::TE], "trailers");
        h.append(header::TE, HeaderValue::from_static("trailers"));
        h.insert(header::UPGRADE, HeaderValue::from_static("h2c"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 2);
        assert_eq!(h.get_all(header::TE).iter().count(), 1);
    }

    #[test]
    fn forwarded_headers_append() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("10.0.0.1"));
        h.insert(header::HOST, HeaderValue::from_static("api.test"));
        add_forwarded(
            &mut h,
            "127.0.0.1:5000".parse().unwrap(),
            Some("ignored.test"),
            ForwardedHeaders::BOTH,
        );
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 127.0.0.1");
        assert_eq!(
            h[header::FORWARDED],
            "for=127.0.0.1;proto=http;host=\"api.test\""
        );
    }

    /// A header left out of `forwarded_headers` goes on as the client sent it.
    #[test]
    fn only_the_forwarding_headers_asked_for_are_appended() {
        let client = "127.0.0.1:5000".parse().unwrap();
        let sent = || {
            let mut h = HeaderMap::new();
            h.insert("x-forwarded-for", HeaderValue::from_static("10.0.0.1"));
            h.insert(header::FORWARDED, HeaderValue::from_static("for=10.0.0.1"));
            h
        };
        let only = |x_forwarded_for, forwarded| ForwardedHeaders {
            x_forwarded_for,
            forwarded,
        };
        for (which, xff, fwd) in [
            (ForwardedHeaders::NONE, "10.0.0.1", "for=10.0.0.1"),
            (only(true, false), "10.0.0.1, 127.0.0.1", "for=10.0.0.1"),
            (
                only(false, true),
                "10.0.0.1",
                "for=10.0.0.1, for=127.0.0.1;proto=http",
            ),
        ] {
            let mut h = sent();
            add_forwarded(&mut h, client, None, which);
            assert_eq!(h["x-forwarded-for"], xff, "{which:?}");
            assert_eq!(h[header::FORWARDED], fwd, "{which:?}");
        }
        let mut h = HeaderMap::new();
        add_forwarded(&mut h, client, None, ForwardedHeaders::NONE);
        assert!(h.is_empty());
    }
}
