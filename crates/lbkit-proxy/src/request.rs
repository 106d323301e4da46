//! What the proxy accepts from a client before routing, one rule for both HTTP engines:
//!
//! * **`Host`** (RFC 9112 §3.2): an HTTP/1.1 request has exactly one `Host` header, and its
//!   value is a valid `host[:port]` (a reg-name, an IPv4 address or a bracketed IP literal;
//!   a port of digits); an HTTP/1.0 request may omit it. An HTTP/2 request names its
//!   authority in `:authority`; a `Host` header beside it must be valid and name the same.
//!   Anything else is answered 400 and reaches no backend.
//! * **The path** is normalised before routing, and the normalised path is what the upstream
//!   receives (so a backend never resolves a path routing did not see), as nginx and Envoy's
//!   `normalize_path` do:
//!   1. percent-encoded unreserved characters (`A-Z a-z 0-9 - . _ ~`) are decoded
//!      (RFC 3986 §6.2.2.2); other escapes are kept, with upper-case hex digits;
//!   2. runs of `/` become one (nginx's `merge_slashes`);
//!   3. `.` and `..` segments are removed (RFC 3986 §5.2.4).
//!
//!   Rejected with 400: an encoded `/` or `\` (`%2F`, `%5C`) or a raw `\`, which a backend
//!   might decode into a separator routing never saw (Envoy's `REJECT_REQUEST`); an encoded
//!   NUL (`%00`); a `%` not followed by two hex digits; a `..` that climbs above the root.
//!
//! The fast path serves only requests whose `Host` is valid and whose path is already normal
//! ([`is_normal`]: one scan, no allocation); hyper's engine serves the rest under the same
//! rules.

use std::borrow::Cow;

/// Why a request is refused before routing (400).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// A missing, duplicated or invalid `Host`, or one that contradicts `:authority`.
    Host,
    /// A path that does not normalise (see the module docs).
    Path,
}

impl Refused {
    /// The text of the 400 answer.
    pub(crate) fn text(self) -> &'static str {
        match self {
            Refused::Host => "bad request: missing, repeated or invalid Host\n",
            Refused::Path => "bad request: path does not normalise\n",
        }
    }
}

/// The authority `req` names (for routing), checked as the module docs say; `None` for an
/// HTTP/1.0 or HTTP/2 request that names none.
///
/// # Errors
/// [`Refused::Host`].
pub(crate) fn authority<B>(req: &http::Request<B>) -> Result<Option<&str>, Refused> {
    let mut hosts = req.headers().get_all(http::header::HOST).iter();
    let (host, extra) = (hosts.next(), hosts.next());
    if extra.is_some() || host.is_some_and(|h| !valid_host(h.as_bytes())) {
        return Err(Refused::Host);
    }
    let host = host.and_then(|h| h.to_str().ok());
    let target = req.uri().authority().map(|a| a.as_str());
    match req.version() {
        http::Version::HTTP_2 | http::Version::HTTP_3 => match (target, host) {
            (Some(a), Some(h)) if !a.eq_ignore_ascii_case(h) => Err(Refused::Host),
            (a, h) => Ok(a.or(h)),
        },
        // An absolute-form target's authority wins over `Host` (RFC 9112 §3.2.2), but
        // HTTP/1.1 still requires the header.
        http::Version::HTTP_11 if host.is_none() => Err(Refused::Host),
        _ => Ok(target.or(host)),
    }
}

/// What hyper's engine admits of `req`: its authority (for routing) and its normalised path
/// (`None` when the path is normal already).
///
/// # Errors
/// [`Refused::Host`] or [`Refused::Path`].
pub(crate) fn admit<B>(req: &http::Request<B>) -> Result<(Option<&str>, Option<String>), Refused> {
    let host = authority(req)?;
    match normalize(req.uri().path())? {
        Cow::Borrowed(_) => Ok((host, None)),
        Cow::Owned(p) => Ok((host, Some(p))),
    }
}

/// `admit` for the fuzz targets: the authority and the normalised path, or the refusal's
/// text.
///
/// # Errors
/// The text of the 400 the proxy answers.
pub fn admits<B>(req: &http::Request<B>) -> Result<(Option<String>, Option<String>), &'static str> {
    admit(req)
        .map(|(host, path)| (host.map(str::to_owned), path))
        .map_err(|r| r.text())
}

