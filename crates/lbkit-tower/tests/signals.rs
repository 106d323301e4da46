//! Deadlines and pushback through the tower layer (issue 41), against hyper servers on
//! loopback: the caller's deadline (`grpc-timeout`, a configured header of milliseconds) cuts
//! the call and reaches the endpoint as the time left; one that has passed fails at once; a
//! `429` with `Retry-After` takes its endpoint out of the picks; a retry waits out a
//! `grpc-retry-pushback-ms`, and a negative one stops it.

mod support;

use std::time::Duration;

use bytes::Bytes;
use http::HeaderName;
use http_body_util::Full;
use lbkit_core::Availability;
use lbkit_strategy::RoundRobin;
use lbkit_tower::http::{HttpRequests, SetOrigin};
use lbkit_tower::{BalanceLayer, Error, ErrorKind};
use support::*;
use tower::{Layer, Service, ServiceExt};

type Pool = lbkit_tower::Pool<SetOrigin<Client>, RoundRobin>;

fn pool_of(addrs: &[std::net::SocketAddr], availability: Availability) -> Pool {
    round_robin_pool(addrs, false, availability)
}

fn get(headers: &[(&str, &str)]) -> http::Request<Full<Bytes>> {
    let mut req = http::Request::get("/");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.body(Full::new(Bytes::new())).unwrap()
}

fn seen(resp: &http::Response<impl Sized>, name: &str) -> String {
    resp.headers()[name].to_str().unwrap().trim().to_owned()
}

const X_REQUEST_TIMEOUT: HeaderName = HeaderName::from_static("x-request-timeout");

#[tokio::test]
async fn the_callers_deadline_reaches_the_endpoint_as_the_time_left() {
    let server = HttpServer::start("up", Reply::Ok).await;
    let pool = pool_of(&[server.addr], Availability::default());
    let requests = HttpRequests::new().deadline_header(X_REQUEST_TIMEOUT);
    let mut svc = BalanceLayer::http()
        .requests(requests)
        .deadline(Duration::from_secs(5))
        .seed(SEED)
        .layer(pool);
    within(async {
        let resp = svc.ready().await.unwrap();
        let resp = resp
            .call(get(&[("x-request-timeout", "400")]))
            .await
            .unwrap();
        let ms: u64 = seen(&resp, "x-seen-timeout").parse().unwrap();
        assert!((1..=400).contains(&ms), "{ms}");
        // gRPC: grpc-timeout in, the time left out.
        let grpc = [
            ("content-type", "application/grpc"),
            ("grpc-timeout", "300m"),
        ];
        let resp = svc.ready().await.unwrap().call(get(&grpc)).await.unwrap();
        let value = seen(&resp, "x-seen-grpc-timeout");
        let left = lbkit_core::signal::parse_grpc_timeout(value.as_bytes()).unwrap();
        assert!(
            left > Duration::ZERO && left <= Duration::from_millis(300),
            "{value}"
        );
        // Without one, the endpoint hears of none (the layer's own deadline is its limit).
        let resp = svc.ready().await.unwrap().call(get(&[])).await.unwrap();
        assert!(!resp.headers().contains_key("x-seen-timeout"));
    })
    .await;
}

#[tokio::test]
async fn a_deadline_that_has_passed_fails_without_an_attempt() {
    let server = HttpServer::start("up", Reply::Ok).await;
    let pool = pool_of(&[server.addr], Availability::default());
    let mut svc = BalanceLayer::http().seed(SEED).layer(pool);
    let grpc = [("content-type", "application/grpc"), ("grpc-timeout", "0n")];
    let err = within(svc.ready().await.unwrap().call(get(&grpc)))
        .await
        .unwrap_err();
    let err = err.downcast::<Error>().unwrap();
    assert_eq!(err.kind(), ErrorKind::DeadlineExceeded);
    assert_eq!(err.reached_server(), Some(false));
    assert_eq!(server.hits(), 0);
}

