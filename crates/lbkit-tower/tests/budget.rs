//! The retry budget bounds retries; exhaustion is an error kind (and a counter, see metrics.rs).

mod support;

use std::sync::Arc;
use std::time::Duration;

use lbkit_core::Availability;
use lbkit_strategy::RoundRobin;
use lbkit_tower::{BalanceLayer, CloneRequests, Error, ErrorKind, PoolBuilder};
use support::*;
use tower::retry::budget::TpsBudget;
use tower::{Layer, Service, ServiceExt};

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn retry_budget_exhaustion_stops_retries() {
    let farm = Farm::new(&["a", "b", "c"]);
    for n in ["a", "b", "c"] {
        farm.get(n).set(Behaviour::Fail);
    }
    let pool = PoolBuilder::new(RoundRobin::default())
        .availability(Availability::OFF)
        .spawn_static(farm.specs(&["a", "b", "c"]), farm.maker());
    // One retry per second in reserve (ttl 1 s), plus 20 % of requests: a retry costs 5
    // deposits. Time is paused, so no window expires during the test.
    let budget = Arc::new(TpsBudget::new(Duration::from_secs(1), 1, 0.2));
    let mut svc = BalanceLayer::new()
        .requests(CloneRequests::idempotent())
        .failover(2)
        .retry_budget(budget)
        .layer(pool.clone());
    let mut exhausted = 0;
    for id in 0..10 {
        let err = svc.ready().await.unwrap().call(id).await.unwrap_err();
        let err = err.downcast::<Error>().unwrap();
        if err.kind() == ErrorKind::BudgetExhausted {
            exhausted += 1;
            assert!(err.is_budget_exhausted());
            assert!(err.to_string().contains("retry budget exhausted"), "{err}");
            assert!(
                lbkit_tower::is_caused_by::<std::io::Error>(&*err),
                "the last failure is the source"
            );
        }
    }
    // Budget: reserve 5, +1 per request, -5 per retry. Requests 1, 5 and 10 get one retry each;
    // every request then finds the budget empty before its second retry.
    let calls: u32 = ["a", "b", "c"].iter().map(|n| farm.get(n).calls()).sum();
    assert_eq!(calls, 10 + 3);
    assert_eq!(exhausted, 10);
    let snap = pool.snapshot();
    let failures: u64 = snap.endpoints().iter().map(|e| e.stats().failures()).sum();
    assert_eq!(failures, 13);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_default_budget_allows_normal_failover() {
    let farm = Farm::new(&["a", "b"]);
    farm.get("a").set(Behaviour::Fail);
    let pool = PoolBuilder::new(RoundRobin::default())
        .availability(Availability::OFF)
        .spawn_static(farm.specs(&["a", "b"]), farm.maker());
    let mut svc = BalanceLayer::new()
        .requests(CloneRequests::idempotent())
        .layer(pool);
    for id in 0..50 {
        assert_eq!(svc.ready().await.unwrap().call(id).await.unwrap(), "b");
    }
}

/// Counts what the call path deposits and withdraws; never refuses.
#[derive(Default)]
struct Counting {
    deposits: std::sync::atomic::AtomicU32,
    withdrawals: std::sync::atomic::AtomicU32,
}

impl lbkit_core::Budget for Counting {
    fn deposit(&self, _: lbkit_core::Timestamp) {
        self.deposits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    fn withdraw(&self, _: lbkit_core::Timestamp) -> bool {
        self.withdrawals
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        true
    }
}

/// A retry or a fork with no untried endpoint left is not sent, so it takes nothing from the
/// budget (issue 41): two failing endpoints and five retries allowed make one retry per
/// request, one withdrawal; forking to three over two endpoints sends one fork, one withdrawal.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_retry_not_sent_spends_no_budget() {
    use std::sync::atomic::Ordering::Relaxed;
    let farm = Farm::new(&["a", "b"]);
    for n in ["a", "b"] {
        farm.get(n).set(Behaviour::Fail);
    }
    let pool = PoolBuilder::new(RoundRobin::default())
        .availability(Availability::OFF)
        .spawn_static(farm.specs(&["a", "b"]), farm.maker());
    let budget = Arc::new(Counting::default());
    let mut svc = BalanceLayer::new()
        .requests(CloneRequests::idempotent())
        .failover(5)
        .budget(budget.clone())
        .layer(pool.clone());
    for id in 0..10 {
        let err = svc.ready().await.unwrap().call(id).await.unwrap_err();
        let err = err.downcast::<Error>().unwrap();
        assert_ne!(err.kind(), ErrorKind::BudgetExhausted);
    }
    assert_eq!(budget.deposits.load(Relaxed), 10);
    assert_eq!(budget.withdrawals.load(Relaxed), 10, "one retry each");
    let snap = pool.snapshot();
    let cancelled: u64 = snap
        .endpoints()
        .iter()
        .map(|e| e.stats().cancellations())
        .sum();
    assert_eq!(cancelled, 0, "no call begun and dropped");

    farm.get("a").set(Behaviour::Ok);
    farm.get("b").set(Behaviour::Ok);
    let forks = Arc::new(Counting::default());
    let mut svc = BalanceLayer::new()
        .requests(CloneRequests::idempotent())
        .forking(3)
        .budget(forks.clone())
        .layer(pool.clone());
    for id in 0..10 {
        svc.ready().await.unwrap().call(id).await.unwrap();
    }
    assert_eq!(forks.withdrawals.load(Relaxed), 10, "one fork each");
    // A budget that refuses once the fork has its endpoint: the fork is not sent, and its pick
    // leaves nothing behind (no call in flight, no cancellation recorded).
    let refusing = Arc::new(lbkit_core::RetryBudget::new(
        std::time::Duration::from_secs(10),
        0,
        0.0,
    ));
    let mut svc = BalanceLayer::new()
        .requests(CloneRequests::idempotent())
        .forking(2)
        .budget(refusing)
        .layer(pool.clone());
    let calls_before: u32 = ["a", "b"].iter().map(|n| farm.get(n).calls()).sum();
    let cancelled = |pool: &lbkit_tower::Pool<_, _>| -> u64 {
        pool.snapshot()
            .endpoints()
            .iter()
            .map(|e| e.stats().cancellations())
            .sum()
    };
    let cancelled_before = cancelled(&pool);
    for id in 0..10 {
        svc.ready().await.unwrap().call(id).await.unwrap();
    }
    let calls: u32 = ["a", "b"].iter().map(|n| farm.get(n).calls()).sum();
    assert_eq!(calls - calls_before, 10, "no fork sent");
    for e in pool.snapshot().endpoints() {
        assert_eq!(e.stats().in_flight(), 0);
    }
    assert_eq!(
        cancelled(&pool),
        cancelled_before,
        "the abandoned picks record nothing"
    );
}
