//! The upstream call loop of one HTTP request on hyper's engine: pick with the service's
//! balancer, send on the pooled client, finish the call's guard with its outcome, and retry on
//! another endpoint. The rules — which results count against the endpoint, which are retried,
//! the tried set, the retry budget, the per-attempt and overall deadlines — are lbkit-core's
//! [`Attempts`] (its module docs have the table); the fast path (`h1/`) and the TCP relay
//! drive the same state machine.
//!
//! * A request body announced at most [`MAX_REPLAY_BODY`] bytes is buffered before the first
//!   attempt (within the route's timeout, as the fast path does). Any other body (one without
//!   a length, as gRPC clients send, or a longer one) streams to the first attempt, watched
//!   and kept up to the same bound ([`ClientBody`], Envoy's retry buffer): a failed attempt
//!   hands it back, and the next attempt sends the kept bytes again, then the rest. A body
//!   that outgrew the bound is not retried. A connect failure is retried for every method,
//!   since nothing reached the upstream.
//! * A failure the client caused is the client's: a body that breaks (malformed framing, an
//!   aborted upload) is answered 400, one still uploading when the attempt times out 408, and
//!   the call is a cancellation, never the endpoint's failure (so a slow or broken client
//!   cannot get a healthy endpoint ejected).
//! * An HTTP/1.1 upgrade to an allowed protocol (WebSocket's handshake) keeps its `Upgrade`
//!   and `Connection: upgrade` for the upstream; its 101 turns both connections into a tunnel
//!   (`tunnel.rs`). The call, for the balancer's statistics, is the handshake.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::request::Parts;
use http::uri::{PathAndQuery, Scheme};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body::Body as _;
use http_body_util::{BodyExt, Either, Full};
use lbkit_core::http::is_idempotent_method;
use lbkit_core::signal::Pushback;
use lbkit_core::stage::Attr;
use lbkit_core::{
    classify_answer, Attempts, CallGuard, Classified, Clock, FastRng, Observed, Outcome,
    RequestTagBuf, RetryWhen, Route, Stop, Timestamp,
};
use lbkit_strategy::attrs::{attr_buf, MAX_ATTRS};
use lbkit_strategy::KeyExtractor;
use lbkit_tower::http::{
    deadline, grpc_failure, propagate_deadline, record_pushback, trailers_outcome, GrpcKind,
    HttpKeySource, SourceAddr,
};
use lbkit_tower::orca;
use lbkit_tower::policy::GrpcCodes;

use crate::body::{
    BodyError, ClientBody, Inbound, ProxyBody, Reclaim, Upload, UploadState, UpstreamAnswer,
};
use crate::envelope::{failure_answer, Envelope, MAX_BUFFERED_RESPONSE, MAX_REPLAY_BODY};
use crate::headers;
use crate::hub::Hub;
use crate::request::{self, Refused};
use crate::service::{Service, UpstreamBody};
use crate::tunnel;

/// One request on hyper's engine or the HTTP/2 server: admitted (`Host`, the normalised path;
/// `request.rs`), routed, then forwarded inside the request's envelope. Also gives the route's
/// timeout (`None` without a route), which bounds each wait of the answer for the client's
/// flow-control window on HTTP/2.
pub(crate) async fn serve(
    hub: &Hub,
    peer: SocketAddr,
    mut req: Request<Inbound>,
) -> (Response<ProxyBody>, Option<Duration>) {
    let state = hub.state.load_full();
    let refused = |r: Refused| (local(StatusCode::BAD_REQUEST, r.text()), None);
    // Routing and the upstream see the normalised path.
    let (host, path) = match request::admit(&req) {
        Ok((host, path)) => (host.map(str::to_owned), path),
        Err(r) => return refused(r),
    };
    if let Some(p) = &path {
        let Some(uri) = request::with_path(req.uri(), p) else {
            return refused(Refused::Path);
        };
        *req.uri_mut() = uri;
    }
    let Some(route) = state.route(host.as_deref(), req.uri().path()) else {
        return (local(StatusCode::NOT_FOUND, "no route\n"), None);
    };
    let envelope = Envelope::open(route);
    // gRPC-web callers get their own content type back on a local answer.
    let grpc = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| GrpcKind::of(v.as_bytes()));
    let resp = forward(&envelope, req, peer).await;
    envelope.close(resp.status().as_u16(), None);
    let resp = match grpc {
        Some(kind) => grpc_local(resp, kind.content_type()),
        None => resp,
    };
    (resp, route.policy.overall)
}

