//! Discovery updates make and drop endpoint services; stream errors keep the last snapshot.

mod support;

use std::sync::Arc;
use std::time::Duration;

use lbkit_core::{EndpointKey, EndpointSpec, Update};
use lbkit_tower::{BalanceLayer, PoolBuilder, PoolStatus};
use support::*;
use tokio::sync::{mpsc, watch};
use tower::{Layer, Service, ServiceExt};

type Item = Result<Update, std::io::Error>;

fn source(rx: mpsc::UnboundedReceiver<Item>) -> impl futures_core::Stream<Item = Item> + Send {
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|i| (i, rx)) })
}

async fn wait(status: &mut watch::Receiver<PoolStatus>, what: impl Fn(&PoolStatus) -> bool) {
    let waited = tokio::time::timeout(Duration::from_secs(30), status.wait_for(|s| what(s)))
        .await
        .map(|r| r.is_ok());
    let last = status.borrow().clone();
    assert!(
        waited.is_ok(),
        "the pool task reports within 30 s: {last:?}"
    );
    assert!(waited.unwrap(), "the pool is alive");
}

/// In a pool large enough that its map of services is layered (see `pool/services.rs`), a
/// service is still dropped as its endpoint goes, not when the layer next folds; and a set out
/// of key order makes and releases exactly the services of what changed.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_large_pool_drops_a_service_as_its_endpoint_goes() {
    let names: Vec<String> = (0..200).map(|i| format!("s{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let farm = Farm::new(&names);
    let (tx, rx) = mpsc::unbounded_channel::<Item>();
    tx.send(Ok(Update::Reset(farm.specs(&names[..100]))))
        .unwrap();
    let pool = PoolBuilder::default().spawn(source(rx), farm.maker());
    let mut status = pool.status();
    // One addition at a time stays in the layer; each removal must release its service now.
    for i in 0..50 {
        let version = status.borrow().version;
        tx.send(Ok(Update::Add(farm.specs(&[names[100 + i]]))))
            .unwrap();
        wait(&mut status, |s| s.version == version + 1).await;
        assert!(pool.has_service(&EndpointKey::from(names[100 + i])));
        tx.send(Ok(Update::Remove(vec![EndpointKey::from(names[i])])))
            .unwrap();
        wait(&mut status, |s| s.version == version + 2).await;
        // The initial set is out of key order (s10 sorts before s2): nothing else is remade.
        let s = status.borrow().clone();
        assert_eq!(
            (s.services_made, s.services_released),
            (101 + i as u64, 1 + i as u64)
        );
        assert!(!pool.has_service(&EndpointKey::from(names[i])));
        assert_eq!(
            Arc::strong_count(&farm.backends[names[i]].0),
            1,
            "{}'s service is dropped with its endpoint",
            names[i]
        );
    }
    assert_eq!(pool.service_count(), 100);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn updates_add_and_drop_endpoint_services() {
    let farm = Farm::new(&["a", "b", "c"]);
    let (tx, rx) = mpsc::unbounded_channel::<Item>();
    tx.send(Ok(Update::Reset(farm.specs(&["a", "b"])))).unwrap();
    let pool = PoolBuilder::default().spawn(source(rx), farm.maker());
    // Queued updates are applied before `spawn` returns.
    assert_eq!(pool.service_count(), 2);
    assert_eq!(pool.snapshot().len(), 2);
    let mut status = pool.status();
    assert_eq!(
        (status.borrow().version, status.borrow().services_made),
        (1, 2)
    );
    let mut svc = BalanceLayer::new().failfast().layer(pool.clone());

    tx.send(Ok(Update::Add(farm.specs(&["c"])))).unwrap();
    wait(&mut status, |s| s.services_made == 3).await;
    assert!(pool.has_service(&EndpointKey::from("c")));
    assert_eq!(pool.snapshot().len(), 3);

    tx.send(Ok(Update::Remove(vec![EndpointKey::from("a")])))
        .unwrap();
    wait(&mut status, |s| s.services_released == 1).await;
    assert!(!pool.has_service(&EndpointKey::from("a")));
    assert_eq!(
        Arc::strong_count(&farm.backends["a"].0),
        1,
        "a's service is dropped"
    );
    for id in 0..10 {
        assert_ne!(svc.ready().await.unwrap().call(id).await.unwrap(), "a");
    }

    // A weight change keeps the service (same key, same address).
    tx.send(Ok(Update::Add(vec![
        EndpointSpec::new("b").with_weight(300)
    ])))
    .unwrap();
    wait(&mut status, |s| s.version == 4).await;
    assert_eq!(status.borrow().services_made, 3);
    let version = status.borrow().version;

    // A source error keeps the last good snapshot.
    tx.send(Err(std::io::Error::other("registry unreachable")))
        .unwrap();
    wait(&mut status, |s| s.source_errors == 1).await;
    assert_eq!(
        status.borrow().last_error.as_deref(),
        Some("registry unreachable")
    );
    assert_eq!(pool.snapshot().version(), version);
    assert_eq!(pool.service_count(), 2);
    assert!(svc.ready().await.unwrap().call(11).await.is_ok());

    // Several updates queued together are published as one snapshot.
    tx.send(Ok(Update::Add(farm.specs(&["a"])))).unwrap();
    tx.send(Ok(Update::Remove(vec![EndpointKey::from("c")])))
        .unwrap();
    wait(&mut status, |s| s.services_released == 2).await;
    assert_eq!(status.borrow().version, version + 1);
    assert_eq!(pool.service_count(), 2);

    drop(tx);
    wait(&mut status, |s| s.source_ended).await;
    drop((svc, pool));
    for n in ["a", "b", "c"] {
        assert_eq!(
            Arc::strong_count(&farm.backends[n].0),
            1,
            "{n}: every service dropped with the pool"
        );
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_endpoint_without_a_service_is_left_out() {
    let farm = Farm::new(&["a", "b"]);
    let backends = farm.backends.clone();
    let pool = PoolBuilder::default().spawn_static(
        farm.specs(&["a", "b"]),
        lbkit_tower::TryMake(move |ep: &lbkit_core::Endpoint| match ep.address() {
            "a" => Err(std::io::Error::other("bad address")),
            other => Ok(backends[other].clone()),
        }),
    );
    assert_eq!(pool.snapshot().len(), 1);
    assert!(pool.has_service(&EndpointKey::from("b")));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn outlier_detection_ejects_a_failing_endpoint() {
    use lbkit_core::{Availability, Clock, Timestamp};
    use lbkit_health::OutlierConfig;

    let farm = Farm::new(&["a", "b", "c"]);
    farm.get("a").set(Behaviour::Fail);
    let (clock, hand) = Clock::manual(Timestamp::from_millis(1_000));
    let pool = PoolBuilder::new(lbkit_strategy::RoundRobin::default())
        .clock(clock)
        .availability(Availability::OFF)
        .outlier_detection(OutlierConfig::default())
        .spawn_static(farm.specs(&["a", "b", "c"]), farm.maker());
    let mut svc = BalanceLayer::new().failfast().layer(pool.clone());
    for id in 0..30 {
        let _ = svc.ready().await.unwrap().call(id).await;
    }
    assert_eq!(pool.snapshot().eligible().len(), 3);
    // Two outlier intervals later (the first tick starts the clock), a is ejected.
    for _ in 0..2 {
        hand.advance(Duration::from_secs(10));
        // Paused time: move the virtual clock past one pool tick and let the pool task run it.
        tokio::time::advance(Duration::from_millis(300)).await;
        tokio::task::yield_now().await;
    }
    let snap = pool.snapshot();
    assert_eq!(snap.eligible().len(), 2);
    assert!(snap
        .ejected_until(snap.find(&EndpointKey::from("a")).unwrap())
        .is_some());
    let before = farm.get("a").calls();
    for id in 100..110 {
        assert_ne!(svc.ready().await.unwrap().call(id).await.unwrap(), "a");
    }
    assert_eq!(farm.get("a").calls(), before);
}

// Mass-removal protection in a pool (on by default): three of five endpoints removed at once
// stay served until confirmed gone.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_mass_removal_is_held_back() {
    let names = ["a", "b", "c", "d", "e"];
    let farm = Farm::new(&names);
    let (tx, rx) = mpsc::unbounded_channel::<Item>();
    tx.send(Ok(Update::Reset(farm.specs(&names)))).unwrap();
    let pool = PoolBuilder::default().spawn(source(rx), farm.maker());
    let mut status = pool.status();
    wait(&mut status, |s| s.endpoints == 5).await;
    let gone = ["a", "b", "c"].map(EndpointKey::from).to_vec();
    tx.send(Ok(Update::Remove(gone))).unwrap();
    wait(&mut status, |s| s.held == 3).await;
    assert_eq!(pool.snapshot().len(), 5, "all five served");
    assert_eq!(status.borrow().removals_held, 3);
}

// The pool runs lbkit-discovery's Controller: an empty push is held back like everywhere else,
// and the next real set replaces it (mass-removal protection off: with it, leaving the held
// set for a smaller one holds the rest too, see the next test).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_empty_push_is_held_back() {
    let farm = Farm::new(&["a", "b", "c"]);
    let (tx, rx) = mpsc::unbounded_channel::<Item>();
    tx.send(Ok(Update::Reset(farm.specs(&["a", "b"])))).unwrap();
    let pool = PoolBuilder::default()
        .removal_protection(None)
        .spawn(source(rx), farm.maker());
    let mut status = pool.status();
    let mut svc = BalanceLayer::new().failfast().layer(pool.clone());
    tx.send(Ok(Update::Reset(Vec::new()))).unwrap();
    wait(&mut status, |s| s.empty_held == 1).await;
    assert_eq!(pool.snapshot().len(), 2, "the last set stays");
    assert!(svc.ready().await.unwrap().call(1).await.is_ok());
    tx.send(Ok(Update::Remove(vec![EndpointKey::from("a")])))
        .unwrap();
    // A later update is the event that shows the two before it were applied.
    tx.send(Ok(Update::Add(farm.specs(&["c"])))).unwrap();
    wait(&mut status, |s| s.services_made == 3).await;
    let keys: Vec<_> = pool
        .snapshot()
        .endpoints()
        .iter()
        .map(|e| e.key().to_string())
        .collect();
    assert_eq!(keys, ["c"], "the held-back removal applied, then c");
    assert!(svc.ready().await.unwrap().call(2).await.is_ok());
    // Emptied again: held, c keeps serving.
    tx.send(Ok(Update::Reset(Vec::new()))).unwrap();
    tx.send(Ok(Update::Reset(farm.specs(&["b"])))).unwrap();
    wait(&mut status, |s| s.endpoints == 1 && s.services_made == 4).await;
    assert_eq!(pool.snapshot().endpoints()[0].key().as_str(), "b");
}

/// A TCP port that accepts while open: what lbkit-health's TCP probe checks.
async fn listen(addr: &str) -> tokio::task::JoinHandle<()> {
    let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            drop(stream);
        }
    })
}

