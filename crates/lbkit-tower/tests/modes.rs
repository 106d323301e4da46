//! Forking, broadcast, failsafe, failback and failfast.

mod support;

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use lbkit_core::{Availability, Endpoint, EndpointSpec};
use lbkit_strategy::RoundRobin;
use lbkit_tower::http::SetOrigin;
use lbkit_tower::{
    BalanceLayer, CloneRequests, Error, ErrorKind, FailbackConfig, PoolBuilder, TryMake,
};
use support::*;
use tower::{Layer, Service, ServiceExt};

#[tokio::test]
async fn forking_returns_the_first_success_and_cancels_the_rest() {
    let mut slow = HttpServer::start("slow", Reply::Hang).await;
    let fast = HttpServer::start("fast", Reply::Ok).await;
    let client = client(true); // HTTP/2: a dropped call resets its stream at once
    let pool = PoolBuilder::new(RoundRobin::default()).spawn_static(
        vec![
            EndpointSpec::new(slow.addr.to_string()),
            EndpointSpec::new(fast.addr.to_string()),
        ],
        TryMake(move |ep: &Endpoint| SetOrigin::http(client.clone(), ep.address())),
    );
    let mut svc = BalanceLayer::http()
        .forking(2)
        .seed(SEED)
        .layer(pool.clone());
    within(async {
        for round in 1..=3 {
            let req = http::Request::get("/search")
                .body(Full::<Bytes>::default())
                .unwrap();
            let resp = svc.ready().await.unwrap().call(req).await.unwrap();
            assert_eq!(resp.into_body().collect().await.unwrap().to_bytes(), "fast");
            // The slow server's handler is dropped: the losing fork was cancelled.
            slow.cancelled.recv().await.unwrap();
            assert_eq!(slow.hits(), round);
        }
    })
    .await;
    assert_eq!(fast.hits(), 3);
    let snap = pool.snapshot();
    for e in snap.endpoints() {
        assert_eq!(e.stats().in_flight(), 0, "{}", e.key());
    }
    let slow_stats =
        snap.endpoints()[snap.find(&slow.addr.to_string().into()).unwrap().get()].stats();
    assert_eq!((slow_stats.cancellations(), slow_stats.failures()), (3, 0));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn broadcast_calls_every_endpoint_and_fails_if_one_does() {
    let farm = Farm::new(&["a", "b", "c"]);
    let pool = PoolBuilder::default().spawn_static(farm.specs(&["a", "b", "c"]), farm.maker());
    let mut svc = BalanceLayer::new()
        .requests(CloneRequests::default())
        .broadcast()
        .layer(pool.clone());
    let last = svc.ready().await.unwrap().call(1).await.unwrap();
    assert_eq!(last, "c", "the last endpoint's answer, as Dubbo returns");
    farm.get("b").set(Behaviour::Fail);
    let err = svc.ready().await.unwrap().call(2).await.unwrap_err();
    let err = err.downcast::<Error>().unwrap();
    assert_eq!(
        err.kind(),
        ErrorKind::Broadcast {
            failed: 1,
            total: 3
        }
    );
    assert_eq!(
        err.to_string(),
        "endpoint b: broadcast: 1 of 3 endpoints failed"
    );
    for n in ["a", "b", "c"] {
        assert_eq!(farm.get(n).calls(), 2, "{n}");
    }
    // Not replayable: refused before anything is sent.
    let mut once = BalanceLayer::new().broadcast().layer(pool);
    let err = once.ready().await.unwrap().call(3).await.unwrap_err();
    assert_eq!(
        err.downcast::<Error>().unwrap().kind(),
        ErrorKind::NotReplayable
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn failsafe_swallows_errors_into_the_fallback() {
    let farm = Farm::new(&["a"]);
    farm.get("a").set(Behaviour::Fail);
    let pool = PoolBuilder::default()
        .availability(Availability::OFF)
        .spawn_static(farm.specs(&["a"]), farm.maker());
    let mut svc = BalanceLayer::new()
        .failsafe(|e: &lbkit_tower::BoxError| format!("fallback after: {e}"))
        .layer(pool.clone());
    let out = svc.ready().await.unwrap().call(1).await.unwrap();
    assert_eq!(out, "fallback after: endpoint a: call failed (other)");
    assert_eq!(farm.get("a").calls(), 1, "failsafe never retries");
    // No endpoint at all is swallowed too.
    let empty = PoolBuilder::default().spawn_static(Vec::new(), farm.maker());
    let mut svc = BalanceLayer::new()
        .failsafe(|_: &lbkit_tower::BoxError| "empty".to_owned())
        .layer(empty);
    assert_eq!(svc.ready().await.unwrap().call(2).await.unwrap(), "empty");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn failback_retries_in_the_background_bounded() {
    let mut farm = Farm::new(&["a"]);
    farm.get("a").set(Behaviour::Fail);
    let pool = PoolBuilder::default()
        .availability(Availability::OFF)
        .spawn_static(farm.specs(&["a"]), farm.maker());
    let config = FailbackConfig {
        retries: 3,
        period: Duration::from_secs(5),
        max_pending: 1,
    };
    let mut svc = BalanceLayer::new()
        .requests(CloneRequests::default())
        .failback(config, |_: &lbkit_tower::BoxError| "accepted".to_owned())
        .layer(pool.clone());
    assert_eq!(
        svc.ready().await.unwrap().call(7).await.unwrap(),
        "accepted"
    );
    assert_eq!(farm.next_event().await, Event::Called("a".into(), 7));
    assert_eq!(svc.failback_pending(), 1);
    // A second failure while one is pending is over `max_pending`: dropped, not queued.
    assert_eq!(
        svc.ready().await.unwrap().call(8).await.unwrap(),
        "accepted"
    );
    assert_eq!(farm.next_event().await, Event::Called("a".into(), 8));
    assert_eq!(svc.failback_pending(), 1);
    // The endpoint recovers; the background retry (after 5 s of paused time) succeeds.
    let before = tokio::time::Instant::now();
    assert_eq!(farm.next_event().await, Event::Called("a".into(), 7));
    assert!(before.elapsed() >= Duration::from_secs(5) - Duration::from_millis(1));
    farm.get("a").set(Behaviour::Ok);
    assert_eq!(farm.next_event().await, Event::Called("a".into(), 7));
    tokio::time::timeout(Duration::from_secs(60), async {
        while svc.failback_pending() > 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap();
    assert_eq!(
        farm.get("a").calls(),
        4,
        "7, 8, then 7 twice in the background"
    );
    // Gives up after `retries` background attempts.
    farm.get("a").set(Behaviour::Fail);
    svc.ready().await.unwrap().call(9).await.unwrap();
    for _ in 0..4 {
        assert_eq!(farm.next_event().await, Event::Called("a".into(), 9));
    }
    tokio::time::timeout(Duration::from_secs(60), async {
        while svc.failback_pending() > 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap();
    assert_eq!(farm.get("a").calls(), 8);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn failfast_makes_one_attempt() {
    let farm = Farm::new(&["a", "b"]);
    farm.get("a").set(Behaviour::Refuse);
    let pool = PoolBuilder::new(RoundRobin::default())
        .availability(Availability::OFF)
        .spawn_static(farm.specs(&["a", "b"]), farm.maker());
    let mut svc = BalanceLayer::new()
        .requests(CloneRequests::idempotent())
        .failfast()
        .layer(pool);
    let results: Vec<bool> = {
        let mut v = Vec::new();
        for id in 0..4 {
            v.push(svc.ready().await.unwrap().call(id).await.is_ok());
        }
        v
    };
    assert_eq!(results.iter().filter(|ok| !**ok).count(), 2);
    assert_eq!(farm.get("a").calls() + farm.get("b").calls(), 4);
}

/// Broadcast's calls are bounded by the overall deadline when no per-attempt limit is set
/// (they waited forever for a hung endpoint before; issue 41).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn broadcast_honours_the_overall_deadline() {
    let farm = Farm::new(&["a", "b"]);
    farm.get("b").set(Behaviour::Hang);
    let pool = PoolBuilder::default()
        .availability(Availability::OFF)
        .spawn_static(farm.specs(&["a", "b"]), farm.maker());
    let mut svc = BalanceLayer::new()
        .requests(CloneRequests::default())
        .broadcast()
        .deadline(Duration::from_millis(300))
        .layer(pool);
    let before = tokio::time::Instant::now();
    let call = svc.ready().await.unwrap().call(1);
    let err = tokio::time::timeout(Duration::from_secs(60), call)
        .await
        .expect("answered within the deadline")
        .unwrap_err();
    assert_eq!(before.elapsed(), Duration::from_millis(300));
    let err = err.downcast::<Error>().unwrap();
    assert_eq!(
        err.kind(),
        ErrorKind::Broadcast {
            failed: 1,
            total: 2
        }
    );
}

/// Failback's background attempts draw on the retry budget: with none left, a failed request
/// is not sent again (issue 41).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn failback_draws_on_the_retry_budget() {
    let farm = Farm::new(&["a"]);
    farm.get("a").set(Behaviour::Fail);
    let pool = PoolBuilder::default()
        .availability(Availability::OFF)
        .spawn_static(farm.specs(&["a"]), farm.maker());
    let spent = std::sync::Arc::new(lbkit_core::RetryBudget::new(
        Duration::from_secs(10),
        0,
        0.0,
    ));
    let mut svc = BalanceLayer::new()
        .requests(CloneRequests::default())
        .failback(FailbackConfig::default(), |_: &lbkit_tower::BoxError| {
            "accepted".to_owned()
        })
        .budget(spent)
        .layer(pool);
    assert_eq!(
        svc.ready().await.unwrap().call(7).await.unwrap(),
        "accepted"
    );
    // Three periods of 5 s in paused time: every background attempt has had its turn.
    tokio::time::sleep(Duration::from_secs(16)).await;
    assert_eq!(svc.failback_pending(), 0, "given up");
    assert_eq!(
        farm.get("a").calls(),
        1,
        "no background attempt without budget"
    );
}