/// What one attempt gave: the answer (its head, with a small body read whole), or no answer.
type Tried = Result<Response<Answer>, Observed>;

/// An upstream answer's body: streamed to the client as it comes, or, when it is small (an
/// exact length of at most [`MAX_BUFFERED_RESPONSE`]), read whole within the attempt, so that
/// one that breaks or stalls before its end is the attempt's failure, retried by the attempt
/// table's rule as the HTTP/1.1 fast path does, and head and body leave in one write (nginx's
/// proxy_buffering).
enum Answer {
    Streamed(UpstreamAnswer),
    Whole(http_body_util::Collected<Bytes>),
}

/// The answer `resp`, its body read whole within `limit` when it is small: a body that breaks
/// is a reset before the response, one that does not end in time a timeout.
async fn read_small(
    resp: Response<UpstreamAnswer>,
    deadline: Option<tokio::time::Instant>,
) -> Tried {
    let small = resp
        .body()
        .size_hint()
        .exact()
        .is_some_and(|n| n <= MAX_BUFFERED_RESPONSE);
    if !small {
        return Ok(resp.map(Answer::Streamed));
    }
    let (parts, body) = resp.into_parts();
    match within(deadline, body.collect()).await {
        Some(Ok(whole)) => Ok(Response::from_parts(parts, Answer::Whole(whole))),
        Some(Err(_)) => Err(Observed::ResetBeforeResponse),
        None => Err(Observed::Timeout),
    }
}

/// Forward `req` from `client` on its route (`envelope`) and return the response for the
/// client.
async fn forward(
    envelope: &Envelope<'_>,
    req: Request<Inbound>,
    client: SocketAddr,
) -> Response<ProxyBody> {
    let service = envelope.service();
    let mut out = match Outgoing::read(service, req, envelope, client).await {
        Ok(out) => out,
        Err(resp) => return resp,
    };
    let (policy, started) = (envelope.route().policy, envelope.started());
    // A streamed body is replayable until it outgrows the bound (checked before each retry).
    let mut attempts = Attempts::start(policy, service.budget(), out.idempotent, true, started);
    if let Some(d) = out.deadline {
        attempts.limit(d);
    }
    // One clock read for the check and the first attempt's limit.
    let mut now = service.clock().now();
    if attempts.deadline_passed(now) {
        return local(StatusCode::GATEWAY_TIMEOUT, "deadline exceeded\n");
    }
    let mut rng = FastRng::from_entropy();
    let mut guard = match service.pick(&mut attempts, started, out.route(&mut attr_buf()), &mut rng)
    {
        Ok(g) => g,
        Err(e) => return local(StatusCode::SERVICE_UNAVAILABLE, &format!("{e}\n")),
    };
    loop {
        let next = attempt(envelope, &mut out, &mut attempts, guard, &mut rng, now);
        let (tried, g) = match next.await {
            Ok(tried) => tried,
            Err(early) => return early,
        };
        guard = g;
        let c = match &tried {
            Ok(resp) => classify_head(resp.status(), resp.headers()),
            Err(observed) => observed.classify(),
        };
        if retries(c, &out) && out.reclaim.is_some() {
            let left = attempts.timeout(service.clock().now());
            let back = out.reclaim(left.map_or(RECLAIM_WAIT, |l| l.min(RECLAIM_WAIT)));
            attempts.set_replayable(back.await);
        }
        // Its latency ends when its answer came, not after a pushback's wait.
        let answered = service.clock().now();
        service.wait_pushback(&mut attempts, c).await;
        match service.retry(&mut attempts, c, out.route(&mut attr_buf()), &mut rng) {
            Ok((next, _)) => {
                guard.finish_at(c.outcome, answered);
                guard = next;
                now = service.clock().now();
            }
            Err(stop) => return answer(service, tried, guard, c.outcome, stop),
        }
    }
}

