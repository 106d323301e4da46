//! Aperture coordinates from the registry (`ZkPeers`) against real ZooKeeper servers: clients
//! register under `/dubbo/<interface>/consumers` as Dubbo consumers do, derive distinct
//! indices and the count, follow joins and leaves, and keep their coordinates through an
//! outage.
#![cfg(feature = "zookeeper")]

mod common;

use std::collections::BTreeSet;

use common::{unique, OwnZk, WAIT};
use lbkit_core::stage::Coordinates;
use lbkit_discovery::zookeeper::{Layout, PeersHandle, ServicePath, ZkConfig, ZkPeers};
use zookeeper_client::Client;

/// Wait until every handle sees `count` clients; their indices.
async fn settled(handles: &[&PeersHandle], count: u32) -> BTreeSet<u32> {
    let mut indices = BTreeSet::new();
    for h in handles {
        let mut rx = h.coordinates();
        let at = tokio::time::timeout(WAIT, rx.wait_for(|c| c.is_some_and(|c| c.count == count)))
            .await
            .unwrap_or_else(|_| panic!("coordinates never reached a count of {count}"))
            .expect("peers task alive")
            .expect("some");
        indices.insert(at.index);
    }
    indices
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_number_themselves_and_follow_joins_and_leaves() {
    let zk = ZkConfig::new(require_zk!());
    let path = ServicePath::new("dubbo", &unique("peers"), Layout::Dubbo).unwrap();
    let peers = || ZkPeers::new(zk.clone(), path.clone()).with_application("peers-test");
    let (a, b, c) = (peers().spawn(), peers().spawn(), peers().spawn());
    assert_eq!(settled(&[&a, &b, &c], 3).await, BTreeSet::from([0, 1, 2]));
    // The nodes are Dubbo consumer URLs, where Dubbo's own consumers register.
    let client = Client::connect(&zk.servers).await.unwrap();
    let dir = format!("/dubbo/{}/consumers", path.service());
    // A Java Dubbo consumer of the interface registers there too; it is not in the ring.
    let java = format!(
        "{dir}/consumer%3A%2F%2F10.9.9.9%2F{}%3Fapplication%3Djava%26category%3Dconsumers",
        path.service()
    );
    let ephemeral =
        zookeeper_client::CreateMode::Ephemeral.with_acls(zookeeper_client::Acls::anyone_all());
    client.create(&java, &[], &ephemeral).await.unwrap();
    let d = peers().spawn();
    assert_eq!(
        settled(&[&a, &b, &c, &d], 4).await,
        BTreeSet::from([0, 1, 2, 3])
    );
    drop(d);
    assert_eq!(settled(&[&a, &b, &c], 3).await, BTreeSet::from([0, 1, 2]));
    let (children, _) = client.get_children(&dir).await.unwrap();
    assert_eq!(children.len(), 4, "three lbkit clients and the Java one");
    let children: Vec<String> = children
        .into_iter()
        .filter(|n| n.contains("lbkit.instance"))
        .collect();
    assert_eq!(children.len(), 3);
    assert!(
        children.iter().all(|n| n.starts_with("consumer%3A%2F%2F")),
        "{children:?}"
    );
    assert!(children[0].contains("category%3Dconsumers"), "{children:?}");
    drop(b);
    assert_eq!(settled(&[&a, &c], 2).await, BTreeSet::from([0, 1]));
    let d = peers().spawn();
    assert_eq!(settled(&[&a, &c, &d], 3).await, BTreeSet::from([0, 1, 2]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinates_survive_an_outage() {
    let own = OwnZk::start("peers-outage").await;
    let zk = ZkConfig::new(own.addr.clone());
    let path = ServicePath::new("dubbo", &unique("outage"), Layout::Dubbo).unwrap();
    let (a, b) = (
        ZkPeers::new(zk.clone(), path.clone()).spawn(),
        ZkPeers::new(zk.clone(), path.clone()).spawn(),
    );
    settled(&[&a, &b], 2).await;
    let before: Vec<Option<Coordinates>> =
        vec![*a.coordinates().borrow(), *b.coordinates().borrow()];
    own.stop().await;
    // Unreachable: the coordinates stay as they were (nothing is sent while it lasts).
    assert_eq!(
        vec![*a.coordinates().borrow(), *b.coordinates().borrow()],
        before
    );
    own.restart().await;
    assert_eq!(settled(&[&a, &b], 2).await, BTreeSet::from([0, 1]));
}

// A client that only registers (the proxy without an aperture) is in the consumers directory
// but in no one's count, lists nothing, and registers again when its node is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_register_only_client_is_listed_but_not_counted() {
    let zk = ZkConfig::new(require_zk!());
    let path = ServicePath::new("dubbo", &unique("peers"), Layout::Dubbo).unwrap();
    let only = ZkPeers::new(zk.clone(), path.clone())
        .register_only()
        .spawn();
    let mut node = only.coordinates();
    let a = ZkPeers::new(zk.clone(), path.clone()).spawn();
    assert_eq!(settled(&[&a], 1).await, BTreeSet::from([0]));
    let client = Client::connect(&zk.servers).await.unwrap();
    let registered = || async {
        let at = only.node()?;
        client.check_stat(&at).await.ok().flatten().map(|_| at)
    };
    let mut pace = tokio::time::interval(std::time::Duration::from_millis(20));
    let at = tokio::time::timeout(WAIT, async {
        loop {
            if let Some(at) = registered().await {
                return at;
            }
            pace.tick().await;
        }
    })
    .await
    .expect("registered in time");
    assert!(at.contains("lbkit.consumer%3D"), "{at}");
    assert!(node.borrow_and_update().is_none(), "no coordinates for it");
    client.delete(&at, None).await.unwrap();
    tokio::time::timeout(WAIT, async {
        while registered().await.is_none() {
            pace.tick().await;
        }
    })
    .await
    .expect("registered again after the delete");
    assert_eq!(settled(&[&a], 1).await, BTreeSet::from([0]), "still alone");
}
