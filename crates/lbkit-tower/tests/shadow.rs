//! Shadow mode through the layer: a candidate strategy picks beside the live one on every
//! request, nothing is sent to its choices, and the report and metrics show where it would
//! have sent the traffic.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use lbkit_core::{Endpoint, EndpointSpec};
use lbkit_strategy::catalog::{build, Params};
use lbkit_tower::{BalanceLayer, PoolBuilder};
use tower::{Layer, Service, ServiceExt};

type Req = http::Request<Full<Bytes>>;

#[tokio::test]
async fn the_candidate_picks_beside_the_live_strategy_and_sends_nothing() {
    // Live: round robin over 4 endpoints. Candidate: consistent hashing on a key every request
    // shares, so it would send everything to one endpoint.
    let calls: Arc<Vec<AtomicU64>> = Arc::new((0..4).map(|_| AtomicU64::new(0)).collect());
    let specs = (0..4)
        .map(|i| EndpointSpec::new(format!("10.0.0.{}:80", i + 1)))
        .collect();
    let counted = calls.clone();
    let pool = PoolBuilder::new(build("round-robin", Params::new()).unwrap())
        .name("shop")
        .shadow("ketama", build("ketama", Params::new()).unwrap())
        .spawn_static(specs, move |ep: &Endpoint| {
            let i: usize = ep.address()[7..8].parse::<usize>().unwrap() - 1;
            let counted = counted.clone();
            tower::service_fn(move |_req: Req| {
                counted[i].fetch_add(1, Relaxed);
                async move {
                    Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(b"ok"))))
                }
            })
        });
    let collector = pool.collector();
    let mut svc = BalanceLayer::http()
        .requests(
            lbkit_tower::http::HttpRequests::new()
                .hash_key(lbkit_strategy::KeyExtractor::Header("x-user".into())),
        )
        .failover(1)
        .seed(5)
        .layer(pool);
    for _ in 0..40 {
        let req = http::Request::get("/")
            .header("x-user", "alice")
            .body(Full::default())
            .unwrap();
        let resp = svc.ready().await.unwrap().call(req).await.unwrap();
        resp.into_body().collect().await.unwrap();
    }
    // Round robin sent 10 to each: the candidate's choices got nothing extra.
    let sent: Vec<u64> = calls.iter().map(|c| c.load(Relaxed)).collect();
    assert_eq!(sent, [10, 10, 10, 10]);

    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(collector));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains("lbkit_shadow_picks_total{service=\"shop\",candidate=\"ketama\"} 40"),
        "{text}"
    );
    assert!(
        text.contains("lbkit_shadow_disagreements_total{service=\"shop\",candidate=\"ketama\"} 30"),
        "one key: ketama agrees with round robin one time in four\n{text}"
    );
    let candidate_lines: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.starts_with("lbkit_shadow_endpoint_picks_total") && l.contains("by=\"candidate\"")
        })
        .collect();
    assert_eq!(candidate_lines.len(), 4, "{text}");
    assert_eq!(
        candidate_lines
            .iter()
            .filter(|l| l.ends_with(" 40"))
            .count(),
        1,
        "every request's key hashes to one endpoint: {candidate_lines:?}"
    );
}