/// `uri` with its path replaced by `path` (the query kept).
pub(crate) fn with_path(uri: &http::Uri, path: &str) -> Option<http::Uri> {
    let pq = match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_owned(),
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(pq.parse().ok()?);
    http::Uri::from_parts(parts).ok()
}

/// Whether `value` is a valid `Host` value: `host[:port]`.
pub(crate) fn valid_host(value: &[u8]) -> bool {
    let (host, port) = match value.first() {
        Some(b'[') => match value.iter().position(|&b| b == b']') {
            Some(end) => {
                let literal = &value[1..end];
                let ok = !literal.is_empty()
                    && literal
                        .iter()
                        .all(|&b| b.is_ascii_hexdigit() || matches!(b, b':' | b'.'));
                if !ok {
                    return false;
                }
                match &value[end + 1..] {
                    [] => return true,
                    [b':', port @ ..] => (&value[..0], Some(port)),
                    _ => return false,
                }
            }
            None => return false,
        },
        _ => match value.iter().rposition(|&b| b == b':') {
            Some(i) => (&value[..i], Some(&value[i + 1..])),
            None => (value, None),
        },
    };
    let port_ok = port.is_none_or(|p| p.len() <= 5 && p.iter().all(u8::is_ascii_digit));
    let host_ok = host.iter().all(|&b| {
        b.is_ascii_alphanumeric()
            || matches!(b, b'-' | b'.' | b'_' | b'~' | b'%')
            || matches!(
                b,
                b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'='
            )
    });
    port_ok && host_ok && (!host.is_empty() || value.first() == Some(&b'['))
}

/// The bytes of an origin-form target (RFC 3986 `pchar`, `/` and `?`): unreserved,
/// sub-delims, `:`, `@`, `%`, `/`, `?`.
const TARGET_BYTES: [bool; 256] = {
    let mut t = [false; 256];
    let allowed =
        b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~!$&'()*+,;=:@%/?";
    let mut i = 0;
    while i < allowed.len() {
        t[allowed[i] as usize] = true;
        i += 1;
    }
    t
};

/// Whether every byte of `target` may appear in an origin-form request target. `httparse`
/// lets more through (`<`, `>`, `"`, `{`, `^`, …), which hyper's `Uri` refuses with a 400:
/// the fast path serves only targets made of these bytes and hands the rest to hyper, so both
/// engines answer such a target alike (found by the `h1_differential` fuzz target).
pub(crate) fn is_uri_target(target: &[u8]) -> bool {
    target.iter().all(|&b| TARGET_BYTES[usize::from(b)])
}

/// Whether `path` is already normal: no `%`, no `\`, no empty, `.` or `..` segment.
pub(crate) fn is_normal(path: &[u8]) -> bool {
    if path.first() != Some(&b'/') || path.iter().any(|&b| b == b'%' || b == b'\\') {
        return false;
    }
    let rest = &path[1..];
    // Only the last segment may be empty (a trailing `/`).
    let last = rest.iter().filter(|&&b| b == b'/').count();
    rest.split(|&b| b == b'/')
        .enumerate()
        .all(|(i, seg)| !matches!(seg, b"." | b"..") && (!seg.is_empty() || i == last))
}

/// `path` normalised (see the module docs), borrowed when it already is.
///
/// # Errors
/// [`Refused::Path`] for the paths the module docs list.
pub(crate) fn normalize(path: &str) -> Result<Cow<'_, str>, Refused> {
    if is_normal(path.as_bytes()) {
        return Ok(Cow::Borrowed(path));
    }
    if !path.starts_with('/') {
        return Err(Refused::Path);
    }
    let decoded = decode_unreserved(path.as_bytes())?;
    let mut out: Vec<&[u8]> = Vec::new();
    let segments: Vec<&[u8]> = decoded[1..].split(|&b| b == b'/').collect();
    let trailing = decoded.len() > 1 && decoded.ends_with(b"/");
    for (i, seg) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        match *seg {
            b"" => {}
            b"." => {}
            b".." => {
                if out.pop().is_none() {
                    return Err(Refused::Path);
                }
            }
            s => out.push(s),
        }
        // A final `.` or `..` names a directory: keep the trailing slash.
        if last && matches!(*seg, b"." | b"..") && !out.is_empty() {
            return Ok(Cow::Owned(join(&out, true)));
        }
    }
    Ok(Cow::Owned(join(&out, trailing)))
}

