//! Where a request's hash key comes from: [`KeyExtractor`] names the place (header, cookie,
//! path, source IP, RPC argument), [`KeySource`] is what a layer (tower middleware, proxy, Dubbo
//! client) implements for its request type to hand the pieces over.
//!
//! The key is text as the origin hashes it, so an lbkit client agrees with the others: nginx
//! hashes `$http_x_user_id`, `$cookie_session`, `$request_uri` or `$remote_addr` as text; Envoy
//! hashes a header value, a cookie value or the source IP as text; Dubbo hashes its arguments
//! rendered by `String.valueOf` and concatenated.
//!
//! ```
//! use std::net::IpAddr;
//! use lbkit_strategy::{KeyExtractor, KeySource};
//!
//! struct Request { cookie: &'static str, ip: IpAddr }
//! impl KeySource for Request {
//!     fn header(&self, name: &str) -> Option<&[u8]> {
//!         (name == "cookie").then_some(self.cookie.as_bytes())
//!     }
//!     fn source_ip(&self) -> Option<IpAddr> {
//!         Some(self.ip)
//!     }
//! }
//!
//! let req = Request { cookie: "theme=dark; session=\"abc123\"", ip: [10, 0, 0, 7].into() };
//! let by_cookie: KeyExtractor = "cookie:session".parse().unwrap();
//! assert_eq!(by_cookie.extract(&req).as_deref(), Some(&b"abc123"[..]));
//! let by_ip: KeyExtractor = "source-ip".parse().unwrap();
//! assert_eq!(by_ip.extract(&req).as_deref(), Some(&b"10.0.0.7"[..]));
//! assert_eq!("header:x-user-id".parse::<KeyExtractor>().unwrap().extract(&req), None);
//! ```

use std::borrow::Cow;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// What a layer's request type exposes to [`KeyExtractor::extract`]. Every method defaults to
/// "not available", so a layer implements only what its protocol has.
pub trait KeySource {
    /// The value of header `name` (given in lowercase; compare case-insensitively). When the
    /// header appears several times, the layer decides (the first value, or the values joined
    /// with `", "`; for `cookie`, joined with `"; "` as HTTP/2 requires).
    fn header(&self, name: &str) -> Option<&[u8]> {
        let _ = name;
        None
    }

    /// The value of cookie `name`. By default parsed from the `cookie` header: pairs separated by
    /// `;`, optional spaces around them, the first pair with that exact (case-sensitive) name
    /// wins, and a value in double quotes loses them (RFC 6265 §4.2.1).
    fn cookie(&self, name: &str) -> Option<&[u8]> {
        self.header("cookie").and_then(|h| find_cookie(h, name))
    }

    /// The request target as the client sent it: the path and, if any, `?` and the query
    /// (nginx's `$request_uri`), not decoded. [`KeyExtractor`] derives `path`, `uri` and
    /// `query:NAME` keys from it, so every layer hashes them alike.
    fn target(&self) -> Option<&[u8]> {
        None
    }

    /// The address of the calling client.
    fn source_ip(&self) -> Option<IpAddr> {
        None
    }

    /// RPC argument `index` rendered as text (Dubbo renders with `String.valueOf`, so a null
    /// argument is `null`); `None` when the call has fewer arguments.
    fn argument(&self, index: usize) -> Option<&[u8]> {
        let _ = index;
        None
    }
}

