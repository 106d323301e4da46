//! HTTP and gRPC (feature `http`): request and response policies for `http::Request` /
//! `http::Response`, body completion tracking, and two helper services.
//!
//! * [`HttpRequests`]: idempotent by method (GET, HEAD, PUT, DELETE, OPTIONS, TRACE; RFC 9110
//!   §9.2.2) or by an [`Idempotent`] extension (gRPC: put it in the `tonic::Request`'s
//!   extensions); hash key from a header (gRPC metadata are headers), a cookie, the path or the
//!   source address ([`HttpKeySource`]); replayed when the body is a [`ReplayBody`].
//! * [`HttpResponses`]: 5xx is a failure (504 a timeout), as is a failing `grpc-status` in the
//!   headers (trailers-only) or, when tracked to the end, in the trailers. The call ends at the
//!   end of the body stream by default, or at the first frame ([`CompleteAt`]).
//! * Load reports: an ORCA `endpoint-load-metrics` header in the head (when the answer is
//!   completed) or in the trailers (at the end of the body) becomes the endpoint's last report,
//!   which the `adaptive` strategy weighs ([`crate::orca`]).
//! * Deadlines and pushback ([`deadline`], [`propagate_deadline`], [`pushback`]): the caller's
//!   `grpc-timeout` (or a configured header of milliseconds) cuts the call's deadline and the
//!   upstream gets what is left; `429`/`503` with `Retry-After` and `grpc-retry-pushback-ms`
//!   make the endpoint passed over for that long and a retry wait it out.
//! * [`SetOrigin`]: points a request at the endpoint's address (for hyper-util's client).
//! * [`BufferRequest`]: collects a request body into `Full<Bytes>` so it can be replayed.

mod body;
mod buffer;
mod origin;
mod signal;

use std::net::{IpAddr, SocketAddr};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, Method, StatusCode};
use http_body_util::{Empty, Full};
use lbkit_core::{FailureKind, Outcome, Route};
use lbkit_strategy::{AttrHeaders, KeyExtractor, KeySource, TagHeaders};

use crate::completion::Completion;
use crate::policy::{grpc_code_kind, GrpcCodes, RequestPolicy, ResponsePolicy};

pub use body::{CompleteAt, TrackBody};
pub use buffer::{BufferRequest, BufferRequestLayer, DEFAULT_BUFFER_LIMIT};
pub use origin::SetOrigin;
pub use signal::{
    deadline, is_grpc, propagate_deadline, pushback, record_pushback, GrpcKind,
    GRPC_RETRY_PUSHBACK_MS, GRPC_TIMEOUT,
};

/// Request extension marking a request as safe to send again after it reached a server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Idempotent;

/// Request extension with the calling client's IP, for `source-ip` hash keys (a
/// `std::net::SocketAddr` extension is read too).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SourceAddr(pub IpAddr);

/// A request body that can be copied for another attempt.
pub trait ReplayBody: Sized {
    /// A copy of the body, or `None` when it is a stream that cannot be read twice.
    fn replay(&self) -> Option<Self>;
}