/// The eligible endpoints of the pool's snapshot, once `pred` holds for them (each publish is
/// the event waited on).
async fn eligible_until<S: lbkit_core::Strategy>(
    pool: &lbkit_tower::Pool<
        tower::util::BoxCloneSyncService<u64, String, std::convert::Infallible>,
        S,
    >,
    pred: impl Fn(&[String]) -> bool,
) -> Vec<String> {
    let mut status = pool.status();
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let snap = pool.snapshot();
            let now: Vec<String> = snap
                .eligible()
                .iter()
                .map(|&i| snap.endpoint(i).address().to_owned())
                .collect();
            if pred(&now) {
                return now;
            }
            status.changed().await.expect("pool alive");
        }
    })
    .await
    .expect("in time")
}

// A tower user gets the proxy's active health checks: an endpoint whose port closes is taken
// out after `fall` failed probes and readmitted after `rise` good ones.
#[tokio::test(flavor = "current_thread")]
async fn active_health_checks_take_an_endpoint_out_and_back() {
    use lbkit_health::active::{ActiveCheck, TcpProbe};
    let a = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let a_addr = a.local_addr().expect("addr").to_string();
    drop(a);
    let a_task = listen(&a_addr).await;
    let b = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let b_addr = b.local_addr().expect("addr").to_string();
    let _b_keep = tokio::spawn(async move { while b.accept().await.is_ok() {} });
    let check = ActiveCheck {
        interval: Duration::from_millis(20),
        timeout: Duration::from_millis(500),
        rise: 2,
        fall: 2,
    };
    let pool = PoolBuilder::default()
        .health_check(TcpProbe, check)
        .spawn_static(
            vec![EndpointSpec::new(&a_addr), EndpointSpec::new(&b_addr)],
            |ep: &lbkit_core::Endpoint| {
                let name = ep.address().to_owned();
                tower::util::BoxCloneSyncService::new(tower::service_fn(move |_: u64| {
                    let name = name.clone();
                    async move { Ok::<_, std::convert::Infallible>(name) }
                }))
            },
        );
    let both = eligible_until(&pool, |e| e.len() == 2).await;
    assert_eq!(both, [a_addr.clone(), b_addr.clone()]);
    a_task.abort();
    let _ = a_task.await;
    let left = eligible_until(&pool, |e| e.len() == 1).await;
    assert_eq!(
        left.as_slice(),
        std::slice::from_ref(&b_addr),
        "a failed its checks"
    );
    let mut svc = BalanceLayer::new().failfast().layer(pool.clone());
    for i in 0..10 {
        assert_eq!(svc.ready().await.unwrap().call(i).await.unwrap(), b_addr);
    }
    let _a_again = listen(&a_addr).await;
    let back = eligible_until(&pool, |e| e.len() == 2).await;
    assert_eq!(back, [a_addr, b_addr], "readmitted after rise");
}