/// Where the hash key of a request comes from. Parses from and prints as the text forms below.
///
/// | text | variant | key |
/// |---|---|---|
/// | `header:x-user-id` | [`Header`](Self::Header) | the header's value (name stored lowercase) |
/// | `cookie:session` | [`Cookie`](Self::Cookie) | the cookie's value |
/// | `path` | [`Path`](Self::Path) | the request path, without the query (`/users/7` for `/users/7?x=1`) |
/// | `uri` | [`Uri`](Self::Uri) | the whole request target with the query, as sent (nginx's `$request_uri`) |
/// | `query:id` | [`Query`](Self::Query) | the value of the first query parameter `id`, as sent (nginx's `$arg_id`) |
/// | `source-ip` | [`SourceIp`](Self::SourceIp) | the client IP as text (`10.0.0.7`, `2001:db8::1`) |
/// | `arg:0` | [`RpcArgument`](Self::RpcArgument) | one RPC argument |
/// | `arg:0,2` | [`RpcArguments`](Self::RpcArguments) | arguments concatenated (Dubbo `hash.arguments`) |
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KeyExtractor {
    /// A request header (lowercase name).
    Header(String),
    /// A cookie.
    Cookie(String),
    /// The request path, without the query: requests for one resource land together whatever
    /// their query.
    Path,
    /// The request target with its query, as sent (nginx's `$request_uri`).
    Uri,
    /// One query parameter's value, not decoded (nginx's `$arg_NAME`; the name is compared
    /// exactly).
    Query(String),
    /// The client's IP address, as text.
    SourceIp,
    /// One RPC argument by position (Dubbo's default `hash.arguments = 0`).
    RpcArgument(usize),
    /// Several RPC arguments concatenated in the order given, skipping missing ones (Dubbo's
    /// `toKey`).
    RpcArguments(Vec<usize>),
}

// === impl KeyExtractor ===

impl KeyExtractor {
    /// The key of a request, or `None` when the request does not carry it (the strategy then
    /// falls back to a random pick; see the [hash module](super)).
    ///
    /// Borrows from the request except for `source-ip` and `arg:A,B`, which build a short
    /// string.
    pub fn extract<'s, S: KeySource + ?Sized>(&self, source: &'s S) -> Option<Cow<'s, [u8]>> {
        match self {
            KeyExtractor::Header(name) => source.header(name).map(Cow::Borrowed),
            KeyExtractor::Cookie(name) => source.cookie(name).map(Cow::Borrowed),
            KeyExtractor::Path => source.target().map(|t| Cow::Borrowed(split_target(t).0)),
            KeyExtractor::Uri => source.target().map(Cow::Borrowed),
            KeyExtractor::Query(name) => source
                .target()
                .and_then(|t| find_query(split_target(t).1?, name))
                .map(Cow::Borrowed),
            KeyExtractor::SourceIp => source
                .source_ip()
                .map(|ip| Cow::Owned(ip.to_string().into_bytes())),
            KeyExtractor::RpcArgument(i) => source.argument(*i).map(Cow::Borrowed),
            KeyExtractor::RpcArguments(list) => {
                let mut parts = list.iter().filter_map(|&i| source.argument(i)).peekable();
                parts.peek()?;
                Some(Cow::Owned(parts.flatten().copied().collect()))
            }
        }
    }
}

impl FromStr for KeyExtractor {
    type Err = KeyExtractorError;

    fn from_str(text: &str) -> Result<Self, KeyExtractorError> {
        let bad = |reason: &'static str| KeyExtractorError {
            text: text.to_owned(),
            reason,
        };
        let (kind, arg) = match text.trim().split_once(':') {
            Some((k, a)) => (k.trim(), Some(a.trim())),
            None => (text.trim(), None),
        };
        match (kind.to_ascii_lowercase().as_str(), arg) {
            ("path", None) => Ok(KeyExtractor::Path),
            ("uri", None) => Ok(KeyExtractor::Uri),
            ("query", Some(name)) if !name.is_empty() && !name.contains(['&', '=', '#']) => {
                Ok(KeyExtractor::Query(name.to_owned()))
            }
            ("query", _) => Err(bad("a query parameter name is non-empty, without & = #")),
            ("source-ip", None) => Ok(KeyExtractor::SourceIp),
            ("header", Some(name)) if is_token(name) => {
                Ok(KeyExtractor::Header(name.to_ascii_lowercase()))
            }
            ("header", _) => Err(bad("a header name is a non-empty HTTP token")),
            ("cookie", Some(name)) if is_token(name) => Ok(KeyExtractor::Cookie(name.to_owned())),
            ("cookie", _) => Err(bad("a cookie name is a non-empty HTTP token")),
            ("arg", Some(list)) => {
                let indices = list
                    .split(',')
                    .map(|i| i.trim().parse::<usize>())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| bad("arguments are indices such as 0 or 0,2"))?;
                match indices.as_slice() {
                    [one] => Ok(KeyExtractor::RpcArgument(*one)),
                    _ => Ok(KeyExtractor::RpcArguments(indices)),
                }
            }
            ("arg", None) => Err(bad("name the argument index, e.g. arg:0")),
            ("path" | "uri" | "source-ip", Some(_)) => Err(bad("takes no parameter")),
            _ => Err(bad("unknown key source")),
        }
    }
}