macro_rules! replay_by_clone {
    ($($t:ty),*) => {$(
        impl ReplayBody for $t {
            fn replay(&self) -> Option<Self> {
                Some(self.clone())
            }
        }
    )*};
}
replay_by_clone!(String, Bytes, Vec<u8>, &'static str);

impl<D: Clone> ReplayBody for Full<D> {
    fn replay(&self) -> Option<Self> {
        Some(self.clone())
    }
}

impl<D> ReplayBody for Empty<D> {
    fn replay(&self) -> Option<Self> {
        Some(Empty::new())
    }
}

#[cfg(feature = "tonic")]
impl ReplayBody for tonic::body::Body {
    /// A stream: put a [`BufferRequest`] in front of the balance to replay gRPC calls.
    fn replay(&self) -> Option<Self> {
        None
    }
}

/// A copy of `req` with its body replayed (method, URI, version, headers, extensions).
pub fn replay_request<B: ReplayBody>(req: &http::Request<B>) -> Option<http::Request<B>> {
    let mut copy = http::Request::new(req.body().replay()?);
    *copy.method_mut() = req.method().clone();
    *copy.uri_mut() = req.uri().clone();
    *copy.version_mut() = req.version();
    *copy.headers_mut() = req.headers().clone();
    *copy.extensions_mut() = req.extensions().clone();
    Some(copy)
}

/// The [`RequestPolicy`] for `http::Request<B>`.
#[derive(Clone, Debug)]
pub struct HttpRequests {
    key: Option<KeyExtractor>,
    by_method: bool,
    tags: Option<HttpTags>,
    attrs: Option<AttrHeaders>,
    deadlines: bool,
    deadline_header: Option<HeaderName>,
}

impl Default for HttpRequests {
    fn default() -> Self {
        HttpRequests {
            key: None,
            by_method: true,
            tags: Some(HttpTags::new(TagHeaders::default())),
            attrs: None,
            deadlines: true,
            deadline_header: None,
        }
    }
}

/// [`TagHeaders`] with the two header names prepared for `HeaderMap` lookups, for reading the
/// routing tag of `http::Request`s: a lookup by `&str` parses and checks the name on every
/// request (143 instructions a request in the tower layer's profile, BENCHMARKS.md). A name
/// that is no valid header name is never present. [`HttpRequests`] reads tags with it, and so
/// does `lbkit proxy` for HTTP/2 requests.
///
/// ```
/// use lbkit_strategy::TagHeaders;
/// use lbkit_tower::http::HttpTags;
///
/// let tags = HttpTags::new(TagHeaders::default());
/// let req = http::Request::builder().header("dubbo.tag", "gray").body(()).unwrap();
/// let tag = tags.with_tag(&req, |tag| tag.map(|t| (t.name.to_vec(), t.force)));
/// assert_eq!(tag, Some((b"gray".to_vec(), false)));
/// ```
#[derive(Clone, Debug)]
pub struct HttpTags {
    headers: TagHeaders,
    tag: Option<HeaderName>,
    force: Option<HeaderName>,
}

impl HttpTags {
    /// Prepare `headers`' names.
    pub fn new(headers: TagHeaders) -> Self {
        let name = |s: &str| HeaderName::from_bytes(s.as_bytes()).ok();
        HttpTags {
            tag: name(headers.tag_header()),
            force: name(headers.force_header()),
            headers,
        }
    }

    /// The tag headers and their defaults.
    pub fn headers(&self) -> &TagHeaders {
        &self.headers
    }

    /// Call `f` with the routing tag of `req` (as [`TagHeaders::read`] reads it), if any.
    pub fn with_tag<B, R>(
        &self,
        req: &http::Request<B>,
        f: impl FnOnce(Option<lbkit_core::RequestTag<'_>>) -> R,
    ) -> R {
        let source = TagSource {
            req: HttpKeySource::new(req),
            tags: self,
        };
        f(self.headers.read(&source))
    }
}

/// A request as the tag reader sees it: the two tag headers by their prepared names, anything
/// else as [`HttpKeySource`] reads it.
struct TagSource<'a, B> {
    req: HttpKeySource<'a, B>,
    tags: &'a HttpTags,
}

impl<B> KeySource for TagSource<'_, B> {
    fn header(&self, name: &str) -> Option<&[u8]> {
        let prepared = if name == self.tags.headers.tag_header() {
            &self.tags.tag
        } else if name == self.tags.headers.force_header() {
            &self.tags.force
        } else {
            return self.req.header(name);
        };
        let value = self.req.0.headers().get(prepared.as_ref()?)?;
        Some(value.as_bytes())
    }

    fn target(&self) -> Option<&[u8]> {
        self.req.target()
    }

    fn source_ip(&self) -> Option<IpAddr> {
        self.req.source_ip()
    }
}

// === impl HttpRequests ===

impl HttpRequests {
    /// No hash key; idempotent by method or [`Idempotent`] extension.
    pub fn new() -> Self {
        HttpRequests::default()
    }

    /// Take the hash key with `extractor` (`header:x-user-id`, `cookie:sid`, `path`,
    /// `source-ip`).
    pub fn hash_key(mut self, extractor: KeyExtractor) -> Self {
        self.key = Some(extractor);
        self
    }

    /// Whether the method makes a request idempotent (default `true`); the [`Idempotent`]
    /// extension always does.
    pub fn idempotent_by_method(mut self, on: bool) -> Self {
        self.by_method = on;
        self
    }

    /// Read the routing tag with `tags` (default: the `dubbo.tag` and `dubbo.force.tag`
    /// headers, which tonic sends as gRPC metadata; `None` reads no tag, so every request is
    /// untagged and avoids tagged providers). A request's tag picks among the providers with
    /// that tag, as Dubbo's tag router does (`lbkit_core::route`).
    ///
    /// ```
    /// use lbkit_strategy::TagHeaders;
    /// use lbkit_tower::http::HttpRequests;
    /// let requests = HttpRequests::new()
    ///     .tags(Some(TagHeaders::new("x-canary", "x-canary-only").with_default(None, false)));
    /// # let _ = requests;
    /// ```
    pub fn tags(mut self, tags: Option<TagHeaders>) -> Self {
        self.tags = tags.map(HttpTags::new);
        self
    }

