//! Failover: retries go to other endpoints, only when the request is idempotent or the failure
//! certainly happened before the server saw it.

mod support;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use lbkit_core::{Availability, FailureKind};
use lbkit_strategy::RoundRobin;
use lbkit_tower::http::SetOrigin;
use lbkit_tower::{BalanceLayer, CloneRequests, Error, ErrorKind, PoolBuilder};
use support::*;
use tower::{Layer, Service, ServiceExt};

fn stats_of(
    pool: &lbkit_tower::Pool<impl Sized, impl lbkit_core::Strategy>,
    key: &str,
) -> (u64, u64, u32) {
    let snap = pool.snapshot();
    let e = &snap.endpoints()[snap.find(&key.into()).unwrap().get()];
    (
        e.stats().successes(),
        e.stats().failures(),
        e.stats().in_flight(),
    )
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn idempotent_failures_are_retried_elsewhere() {
    let farm = Farm::new(&["a", "b", "c"]);
    farm.get("b").set(Behaviour::Fail);
    let pool = PoolBuilder::new(RoundRobin::default())
        .availability(Availability::OFF)
        .spawn_static(farm.specs(&["a", "b", "c"]), farm.maker());
    let mut svc = BalanceLayer::new()
        .requests(CloneRequests::idempotent())
        .seed(SEED)
        .layer(pool.clone());
    for id in 0..30 {
        let name = svc.ready().await.unwrap().call(id).await.unwrap();
        assert_ne!(name, "b");
    }
    let (ok, failed, in_flight) = stats_of(&pool, "b");
    assert_eq!((ok, in_flight), (0, 0));
    assert_eq!(failed, u64::from(farm.get("b").calls()));
    assert!(
        failed >= 5,
        "round robin sends b its share before failover: {failed}"
    );
    let total_ok = stats_of(&pool, "a").0 + stats_of(&pool, "c").0;
    assert_eq!(total_ok, 30);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn non_idempotent_requests_are_retried_only_when_refused() {
    let farm = Farm::new(&["a", "b"]);
    let pool = PoolBuilder::new(RoundRobin::default())
        .availability(Availability::OFF)
        .spawn_static(farm.specs(&["a", "b"]), farm.maker());
    let mut svc = BalanceLayer::new()
        .requests(CloneRequests::default())
        .seed(SEED)
        .layer(pool.clone());
    // Refused connections never reached a server: retried even though not idempotent.
    farm.get("a").set(Behaviour::Refuse);
    for id in 0..10 {
        assert_eq!(svc.ready().await.unwrap().call(id).await.unwrap(), "b");
    }
    // A failure after the server saw the request is returned as it is.
    farm.get("a").set(Behaviour::Fail);
    let mut errors = 0;
    for id in 10..20 {
        if let Err(e) = svc.ready().await.unwrap().call(id).await {
            let e = e.downcast::<Error>().unwrap();
            assert_eq!(e.kind(), ErrorKind::Failed(FailureKind::Other));
            assert_eq!(e.endpoint().map(|k| k.as_str()), Some("a"));
            assert!(e.to_string().starts_with("endpoint a: call failed"), "{e}");
            assert!(lbkit_tower::is_caused_by::<std::io::Error>(&*e));
            errors += 1;
        }
    }
    assert_eq!(
        errors, 5,
        "round robin: every other request lands on a, none retried"
    );
    assert_eq!(farm.get("a").calls() + farm.get("b").calls(), 10 + 10 + 10);
}

fn http_pool(
    addrs: &[std::net::SocketAddr],
    h2: bool,
) -> lbkit_tower::Pool<SetOrigin<Client>, RoundRobin> {
    round_robin_pool(addrs, h2, Availability::OFF)
}

fn post(path: &str) -> http::Request<Full<Bytes>> {
    http::Request::post(path)
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap()
}

/// Send `n` POSTs through `svc`, each answered 200 by the endpoint named `live`.
async fn posts_answered_by_live<S, B>(svc: &mut S, n: usize)
where
    S: Service<http::Request<Full<Bytes>>, Response = http::Response<B>>,
    S::Error: std::fmt::Debug,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    within(async {
        for _ in 0..n {
            let resp = svc.ready().await.unwrap().call(post("/orders")).await;
            let resp = resp.unwrap();
            assert_eq!(resp.status(), 200);
            assert_eq!(resp.into_body().collect().await.unwrap().to_bytes(), "live");
        }
    })
    .await;
}

#[tokio::test]
async fn failover_when_an_endpoint_refuses_connections() {
    let live = HttpServer::start("live", Reply::Ok).await;
    let dead = lbkit_testkit::refused_addr();
    let pool = http_pool(&[dead, live.addr], false);
    let mut svc = BalanceLayer::http().seed(SEED).layer(pool.clone());
    // POST is not idempotent, yet a refused connection is retried.
    posts_answered_by_live(&mut svc, 6).await;
    assert_eq!(live.hits(), 6);
    let (ok, failed, in_flight) = stats_of(&pool, &dead.to_string());
    assert_eq!((ok, in_flight), (0, 0));
    // Each retry moves the round-robin cursor too, so every first attempt lands on the dead port.
    assert_eq!(failed, 6);
    let snap = pool.snapshot();
    let live_stats =
        snap.endpoints()[snap.find(&live.addr.to_string().into()).unwrap().get()].stats();
    assert_eq!((live_stats.successes(), live_stats.in_flight()), (6, 0));
}

/// An HTTP/2 endpoint that answers with `GOAWAY` naming an earlier last stream did not
/// process the request, whatever the frame's error code (here `ENHANCE_YOUR_CALM`): a POST
/// goes on to the next endpoint, as `lbkit proxy`'s h2c upstreams do, and the endpoint is
/// charged with a connect failure.
#[tokio::test]
async fn failover_of_a_post_an_http2_endpoint_sent_goaway_for() {
    const ENHANCE_YOUR_CALM: u32 = 0xb;
    let live = HttpServer::start("live", Reply::Ok).await;
    let going = lbkit_testkit::goaway_upstream(0, ENHANCE_YOUR_CALM).await;
    let pool = http_pool(&[going, live.addr], true);
    let mut svc = BalanceLayer::http().seed(SEED).layer(pool.clone());
    posts_answered_by_live(&mut svc, 4).await;
    assert_eq!(live.hits(), 4);
    let snap = pool.snapshot();
    let stats = snap.endpoints()[snap.find(&going.to_string().into()).unwrap().get()].stats();
    // Each retry moves the round-robin cursor too, so every first attempt goes there.
    assert_eq!(
        stats.failures_by_kind(),
        [4, 0, 0, 0],
        "all connect failures"
    );
}

#[tokio::test]
async fn no_retry_of_a_non_idempotent_request_that_reached_the_server() {
    let a = HttpServer::start("a", Reply::Status503).await;
    let b = HttpServer::start("b", Reply::Status503).await;
    let pool = http_pool(&[a.addr, b.addr], false);
    let mut svc = BalanceLayer::http().seed(SEED).layer(pool.clone());
    within(async {
        for _ in 0..4 {
            let resp = svc.ready().await.unwrap().call(post("/pay")).await.unwrap();
            assert_eq!(
                resp.status(),
                503,
                "the failure response is returned as it is"
            );
        }
        // The same with GET is idempotent: each request is tried on both endpoints, and no
        // more (2 retries allowed, but a retry goes to an endpoint not tried yet or nowhere).
        for _ in 0..2 {
            let get = http::Request::get("/balance")
                .body(Full::default())
                .unwrap();
            let resp = svc.ready().await.unwrap().call(get).await.unwrap();
            assert_eq!(resp.status(), 503);
        }
    })
    .await;
    assert_eq!(a.hits() + b.hits(), 4 + 2 * 2);
    let (_, failed_a, in_flight_a) = stats_of(&pool, &a.addr.to_string());
    let (_, failed_b, in_flight_b) = stats_of(&pool, &b.addr.to_string());
    assert_eq!((failed_a + failed_b, in_flight_a, in_flight_b), (8, 0, 0));
}
