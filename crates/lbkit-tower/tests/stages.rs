//! Stages through the layer (`lbkit_core::stage`): a header picks the metadata subset, a
//! retry stays inside it, fallback `none` fails the call naming why, tag routing and subsets
//! compose, and priority tiers keep the backups idle while the primaries are healthy.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::Full;
use lbkit_core::stage::{Stages, SubsetFallback, Subsets};
use lbkit_core::{Endpoint, EndpointSpec};
use lbkit_strategy::catalog::{build, Params};
use lbkit_strategy::AttrHeaders;
use lbkit_tower::http::HttpRequests;
use lbkit_tower::{BalanceLayer, Pool, PoolBuilder};
use tower::Layer;

#[path = "support/answers.rs"]
mod answers;

use answers::{answered_by, set, Req};
type Svc = tower::util::BoxCloneSyncService<Req, http::Response<Full<Bytes>>, Infallible>;

/// Each endpoint answers its address; `failing` ones answer 503.
fn pool(specs: Vec<EndpointSpec>, failing: &'static [&'static str], stages: Stages) -> Pool<Svc> {
    PoolBuilder::new(build("round-robin", Params::new()).unwrap())
        .stages(stages)
        .spawn_static(specs, move |ep: &Endpoint| {
            let name = Bytes::from(ep.address().to_owned());
            let fails = failing.contains(&ep.address());
            Svc::new(tower::service_fn(move |_req: Req| {
                let name = name.clone();
                async move {
                    let mut resp = http::Response::new(Full::new(name));
                    if fails {
                        *resp.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
                    }
                    Ok::<_, Infallible>(resp)
                }
            }))
        })
}

fn versioned() -> Vec<EndpointSpec> {
    ["v1", "v1", "v2", "v2"]
        .iter()
        .enumerate()
        .map(|(i, v)| EndpointSpec::new(format!("10.0.0.{}:80", i + 1)).with_meta("version", *v))
        .collect()
}

fn subsets(fallback: SubsetFallback) -> Stages {
    Stages {
        subsets: Some(Subsets::new(vec![vec!["version".into()]], fallback)),
        ..Stages::default()
    }
}

fn requests() -> HttpRequests {
    HttpRequests::new().attributes(AttrHeaders::new([("version", "x-version")]))
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_header_picks_the_subset_and_failover_stays_in_it() {
    let pool = pool(versioned(), &["10.0.0.3:80"], subsets(SubsetFallback::None));
    let mut svc = BalanceLayer::http()
        .requests(requests())
        .failover(1)
        .layer(pool);
    assert_eq!(
        answered_by(&mut svc, &[("x-version", "v2")], 20).await,
        set(&["200 10.0.0.4:80"]),
        "10.0.0.3 answers 503; the retry goes to v2's other endpoint, never to v1"
    );
    assert_eq!(
        answered_by(&mut svc, &[("x-version", "v1")], 20).await,
        set(&["200 10.0.0.1:80", "200 10.0.0.2:80"])
    );
    let err = answered_by(&mut svc, &[("x-version", "v7")], 1)
        .await
        .expect_err("fallback none: no endpoint");
    assert!(err.contains("no subset matches"), "{err}");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn without_the_header_the_fallback_serves() {
    let pool = pool(versioned(), &[], subsets(SubsetFallback::Any));
    let mut svc = BalanceLayer::http().requests(requests()).layer(pool);
    assert_eq!(
        answered_by(&mut svc, &[], 40).await.map(|s| s.len()),
        Ok(4),
        "any: every endpoint"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn tags_and_subsets_compose() {
    // The gray tag holds 10.0.0.1 (v1) and 10.0.0.3 (v2): gray + v2 is 10.0.0.3 alone.
    let specs = versioned()
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            if i % 2 == 0 {
                s.with_meta("dubbo.tag", "gray")
            } else {
                s
            }
        })
        .collect();
    let pool = pool(specs, &[], subsets(SubsetFallback::None));
    let mut svc = BalanceLayer::http().requests(requests()).layer(pool);
    assert_eq!(
        answered_by(&mut svc, &[("dubbo.tag", "gray"), ("x-version", "v2")], 10).await,
        set(&["200 10.0.0.3:80"])
    );
    assert_eq!(
        answered_by(&mut svc, &[("x-version", "v2")], 10).await,
        set(&["200 10.0.0.4:80"]),
        "untagged requests avoid the gray endpoints, then take v2"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn backups_stay_idle_while_the_primaries_are_healthy() {
    let specs = vec![
        EndpointSpec::new("10.0.0.1:80"),
        EndpointSpec::new("10.0.0.2:80"),
        EndpointSpec::new("10.0.0.9:80").with_priority(1),
    ];
    let pool = pool(specs, &[], Stages::default());
    let mut svc = BalanceLayer::http().layer(pool);
    assert_eq!(
        answered_by(&mut svc, &[], 20).await,
        set(&["200 10.0.0.1:80", "200 10.0.0.2:80"])
    );
}

#[tokio::test(flavor = "current_thread")]
async fn an_aperture_follows_coordinates_from_the_registry() {
    use lbkit_core::stage::{Aperture, ApertureMode, Coordinates};
    // Four endpoints, an aperture of 1 with no coordinates yet: the whole set until they come.
    let specs = (1..=4)
        .map(|i| EndpointSpec::new(format!("10.0.0.{i}:80")))
        .collect();
    let stages = Stages {
        aperture: Some(Aperture {
            size: 1,
            mode: ApertureMode::Deterministic,
            coordinates: None,
            seed: 0,
        }),
        ..Stages::default()
    };
    let pool = pool(specs, &[], stages);
    let (tx, rx) = tokio::sync::watch::channel(None);
    let task = pool.follow_coordinates(rx);
    let mut svc = BalanceLayer::http().layer(pool.clone());
    assert_eq!(answered_by(&mut svc, &[], 40).await.map(|s| s.len()), Ok(4));
    // The registry says: client 2 of 4 — one endpoint.
    let at = Coordinates { index: 2, count: 4 };
    tx.send(Some(at)).unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while pool
            .balancer()
            .stages()
            .aperture
            .and_then(|a| a.coordinates)
            != Some(at)
        {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("coordinates applied");
    assert_eq!(answered_by(&mut svc, &[], 20).await.map(|s| s.len()), Ok(1));
    drop(tx);
    task.await.unwrap();
}