/// The call's next attempt on `guard`'s endpoint, starting `now`: hedged when the route hedges
/// it ([`hedged`]), else [`one`]. Not an `async fn`, which would add a level of state that
/// each call moves.
fn attempt<'a>(
    envelope: &'a Envelope<'_>,
    out: &'a mut Outgoing,
    attempts: &'a mut Attempts,
    guard: CallGuard,
    rng: &'a mut FastRng,
    now: Timestamp,
) -> impl std::future::Future<Output = Result<(Tried, CallGuard), Response<ProxyBody>>> + 'a {
    use futures_util::future::Either;
    let service = envelope.service();
    match hedge_delay(envelope, out, attempts) {
        // Boxed: a race of two exchanges is the largest state of a call, and most calls do not
        // hedge (they would all carry its size).
        Some(delay) => Either::Left(Box::pin(hedged(service, out, attempts, guard, rng, delay))),
        None => Either::Right(one(service, out, attempts, guard, now)),
    }
}

/// Whether an answer classified `c` may be retried by its retry rule (an idempotent request's
/// only, or any).
fn retries(c: Classified, out: &Outgoing) -> bool {
    match c.retry {
        RetryWhen::Never => false,
        RetryWhen::Idempotent => out.idempotent,
        RetryWhen::Always => true,
    }
}

/// One attempt of the call on `guard`'s endpoint, starting `now`: what it gave, or the call's
/// answer when it ends here (an upgrade's `101`, a fault of the client's, a target that cannot
/// be sent).
async fn one(
    service: &Service,
    out: &mut Outgoing,
    attempts: &mut Attempts,
    guard: CallGuard,
    now: Timestamp,
) -> Result<(Tried, CallGuard), Response<ProxyBody>> {
    let last = attempts.begun() > attempts.policy().retries;
    let Some(upstream) = out.request(guard.endpoint().address(), last) else {
        return Err(local(StatusCode::BAD_REQUEST, "bad request target\n"));
    };
    let limit = attempts.timeout(now);
    let deadline = limit.map(|l| tokio::time::Instant::now() + l);
    let upstream = out.tell_deadline(upstream, limit, service);
    let tried = match send(service, upstream, deadline).await {
        Ok(resp) if resp.status() == StatusCode::SWITCHING_PROTOCOLS => {
            return Err(switch(out.upgrade.take(), resp, guard));
        }
        Ok(resp) => {
            if let Some(p) = noted(service, &resp, guard.endpoint()) {
                attempts.pushed_back(p);
            }
            // The body of a small answer is read within what is left of the attempt's limit
            // (one timer for head and body, as on the fast path); a failure then is the
            // endpoint's, never the client's upload's.
            read_small(resp, deadline).await
        }
        Err(observed) => match client_fault(observed, out.upload.as_ref()) {
            Some(fault) => {
                guard.finish(Observed::ClientGone.classify().outcome);
                return Err(fault);
            }
            None => Err(observed),
        },
    };
    Ok((tried, guard))
}

/// An answer's load report and pushback, recorded against `endpoint`; the pushback, for the
/// call's attempts.
fn noted(
    service: &Service,
    resp: &Response<UpstreamAnswer>,
    endpoint: &lbkit_core::Endpoint,
) -> Option<Pushback> {
    orca::record(resp.headers(), endpoint.stats(), service.clock());
    record_pushback(
        resp.status(),
        resp.headers(),
        endpoint.stats(),
        service.clock(),
    )
}