// A handle made before an update follows it: an endpoint added later is picked, one removed is
// not (round robin, so every endpoint of the current snapshot is reached).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_handle_made_before_an_update_follows_it() {
    let farm = Farm::new(&["a", "b", "c"]);
    let (tx, rx) = mpsc::unbounded_channel::<Item>();
    tx.send(Ok(Update::Reset(farm.specs(&["a", "b"])))).unwrap();
    let pool = PoolBuilder::new(lbkit_core::BoxStrategy::new(
        lbkit_strategy::RoundRobin::new(),
    ))
    .spawn(source(rx), farm.maker());
    let mut status = pool.status();
    let mut svc = BalanceLayer::new().failfast().layer(pool.clone());
    let mut reached = std::collections::BTreeSet::new();
    for id in 0..4 {
        reached.insert(svc.ready().await.unwrap().call(id).await.unwrap());
    }
    assert_eq!(reached, ["a", "b"].map(String::from).into());

    tx.send(Ok(Update::Add(farm.specs(&["c"])))).unwrap();
    wait(&mut status, |s| s.services_made == 3).await;
    reached.clear();
    for id in 0..6 {
        reached.insert(svc.ready().await.unwrap().call(id).await.unwrap());
    }
    assert_eq!(reached, ["a", "b", "c"].map(String::from).into());

    tx.send(Ok(Update::Remove(vec![EndpointKey::from("a")])))
        .unwrap();
    wait(&mut status, |s| s.services_released == 1).await;
    reached.clear();
    for id in 0..6 {
        reached.insert(svc.ready().await.unwrap().call(id).await.unwrap());
    }
    assert_eq!(reached, ["b", "c"].map(String::from).into());
}

