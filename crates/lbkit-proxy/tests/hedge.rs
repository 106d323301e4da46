//! Hedged requests through `lbkit proxy` (issue 41): on a route with `hedge`, an idempotent
//! request whose first attempt is slow is answered by its hedge on another endpoint, through
//! both engines (HTTP/1.1 requests a hedge may race go through hyper's engine), the slow
//! attempt is cancelled without being charged, and a POST is never hedged.

mod common;

use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use bytes::Bytes;
use common::{client, endpoint_json, h2c_client, WAIT};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_first_attempt_is_raced_by_a_hedge() {
    let (slow, slow_hits) =
        common::scripted_backend(200, &[], Duration::from_millis(1_500), "slow").await;
    let (fast, _) = common::scripted_backend(200, &[], Duration::ZERO, "fast").await;
    let config = format!(
        "{}[[route]]\nservice = \"svc\"\ntimeout_ms = 5000\nhedge = \"30ms\"\n\
         [service.svc]\nendpoints = [\"{slow}\", \"{fast}\"]\nstrategy = \"round-robin\"\nretries = 1\n\
         outlier_detection = {{ enabled = false }}\n",
        common::LISTENERS
    );
    let proxy = common::published(&config).await;
    let addr = proxy.listeners()[0];
    for (engine, client) in [("HTTP/1.1", client()), ("HTTP/2", h2c_client())] {
        for _ in 0..4 {
            let req = Request::get(format!("http://{addr}/"))
                .body(Full::new(Bytes::new()))
                .unwrap();
            let t = tokio::time::Instant::now();
            let resp = tokio::time::timeout(WAIT, client.request(req))
                .await
                .expect("in time")
                .expect("answer");
            assert_eq!(resp.status(), StatusCode::OK, "{engine}");
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(body, "fast", "{engine}");
            assert!(
                t.elapsed() < Duration::from_secs(1),
                "{engine}: {:?}",
                t.elapsed()
            );
        }
    }
    assert!(
        slow_hits.load(SeqCst) >= 2,
        "first attempts met the slow server"
    );
    let e = endpoint_json(&proxy, slow).await;
    assert_eq!(e["failures"], 0, "a lost race is no failure: {e}");
    // Every hedge is counted, as a hedge and as a retry.
    let hedges = common::sample(&proxy, "lbkit_hedges_total").await;
    assert_eq!(hedges, slow_hits.load(SeqCst) as f64);
    assert!(common::sample(&proxy, "lbkit_retries_total").await >= hedges);
    // A POST may not be sent twice: never hedged, so round robin's turn on the slow server
    // waits for it.
    let before = slow_hits.load(SeqCst);
    let mut bodies = Vec::new();
    for _ in 0..2 {
        let req = Request::post(format!("http://{addr}/"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = tokio::time::timeout(WAIT, client().request(req))
            .await
            .expect("in time")
            .expect("answer");
        bodies.push(resp.into_body().collect().await.unwrap().to_bytes());
    }
    assert!(bodies.contains(&Bytes::from("slow")), "{bodies:?}");
    assert_eq!(slow_hits.load(SeqCst), before + 1);
    proxy.shutdown(Duration::from_secs(1)).await;
}

// Both attempts of a race fail with a pushback: the retry after it waits the longer one, the
// hedge's (400 ms, answered first), not only the last answer's (the first attempt's 50 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_lost_race_waits_the_stronger_pushback() {
    const SHORT: &[(&str, &str)] = &[("grpc-retry-pushback-ms", "50")];
    const LONG: &[(&str, &str)] = &[("grpc-retry-pushback-ms", "400")];
    let (slow, _) = common::scripted_backend(503, SHORT, Duration::from_millis(150), "slow").await;
    let (busy, _) = common::scripted_backend(503, LONG, Duration::ZERO, "busy").await;
    let (ok, _) = common::scripted_backend(200, &[], Duration::ZERO, "ok").await;
    let config = format!(
        "{}[[route]]\nservice = \"svc\"\ntimeout_ms = 5000\nhedge = \"20ms\"\n\
         [service.svc]\nendpoints = [\"{slow}\", \"{busy}\", \"{ok}\"]\nstrategy = \"round-robin\"\n\
         retries = 2\noutlier_detection = {{ enabled = false }}\n",
        common::LISTENERS
    );
    let proxy = common::published(&config).await;
    let addr = proxy.listeners()[0];
    let req = Request::get(format!("http://{addr}/"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let t = tokio::time::Instant::now();
    let resp = tokio::time::timeout(WAIT, h2c_client().request(req))
        .await
        .expect("in time")
        .expect("answer");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "ok");
    assert!(
        t.elapsed() >= Duration::from_millis(400),
        "{:?}",
        t.elapsed()
    );
    proxy.shutdown(Duration::from_secs(1)).await;
}