/// When the call's first attempt is hedged: on a route that hedges (`hedge`), for an
/// idempotent request with a buffered body and no upgrade, while `Attempts` allows a hedge and
/// the delay is known.
fn hedge_delay(envelope: &Envelope<'_>, out: &Outgoing, attempts: &Attempts) -> Option<Duration> {
    let timer = envelope.route().hedge.as_ref()?;
    let buffered = matches!(out.body, Either::Left(_)) && out.upgrade.is_none();
    let service = envelope.service();
    let now = service.clock().now();
    if !(out.idempotent && buffered && attempts.begun() == 1 && attempts.may_hedge(now)) {
        return None;
    }
    timer.delay_at(now, || service.active().balancer.snapshot())
}

/// The first attempt on `first`, raced after `delay` without an answer by a hedge on an
/// endpoint not tried yet (lbkit-core's `hedge`): the first answer that is not a failure wins
/// and the other attempt is cancelled (not its endpoint's failure); a failure waits for the
/// other attempt. What the deciding attempt gave, and its guard; `Err` is the call's answer
/// when the request cannot be sent (a bad target, as in [`one`]).
async fn hedged(
    service: &Service,
    out: &mut Outgoing,
    attempts: &mut Attempts,
    first: CallGuard,
    rng: &mut FastRng,
    delay: Duration,
) -> Result<(Tried, CallGuard), Response<ProxyBody>> {
    let Some(req) = out.request(first.endpoint().address(), false) else {
        return Err(local(StatusCode::BAD_REQUEST, "bad request target\n"));
    };
    let a = exchange(service, out, attempts, req, first.endpoint());
    tokio::pin!(a);
    let (second, req) = tokio::select! {
        r = &mut a => return Ok(settle(attempts, r, first)),
        () = tokio::time::sleep(delay) => match service.hedge(attempts, out.route(&mut attr_buf()), rng) {
            Ok(second) => match out.request(second.endpoint().address(), false) {
                Some(req) => (second, req),
                None => {
                    // An address the request cannot go to: no hedge after all.
                    second.finish(Outcome::Cancelled);
                    return Ok(settle(attempts, a.await, first));
                }
            },
            Err(_) => return Ok(settle(attempts, a.await, first)),
        },
    };
    let b = exchange(service, out, attempts, req, second.endpoint());
    tokio::pin!(b);
    Ok(tokio::select! {
        r = &mut a => finish_race(attempts, r, first, second, b).await,
        r = &mut b => finish_race(attempts, r, second, first, a).await,
    })
}

/// One exchange of a hedged call with `endpoint`: `upstream` told its time left (at the start),
/// sent, its answer's signals noted, a small body read whole.
fn exchange<'s>(
    service: &'s Service,
    out: &Outgoing,
    attempts: &Attempts,
    upstream: Request<UpstreamBody>,
    endpoint: &lbkit_core::Endpoint,
) -> impl std::future::Future<Output = (Tried, Option<Pushback>)> + 's {
    let limit = attempts.timeout(service.clock().now());
    let upstream = out.tell_deadline(upstream, limit, service);
    let endpoint = endpoint.clone();
    async move {
        let deadline = limit.map(|l| tokio::time::Instant::now() + l);
        match send(service, upstream, deadline).await {
            Ok(resp) => {
                let p = noted(service, &resp, &endpoint);
                (read_small(resp, deadline).await, p)
            }
            Err(observed) => (Err(observed), None),
        }
    }
}

/// The race after one attempt (`won`, its result `r`) answered first: an answer that is no
/// failure wins and `other` is cancelled; a failure is recorded and the other attempt (`rest`)
/// decides.
async fn finish_race<F>(
    attempts: &mut Attempts,
    r: (Tried, Option<Pushback>),
    won: CallGuard,
    other: CallGuard,
    rest: std::pin::Pin<&mut F>,
) -> (Tried, CallGuard)
where
    F: std::future::Future<Output = (Tried, Option<Pushback>)>,
{
    let c = match &r.0 {
        Ok(resp) => classify_head(resp.status(), resp.headers()),
        Err(observed) => observed.classify(),
    };
    if !c.is_failure() {
        other.finish(Outcome::Cancelled);
        return settle(attempts, r, won);
    }
    won.finish(c.outcome);
    // Its pushback holds for a retry after the race too (with the other's, the stronger).
    if let Some(p) = r.1 {
        attempts.pushed_back(p);
    }
    let r = rest.await;
    settle(attempts, r, other)
}

