//! A pool's metric families, read through `prometheus_client` as a registry scrape would.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use lbkit_core::Availability;
use lbkit_strategy::RoundRobin;
use lbkit_tower::{BalanceLayer, CloneRequests, PoolBuilder};
use support::*;
use tower::retry::budget::TpsBudget;
use tower::{Layer, Service, ServiceExt};

/// The samples of one scrape, by `name{labels}` as written.
fn scrape(registry: &prometheus_client::registry::Registry) -> (String, BTreeMap<String, f64>) {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).expect("encode");
    let samples = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_owned(), value.parse().ok()?))
        })
        .collect();
    (text, samples)
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn families_per_endpoint_and_per_pool() {
    let farm = Farm::new(&["a", "b"]);
    farm.get("a").set(Behaviour::Fail);
    let pool = PoolBuilder::new(RoundRobin::default())
        .name("orders")
        .availability(Availability::OFF)
        .spawn_static(farm.specs(&["a", "b"]), farm.maker());
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(pool.collector()));
    let mut svc = BalanceLayer::new()
        .requests(CloneRequests::idempotent())
        .retry_budget(Arc::new(TpsBudget::new(Duration::from_secs(1), 1, 0.2)))
        .layer(pool);
    for id in 0..4 {
        let _ = svc.ready().await.unwrap().call(id).await;
    }
    let (text, got) = scrape(&registry);
    let get = |n: &str| {
        *got.get(n)
            .unwrap_or_else(|| panic!("{n} missing from\n{text}"))
    };
    let labels = |e: &str| format!("{{service=\"orders\",endpoint=\"{e}\"}}");
    let a_calls = get(&format!("lbkit_endpoint_calls_total{}", labels("a")));
    let b_calls = get(&format!("lbkit_endpoint_calls_total{}", labels("b")));
    let a_other =
        get("lbkit_endpoint_failures_total{service=\"orders\",endpoint=\"a\",kind=\"other\"}");
    assert_eq!(a_other, a_calls, "every call to a failed");
    assert_eq!(
        a_calls + b_calls,
        f64::from(farm.get("a").calls() + farm.get("b").calls())
    );
    assert_eq!(
        get(&format!(
            "lbkit_endpoint_call_duration_seconds_count{}",
            labels("b")
        )),
        b_calls
    );
    assert_eq!(
        get("lbkit_attempts_total{service=\"orders\"}"),
        a_calls + b_calls
    );
    assert!(get("lbkit_retries_total{service=\"orders\"}") >= 1.0);
    // Round robin alternates a, b: with one retry in the budget, later failures on a are
    // returned without a retry.
    assert!(get("lbkit_retries_refused_total{service=\"orders\"}") >= 1.0);
    assert_eq!(get("lbkit_endpoints{service=\"orders\"}"), 2.0);
    assert_eq!(
        get("lbkit_discovery_published_total{service=\"orders\"}"),
        1.0
    );
    assert!(text.contains("# TYPE lbkit_endpoint_call_duration_seconds histogram"));
    assert!(text.trim_end().ends_with("# EOF"));
}