/// Services follow any sequence of changes made one publish at a time, as the pool carries
/// the unchanged ones over (diffing each snapshot against the last) or rebuilds them: each
/// endpoint has exactly one service, made when its key first comes or moves to another
/// address, released when it goes or moves; a weight change makes nothing.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn services_follow_every_change_made_or_released_once() {
    let (tx, rx) = mpsc::unbounded_channel::<Item>();
    let spec = |k: u64, addr: u64, w: u32| EndpointSpec {
        key: EndpointKey::from(format!("k{k:02}").as_str()),
        ..EndpointSpec::new(format!("10.0.0.{addr}:{k}")).with_weight(w)
    };
    let make = |e: &lbkit_core::Endpoint| e.address().to_owned();
    let pool = PoolBuilder::default()
        .removal_protection(None)
        .spawn(source(rx), make);
    let mut status = pool.status();
    let mut held: std::collections::BTreeMap<u64, (u64, u32)> = Default::default();
    let (mut made, mut released, mut version) = (0, 0, 0);
    let mut rng = lbkit_core::FastRng::seed_from_u64(44);
    for step in 0..300 {
        let k = rng.below(16);
        let was = held.get(&k).copied();
        let update = match (rng.below(4), was) {
            (0, Some(_)) if held.len() > 1 => {
                held.remove(&k);
                released += 1;
                Update::Remove(vec![EndpointKey::from(format!("k{k:02}").as_str())])
            }
            (1, Some((addr, w))) => {
                held.insert(k, (addr, w + 1));
                Update::Add(vec![spec(k, addr, w + 1)])
            }
            (_, was) => {
                let addr = was.map_or(1, |(a, _)| 3 - a);
                made += 1;
                released += u64::from(was.is_some());
                held.insert(k, (addr, 1));
                Update::Add(vec![spec(k, addr, 1)])
            }
        };
        tx.send(Ok(update)).unwrap();
        version += 1;
        wait(&mut status, |s| s.version == version).await;
        let s = status.borrow().clone();
        assert_eq!(
            (s.services_made, s.services_released),
            (made, released),
            "step {step}"
        );
        assert_eq!(pool.service_count(), held.len(), "step {step}");
        for k in held.keys() {
            assert!(pool.has_service(&EndpointKey::from(format!("k{k:02}").as_str())));
        }
    }
}