/// The deciding attempt's result, its pushback given to the call's attempts.
fn settle(
    attempts: &mut Attempts,
    (tried, pushback): (Tried, Option<Pushback>),
    guard: CallGuard,
) -> (Tried, CallGuard) {
    if let Some(p) = pushback {
        attempts.pushed_back(p);
    }
    (tried, guard)
}

/// The call's answer after its last attempt (`tried`, recorded as `outcome`), which stopped
/// for `stop`: the upstream's answer relayed, or the proxy's when there was none.
fn answer(
    service: &Service,
    tried: Tried,
    guard: CallGuard,
    outcome: Outcome,
    stop: Stop,
) -> Response<ProxyBody> {
    match tried {
        Ok(resp) => relay(resp, guard, service.clock(), outcome),
        Err(observed) => {
            guard.finish(outcome);
            let (code, text) = failure_answer(observed, stop);
            let code = StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_GATEWAY);
            local(code, text)
        }
    }
}

/// The answer when an attempt failed because of the client, not the endpoint: its upload broke
/// (malformed framing, or it went away mid-body: 400), or the attempt timed out while the
/// upload was still coming (too slow a client: 408, as nginx's `client_body_timeout`).
fn client_fault(observed: Observed, upload: Option<&UploadState>) -> Option<Response<ProxyBody>> {
    let upload = upload?;
    match (upload.get(), observed) {
        (Upload::Broken, _) => Some(local(StatusCode::BAD_REQUEST, "bad request body\n")),
        (Upload::Streaming, Observed::Timeout) => Some(local(
            StatusCode::REQUEST_TIMEOUT,
            "request body too slow\n",
        )),
        _ => None,
    }
}

/// How long a retry waits for the failed attempt to let go of a streamed body (a refused
/// connection drops it at once; a reset stream as soon as the task sending it sees the reset).
const RECLAIM_WAIT: Duration = Duration::from_secs(1);

/// One attempt: `upstream` on the service's client of this thread (h2c's or the pooled
/// HTTP/1.1 one), until `deadline`. Not an `async fn`, which would keep `upstream` twice.
fn send<'s>(
    service: &'s Service,
    upstream: Request<UpstreamBody>,
    deadline: Option<tokio::time::Instant>,
) -> impl std::future::Future<Output = Result<Response<UpstreamAnswer>, Observed>> + 's {
    use futures_util::future::{Either as Which, FutureExt};
    if service.config().h2c {
        let asked = within(deadline, service.h2c().request(upstream));
        return Which::Left(asked.map(|answered| match answered {
            Some(Ok(resp)) => Ok(resp.map(Either::Right)),
            Some(Err(observed)) => Err(observed),
            None => Err(Observed::Timeout),
        }));
    }
    let asked = within(deadline, service.client().request(upstream));
    Which::Right(asked.map(|answered| match answered {
        Some(Ok(resp)) => Ok(resp.map(Either::Left)),
        Some(Err(e)) if e.is_connect() => Err(Observed::ConnectFailed),
        Some(Err(_)) => Err(Observed::ResetBeforeResponse),
        None => Err(Observed::Timeout),
    }))
}

/// `fut`, unless `deadline` comes first (`None`: no limit, and no timer). Not an `async fn`:
/// one would keep `fut` twice in its state (as its argument and inside the timeout).
fn within<F: std::future::Future>(
    deadline: Option<tokio::time::Instant>,
    fut: F,
) -> impl std::future::Future<Output = Option<F::Output>> {
    use futures_util::future::{Either, FutureExt};
    match deadline {
        Some(at) => Either::Left(tokio::time::timeout_at(at, fut).map(Result::ok)),
        None => Either::Right(fut.map(Some)),
    }
}