impl fmt::Display for KeyExtractor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyExtractor::Header(name) => write!(f, "header:{name}"),
            KeyExtractor::Cookie(name) => write!(f, "cookie:{name}"),
            KeyExtractor::Path => f.write_str("path"),
            KeyExtractor::Uri => f.write_str("uri"),
            KeyExtractor::Query(name) => write!(f, "query:{name}"),
            KeyExtractor::SourceIp => f.write_str("source-ip"),
            KeyExtractor::RpcArgument(i) => write!(f, "arg:{i}"),
            KeyExtractor::RpcArguments(list) => {
                f.write_str("arg:")?;
                for (n, i) in list.iter().enumerate() {
                    if n > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{i}")?;
                }
                Ok(())
            }
        }
    }
}

/// Text that does not name a key source.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("key source {text:?} is invalid: {reason} (expected header:NAME, cookie:NAME, path, uri, query:NAME, source-ip or arg:N[,N...])")]
pub struct KeyExtractorError {
    text: String,
    reason: &'static str,
}

/// An RFC 9110 token (header and cookie names).
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// A request target split at the first `?`: the path, and the query if there is one.
///
/// ```
/// use lbkit_strategy::split_target;
/// assert_eq!(split_target(b"/a/b?x=1"), (&b"/a/b"[..], Some(&b"x=1"[..])));
/// assert_eq!(split_target(b"/a"), (&b"/a"[..], None));
/// ```
pub fn split_target(target: &[u8]) -> (&[u8], Option<&[u8]>) {
    match target.iter().position(|&b| b == b'?') {
        Some(q) => (&target[..q], Some(&target[q + 1..])),
        None => (target, None),
    }
}

/// The value of the first parameter `name` in a query (`a=1&b=2`; a parameter without `=` has
/// an empty value; a `#fragment` is not part of it).
fn find_query<'a>(query: &'a [u8], name: &str) -> Option<&'a [u8]> {
    let query = query.split(|&b| b == b'#').next().unwrap_or(query);
    query.split(|&b| b == b'&').find_map(|pair| {
        let (k, v) = match pair.iter().position(|&b| b == b'=') {
            Some(eq) => (&pair[..eq], &pair[eq + 1..]),
            None => (pair, &pair[pair.len()..]),
        };
        (k == name.as_bytes()).then_some(v)
    })
}

/// The value of cookie `name` in a `Cookie` header value.
fn find_cookie<'a>(header: &'a [u8], name: &str) -> Option<&'a [u8]> {
    header.split(|&b| b == b';').find_map(|pair| {
        let eq = pair.iter().position(|&b| b == b'=')?;
        (pair[..eq].trim_ascii() == name.as_bytes()).then(|| unquote(pair[eq + 1..].trim_ascii()))
    })
}