    /// Read the request attributes that metadata subsets match on ([`lbkit_core::stage`])
    /// with `attrs` (default: none, so every request takes the subset fallback).
    ///
    /// ```
    /// use lbkit_strategy::AttrHeaders;
    /// use lbkit_tower::http::HttpRequests;
    /// let requests = HttpRequests::new().attributes(AttrHeaders::new([("version", "x-version")]));
    /// # let _ = requests;
    /// ```
    pub fn attributes(mut self, attrs: AttrHeaders) -> Self {
        self.attrs = (!attrs.is_empty()).then_some(attrs);
        self
    }

    /// Also read the caller's deadline from `header` (whole milliseconds, such as
    /// `x-request-timeout`), and tell each attempt's endpoint the time left in it. gRPC's
    /// `grpc-timeout` is read (and rewritten for gRPC requests) either way ([`deadline`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use http::HeaderName;
    /// use lbkit_tower::http::HttpRequests;
    /// use lbkit_tower::RequestPolicy;
    /// let requests = HttpRequests::new().deadline_header(HeaderName::from_static("x-request-timeout"));
    /// let req = http::Request::get("/").header("x-request-timeout", "250").body(String::new()).unwrap();
    /// assert_eq!(requests.deadline(&req), Some(Duration::from_millis(250)));
    /// ```
    pub fn deadline_header(mut self, header: HeaderName) -> Self {
        self.deadline_header = Some(header);
        self
    }

    /// Whether requests carry deadlines at all (default `true`): `false` reads none and tells
    /// the endpoints nothing, saving a header lookup a request.
    pub fn deadlines(mut self, on: bool) -> Self {
        self.deadlines = on;
        self
    }
}

impl<B: ReplayBody + Send + 'static> RequestPolicy<http::Request<B>> for HttpRequests {
    fn with_hash_key<R>(&self, req: &http::Request<B>, pick: impl FnOnce(Option<&[u8]>) -> R) -> R {
        match &self.key {
            None => pick(None),
            Some(k) => pick(k.extract(&HttpKeySource::new(req)).as_deref()),
        }
    }

    fn with_route<R>(&self, req: &http::Request<B>, pick: impl FnOnce(Route<'_>) -> R) -> R {
        match &self.attrs {
            None => self.route_with(req, &[], pick),
            Some(a) => a.with_attrs(&HttpKeySource::new(req), |attrs| {
                self.route_with(req, attrs, pick)
            }),
        }
    }

    fn is_idempotent(&self, req: &http::Request<B>) -> bool {
        req.extensions().get::<Idempotent>().is_some()
            || (self.by_method && is_idempotent_method(req.method()))
    }

    fn replay(&self, req: &http::Request<B>) -> Option<http::Request<B>> {
        replay_request(req)
    }

    fn deadline(&self, req: &http::Request<B>) -> Option<std::time::Duration> {
        if !self.deadlines {
            return None;
        }
        deadline(req.headers(), self.deadline_header.as_ref())
    }

    fn tell_deadline(&self, req: &mut http::Request<B>, left: std::time::Duration) {
        if !self.deadlines {
            return;
        }
        let header = self.deadline_header.as_ref();
        propagate_deadline(req.headers_mut(), left, header);
    }
}

impl HttpRequests {
    /// The route of `req` with its attributes already read: tag, then hash key.
    fn route_with<B: ReplayBody + Send + 'static, R>(
        &self,
        req: &http::Request<B>,
        attrs: &[lbkit_core::stage::Attr<'_>],
        pick: impl FnOnce(Route<'_>) -> R,
    ) -> R {
        match &self.tags {
            Some(tags) => tags.with_tag(req, |tag| {
                self.with_hash_key(req, |key| pick(Route { key, tag, attrs }))
            }),
            None => self.with_hash_key(req, |key| {
                pick(Route {
                    key,
                    tag: None,
                    attrs,
                })
            }),
        }
    }
}

/// RFC 9110 §9.2.2: GET, HEAD, PUT, DELETE, OPTIONS and TRACE (lbkit-core's one list).
pub fn is_idempotent_method(m: &Method) -> bool {
    lbkit_core::http::is_idempotent_method(m.as_str().as_bytes())
}

/// An `http::Request` seen as a [`KeySource`]: headers (first value), cookies (from the first
/// `cookie` header), the request target (path and query, from which the extractor takes
/// `path`, `uri` or `query:NAME`) and the source address ([`SourceAddr`] or `SocketAddr`
/// extension). `lbkit proxy` reads requests the same way, so a key picks the same endpoint
/// through either.
#[derive(Debug)]
pub struct HttpKeySource<'a, B>(&'a http::Request<B>);

impl<'a, B> HttpKeySource<'a, B> {
    /// View `req` as a key source.
    pub fn new(req: &'a http::Request<B>) -> Self {
        HttpKeySource(req)
    }
}

