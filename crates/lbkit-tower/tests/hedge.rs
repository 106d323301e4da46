//! Hedged requests through the tower layer (issue 41), against hyper servers on loopback: an
//! idempotent request whose first attempt is slow is answered by its hedge on another
//! endpoint, the slow attempt is cancelled without being charged, and a request that may not
//! be sent twice is never hedged.

mod support;

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use lbkit_core::{Availability, Endpoint, EndpointSpec, HedgeDelay};
use lbkit_strategy::RoundRobin;
use lbkit_tower::http::SetOrigin;
use lbkit_tower::{BalanceLayer, PoolBuilder, TryMake};
use support::*;
use tower::{Layer, Service, ServiceExt};

fn request(method: &str) -> http::Request<Full<Bytes>> {
    http::Request::builder()
        .method(method)
        .uri("/")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

#[tokio::test]
async fn a_slow_first_attempt_is_raced_by_a_hedge_on_another_endpoint() {
    let slow = HttpServer::start("slow", Reply::Delay(1_500)).await;
    let fast = HttpServer::start("fast", Reply::Ok).await;
    let client = client(false);
    let pool = PoolBuilder::new(RoundRobin::default())
        .availability(Availability::OFF)
        .spawn_static(
            vec![
                EndpointSpec::new(slow.addr.to_string()),
                EndpointSpec::new(fast.addr.to_string()),
            ],
            TryMake(move |ep: &Endpoint| SetOrigin::http(client.clone(), ep.address())),
        );
    let hedge = HedgeDelay::Fixed(Duration::from_millis(50));
    let mut svc = BalanceLayer::http()
        .failover(1)
        .hedge(hedge)
        .seed(SEED)
        .layer(pool.clone());
    // Round robin's first attempts meet the slow server (every one here: each hedge takes the
    // next position too); each is hedged.
    within(async {
        for _ in 0..4 {
            let t = tokio::time::Instant::now();
            let resp = svc
                .ready()
                .await
                .unwrap()
                .call(request("GET"))
                .await
                .unwrap();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(body, "fast");
            assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        }
    })
    .await;
    assert!(slow.hits() >= 2, "{}", slow.hits());
    let snap = pool.snapshot();
    let slow_stats =
        snap.endpoints()[snap.find(&slow.addr.to_string().into()).unwrap().get()].stats();
    assert_eq!(slow_stats.failures(), 0, "a lost race is no failure");
    assert_eq!(slow_stats.cancellations(), u64::from(slow.hits()));
    // A POST may not be sent twice: the slow server answers it, late.
    let mut answered = Vec::new();
    within(async {
        for _ in 0..2 {
            let resp = svc
                .ready()
                .await
                .unwrap()
                .call(request("POST"))
                .await
                .unwrap();
            answered.push(resp.into_body().collect().await.unwrap().to_bytes());
        }
    })
    .await;
    assert!(answered.contains(&Bytes::from("slow")), "{answered:?}");
}

// A service's configured call settings (`lbkit::config`'s `call` table resolves to a
// `CallPolicy`) set the same hedge: one retry, a 50 ms hedge, a 5 s deadline.
#[tokio::test]
async fn a_call_policy_sets_retries_hedge_and_deadline() {
    let slow = HttpServer::start("slow", Reply::Delay(1_500)).await;
    let fast = HttpServer::start("fast", Reply::Ok).await;
    let pool = round_robin_pool(&[slow.addr, fast.addr], false, Availability::OFF);
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(pool.collector()));
    let call = lbkit_core::CallPolicy {
        retries: Some(1),
        overall: Some(Duration::from_secs(5)),
        hedge: Some(HedgeDelay::Fixed(Duration::from_millis(50))),
        ..lbkit_core::CallPolicy::default()
    };
    // Another mode than failover keeps its mode: the retries are failover's.
    let failfast = BalanceLayer::http().failfast().call_policy(&call);
    assert!(format!("{failfast:?}").contains("Failfast"), "{failfast:?}");
    let mut svc = BalanceLayer::http()
        .call_policy(&call)
        .seed(SEED)
        .layer(pool);
    within(async {
        for _ in 0..2 {
            let t = tokio::time::Instant::now();
            let resp = svc.ready().await.unwrap().call(request("GET")).await;
            let body = resp
                .unwrap()
                .into_body()
                .collect()
                .await
                .unwrap()
                .to_bytes();
            assert_eq!(body, "fast");
            assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        }
    })
    .await;
    assert!(slow.hits() >= 1, "the slow server got a first attempt");
    // Each hedge is counted as a hedge and as a retry.
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    let hedges = format!("lbkit_hedges_total{{service=\"default\"}} {}", slow.hits());
    assert!(text.contains(&hedges), "{text}");
}

// Both attempts of a race fail with a pushback: the retry after it waits the longer one, the
// hedge's (400 ms, answered first), not only the last answer's (the first attempt's 50 ms).
#[tokio::test]
async fn a_retry_after_a_lost_race_waits_the_stronger_pushback() {
    let slow = HttpServer::start(
        "slow",
        Reply::PushbackAfter(150, 503, "grpc-retry-pushback-ms", "50"),
    )
    .await;
    let busy = HttpServer::start(
        "busy",
        Reply::Pushback(503, "grpc-retry-pushback-ms", "400"),
    )
    .await;
    let ok = HttpServer::start("ok", Reply::Ok).await;
    let pool = round_robin_pool(&[slow.addr, busy.addr, ok.addr], false, Availability::OFF);
    let mut svc = BalanceLayer::http()
        .failover(2)
        .hedge(HedgeDelay::Fixed(Duration::from_millis(20)))
        .seed(SEED)
        .layer(pool);
    within(async {
        let t = tokio::time::Instant::now();
        let resp = svc
            .ready()
            .await
            .unwrap()
            .call(request("GET"))
            .await
            .unwrap();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "ok");
        assert!(
            t.elapsed() >= Duration::from_millis(400),
            "{:?}",
            t.elapsed()
        );
    })
    .await;
    assert_eq!((slow.hits(), busy.hits()), (1, 1));
}
