//! The upstream call loop of one HTTP request: pick with the service's balancer, send on the
//! pooled client, finish the call's guard with its outcome, and retry on another endpoint.
//!
//! Kept small and in one place on purpose: it is what moves onto `lbkit-tower`'s balance layer
//! once that lands (pick → call → `CallGuard::finish`, retry with a `TriedSet` under a budget).
//!
//! * A 5xx answer, a connect error and a timeout count as failures of the endpoint.
//! * Retried: idempotent methods (GET, HEAD, OPTIONS, PUT, DELETE, TRACE) after a 5xx or an
//!   error, and any method whose attempt failed to connect (the request never left). Each retry
//!   goes to an endpoint not tried yet, at most `retries` of them, and only while the service's
//!   retry budget allows (lbkit's lock-free `RetryBudget`: a share of requests plus a floor per
//!   second).
//! * A request body is replayable when it is empty or, for an idempotent method, announced at
//!   most [`MAX_REPLAY_BODY`] bytes (then it is buffered); any other body is streamed once.
//! * An HTTP/1.1 upgrade to an allowed protocol (WebSocket's handshake) keeps its `Upgrade`
//!   and `Connection: upgrade` for the upstream; its 101 turns both connections into a tunnel
//!   (`tunnel.rs`). The call, for the balancer's statistics, is the handshake.

use std::future::{poll_fn, Future};
use std::net::IpAddr;
use std::pin::{pin, Pin};
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response, StatusCode, Uri, Version};
use http_body::Body as _;
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use lbkit_core::{FailureKind, FastRng, Outcome, PickContext, TriedSet};
use lbkit_strategy::{KeyExtractor, KeySource};

use crate::body::ProxyBody;
use crate::headers;
use crate::service::{Service, UpstreamBody};
use crate::tunnel;

/// Largest request body buffered so that the request can be retried (64 KiB).
pub const MAX_REPLAY_BODY: u64 = 64 * 1024;

/// Largest response body (announced by `Content-Length`) read whole before answering, so that
/// head and body go out in one write, as nginx's `proxy_buffering` does; larger or unannounced
/// bodies stream. 16 KiB: most API answers, and a bounded buffer per request.
pub const MAX_BUFFERED_RESPONSE: u64 = 16 * 1024;

/// What a route adds to the call.
#[derive(Debug)]
pub(crate) struct CallOptions<'a> {
    pub(crate) timeout: Duration,
    pub(crate) hash_key: Option<&'a KeyExtractor>,
    pub(crate) client: std::net::SocketAddr,
}