fn join(segments: &[&[u8]], trailing: bool) -> String {
    let mut s = String::new();
    for seg in segments {
        s.push('/');
        // Only ASCII reaches here: escapes stay escaped, decoded octets are unreserved.
        s.push_str(std::str::from_utf8(seg).unwrap_or_default());
    }
    if s.is_empty() || trailing {
        s.push('/');
    }
    s
}

/// Decode escapes of unreserved characters; keep others (upper-case hex); refuse `%2F`,
/// `%5C`, `%00`, raw `\`, bad escapes and non-ASCII bytes.
fn decode_unreserved(path: &[u8]) -> Result<Vec<u8>, Refused> {
    let mut out = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < path.len() {
        let b = path[i];
        if b == b'\\' || !b.is_ascii() {
            return Err(Refused::Path);
        }
        if b != b'%' {
            out.push(b);
            i += 1;
            continue;
        }
        let hex = |c: u8| (c as char).to_digit(16);
        let (Some(h), Some(l)) = (
            path.get(i + 1).copied().and_then(hex),
            path.get(i + 2).copied().and_then(hex),
        ) else {
            return Err(Refused::Path);
        };
        let c = (h * 16 + l) as u8;
        if matches!(c, b'/' | b'\\' | 0) {
            return Err(Refused::Path);
        }
        if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~') {
            out.push(c);
        } else {
            out.extend_from_slice(format!("%{c:02X}").as_bytes());
        }
        i += 3;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_normalise_as_the_module_docs_say() {
        let ok = [
            ("/", "/"),
            ("/a/b", "/a/b"),
            ("/a/b/", "/a/b/"),
            ("/public/../secret", "/secret"),
            ("/public/%2e%2e/secret", "/secret"),
            ("/public/%2E%2E/secret", "/secret"),
            ("/public/.%2e/secret", "/secret"),
            ("/a/./b", "/a/b"),
            ("//a///b", "/a/b"),
            ("/a/b/..", "/a/"),
            ("/a/.", "/a/"),
            ("/%7euser/%41", "/~user/A"),
            ("/a%20b", "/a%20b"),
            ("/a%3fb", "/a%3Fb"),
        ];
        for (raw, want) in ok {
            assert_eq!(normalize(raw).as_deref(), Ok(want), "{raw}");
        }
        for bad in [
            "/..", "/a/../..", "/a%2Fb", "/a%2fb", "/a%5Cb", "/a\\b", "/a%00", "/a%", "/a%g1", "x",
        ] {
            assert_eq!(normalize(bad), Err(Refused::Path), "{bad}");
        }
    }

    #[test]
    fn normal_paths_are_borrowed_and_others_are_not_normal() {
        assert!(matches!(normalize("/a/b/"), Ok(Cow::Borrowed(_))));
        for p in ["/a//b", "/a/./b", "/a/..", "/%41", "/a\\b", "//"] {
            assert!(!is_normal(p.as_bytes()), "{p}");
        }
        for p in ["/", "/a", "/a/", "/a.b/c..d/.e"] {
            assert!(is_normal(p.as_bytes()), "{p}");
        }
    }

    #[test]
    fn hosts_are_checked() {
        for h in [
            "api.test",
            "api.test:8080",
            "127.0.0.1",
            "127.0.0.1:80",
            "[::1]",
            "[::1]:443",
            "a_b",
        ] {
            assert!(valid_host(h.as_bytes()), "{h}");
        }
        for h in [
            "",
            ":80",
            "api.test:80x",
            "api test",
            "a/b",
            "[::1",
            "[zz]",
            "api.test:123456",
            "a@b",
        ] {
            assert!(!valid_host(h.as_bytes()), "{h}");
        }
    }
}