#[tokio::test]
async fn a_429_with_retry_after_takes_its_endpoint_out_of_the_picks() {
    let limited = HttpServer::start("limited", Reply::Pushback(429, "retry-after", "30")).await;
    let ok = HttpServer::start("ok", Reply::Ok).await;
    let pool = pool_of(&[limited.addr, ok.addr], Availability::default());
    let mut svc = BalanceLayer::http().seed(SEED).layer(pool.clone());
    let mut limited_answers = 0;
    within(async {
        for _ in 0..12 {
            let resp = svc.ready().await.unwrap().call(get(&[])).await.unwrap();
            if resp.status() == 429 {
                limited_answers += 1;
            }
        }
    })
    .await;
    assert_eq!((limited_answers, limited.hits()), (1, 1));
    let snap = pool.snapshot();
    let e = &snap.endpoints()[snap.find(&limited.addr.to_string().into()).unwrap().get()];
    let now = lbkit_core::Clock::System.now();
    let until = e.stats().pushed_back_until(now).expect("pushed back");
    assert!(until <= now.saturating_add(Duration::from_secs(30)));
    // With pushback not honoured, round robin goes back at once.
    let pool = pool_of(&[limited.addr, ok.addr], Availability::OFF);
    let mut svc = BalanceLayer::http().seed(SEED).layer(pool);
    within(async {
        for _ in 0..4 {
            svc.ready().await.unwrap().call(get(&[])).await.unwrap();
        }
    })
    .await;
    assert_eq!(limited.hits(), 1 + 2);
}

#[tokio::test]
async fn a_retry_waits_out_the_pushback_and_a_negative_one_stops_it() {
    let busy = HttpServer::start(
        "busy",
        Reply::Pushback(503, "grpc-retry-pushback-ms", "300"),
    )
    .await;
    let ok = HttpServer::start("ok", Reply::Ok).await;
    // Not passed over, so that round robin meets the busy one again and again.
    let pool = pool_of(&[busy.addr, ok.addr], Availability::OFF);
    let mut svc = BalanceLayer::http().seed(SEED).layer(pool);
    let mut waited = None;
    within(async {
        for _ in 0..2 {
            let before = busy.hits();
            let t = tokio::time::Instant::now();
            let resp = svc.ready().await.unwrap().call(get(&[])).await.unwrap();
            assert_eq!(resp.status(), 200);
            if busy.hits() > before {
                waited = Some(t.elapsed());
            }
        }
    })
    .await;
    let waited = waited.expect("the busy endpoint was met");
    assert!(waited >= Duration::from_millis(300), "{waited:?}");
    // The busy endpoint's answer took no time: the wait after it is not its latency.
    let snap = svc.pool().snapshot();
    let i = snap.find(&busy.addr.to_string().into()).unwrap();
    let h = snap.endpoint(i).stats().latency_histogram();
    assert!(
        h.count() >= 1 && h.sum < Duration::from_millis(250),
        "{h:?}"
    );
    // A negative pushback: the answer is the busy one's, not retried.
    let refusing = HttpServer::start(
        "refusing",
        Reply::Pushback(503, "grpc-retry-pushback-ms", "-1"),
    )
    .await;
    let pool = pool_of(&[refusing.addr, ok.addr], Availability::OFF);
    let mut svc = BalanceLayer::http().seed(SEED).layer(pool);
    let statuses: Vec<u16> = within(async {
        let mut out = Vec::new();
        for _ in 0..2 {
            let resp = svc.ready().await.unwrap().call(get(&[])).await.unwrap();
            out.push(resp.status().as_u16());
        }
        out
    })
    .await;
    assert!(statuses.contains(&503), "{statuses:?}");
    assert_eq!(refusing.hits(), 1);
}

#[tokio::test]
async fn a_retried_answer_still_leaves_its_load_report() {
    let busy = HttpServer::start(
        "busy",
        Reply::Pushback(503, "endpoint-load-metrics", "TEXT cpu_utilization=0.7"),
    )
    .await;
    let ok = HttpServer::start("ok", Reply::Ok).await;
    let pool = pool_of(&[busy.addr, ok.addr], Availability::OFF);
    let mut svc = BalanceLayer::http().seed(SEED).layer(pool.clone());
    within(async {
        for _ in 0..2 {
            let resp = svc.ready().await.unwrap().call(get(&[])).await.unwrap();
            assert_eq!(resp.status(), 200, "the 503 was retried");
        }
    })
    .await;
    assert!(busy.hits() >= 1);
    let snap = pool.snapshot();
    let e = &snap.endpoints()[snap.find(&busy.addr.to_string().into()).unwrap().get()];
    assert_eq!(e.stats().load_report().map(|r| r.utilization), Some(0.7));
}