/// The request as it goes upstream, read from the client's: its head (forwarding headers
/// added, hop-by-hop ones removed), its body (buffered when it can be replayed), its hash key
/// and the upgrade it asks for.
struct Outgoing {
    parts: Parts,
    body: UpstreamBody,
    /// How far a streamed body got (`None` for a buffered one).
    upload: Option<UploadState>,
    /// A streamed body, once the attempt sending it has failed (`None` for a buffered one).
    reclaim: Option<Reclaim>,
    key: Option<Vec<u8>>,
    /// The request's routing tag.
    tag: Option<RequestTagBuf>,
    /// The request's attributes, for metadata subsets.
    attrs: lbkit_strategy::OwnedAttrs,
    upgrade: Option<tunnel::Ask>,
    idempotent: bool,
    h2c: bool,
    /// The caller's deadline (`grpc-timeout`, the service's `deadline_header`), from the start.
    deadline: Option<Duration>,
}

impl Outgoing {
    /// Read `req`; `Err` is the answer to a request whose body broke.
    async fn read(
        service: &Service,
        mut req: Request<Inbound>,
        envelope: &Envelope<'_>,
        client: SocketAddr,
    ) -> Result<Outgoing, Response<ProxyBody>> {
        let h2c = service.config().h2c;
        let upgrade = (!h2c).then(|| tunnel::asked(&mut req)).flatten();
        let key = hash_key(&mut req, envelope.route().hash_key.as_ref(), client);
        let tag = service
            .tags()
            .with_tag(&req, |tag| tag.map(RequestTagBuf::from));
        let attrs = service
            .attrs()
            .read_owned(&lbkit_tower::http::HttpKeySource::new(&req));
        let (mut parts, body) = req.into_parts();
        prepare_headers(&mut parts, client, h2c, service.config().forwarded_headers);
        if let Some(u) = &upgrade {
            u.ask_upstream(&mut parts.headers);
        }
        let idempotent = is_idempotent_method(parts.method.as_str().as_bytes());
        let deadline = deadline(&parts.headers, service.deadline_header());
        let route_limit = envelope.route().policy.overall.unwrap_or(Duration::MAX);
        let limit = deadline.map_or(route_limit, |d| d.min(route_limit));
        let (body, upload, reclaim) = replayable(body, limit).await?;
        Ok(Outgoing {
            parts,
            body,
            upload,
            reclaim,
            key,
            tag,
            attrs,
            upgrade,
            idempotent,
            h2c,
            deadline,
        })
    }

    /// `upstream` telling the endpoint how long it has (`limit`, this attempt's time left), in
    /// the deadline headers the caller sent (`grpc-timeout`, the service's `deadline_header`).
    fn tell_deadline(
        &self,
        mut upstream: Request<UpstreamBody>,
        limit: Option<Duration>,
        service: &Service,
    ) -> Request<UpstreamBody> {
        if let Some(left) = limit {
            let header = service.deadline_header();
            propagate_deadline(upstream.headers_mut(), left, header);
        }
        upstream
    }

    /// The request's hash key, routing tag and attributes (viewed through `view`).
    fn route<'a>(&'a self, view: &'a mut [Attr<'a>; MAX_ATTRS]) -> Route<'a> {
        Route {
            key: self.key.as_deref(),
            tag: self.tag.as_ref().map(RequestTagBuf::get),
            attrs: self.attrs.view(view),
        }
    }

    /// Take back a streamed body from the attempt that failed, for the next one, waiting at
    /// most `bound`: whether it can be sent again.
    async fn reclaim(&mut self, bound: Duration) -> bool {
        let (Some(reclaim), Some(upload)) = (self.reclaim.take(), self.upload.as_ref()) else {
            return false;
        };
        match reclaim.body(bound, upload).await {
            Some((body, reclaim)) => {
                self.body = Either::Right(body);
                self.reclaim = Some(reclaim);
                true
            }
            None => false,
        }
    }

    /// The request for one attempt to `address`: a buffered body is sent again each time, a
    /// streamed one is handed to this attempt (a retry takes it back: [`Outgoing::reclaim`]);
    /// the head is moved into the `last` attempt (earlier ones send a copy).
    fn request(&mut self, address: &str, last: bool) -> Option<Request<UpstreamBody>> {
        let body = match &mut self.body {
            Either::Left(full) => Either::Left(full.clone()),
            streamed => std::mem::replace(streamed, Either::Left(Full::new(Bytes::new()))),
        };
        upstream_request(&mut self.parts, address, body, self.h2c, last)
    }
}

