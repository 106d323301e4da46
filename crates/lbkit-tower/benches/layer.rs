//! Per-request overhead of the lbkit layer, next to calling the endpoint service directly and
//! next to tower's `p2c::Balance` over the same endpoint services.
//!
//! Endpoint services are trivial in-memory services answering with a ready future, so the
//! numbers are the layers' own cost. Every request is one `ready()` + `call()` polled to
//! completion once (a no-op waker), inside a current-thread tokio runtime context.
//!
//! `cargo bench -p lbkit-tower`

use std::convert::Infallible;
use std::future::{ready, Ready};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use divan::{black_box, Bencher};
use futures_util::FutureExt;
use http_body_util::{BodyExt, Full};
use lbkit_core::{Clock, Endpoint, EndpointSpec, Strategy};
use lbkit_strategy::{P2cEwma, RoundRobin};
use lbkit_tower::http::replay_request;
use lbkit_tower::{BalanceLayer, CloneRequests, Pool, PoolBuilder};
use tower::balance::p2c;
use tower::discover::ServiceList;
use tower::load::{CompleteOnResponse, PeakEwmaDiscover, PendingRequestsDiscover};
use tower::{Layer, Service, ServiceExt};

fn main() {
    divan::main();
}

const SIZES: &[usize] = &[3, 10];

/// The endpoint service: answers at once.
#[derive(Clone, Copy, Debug)]
struct Echo;

impl Service<u64> for Echo {
    type Response = u64;
    type Error = Infallible;
    type Future = Ready<Result<u64, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: u64) -> Self::Future {
        ready(Ok(req))
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

fn pool<S: Strategy>(strategy: S, n: usize) -> Pool<Echo, S> {
    let specs = (0..n)
        .map(|i| EndpointSpec::new(format!("10.0.{}.{}:80", i / 256, i % 256)))
        .collect();
    PoolBuilder::new(strategy).spawn_static(specs, |_: &Endpoint| Echo)
}

/// One request through `svc`, polled once.
#[inline]
fn request<S: Service<u64>>(svc: &mut S) {
    let _ = svc.ready().now_or_never();
    let _ = black_box(svc.call(black_box(7)).now_or_never());
}

#[divan::bench(sample_count = 100, sample_size = 1000)]
fn direct(bencher: Bencher<'_, '_>) {
    let mut svc = Echo;
    bencher.bench_local(|| request(black_box(&mut svc)));
}

#[divan::bench(args = SIZES, sample_count = 100, sample_size = 1000)]
fn tower_p2c(bencher: Bencher<'_, '_>, n: usize) {
    let rt = runtime();
    let _enter = rt.enter();
    let list = ServiceList::new(vec![Echo; n]);
    let mut svc = p2c::Balance::new(PendingRequestsDiscover::new(
        list,
        CompleteOnResponse::default(),
    ));
    bencher.bench_local(|| request(&mut svc));
}

/// tower's latency-aware variant (two clock reads per request, as lbkit's statistics need).
#[divan::bench(args = SIZES, sample_count = 100, sample_size = 1000)]
fn tower_p2c_peak_ewma(bencher: Bencher<'_, '_>, n: usize) {
    let rt = runtime();
    let _enter = rt.enter();
    let list = ServiceList::new(vec![Echo; n]);
    let mut svc = p2c::Balance::new(PeakEwmaDiscover::new(
        list,
        Duration::from_millis(30),
        Duration::from_secs(10),
        CompleteOnResponse::default(),
    ));
    bencher.bench_local(|| request(&mut svc));
}

/// Also at 1 000 and 10 000 endpoints, where the `Pool`'s service map has 16 and 64 shards
/// (one at 3 and 10): a call reads the endpoint's shard, then its entry.
#[divan::bench(args = [3, 10, 1_000, 10_000], sample_count = 100, sample_size = 1000)]
fn lbkit_round_robin_failfast(bencher: Bencher<'_, '_>, n: usize) {
    let rt = runtime();
    let _enter = rt.enter();
    let mut svc = BalanceLayer::new()
        .failfast()
        .seed(1)
        .layer(pool(RoundRobin::default(), n));
    bencher.bench_local(|| request(&mut svc));
}

#[divan::bench(args = SIZES, sample_count = 100, sample_size = 1000)]
fn lbkit_p2c_ewma_failfast(bencher: Bencher<'_, '_>, n: usize) {
    let rt = runtime();
    let _enter = rt.enter();
    let mut svc = BalanceLayer::new()
        .failfast()
        .seed(1)
        .layer(pool(P2cEwma::default(), n));
    bencher.bench_local(|| request(&mut svc));
}

/// The default mode: failover with 2 retries, so every request deposits into the retry budget
/// and keeps a copy of the request for a retry.
#[divan::bench(args = SIZES, sample_count = 100, sample_size = 1000)]
fn lbkit_p2c_ewma_failover(bencher: Bencher<'_, '_>, n: usize) {
    let rt = runtime();
    let _enter = rt.enter();
    let mut svc = BalanceLayer::new()
        .requests(CloneRequests::idempotent())
        .seed(1)
        .layer(pool(P2cEwma::default(), n));
    bencher.bench_local(|| request(&mut svc));
}

// --- HTTP: request replay (failover), status classification, body tracked to its end ---

type HttpReq = http::Request<Full<Bytes>>;

/// An HTTP endpoint service: 200 with a small body, at once.
#[derive(Clone, Copy, Debug, Default)]
struct HttpEcho;

impl Service<HttpReq> for HttpEcho {
    type Response = http::Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: HttpReq) -> Self::Future {
        ready(Ok(http::Response::new(Full::new(Bytes::from_static(
            b"ok",
        )))))
    }
}

