//! Hash keys come from requests: a header (gRPC metadata are headers) routes each user to one
//! endpoint.

mod support;

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use lbkit_core::{Endpoint, EndpointSpec};
use lbkit_strategy::catalog::{build, Params};
use lbkit_tower::http::HttpRequests;
use lbkit_tower::{BalanceLayer, PoolBuilder};
use tower::{Layer, Service, ServiceExt};

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_header_key_pins_each_user_to_one_endpoint() {
    let specs = (1..=5)
        .map(|i| EndpointSpec::new(format!("10.0.0.{i}:80")))
        .collect();
    let pool = PoolBuilder::new(build("ketama", Params::new()).unwrap()).spawn_static(
        specs,
        |ep: &Endpoint| {
            let name = Bytes::from(ep.address().to_owned());
            tower::service_fn(move |_req: http::Request<Full<Bytes>>| {
                let name = name.clone();
                async move { Ok::<_, Infallible>(http::Response::new(Full::new(name))) }
            })
        },
    );
    let layer = BalanceLayer::http()
        .requests(HttpRequests::new().hash_key("header:x-user-id".parse().unwrap()));
    let mut svc = layer.layer(pool);
    let mut seen: HashMap<String, String> = HashMap::new();
    for round in 0..3 {
        for user in 0..40 {
            let req = http::Request::post("/cart")
                .header("x-user-id", format!("user-{user}"))
                .body(Full::default())
                .unwrap();
            let resp = svc.ready().await.unwrap().call(req).await.unwrap();
            let endpoint = String::from_utf8(
                resp.into_body()
                    .collect()
                    .await
                    .unwrap()
                    .to_bytes()
                    .to_vec(),
            )
            .unwrap();
            let first = seen
                .entry(format!("user-{user}"))
                .or_insert_with(|| endpoint.clone());
            assert_eq!(*first, endpoint, "round {round}: user-{user} moved");
        }
    }
    let used: HashSet<_> = seen.values().collect();
    assert!(used.len() >= 4, "40 users spread over the ring: {used:?}");
}