fn unquote(v: &[u8]) -> &[u8] {
    match v {
        [b'"', inner @ .., b'"'] => inner,
        _ => v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Default)]
    struct Req {
        headers: Vec<(&'static str, &'static str)>,
        path: Option<&'static str>,
        ip: Option<IpAddr>,
        args: Vec<&'static str>,
    }

    impl KeySource for Req {
        fn header(&self, name: &str) -> Option<&[u8]> {
            self.headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_bytes())
        }
        fn target(&self) -> Option<&[u8]> {
            self.path.map(str::as_bytes)
        }
        fn source_ip(&self) -> Option<IpAddr> {
            self.ip
        }
        fn argument(&self, index: usize) -> Option<&[u8]> {
            self.args.get(index).map(|a| a.as_bytes())
        }
    }

    fn key(extractor: &str, req: &Req) -> Option<String> {
        let e: KeyExtractor = extractor.parse().unwrap();
        e.extract(req)
            .map(|k| String::from_utf8(k.into_owned()).unwrap())
    }

    #[test]
    fn extracts_each_kind() {
        let req = Req {
            headers: vec![
                ("X-User-Id", "u-17"),
                ("Cookie", "a=1;  sid = s-9 ; b=\"q\"; a=2"),
            ],
            path: Some("/cart?id=3&x&y=a=b"),
            ip: Some("2001:db8::1".parse().unwrap()),
            args: vec!["42", "null", "eu"],
        };
        assert_eq!(key("header:X-USER-ID", &req).as_deref(), Some("u-17"));
        assert_eq!(key("cookie:sid", &req).as_deref(), Some("s-9"));
        assert_eq!(
            key("cookie:a", &req).as_deref(),
            Some("1"),
            "first pair wins"
        );
        assert_eq!(
            key("cookie:b", &req).as_deref(),
            Some("q"),
            "quotes dropped"
        );
        assert_eq!(
            key("cookie:A", &req),
            None,
            "cookie names are case-sensitive"
        );
        assert_eq!(key("path", &req).as_deref(), Some("/cart"));
        assert_eq!(key("uri", &req).as_deref(), Some("/cart?id=3&x&y=a=b"));
        assert_eq!(key("query:id", &req).as_deref(), Some("3"));
        assert_eq!(key("query:x", &req).as_deref(), Some(""));
        assert_eq!(key("query:y", &req).as_deref(), Some("a=b"));
        assert_eq!(key("query:ID", &req), None, "names compare exactly");
        assert_eq!(key("query:z", &req), None);
        assert_eq!(key("source-ip", &req).as_deref(), Some("2001:db8::1"));
        assert_eq!(key("arg:0", &req).as_deref(), Some("42"));
        assert_eq!(
            key("arg:2,0,9", &req).as_deref(),
            Some("eu42"),
            "Dubbo concatenation, missing skipped"
        );
        assert_eq!(key("arg:7", &req), None);
        assert_eq!(key("arg:7,8", &req), None);
        assert_eq!(key("header:x-missing", &Req::default()), None);
        assert_eq!(key("cookie:sid", &Req::default()), None);
    }

    #[test]
    fn parse_errors_name_the_text() {
        for bad in [
            "",
            "header",
            "header:",
            "header:a b",
            "cookie:",
            "arg",
            "arg:x",
            "arg:1,",
            "path:x",
            "uri:x",
            "query:",
            "query:a=b",
            "ip",
        ] {
            let e = bad.parse::<KeyExtractor>().unwrap_err().to_string();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            rng_seed: proptest::test_runner::RngSeed::Fixed(0x6b65_7973),
            ..ProptestConfig::default()
        })]
        #[test]
        fn display_round_trips(kind in 0u8..8, name in "[a-z0-9_-]{1,12}", idx in proptest::collection::vec(0usize..100, 2..5)) {
            let e = match kind {
                0 => KeyExtractor::Header(name),
                1 => KeyExtractor::Cookie(name),
                2 => KeyExtractor::Path,
                3 => KeyExtractor::SourceIp,
                4 => KeyExtractor::RpcArgument(idx[0]),
                5 => KeyExtractor::Uri,
                6 => KeyExtractor::Query(name),
                _ => KeyExtractor::RpcArguments(idx),
            };
            prop_assert_eq!(e.to_string().parse::<KeyExtractor>().unwrap(), e);
        }
    }
}