fn http_request() -> HttpReq {
    http::Request::get("http://svc/items/7")
        .header("x-user-id", "u-17")
        .body(Full::new(Bytes::new()))
        .expect("a valid request")
}

/// One HTTP request through `svc`, its body read to the end. Building the request is timed
/// too, the same in every row.
#[inline]
fn http_call<S, B>(svc: &mut S)
where
    S: Service<HttpReq, Response = http::Response<B>>,
    B: http_body::Body + Unpin,
{
    let _ = svc.ready().now_or_never();
    if let Some(Ok(resp)) = svc.call(http_request()).now_or_never() {
        let mut body = resp.into_body();
        while let Some(Some(frame)) = body.frame().now_or_never() {
            let _ = black_box(frame);
        }
    }
}

#[divan::bench(sample_count = 100, sample_size = 1000)]
fn http_direct(bencher: Bencher<'_, '_>) {
    let mut svc = HttpEcho;
    bencher.bench_local(|| http_call(black_box(&mut svc)));
}

/// What any balancer that replays requests and measures latency must add to the direct call,
/// without picking: the replay copy of the request (kept until the response, as failover keeps
/// it) and the two clock reads around the call. The floor of the ≤ 200 ns target of
/// `http_lbkit_p2c_ewma_failover` over `http_direct` (issue 18), less the pick and finish of
/// the pick bench. Without `clock`, the copy alone.
#[derive(Clone, Debug, Default)]
struct ReplayFloor {
    inner: HttpEcho,
    clock: Option<Clock>,
}

impl Service<HttpReq> for ReplayFloor {
    type Response = http::Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: HttpReq) -> Self::Future {
        let started = self.clock.as_ref().map(Clock::now);
        let copy = replay_request(&req);
        let response = self.inner.call(req).into_inner();
        black_box((started, self.clock.as_ref().map(Clock::now)));
        drop(black_box(copy));
        ready(response)
    }
}

#[divan::bench(sample_count = 100, sample_size = 1000)]
fn http_floor_replay(bencher: Bencher<'_, '_>) {
    let mut svc = ReplayFloor::default();
    bencher.bench_local(|| http_call(black_box(&mut svc)));
}

#[divan::bench(sample_count = 100, sample_size = 1000)]
fn http_floor_replay_and_clock(bencher: Bencher<'_, '_>) {
    let mut svc = ReplayFloor {
        clock: Some(Clock::System),
        ..ReplayFloor::default()
    };
    bencher.bench_local(|| http_call(black_box(&mut svc)));
}

#[divan::bench(args = SIZES, sample_count = 100, sample_size = 1000)]
fn http_lbkit_p2c_ewma_failover(bencher: Bencher<'_, '_>, n: usize) {
    let rt = runtime();
    let _enter = rt.enter();
    let specs = (0..n)
        .map(|i| EndpointSpec::new(format!("10.0.{}.{}:80", i / 256, i % 256)))
        .collect();
    let pool = PoolBuilder::new(P2cEwma::default()).spawn_static(specs, |_: &Endpoint| HttpEcho);
    let mut svc = BalanceLayer::http().seed(1).layer(pool);
    bencher.bench_local(|| http_call(&mut svc));
}

#[divan::bench(args = SIZES, sample_count = 100, sample_size = 1000)]
fn http_lbkit_p2c_ewma_failfast(bencher: Bencher<'_, '_>, n: usize) {
    let rt = runtime();
    let _enter = rt.enter();
    let specs = (0..n)
        .map(|i| EndpointSpec::new(format!("10.0.{}.{}:80", i / 256, i % 256)))
        .collect();
    let pool = PoolBuilder::new(P2cEwma::default()).spawn_static(specs, |_: &Endpoint| HttpEcho);
    let mut svc = BalanceLayer::http().failfast().seed(1).layer(pool);
    bencher.bench_local(|| http_call(&mut svc));
}

#[divan::bench(args = SIZES, sample_count = 100, sample_size = 1000)]
fn http_tower_p2c_peak_ewma(bencher: Bencher<'_, '_>, n: usize) {
    let rt = runtime();
    let _enter = rt.enter();
    let list = ServiceList::new(vec![HttpEcho; n]);
    let mut svc = p2c::Balance::new(PeakEwmaDiscover::new(
        list,
        Duration::from_millis(30),
        Duration::from_secs(10),
        CompleteOnResponse::default(),
    ));
    bencher.bench_local(|| http_call(&mut svc));
}
