//! Recording through the layer: every attempt of a sampled request lands in the trace with its
//! endpoint, outcome and retry flag; forks are marked as hedges.

use std::collections::HashMap;
use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use lbkit_core::{Endpoint, EndpointSpec};
use lbkit_strategy::catalog::{build, Params};
use lbkit_tower::trace::{read, TraceConfig, TraceOutcome};
use lbkit_tower::{BalanceLayer, CloneRequests, PoolBuilder};
use tower::{Layer, Service, ServiceExt};

type Req = http::Request<Full<Bytes>>;

/// A fresh directory, removed with everything in it when the value drops.
fn dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("lbkit-tower-trace-{name}-"))
        .tempdir()
        .unwrap()
}

/// Three endpoints; 10.0.0.1 answers 503.
macro_rules! pool {
    ($config:expr) => {{
        let specs = (1..=3)
            .map(|i| EndpointSpec::new(format!("10.0.0.{i}:80")))
            .collect();
        PoolBuilder::new(build("round-robin", Params::new()).unwrap())
            .name("shop")
            .trace($config)
            .unwrap()
            .spawn_static(specs, |ep: &Endpoint| {
                let failing = ep.address() == "10.0.0.1:80";
                tower::service_fn(move |_req: Req| async move {
                    let mut resp = http::Response::new(Full::new(Bytes::from_static(b"ok")));
                    if failing {
                        *resp.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
                    }
                    Ok::<_, Infallible>(resp)
                })
            })
    }};
}

fn request() -> Req {
    http::Request::get("/cart").body(Full::default()).unwrap()
}

#[tokio::test]
async fn failover_attempts_are_recorded_per_request() {
    let d = dir("failover");
    let config = TraceConfig::new(d.path().join("calls.lbkt")).with_sample_rate(1.0);
    let pool = pool!(&config);
    let recorder = pool.trace().unwrap().clone();
    let mut svc = BalanceLayer::http().failover(1).seed(7).layer(pool);
    for _ in 0..30 {
        let resp = svc.ready().await.unwrap().call(request()).await.unwrap();
        assert_eq!(resp.status(), 200);
        // The call ends with its body (read to the end: a success; dropped: a cancellation).
        resp.into_body().collect().await.unwrap();
    }
    drop(svc);
    recorder.flush();
    let trace = read(&config.path).unwrap();
    let mut by_request: HashMap<u64, Vec<_>> = HashMap::new();
    for r in &trace.records {
        assert_eq!((&*r.service, &*r.strategy), ("shop", "round-robin"));
        by_request.entry(r.request).or_default().push(r.clone());
    }
    assert_eq!(by_request.len(), 30, "every request sampled at 1.0");
    let mut retried = 0;
    for attempts in by_request.values() {
        let first = &attempts[0];
        assert_eq!((first.attempt, first.retry), (0, false));
        if &*first.endpoint == "10.0.0.1:80" {
            assert_eq!(first.outcome, TraceOutcome::Server);
            assert_eq!(attempts.len(), 2, "{attempts:?}");
            let second = &attempts[1];
            assert_eq!((second.attempt, second.retry), (1, true));
            assert_eq!(second.outcome, TraceOutcome::Success);
            assert_ne!(&*second.endpoint, "10.0.0.1:80");
            retried += 1;
        } else {
            assert_eq!((attempts.len(), first.outcome), (1, TraceOutcome::Success));
        }
    }
    // Round robin reaches 10.0.0.1 until three failures in a row trip its circuit breaker.
    assert_eq!(retried, 3, "{retried}");
}

#[tokio::test]
async fn forks_are_hedges_of_one_request() {
    let d = dir("forking");
    let config = TraceConfig::new(d.path().join("calls.lbkt")).with_sample_rate(1.0);
    let pool = pool!(&config);
    let recorder = pool.trace().unwrap().clone();
    let mut svc = BalanceLayer::new()
        .requests(CloneRequests::idempotent())
        .forking(2)
        .seed(3)
        .layer(pool);
    for _ in 0..5 {
        let _ = svc.ready().await.unwrap().call(request()).await;
    }
    drop(svc);
    recorder.flush();
    let trace = read(&config.path).unwrap();
    let mut by_request: HashMap<u64, Vec<bool>> = HashMap::new();
    for r in &trace.records {
        by_request.entry(r.request).or_default().push(r.hedge);
    }
    assert_eq!(by_request.len(), 5);
    for hedges in by_request.values() {
        let mut h = hedges.clone();
        h.sort();
        assert_eq!(h, [false, true], "the first copy and one fork: {hedges:?}");
    }
}

// A hedged request: its first attempt and the hedge, the hedge marked, the beaten attempt
// recorded as cancelled (virtual time: the slow endpoint takes 1 s, the hedge goes at 50 ms).
#[tokio::test(start_paused = true)]
async fn hedges_are_marked_and_the_beaten_attempt_is_cancelled() {
    let d = dir("hedge");
    let config = TraceConfig::new(d.path().join("calls.lbkt")).with_sample_rate(1.0);
    let specs = (1..=2)
        .map(|i| EndpointSpec::new(format!("10.0.0.{i}:80")))
        .collect();
    let pool = PoolBuilder::new(build("round-robin", Params::new()).unwrap())
        .name("shop")
        .trace(&config)
        .unwrap()
        .spawn_static(specs, |ep: &Endpoint| {
            let slow = ep.address() == "10.0.0.1:80";
            tower::service_fn(move |_req: Req| async move {
                if slow {
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
                Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(b"ok"))))
            })
        });
    let recorder = pool.trace().unwrap().clone();
    let delay = lbkit_core::HedgeDelay::Fixed(std::time::Duration::from_millis(50));
    let mut svc = BalanceLayer::http()
        .failover(1)
        .hedge(delay)
        .seed(7)
        .layer(pool);
    for _ in 0..4 {
        let resp = svc.ready().await.unwrap().call(request()).await.unwrap();
        assert_eq!(resp.status(), 200);
    }
    drop(svc);
    recorder.flush();
    let trace = read(&config.path).unwrap();
    let hedges: Vec<_> = trace.records.iter().filter(|r| r.hedge).collect();
    assert!(!hedges.is_empty(), "{:?}", trace.records);
    for h in &hedges {
        assert_eq!(h.attempt, 1, "{h:?}");
        let first = trace
            .records
            .iter()
            .find(|r| r.request == h.request && !r.hedge)
            .expect("the first attempt");
        assert_eq!(first.outcome, TraceOutcome::Cancelled, "{first:?}");
    }
}