impl<B> KeySource for HttpKeySource<'_, B> {
    fn header(&self, name: &str) -> Option<&[u8]> {
        self.0.headers().get(name).map(|v| v.as_bytes())
    }

    fn target(&self) -> Option<&[u8]> {
        self.0.uri().path_and_query().map(|p| p.as_str().as_bytes())
    }

    fn source_ip(&self) -> Option<IpAddr> {
        let ext = self.0.extensions();
        ext.get::<SourceAddr>()
            .map(|s| s.0)
            .or_else(|| ext.get::<SocketAddr>().map(SocketAddr::ip))
    }
}

/// The [`ResponsePolicy`] for `http::Response<B>` (HTTP and gRPC).
#[derive(Clone, Copy, Debug)]
pub struct HttpResponses {
    complete_at: CompleteAt,
    grpc: GrpcCodes,
}

impl Default for HttpResponses {
    fn default() -> Self {
        HttpResponses {
            complete_at: CompleteAt::EndOfStream,
            grpc: GrpcCodes::DEFAULT,
        }
    }
}

// === impl HttpResponses ===

impl HttpResponses {
    /// Calls end at the end of the body; [`GrpcCodes::DEFAULT`] are failures.
    pub fn new() -> Self {
        HttpResponses::default()
    }

    /// End calls at `at`.
    pub fn complete_at(mut self, at: CompleteAt) -> Self {
        self.complete_at = at;
        self
    }

    /// Count these gRPC codes as failures.
    pub fn grpc_failures(mut self, codes: GrpcCodes) -> Self {
        self.grpc = codes;
        self
    }
}

/// The failure `status` stands for: 5xx, 504 being a timeout; `429` and every other status
/// are answers (lbkit-core's attempt table, the same for every driver).
pub fn status_failure(status: StatusCode) -> Option<FailureKind> {
    lbkit_core::status_failure(status.as_u16())
}

/// The failure a `grpc-status` header or trailer in `headers` stands for, if any.
pub fn grpc_failure(headers: &HeaderMap, codes: GrpcCodes) -> Option<FailureKind> {
    // A prepared name: looking up by `&str` would parse and validate it on every response.
    static GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");
    grpc_status_failure(headers.get(&GRPC_STATUS)?.as_bytes(), codes)
}

/// The outcome of an answer whose head was classified as `head` once its `trailers` arrived:
/// a failing `grpc-status` in them (by `codes`) makes a success a failure; a head that was a
/// failure stays the failure it was (its status spoke first). The one rule for the end of a
/// body, used by [`TrackBody`] and by the proxy for the answers it buffers.
pub fn trailers_outcome(head: Outcome, trailers: &HeaderMap, codes: GrpcCodes) -> Outcome {
    if head != Outcome::Success {
        return head;
    }
    grpc_failure(trailers, codes).map_or(head, Outcome::Failure)
}

/// The failure a `grpc-status` value stands for, if any (a code that is not a number is none).
pub fn grpc_status_failure(value: &[u8], codes: GrpcCodes) -> Option<FailureKind> {
    let code = std::str::from_utf8(value)
        .ok()?
        .trim()
        .parse::<i32>()
        .ok()?;
    grpc_code_kind(code, codes)
}

impl<B> ResponsePolicy<http::Response<B>> for HttpResponses
where
    B: http_body::Body + Send + 'static,
{
    type Output = http::Response<TrackBody<B>>;

    fn classify(&self, resp: &http::Response<B>) -> Outcome {
        lbkit_core::classify_answer(resp.status().as_u16(), || {
            grpc_failure(resp.headers(), self.grpc)
        })
        .outcome
    }

    /// The head's load report (`crate::orca`), for every answer; `Retry-After` on a `429` or
    /// `503` and `grpc-retry-pushback-ms` on a failure (a success other than `429` costs one
    /// comparison).
    fn signals(
        &self,
        resp: &http::Response<B>,
        outcome: Outcome,
        call: &Completion,
    ) -> Option<lbkit_core::signal::Pushback> {
        call.record_load(resp.headers());
        if outcome == Outcome::Success && resp.status() != StatusCode::TOO_MANY_REQUESTS {
            return None;
        }
        let stats = call.endpoint().stats();
        record_pushback(resp.status(), resp.headers(), stats, call.clock())
    }

    fn complete(
        &self,
        resp: http::Response<B>,
        outcome: Outcome,
        call: Completion,
    ) -> Self::Output {
        // The head's load report was noted with the answer's other signals (`signals`).
        resp.map(|b| TrackBody::new(b, call, outcome, self.complete_at, self.grpc))
    }
}

#[cfg(test)]
mod tests;
