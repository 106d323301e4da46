//! The upstream call loop of one HTTP request on hyper's engine: pick with the service's
//! balancer, send on the pooled client, finish the call's guard with its outcome, and retry on
//! another endpoint. The rules — which results count against the endpoint, which are retried,
//! the tried set, the retry budget, the per-attempt and overall deadlines — are lbkit-core's
//! [`Attempts`] (its module docs have the table); the fast path (`h1/`) and the TCP relay
//! drive the same state machine.
//!
//! * A request body is replayable when it is empty or, for an idempotent method, announced at
//!   most [`MAX_REPLAY_BODY`] bytes (then it is buffered); any other body is streamed once.
//! * An HTTP/1.1 upgrade to an allowed protocol (WebSocket's handshake) keeps its `Upgrade`
//!   and `Connection: upgrade` for the upstream; its 101 turns both connections into a tunnel
//!   (`tunnel.rs`). The call, for the balancer's statistics, is the handshake.

use std::borrow::Cow;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response, StatusCode, Uri, Version};
use http_body::Body as _;
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use lbkit_core::http::is_idempotent_method;
use lbkit_core::{AttemptPolicy, Attempts, CallGuard, FastRng, Next, Observed, Stop};
use lbkit_strategy::KeyExtractor;
use lbkit_tower::http::{HttpKeySource, SourceAddr};

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
    pub(crate) policy: AttemptPolicy,
    pub(crate) hash_key: Option<&'a KeyExtractor>,
    pub(crate) client: std::net::SocketAddr,
}

/// What one attempt gave, before the decision.
enum Tried {
    /// An answer (its head): relayed unless it is retried.
    Answer(Response<Incoming>),
    /// No answer.
    Failed(Observed),
}

/// Forward `req` to `service` and return the response for the client.
pub(crate) async fn forward(
    service: &Service,
    mut req: Request<Incoming>,
    opts: CallOptions<'_>,
) -> Response<ProxyBody> {
    let h2c = service.config().h2c;
    let mut upgrade = (!h2c).then(|| tunnel::asked(&mut req)).flatten();
    let key = hash_key(&mut req, opts.hash_key, opts.client);
    let (mut parts, body) = req.into_parts();
    prepare_headers(&mut parts, opts.client);
    if let Some(u) = &upgrade {
        u.ask_upstream(&mut parts.headers);
    }
    let idempotent = is_idempotent_method(parts.method.as_str().as_bytes());
    let mut body = match replayable(body, idempotent).await {
        Ok(b) => b,
        Err(()) => return local(StatusCode::BAD_REQUEST, "bad request body\n"),
    };
    let clock = service.clock();
    let replay = matches!(body, Either::Left(_));
    let mut attempts = Attempts::start(
        opts.policy,
        service.budget(),
        idempotent,
        replay,
        clock.now(),
    );
    let mut rng = FastRng::from_entropy();
    let mut guard = match attempts.pick(
        &service.active().balancer,
        attempts.started(),
        key.as_deref(),
        &mut rng,
    ) {
        Ok(g) => g,
        Err(e) => return local(StatusCode::SERVICE_UNAVAILABLE, &format!("{e}\n")),
    };
    loop {
        let copy = match &body {
            Either::Left(full) => Some(Either::Left(full.clone())),
            Either::Right(_) => None,
        };
        let send = std::mem::replace(&mut body, Either::Left(Full::new(Bytes::new())));
        // The head is moved into the last attempt; earlier ones send a copy.
        let last = attempts.begun() > attempts.policy().retries || copy.is_none();
        let address = guard.endpoint().address();
        let Some(upstream) = upstream_request(&mut parts, address, send, h2c, last) else {
            return local(StatusCode::BAD_REQUEST, "bad request target\n");
        };
        let limit = attempts.timeout(clock.now()).unwrap_or(Duration::MAX);
        let tried = match tokio::time::timeout(limit, service.client().request(upstream)).await {
            Ok(Ok(resp)) if resp.status() == StatusCode::SWITCHING_PROTOCOLS => {
                return switch(upgrade.take(), resp, guard);
            }
            Ok(Ok(resp)) => Tried::Answer(resp),
            Ok(Err(e)) if e.is_connect() => Tried::Failed(Observed::ConnectFailed),
            Ok(Err(_)) => Tried::Failed(Observed::ResetBeforeResponse),
            Err(_) => Tried::Failed(Observed::Timeout),
        };
        let c = match &tried {
            Tried::Answer(resp) => Observed::Status(resp.status().as_u16()),
            Tried::Failed(o) => *o,
        }
        .classify();
        let stop = match attempts.after(c, service.budget(), clock) {
            Next::Retry => {
                let now = clock.now();
                match attempts.pick(&service.active().balancer, now, key.as_deref(), &mut rng) {
                    Ok(next) => {
                        service.metrics().retried();
                        guard.finish_at(c.outcome, now);
                        guard = next;
                        body = copy.unwrap_or(body);
                        continue;
                    }
                    // Only endpoints tried already: this attempt's result is the answer.
                    Err(_) => Stop::Final,
                }
            }
            Next::Answer(stop) => stop,
        };
        let exhausted = stop == Stop::BudgetExhausted;
        if exhausted {
            service.metrics().retry_refused();
        }
        return match tried {
            Tried::Answer(resp) => {
                let limit = attempts.timeout(clock.now());
                relay(resp, guard, clock, c.outcome, limit).await
            }
            Tried::Failed(observed) => {
                guard.finish(c.outcome);
                let status = if observed == Observed::Timeout {
                    StatusCode::GATEWAY_TIMEOUT
                } else {
                    StatusCode::BAD_GATEWAY
                };
                if exhausted {
                    local(status, "upstream failed (retry budget exhausted)\n")
                } else {
                    local(status, "upstream failed\n")
                }
            }
        };
    }
}

