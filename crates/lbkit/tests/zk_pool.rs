//! `examples/zk_pool.rs` against a real ZooKeeper (`LBKIT_ZK`, see `scripts/zookeeper.sh`;
//! unset: fails in CI, skipped elsewhere): the pool follows providers registered, reweighted and
//! deregistered, each change patched in (the endpoints that stay are the same objects).
#[path = "../examples/zk_pool.rs"]
mod zk_pool;

use std::time::Duration;

use lbkit::discovery::zookeeper::{Layout, Provider, ServicePath, ZkConfig, ZkRegistration};
use lbkit_tower::PoolStatus;

/// Bound on every wait.
const WAIT: Duration = Duration::from_secs(30);

/// Wait (bounded) until the pool's status satisfies `pred`.
async fn until(
    status: &mut tokio::sync::watch::Receiver<PoolStatus>,
    what: &str,
    pred: impl FnMut(&PoolStatus) -> bool,
) {
    tokio::time::timeout(WAIT, status.wait_for(pred))
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
        .expect("pool task alive");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_follows_providers_in_zookeeper() {
    let Some(servers) = lbkit_testkit::zookeeper() else {
        return;
    };
    let interface = format!("com.acme.PoolTest{}", std::process::id());
    let path = ServicePath::new("dubbo", &interface, Layout::Dubbo).expect("path");
    let register = |addr: &str, weight: u32| {
        let provider = Provider {
            weight,
            ..Provider::new(addr)
        };
        ZkRegistration::spawn(ZkConfig::new(&servers), path.clone(), provider).expect("spawn")
    };
    let a = register("127.0.0.1:20001", 100);
    let b = register("127.0.0.1:20002", 100);
    let pool = zk_pool::follow(&servers, &interface, "weighted-round-robin").expect("pool");
    let mut status = pool.status();
    until(&mut status, "two providers", |s| s.endpoints == 2).await;
    let first = pool.snapshot();

    let c = register("127.0.0.1:20003", 100);
    until(&mut status, "the third", |s| s.endpoints == 3).await;
    b.set_weight(300).await.expect("reweight");
    let heavier = |s: &PoolStatus| s.version > 0 && weight_of(&pool, "127.0.0.1:20002") == 300;
    until(&mut status, "the reweight", heavier).await;
    let after = pool.snapshot();
    // The provider no change named is the same endpoint object: patched, not rebuilt.
    let a_of = |s: &lbkit::Snapshot| {
        s.endpoint(s.find(&"127.0.0.1:20001".into()).expect("a"))
            .clone()
    };
    assert!(
        a_of(&first).ptr_eq(&a_of(&after)),
        "an unchanged provider was rebuilt"
    );

    a.deregister().await;
    until(&mut status, "a gone", |s| s.endpoints == 2).await;
    let left: Vec<String> = (pool.snapshot().endpoints().iter())
        .map(|e| e.address().to_owned())
        .collect();
    assert_eq!(left, ["127.0.0.1:20002", "127.0.0.1:20003"]);
    b.deregister().await;
    c.deregister().await;
}

fn weight_of(pool: &lbkit_tower::Pool<String>, addr: &str) -> u32 {
    let snapshot = pool.snapshot();
    snapshot
        .find(&addr.into())
        .map_or(0, |i| snapshot.endpoint(i).weight())
}