/// Forward `req` to `service` and return the response for the client.
pub(crate) async fn forward(
    service: &Service,
    mut req: Request<Incoming>,
    opts: CallOptions<'_>,
) -> Response<ProxyBody> {
    let h2c = service.config().h2c;
    let mut upgrade = (!h2c).then(|| tunnel::asked(&mut req)).flatten();
    let (mut parts, body) = req.into_parts();
    let source = Source(&parts, opts.client.ip());
    let key = opts
        .hash_key
        .and_then(|k| k.extract(&source))
        .map(|k| k.into_owned());
    prepare_headers(&mut parts, opts.client);
    if let Some(u) = &upgrade {
        u.ask_upstream(&mut parts.headers);
    }
    let idempotent = is_idempotent(parts.method.as_str().as_bytes());
    let mut body = Some(match replayable(body, idempotent).await {
        Ok(b) => b,
        Err(()) => return local(StatusCode::BAD_REQUEST, "bad request body\n"),
    });
    service.budget().deposit(service.clock().now());
    // One timer for the whole exchange, retries included (registered once, at its first wait).
    let deadline = pin!(tokio::time::sleep(opts.timeout));
    let mut deadline = Deadline(deadline);
    let mut rng = FastRng::from_entropy();
    let mut tried = TriedSet::new();
    let retries = service.config().retries;
    let mut attempt = 0;
    loop {
        let now = service.clock().now();
        let mut cx = PickContext::new(now, &mut rng).with_tried(attempt, &tried);
        if let Some(k) = &key {
            cx = cx.with_key(k);
        }
        let guard = match service.active().balancer.pick(&mut cx) {
            Ok(g) => g,
            Err(e) => return local(StatusCode::SERVICE_UNAVAILABLE, &format!("{e}\n")),
        };
        tried.insert(guard.endpoint());
        let Some(send) = body.take() else {
            return local(StatusCode::BAD_GATEWAY, "upstream failed\n");
        };
        let replay = match &send {
            Either::Left(full) => Some(Either::Left(full.clone())),
            Either::Right(_) => None,
        };
        // The head is moved into the last attempt; earlier ones send a copy.
        let last = attempt >= retries || replay.is_none();
        let address = guard.endpoint().address();
        let upstream = match upstream_request(&mut parts, address, send, h2c, last) {
            Some(r) => r,
            None => return local(StatusCode::BAD_REQUEST, "bad request target\n"),
        };
        let result = deadline.run(service.client().request(upstream)).await;
        let can_retry =
            |connect: bool| attempt < retries && replay.is_some() && (idempotent || connect);
        let failure = match result {
            Ok(Ok(resp)) if resp.status() == StatusCode::SWITCHING_PROTOCOLS => {
                // Only to a protocol the client asked for (hyper's client takes any 101 as an
                // upgrade: the connection is not pooled again either way).
                return match upgrade.take().map(|u| u.accept(resp)) {
                    Some(Ok(answer)) => {
                        guard.finish(Outcome::Success);
                        answer
                    }
                    _ => {
                        guard.finish(Outcome::Failure(FailureKind::Other));
                        local(
                            StatusCode::BAD_GATEWAY,
                            "upstream switched to another protocol\n",
                        )
                    }
                };
            }
            Ok(Ok(resp)) if !resp.status().is_server_error() || !can_retry(false) => {
                let outcome = if resp.status().is_server_error() {
                    Outcome::Failure(FailureKind::Server)
                } else {
                    Outcome::Success
                };
                let (mut rparts, rbody) = resp.into_parts();
                headers::strip_hop_by_hop(&mut rparts.headers);
                let small = rbody
                    .size_hint()
                    .exact()
                    .is_some_and(|n| n <= MAX_BUFFERED_RESPONSE);
                if !small {
                    return Response::from_parts(
                        rparts,
                        ProxyBody::upstream(rbody, guard, outcome),
                    );
                }
                // A small body is read whole, so head and body leave in one write (nginx's
                // proxy_buffering); the call ends with it.
                return match deadline.run(rbody.collect()).await {
                    Ok(Ok(body)) => {
                        guard.finish(outcome);
                        Response::from_parts(rparts, ProxyBody::local(body.to_bytes()))
                    }
                    Ok(Err(_)) => {
                        guard.finish(Outcome::Failure(FailureKind::Other));
                        local(StatusCode::BAD_GATEWAY, "upstream failed\n")
                    }
                    Err(_) => {
                        guard.finish(Outcome::Failure(FailureKind::Timeout));
                        local(StatusCode::GATEWAY_TIMEOUT, "upstream timed out\n")
                    }
                };
            }
            Ok(Ok(_)) => FailureKind::Server,
            Ok(Err(e)) if e.is_connect() => FailureKind::Connect,
            Ok(Err(_)) => FailureKind::Other,
            Err(_) => FailureKind::Timeout,
        };
        guard.finish(Outcome::Failure(failure));
        if let Retry::Answer(status, text) =
            after_failure(service, failure, can_retry(failure == FailureKind::Connect))
        {
            return local(status, text);
        }
        body = replay;
        attempt += 1;
    }
}