/// The request's hash key, read from it as the tower layer reads it (`lbkit_tower::http`).
fn hash_key(
    req: &mut Request<Incoming>,
    extractor: Option<&KeyExtractor>,
    client: std::net::SocketAddr,
) -> Option<Vec<u8>> {
    let extractor = extractor?;
    if *extractor == KeyExtractor::SourceIp {
        req.extensions_mut().insert(SourceAddr(client.ip()));
    }
    extractor
        .extract(&HttpKeySource::new(&*req))
        .map(Cow::into_owned)
}

/// A 101 answer: the tunnel, if the client asked for this protocol (hyper's client takes any
/// 101 as an upgrade: the connection is not pooled again either way).
fn switch(
    upgrade: Option<tunnel::Ask>,
    resp: Response<Incoming>,
    guard: CallGuard,
) -> Response<ProxyBody> {
    match upgrade.map(|u| u.accept(resp)) {
        Some(Ok(answer)) => {
            guard.finish(Observed::Status(101).classify().outcome);
            answer
        }
        _ => {
            guard.finish(Observed::ResetBeforeResponse.classify().outcome);
            local(
                StatusCode::BAD_GATEWAY,
                "upstream switched to another protocol\n",
            )
        }
    }
}

/// The upstream's answer for the client, the call ending with its body (`outcome` unless the
/// body breaks). A small body is read whole within `limit`, so head and body leave in one write
/// (nginx's proxy_buffering).
async fn relay(
    resp: Response<Incoming>,
    guard: CallGuard,
    clock: &lbkit_core::Clock,
    outcome: lbkit_core::Outcome,
    limit: Option<Duration>,
) -> Response<ProxyBody> {
    let (mut rparts, rbody) = resp.into_parts();
    headers::strip_hop_by_hop(&mut rparts.headers);
    let small = rbody
        .size_hint()
        .exact()
        .is_some_and(|n| n <= MAX_BUFFERED_RESPONSE);
    if !small {
        let body = ProxyBody::upstream(rbody, guard, clock.clone(), outcome);
        return Response::from_parts(rparts, body);
    }
    let limit = limit.unwrap_or(Duration::MAX);
    match tokio::time::timeout(limit, rbody.collect()).await {
        Ok(Ok(body)) => {
            guard.finish(outcome);
            Response::from_parts(rparts, ProxyBody::local(body.to_bytes()))
        }
        Ok(Err(_)) => {
            guard.finish(Observed::ResetBeforeResponse.classify().outcome);
            local(StatusCode::BAD_GATEWAY, "upstream failed\n")
        }
        Err(_) => {
            guard.finish(Observed::Timeout.classify().outcome);
            local(StatusCode::GATEWAY_TIMEOUT, "upstream timed out\n")
        }
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
