//! Tag routing through the layer: the `dubbo.tag` header (gRPC metadata) picks the providers
//! with that tag, retries stay among them, a forced unknown tag fails, untagged requests avoid
//! tagged providers.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::Full;
use lbkit_core::{Endpoint, EndpointSpec};
use lbkit_strategy::catalog::{build, Params};
use lbkit_strategy::TagHeaders;
use lbkit_tower::http::HttpRequests;
use lbkit_tower::{BalanceLayer, PoolBuilder};
use tower::Layer;

#[path = "support/answers.rs"]
mod answers;

use answers::{answered_by, set, Req};

/// Endpoints 1 and 2 tagged gray (1 answers 503), 3 and 4 untagged.
macro_rules! pool {
    () => {{
        let specs = (1..=4)
            .map(|i| {
                let s = EndpointSpec::new(format!("10.0.0.{i}:80"));
                if i <= 2 {
                    s.with_meta("dubbo.tag", "gray")
                } else {
                    s
                }
            })
            .collect();
        PoolBuilder::new(build("round-robin", Params::new()).unwrap()).spawn_static(
            specs,
            |ep: &Endpoint| {
                let name = Bytes::from(ep.address().to_owned());
                let failing = ep.address() == "10.0.0.1:80";
                tower::service_fn(move |_req: Req| {
                    let name = name.clone();
                    async move {
                        let mut resp = http::Response::new(Full::new(name));
                        if failing {
                            *resp.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
                        }
                        Ok::<_, Infallible>(resp)
                    }
                })
            },
        )
    }};
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_tag_header_routes_and_failover_stays_within_the_tag() {
    let mut svc = BalanceLayer::http().failover(1).layer(pool!());
    // gray: 10.0.0.1 answers 503, the retry goes to the other gray provider, never an untagged.
    assert_eq!(
        answered_by(&mut svc, &[("dubbo.tag", "gray")], 20).await,
        set(&["200 10.0.0.2:80"])
    );
    assert_eq!(
        answered_by(&mut svc, &[], 20).await,
        set(&["200 10.0.0.3:80", "200 10.0.0.4:80"])
    );
    // A tag nobody has: the untagged providers, unless forced.
    assert_eq!(
        answered_by(&mut svc, &[("dubbo.tag", "blue")], 20).await,
        set(&["200 10.0.0.3:80", "200 10.0.0.4:80"])
    );
    let forced = answered_by(
        &mut svc,
        &[("dubbo.tag", "blue"), ("dubbo.force.tag", "true")],
        1,
    )
    .await;
    let err = forced.expect_err("a forced unknown tag has no provider");
    assert!(err.contains("tag"), "{err}");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn tags_can_come_from_other_headers_a_default_or_not_at_all() {
    let requests = HttpRequests::new().tags(Some(
        TagHeaders::new("x-canary", "x-canary-only").with_default(Some("gray".into()), false),
    ));
    let mut svc = BalanceLayer::http()
        .failover(1)
        .requests(requests)
        .layer(pool!());
    // No header: the default tag.
    assert_eq!(
        answered_by(&mut svc, &[], 10).await,
        set(&["200 10.0.0.2:80"])
    );
    assert_eq!(
        answered_by(&mut svc, &[("x-canary", "blue")], 10).await,
        set(&["200 10.0.0.3:80", "200 10.0.0.4:80"])
    );
    // No tag read: every request is untagged, and goes to the untagged providers (as a Dubbo
    // consumer without a tag does), whatever its headers say.
    let mut plain = BalanceLayer::http()
        .failover(1)
        .requests(HttpRequests::new().tags(None))
        .layer(pool!());
    assert_eq!(
        answered_by(&mut plain, &[("dubbo.tag", "gray")], 20).await,
        set(&["200 10.0.0.3:80", "200 10.0.0.4:80"])
    );
}