/// The request's hash key, read from it as the tower layer reads it (`lbkit_tower::http`).
fn hash_key(
    req: &mut Request<Inbound>,
    extractor: Option<&KeyExtractor>,
    client: SocketAddr,
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
    resp: Response<UpstreamAnswer>,
    guard: CallGuard,
) -> Response<ProxyBody> {
    let (parts, body) = resp.into_parts();
    let resp = match body {
        Either::Left(body) => Some(Response::from_parts(parts, body)),
        // Services that speak h2c upstream send no upgrades.
        Either::Right(_) => None,
    };
    match upgrade.zip(resp).map(|(u, resp)| u.accept(resp)) {
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
/// body breaks or its trailers say otherwise).
fn relay(
    resp: Response<Answer>,
    guard: CallGuard,
    clock: &Clock,
    outcome: Outcome,
) -> Response<ProxyBody> {
    let (mut rparts, rbody) = resp.into_parts();
    headers::strip_hop_by_hop(&mut rparts.headers);
    let body = match rbody {
        Answer::Streamed(body) => ProxyBody::answer(body, guard, clock.clone(), outcome),
        Answer::Whole(body) => {
            let trailers = body.trailers().cloned();
            // The streamed body's rule (`TrackBody`): a failing `grpc-status` in the trailers
            // makes a success a failure.
            let outcome = trailers.as_ref().map_or(outcome, |t| {
                orca::record(t, guard.endpoint().stats(), clock);
                record_pushback(rparts.status, t, guard.endpoint().stats(), clock);
                trailers_outcome(outcome, t, GrpcCodes::DEFAULT)
            });
            guard.finish(outcome);
            ProxyBody::whole(body.to_bytes(), trailers)
        }
    };
    Response::from_parts(rparts, body)
}

/// lbkit-core's [`classify_answer`] of an answer's head (or trailers) as `http` parsed it.
fn classify_head(status: StatusCode, headers: &http::HeaderMap) -> Classified {
    classify_answer(status.as_u16(), || {
        grpc_failure(headers, GrpcCodes::DEFAULT)
    })
}

/// Marks a proxy-made response ([`local`]) and keeps its text (for a gRPC caller's
/// `grpc-message`).
#[derive(Clone, Debug)]
struct Local(String);

/// A proxy-made response.
pub(crate) fn local(status: StatusCode, text: &str) -> Response<ProxyBody> {
    let mut resp = Response::new(ProxyBody::local(Bytes::copy_from_slice(text.as_bytes())));
    resp.extensions_mut()
        .insert(Local(text.trim_end().to_owned()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// A proxy-made answer to a gRPC request, as gRPC clients read one: trailers-only (`200`,
/// `grpc-status`, `grpc-message`), the status by gRPC's HTTP mapping, except that `504` (the
/// deadline passed, the caller's or the route's) is `DEADLINE_EXCEEDED` (4), with
/// `content_type` (`application/grpc`, or gRPC-web's). Upstream answers pass as they came.
fn grpc_local(resp: Response<ProxyBody>, content_type: &'static str) -> Response<ProxyBody> {
    let Some(Local(text)) = resp.extensions().get::<Local>().cloned() else {
        return resp;
    };
    let code = match resp.status().as_u16() {
        504 => "4",        // DEADLINE_EXCEEDED
        400 | 408 => "13", // INTERNAL
        401 => "16",       // UNAUTHENTICATED
        403 => "7",        // PERMISSION_DENIED
        404 => "12",       // UNIMPLEMENTED
        _ => "14",         // UNAVAILABLE (429, 502, 503 and the rest)
    };
    let mut answer = Response::new(ProxyBody::local(Bytes::new()));
    let h = answer.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    h.insert("grpc-status", http::HeaderValue::from_static(code));
    if let Ok(v) = http::HeaderValue::from_str(&grpc_message(&text)) {
        h.insert("grpc-message", v);
    }
    answer
}

/// `text` as a `grpc-message` value: percent-encoded UTF-8, as gRPC's HTTP/2 protocol writes it
/// (every byte outside printable ASCII, and `%`).
fn grpc_message(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A request body as it goes upstream: the body, how far a streamed one got, and how to take a
/// streamed one back after a failed attempt.
type Read = (UpstreamBody, Option<UploadState>, Option<Reclaim>);

/// The body as a replayable buffer when it is empty or announced small enough, read within
/// `limit`; else the stream as it came, watched and kept ([`ClientBody`]). `Err`: the client's
/// answer (400 for a broken body, 408 for one slower than `limit`).
async fn replayable(body: Inbound, limit: Duration) -> Result<Read, Response<ProxyBody>> {
    if body.is_end_stream() {
        return Ok((Either::Left(Full::new(Bytes::new())), None, None));
    }
    let small = body
        .size_hint()
        .upper()
        .is_some_and(|n| n <= MAX_REPLAY_BODY);
    if !small {
        let (body, upload, reclaim) = ClientBody::new(body);
        return Ok((Either::Right(body), Some(upload), Some(reclaim)));
    }
    match tokio::time::timeout(limit, read_whole(body)).await {
        Ok(Ok(whole)) => Ok((Either::Left(Full::new(whole)), None, None)),
        Ok(Err(_)) => Err(local(StatusCode::BAD_REQUEST, "bad request body\n")),
        Err(_) => Err(local(
            StatusCode::REQUEST_TIMEOUT,
            "request body too slow\n",
        )),
    }
}

/// A small body read whole: its one `DATA` frame as it came (the common case: no copy, no
/// list of frames), else the frames joined. Trailers are dropped, as `Collected::to_bytes`
/// drops them.
async fn read_whole(mut body: Inbound) -> Result<Bytes, BodyError> {
    let mut whole = Bytes::new();
    let mut joined: Option<BytesMut> = None;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        if let Some(j) = &mut joined {
            j.extend_from_slice(&data);
        } else if whole.is_empty() {
            whole = data;
        } else if !data.is_empty() {
            let mut j = BytesMut::with_capacity(whole.len() + data.len());
            j.extend_from_slice(&whole);
            j.extend_from_slice(&data);
            joined = Some(j);
        }
    }
    Ok(joined.map_or(whole, BytesMut::freeze))
}

/// Forwarding headers, hop-by-hop removal, and `Host`: for an HTTP/1.1 upstream, one from
/// `:authority` when an HTTP/2 client sent none; for an h2c upstream none, since HTTP/2 names
/// the target in `:authority` (here the endpoint's address, which the client connects to) and
/// a `Host` naming another entity makes the request malformed (RFC 9113 §8.3.1; strict stacks
/// such as Python's `h2` refuse it). The client's host travels in `Forwarded: host=` either way.
fn prepare_headers(
    parts: &mut Parts,
    client: SocketAddr,
    h2c: bool,
    forwarded: crate::config::ForwardedHeaders,
) {
    headers::strip_hop_by_hop(&mut parts.headers);
    let authority = parts.uri.authority().map(http::uri::Authority::as_str);
    headers::add_forwarded(&mut parts.headers, client, authority, forwarded);
    if h2c {
        parts.headers.remove(http::header::HOST);
    } else if !parts.headers.contains_key(http::header::HOST) {
        if let Some(v) = authority.and_then(|a| http::HeaderValue::from_str(a).ok()) {
            parts.headers.insert(http::header::HOST, v);
        }
    }
}

/// The request for one attempt; the head is moved out of `parts` when `last`.
fn upstream_request(
    parts: &mut Parts,
    address: &str,
    body: UpstreamBody,
    h2c: bool,
    last: bool,
) -> Option<Request<UpstreamBody>> {
    let path = match parts.uri.path_and_query() {
        Some(p) => p.clone(),
        None => PathAndQuery::from_static("/"),
    };
    let uri = Uri::builder()
        .scheme(Scheme::HTTP)
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
