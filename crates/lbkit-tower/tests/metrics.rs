//! Per-endpoint counters and histograms through the `metrics` facade, and a `tracing` span per
//! attempt.

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use lbkit_core::Availability;
use lbkit_strategy::RoundRobin;
use lbkit_tower::{BalanceLayer, CloneRequests, PoolBuilder};
use metrics::{
    Counter, CounterFn, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use support::*;
use tower::retry::budget::TpsBudget;
use tower::{Layer, Service, ServiceExt};

/// Counters by `name{label=value,...}`; histograms count their samples.
#[derive(Default)]
struct Registry {
    #[allow(clippy::disallowed_types)] // test bookkeeping, off any hot path
    values: std::sync::Mutex<BTreeMap<String, Arc<Cell>>>,
}

#[derive(Default)]
struct Cell(AtomicU64);

impl CounterFn for Cell {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, SeqCst);
    }
    fn absolute(&self, value: u64) {
        self.0.store(value, SeqCst);
    }
}

impl HistogramFn for Cell {
    fn record(&self, _: f64) {
        self.0.fetch_add(1, SeqCst);
    }
}

impl Registry {
    fn cell(&self, key: &Key) -> Arc<Cell> {
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        self.values.lock().unwrap().entry(name).or_default().clone()
    }
    fn get(&self, name: &str) -> u64 {
        self.values
            .lock()
            .unwrap()
            .get(name)
            .map_or(0, |c| c.0.load(SeqCst))
    }
}

struct Rec(&'static Registry);

impl Recorder for Rec {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.0.cell(key))
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.0.cell(key))
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn counters_and_histograms_per_endpoint() {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    let registry = REGISTRY.get_or_init(Registry::default);
    metrics::set_global_recorder(Rec(registry)).unwrap();

    let farm = Farm::new(&["a", "b"]);
    farm.get("a").set(Behaviour::Fail);
    let pool = PoolBuilder::new(RoundRobin::default())
        .name("orders")
        .availability(Availability::OFF)
        .spawn_static(farm.specs(&["a", "b"]), farm.maker());
    let mut svc = BalanceLayer::new()
        .requests(CloneRequests::idempotent())
        .retry_budget(Arc::new(TpsBudget::new(Duration::from_secs(1), 1, 0.2)))
        .layer(pool);
    for id in 0..4 {
        let _ = svc.ready().await.unwrap().call(id).await;
    }
    let get = |n: &str| registry.get(n);
    let a_fail = get("lbkit_failures_total{pool=orders,endpoint=a,kind=other}");
    let a_req = get("lbkit_requests_total{pool=orders,endpoint=a}");
    let b_req = get("lbkit_requests_total{pool=orders,endpoint=b}");
    assert_eq!(a_fail, a_req, "every call to a failed");
    assert_eq!(
        a_req + b_req,
        u64::from(farm.get("a").calls() + farm.get("b").calls())
    );
    assert_eq!(
        get("lbkit_request_duration_seconds{pool=orders,endpoint=b}"),
        b_req
    );
    assert!(get("lbkit_retries_total{pool=orders,endpoint=b}") >= 1);
    // Round robin alternates a, b: with one retry in the budget, later failures on a are
    // returned without a retry.
    assert!(get("lbkit_retry_budget_exhausted_total{pool=orders}") >= 1);
}
