//! Endpoints whose service is not ready are passed over; with none ready, the call waits.

mod support;

use futures_util::FutureExt;
use lbkit_core::Availability;
use lbkit_strategy::RoundRobin;
use lbkit_tower::{BalanceLayer, PoolBuilder};
use support::*;
use tower::{Layer, Service, ServiceExt};

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn endpoints_that_are_not_ready_are_passed_over() {
    let farm = Farm::new(&["a", "b", "c"]);
    farm.get("a").set_ready(false);
    let pool = PoolBuilder::new(RoundRobin::default())
        .availability(Availability::OFF)
        .spawn_static(farm.specs(&["a", "b", "c"]), farm.maker());
    let mut svc = BalanceLayer::new().failfast().layer(pool.clone());
    for id in 0..12 {
        let name = svc.ready().await.unwrap().call(id).await.unwrap();
        assert_ne!(name, "a");
    }
    assert_eq!(farm.get("a").calls(), 0);
    let snap = pool.snapshot();
    let a = snap.endpoints()[0].stats();
    assert_eq!(
        (a.total(), a.in_flight()),
        (0, 0),
        "a pass-over records no call"
    );
    assert_eq!(farm.get("b").calls() + farm.get("c").calls(), 12);

    // None ready: the call waits on the endpoint picked, without failing.
    for n in ["b", "c"] {
        farm.get(n).set_ready(false);
    }
    let mut pending = svc.ready().await.unwrap().call(99);
    assert!((&mut pending).now_or_never().is_none());
    let waiting: u32 = snap.endpoints().iter().map(|e| e.stats().in_flight()).sum();
    assert_eq!(waiting, 1, "the call is committed to one endpoint");
    for n in ["a", "b", "c"] {
        farm.get(n).set_ready(true);
    }
    let name = within(pending).await.unwrap();
    assert!(["a", "b", "c"].contains(&name.as_str()));
    let total: u32 = ["a", "b", "c"].iter().map(|n| farm.get(n).calls()).sum();
    assert_eq!(total, 13);
}