/// What follows a failed attempt.
#[derive(Debug)]
pub(crate) enum Retry {
    /// Try another endpoint.
    Again,
    /// Answer the client with this status and text.
    Answer(StatusCode, &'static str),
}

/// Decide on a failed attempt (whose guard is finished): retry when `retryable` (by method,
/// attempts left and a body that can be sent again), the failure is not the deadline, and the
/// service's retry budget allows; count the retry or the refusal.
pub(crate) fn after_failure(service: &Service, failure: FailureKind, retryable: bool) -> Retry {
    let status = if failure == FailureKind::Timeout {
        StatusCode::GATEWAY_TIMEOUT
    } else {
        StatusCode::BAD_GATEWAY
    };
    if failure == FailureKind::Timeout || !retryable {
        return Retry::Answer(status, "upstream failed\n");
    }
    if !service.budget().withdraw(service.clock().now()) {
        service.metrics().retry_refused();
        return Retry::Answer(status, "upstream failed (retry budget exhausted)\n");
    }
    service.metrics().retried();
    Retry::Again
}

/// The exchange's deadline: `run` gives `Err(())` when it passes first.
struct Deadline<'a>(Pin<&'a mut tokio::time::Sleep>);

impl Deadline<'_> {
    async fn run<F: Future>(&mut self, fut: F) -> Result<F::Output, ()> {
        let mut fut = pin!(fut);
        poll_fn(|cx| {
            if let Poll::Ready(out) = fut.as_mut().poll(cx) {
                return Poll::Ready(Ok(out));
            }
            self.0.as_mut().poll(cx).map(Err)
        })
        .await
    }
}

/// A proxy-made response.
pub(crate) fn local(status: StatusCode, text: &str) -> Response<ProxyBody> {
    let mut resp = Response::new(ProxyBody::local(Bytes::copy_from_slice(text.as_bytes())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// GET, HEAD, OPTIONS, PUT, DELETE, TRACE (RFC 9110 §9.2.2), by the method's name.
pub(crate) fn is_idempotent(method: &[u8]) -> bool {
    matches!(
        method,
        b"GET" | b"HEAD" | b"OPTIONS" | b"PUT" | b"DELETE" | b"TRACE"
    )
}

/// The body as a replayable buffer when it is empty or small enough (and worth it), else the
/// stream as it came.
async fn replayable(body: Incoming, idempotent: bool) -> Result<UpstreamBody, ()> {
    if body.is_end_stream() {
        return Ok(Either::Left(Full::new(Bytes::new())));
    }
    let small = body
        .size_hint()
        .upper()
        .is_some_and(|n| n <= MAX_REPLAY_BODY);
    if !(idempotent && small) {
        return Ok(Either::Right(body));
    }
    let bytes = body.collect().await.map_err(|_| ())?.to_bytes();
    Ok(Either::Left(Full::new(bytes)))
}

/// Forwarding headers, hop-by-hop removal, and a `Host` for HTTP/2 clients (which send
/// `:authority` instead).
fn prepare_headers(parts: &mut Parts, client: std::net::SocketAddr) {
    headers::strip_hop_by_hop(&mut parts.headers);
    if !parts.headers.contains_key(http::header::HOST) {
        if let Some(v) = parts
            .uri
            .authority()
            .and_then(|a| http::HeaderValue::from_str(a.as_str()).ok())
        {
            parts.headers.insert(http::header::HOST, v);
        }
    }
    headers::add_forwarded(&mut parts.headers, client);
}

/// The request for one attempt; the head is moved out of `parts` when `last`.
fn upstream_request(
    parts: &mut Parts,
    address: &str,
    body: UpstreamBody,
    h2c: bool,
    last: bool,
) -> Option<Request<UpstreamBody>> {
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let uri = Uri::builder()
        .scheme("http")
        .authority(address)
        .path_and_query(path)
        .build()
        .ok()?;
    let mut req = Request::new(body);
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = uri;
    *req.version_mut() = if h2c {
        Version::HTTP_2
    } else {
        Version::HTTP_11
    };
    *req.headers_mut() = if last {
        std::mem::take(&mut parts.headers)
    } else {
        parts.headers.clone()
    };
    Some(req)
}

/// What a hash key can be read from: the request head and the client's address.
struct Source<'a>(&'a Parts, IpAddr);

impl KeySource for Source<'_> {
    fn header(&self, name: &str) -> Option<&[u8]> {
        self.0.headers.get(name).map(|v| v.as_bytes())
    }

    fn path(&self) -> Option<&[u8]> {
        Some(self.0.uri.path().as_bytes())
    }

    fn source_ip(&self) -> Option<IpAddr> {
        Some(self.1)
    }
}
