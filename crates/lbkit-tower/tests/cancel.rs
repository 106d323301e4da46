//! Cancelled and timed-out calls leave in-flight counts at zero; statistics add up under load.

mod support;

use std::time::Duration;

use futures_util::FutureExt;
use lbkit_core::Availability;
use lbkit_strategy::RoundRobin;
use lbkit_tower::{BalanceLayer, CloneRequests, Error, ErrorKind, PoolBuilder};
use support::*;
use tower::{Layer, Service, ServiceExt};

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn dropped_futures_leave_in_flight_at_zero() {
    let mut farm = Farm::new(&["a", "b"]);
    farm.get("a").set(Behaviour::Hang);
    farm.get("b").set(Behaviour::Hang);
    let pool =
        PoolBuilder::new(RoundRobin::default()).spawn_static(farm.specs(&["a", "b"]), farm.maker());
    let mut svc = BalanceLayer::new()
        .requests(CloneRequests::idempotent())
        .layer(pool.clone());
    let mut calls = Vec::new();
    for id in 0..6 {
        let mut fut = svc.ready().await.unwrap().call(id);
        assert!(
            (&mut fut).now_or_never().is_none(),
            "hanging backends never answer"
        );
        calls.push(fut);
    }
    let snap = pool.snapshot();
    let in_flight = || {
        snap.endpoints()
            .iter()
            .map(|e| e.stats().in_flight())
            .sum::<u32>()
    };
    assert_eq!(in_flight(), 6);
    drop(calls);
    assert_eq!(in_flight(), 0);
    let cancelled: u64 = snap
        .endpoints()
        .iter()
        .map(|e| e.stats().cancellations())
        .sum();
    assert_eq!(cancelled, 6);
    let mut dropped = 0;
    while dropped < 6 {
        if let Event::Dropped(..) = farm.next_event().await {
            dropped += 1;
        }
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn per_request_timeout_is_a_failure_and_failover_moves_on() {
    let farm = Farm::new(&["a", "b"]);
    farm.get("a").set(Behaviour::Hang);
    let pool = PoolBuilder::new(RoundRobin::default())
        .availability(Availability::OFF)
        .spawn_static(farm.specs(&["a", "b"]), farm.maker());
    let mut failfast = BalanceLayer::new()
        .failfast()
        .timeout(Duration::from_millis(100))
        .layer(pool.clone());
    let started = tokio::time::Instant::now();
    let err = failfast.ready().await.unwrap().call(1).await.unwrap_err();
    assert_eq!(started.elapsed(), Duration::from_millis(100));
    let err = err.downcast::<Error>().unwrap();
    assert_eq!(err.kind(), ErrorKind::Timeout(Duration::from_millis(100)));
    assert_eq!(err.reached_server(), None);
    let snap = pool.snapshot();
    let a = snap.endpoints()[0].stats();
    assert_eq!((a.failures(), a.in_flight()), (1, 0));
    // Idempotent: the timed-out attempt is retried on b.
    let mut failover = BalanceLayer::new()
        .requests(CloneRequests::idempotent())
        .timeout(Duration::from_millis(100))
        .layer(pool.clone());
    for id in 2..6 {
        assert_eq!(failover.ready().await.unwrap().call(id).await.unwrap(), "b");
    }
    assert_eq!(a.in_flight(), 0);
    assert!(a.failures() >= 2);
}

/// tower lets `call` run outside a runtime (the future is polled in one later): the attempt's
/// timer starts at the first poll, inside the runtime that polls it, and still ends the attempt.
#[test]
fn a_timed_call_made_outside_a_runtime_times_out_when_polled() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let farm = Farm::new(&["a"]);
    farm.get("a").set(Behaviour::Hang);
    let (pool, mut svc) = rt.block_on(async {
        let pool = PoolBuilder::new(RoundRobin::default())
            .availability(Availability::OFF)
            .spawn_static(farm.specs(&["a"]), farm.maker());
        let svc = BalanceLayer::new()
            .failfast()
            .timeout(Duration::from_millis(100))
            .layer(pool.clone());
        (pool, svc)
    });
    let fut = svc.call(1);
    let (err, elapsed) = rt.block_on(async {
        let started = tokio::time::Instant::now();
        let err = fut.await.unwrap_err();
        (err, started.elapsed())
    });
    assert_eq!(elapsed, Duration::from_millis(100));
    let err = err.downcast::<Error>().unwrap();
    assert_eq!(err.kind(), ErrorKind::Timeout(Duration::from_millis(100)));
    let snap = pool.snapshot();
    let a = snap.endpoints()[0].stats();
    assert_eq!((a.failures(), a.in_flight()), (1, 0));
}

#[test]
fn statistics_add_up_under_concurrent_load() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let farm = Farm::new(&["a", "b", "c"]);
        farm.get("b").set(Behaviour::Fail);
        let pool = PoolBuilder::default().spawn_static(farm.specs(&["a", "b", "c"]), farm.maker());
        let svc = BalanceLayer::new()
            .requests(CloneRequests::default())
            .layer(pool.clone());
        let tasks: Vec<_> = (0..4u64)
            .map(|t| {
                let mut svc = svc.clone();
                tokio::spawn(async move {
                    let mut errors = 0u64;
                    for i in 0..250 {
                        if svc.ready().await.unwrap().call(t * 1000 + i).await.is_err() {
                            errors += 1;
                        }
                    }
                    errors
                })
            })
            .collect();
        let mut errors = 0;
        for t in tasks {
            errors += within(t).await.unwrap();
        }
        let snap = pool.snapshot();
        let mut total = 0;
        for e in snap.endpoints() {
            let s = e.stats();
            let calls = u64::from(farm.get(e.address()).calls());
            assert_eq!(s.in_flight(), 0, "{}", e.key());
            assert_eq!(s.successes() + s.failures(), calls, "{}", e.key());
            assert_eq!(s.cancellations(), 0);
            total += calls;
        }
        assert_eq!(total, 1000, "not idempotent: one attempt per request");
        assert_eq!(errors, snap.endpoints()[1].stats().failures());
    });
}
