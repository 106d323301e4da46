//! ZooKeeper consumer and provider against a real server (`LBKIT_ZK`, see
//! `scripts/zookeeper.sh`): round trips in both layouts, filters, weight changes, malformed nodes.
#![cfg(feature = "zookeeper")]

mod common;

use std::sync::Arc;

use lbkit_core::Snapshot;

use common::{entries, has, unique, wait_status, Pipeline};
use lbkit_discovery::governance::yaml_configurators_path;
use lbkit_discovery::zookeeper::{
    Layout, Provider, ProviderFilter, ServicePath, WatchMode, ZkConfig, ZkRegistration, ZkSource,
};
use lbkit_discovery::ControllerConfig;
use lbkit_testkit::zk_shim::ZkShim;
use zookeeper_client::{Acls, Client, CreateMode};

fn provider(address: &str, weight: u32) -> Provider {
    let mut p = Provider::new(address);
    p.weight = weight;
    p
}

async fn registered(zk: &ZkConfig, path: &ServicePath, p: Provider) -> ZkRegistration {
    let r = ZkRegistration::spawn(zk.clone(), path.clone(), p).expect("valid provider");
    wait_status(&mut r.status(), "registration", |s| s.registered).await;
    r
}

async fn round_trip(layout: Layout) {
    let zk = ZkConfig::new(require_zk!());
    let path = ServicePath::new("dubbo", &unique("roundtrip"), layout).unwrap();
    let mut pipeline = Pipeline::start(
        ZkSource::new(zk.clone(), path.clone()),
        ControllerConfig::default(),
    );
    let mut b = provider("10.1.0.2:20880", 300);
    b.zone = Some("eu-1".into());
    b.metadata.insert("tag", "blue");
    // Registered out of key order: the consumer sorts by key.
    let rb = registered(&zk, &path, b).await;
    let ra = registered(&zk, &path, provider("10.1.0.1:20880", 100)).await;
    let s = pipeline.until("both providers", |s| s.len() == 2).await;
    assert_eq!(
        entries(&s),
        vec![
            ("10.1.0.1:20880".to_owned(), 100),
            ("10.1.0.2:20880".to_owned(), 300)
        ]
    );
    let e = &s.endpoints()[1];
    assert_eq!(e.zone(), Some("eu-1"));
    assert_eq!(e.metadata()["tag"], "blue");
    if layout == Layout::Dubbo {
        assert!(
            e.registered_at().is_some(),
            "Dubbo timestamp read for warm-up"
        );
    }
    let stats_a = s.endpoints()[0].stats_arc().clone();
    ra.deregister().await;
    let s = pipeline
        .until("a deregistered", |s| !has(s, "10.1.0.1:20880"))
        .await;
    assert_eq!(entries(&s), vec![("10.1.0.2:20880".to_owned(), 300)]);
    assert!(!Arc::ptr_eq(&stats_a, s.endpoints()[0].stats_arc()));
    rb.deregister().await;
    // The source now lists nothing: empty-push protection holds the last provider back…
    wait_status(&mut pipeline.status, "zero providers", |st| {
        st.providers == 0
    })
    .await;
    assert_eq!(pipeline.balancer.snapshot().len(), 1);
    // …until a real set arrives; no empty snapshot was ever published.
    let rc = registered(&zk, &path, provider("10.1.0.3:20880", 100)).await;
    let s = pipeline
        .until("c alone", |s| has(s, "10.1.0.3:20880"))
        .await;
    assert_eq!(s.len(), 1);
    assert!(
        pipeline
            .history
            .iter()
            .skip_while(|s| s.is_empty()) // the directory was empty at first
            .all(|s| !s.is_empty()),
        "never emptied once non-empty"
    );
    rc.deregister().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_dubbo_layout() {
    round_trip(Layout::Dubbo).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_plain_layout() {
    round_trip(Layout::Plain).await;
}

async fn weight_change(layout: Layout) {
    let zk = ZkConfig::new(require_zk!());
    let path = ServicePath::new("dubbo", &unique("weight"), layout).unwrap();
    let mut pipeline = Pipeline::start(
        ZkSource::new(zk.clone(), path.clone()),
        ControllerConfig::default(),
    );
    let r = registered(&zk, &path, provider("10.2.0.1:20880", 100)).await;
    let before = pipeline
        .until("weight 100", |s| {
            entries(s) == [("10.2.0.1:20880".to_owned(), 100)]
        })
        .await;
    r.set_weight(250).await.expect("weight updated");
    let after = pipeline
        .until("weight 250", |s| {
            entries(s) == [("10.2.0.1:20880".to_owned(), 250)]
        })
        .await;
    assert!(
        Arc::ptr_eq(
            before.endpoints()[0].stats_arc(),
            after.endpoints()[0].stats_arc()
        ),
        "same key: statistics survive the weight change"
    );
    assert!(
        pipeline.drain().iter().all(|s| s.len() == 1),
        "never seen twice or missing"
    );
    r.deregister().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weight_change_propagates_dubbo_layout() {
    weight_change(Layout::Dubbo).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weight_change_propagates_plain_layout() {
    weight_change(Layout::Plain).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_version_and_protocol_filters() {
    let zk = ZkConfig::new(require_zk!());
    let path = ServicePath::new("dubbo", &unique("filters"), Layout::Dubbo).unwrap();
    let mut g1 = provider("10.3.0.1:20880", 100);
    g1.group = Some("g1".into());
    g1.version = Some("1.0".into());
    let mut g2 = provider("10.3.0.2:20880", 100);
    g2.group = Some("g2".into());
    let mut tri = provider("10.3.0.3:50051", 100);
    tri.protocol = "tri".into();
    tri.group = Some("g1".into());
    tri.version = Some("1.0".into());
    let regs = [
        registered(&zk, &path, g1).await,
        registered(&zk, &path, g2).await,
        registered(&zk, &path, tri).await,
    ];
    let filter = ProviderFilter {
        group: Some("g1".into()),
        version: Some("1.0".into()),
        protocol: Some("dubbo".into()),
    };
    let mut pipeline = Pipeline::start(
        ZkSource::new(zk.clone(), path.clone()).with_filter(filter),
        ControllerConfig::default(),
    );
    let s = pipeline.until("first listing", |_| true).await;
    assert_eq!(entries(&s), vec![("10.3.0.1:20880".to_owned(), 100)]);
    assert_eq!(
        pipeline.status.get().rejected,
        0,
        "filtered is not malformed"
    );
    for r in regs {
        r.deregister().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_nodes_are_skipped_counted_once_and_never_stop_the_watch() {
    let zk = ZkConfig::new(require_zk!());
    let client = Client::connect(&zk.servers).await.expect("connect");
    let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
    let ephemeral = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
    let dubbo = ServicePath::new("dubbo", &unique("malformed"), Layout::Dubbo).unwrap();
    let plain = ServicePath::new("dubbo", &unique("malformed-plain"), Layout::Plain).unwrap();
    for p in [&dubbo, &plain] {
        client.mkdir(&p.dir(), &persistent).await.expect("mkdir");
    }
    let bad_dubbo = [
        "garbage",                                         // not a URL
        "foo%3A%2F%2F10.4.0.9%3A1%2Fx",                    // unknown protocol
        "dubbo%3A%2F%2F10.4.0.9%3A2%2Fx%3Fweight%3Dheavy", // bad weight
        "dubbo%3A%2F%2F10.4.0.9%2Fx",                      // no port
    ];
    for name in bad_dubbo {
        let node = format!("{}/{name}", dubbo.dir());
        client.create(&node, &[], &ephemeral).await.expect("create");
    }
    let bad_plain: [(&str, &[u8]); 2] = [("not-an-address", b""), ("10.4.0.9:80", b"{weight")];
    for (name, data) in bad_plain {
        let node = format!("{}/{name}", plain.dir());
        client
            .create(&node, data, &ephemeral)
            .await
            .expect("create");
    }
    let good = "dubbo%3A%2F%2F10.4.0.1%3A20880%2Fx%3Fweight%3D7";
    client
        .create(&format!("{}/{good}", dubbo.dir()), &[], &ephemeral)
        .await
        .expect("create");
    client
        .create(
            &format!("{}/10.4.0.2:80", plain.dir()),
            br#"{"weight": 9}"#,
            &ephemeral,
        )
        .await
        .expect("create");

    let mut pd = Pipeline::start(
        ZkSource::new(zk.clone(), dubbo.clone()),
        ControllerConfig::default(),
    );
    let mut pp = Pipeline::start(
        ZkSource::new(zk.clone(), plain.clone()),
        ControllerConfig::default(),
    );
    let s = pd.until("the good Dubbo node", |s| !s.is_empty()).await;
    assert_eq!(entries(&s), vec![("10.4.0.1:20880".to_owned(), 7)]);
    let s = pp.until("the good plain node", |s| !s.is_empty()).await;
    assert_eq!(entries(&s), vec![("10.4.0.2:80".to_owned(), 9)]);
    assert_eq!(pd.status.get().rejected, 4);
    assert_eq!(pp.status.get().rejected, 2);

    // The watch lives on: more nodes, a good one and a data change that breaks the plain one.
    client
        .create(
            &format!("{}/dubbo%3A%2F%2F10.4.0.3%3A20880%2Fx", dubbo.dir()),
            &[],
            &ephemeral,
        )
        .await
        .expect("create");
    pd.until("a later good node", |s| s.len() == 2).await;
    client
        .set_data(&format!("{}/10.4.0.2:80", plain.dir()), b"[1, 2]", None)
        .await
        .expect("set");
    wait_status(&mut pp.status, "third rejection", |st| st.rejected == 3).await;
    assert_eq!(
        pd.status.get().rejected,
        4,
        "each malformed node counted once"
    );
    drop(client);
}

/// Registrations go to the real server; the consumer under test may sit behind a shim.
async fn follow_changes(consumer: &ZkConfig, real: &ZkConfig, layout: Layout, mode: WatchMode) {
    let path = ServicePath::new("dubbo", &unique("watch"), layout).unwrap();
    let mut pipeline = Pipeline::start(
        ZkSource::new(consumer.clone(), path.clone()).with_watch(mode),
        ControllerConfig::default(),
    );
    let ra = registered(real, &path, provider("10.9.0.1:20880", 100)).await;
    pipeline.until("a", |s| has(s, "10.9.0.1:20880")).await;
    let rb = registered(real, &path, provider("10.9.0.2:20880", 100)).await;
    pipeline.until("a and b", |s| s.len() == 2).await;
    rb.set_weight(300).await.expect("weight updated");
    pipeline
        .until("b's new weight", |s| {
            entries(s).contains(&("10.9.0.2:20880".to_owned(), 300))
        })
        .await;
    ra.deregister().await;
    let s = pipeline.until("b alone", |s| s.len() == 1).await;
    assert_eq!(entries(&s), vec![("10.9.0.2:20880".to_owned(), 300)]);
    rb.deregister().await;
}

// Dubbo's own consumer (Curator) watches with one-shot watches; lbkit does when asked, and
// follows creations, data changes and deletions in both layouts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_shot_watches_follow_every_change() {
    let zk = ZkConfig::new(require_zk!());
    for layout in [Layout::Dubbo, Layout::Plain] {
        follow_changes(&zk, &zk, layout, WatchMode::OneShot).await;
    }
}

// A server older than 3.6 (ZooKeeper 3.4 and 3.5, still common in Dubbo shops) has no
// persistent recursive watches: it answers `UNIMPLEMENTED` and closes the connection. The
// consumer falls back to one-shot watches on the same session (issue 15).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_older_than_3_6_is_watched_with_one_shot_watches() {
    let real = ZkConfig::new(require_zk!());
    let shim = ZkShim::older_than_3_6(&real.servers).await.expect("shim");
    let old = ZkConfig::new(shim.addr.to_string());
    for layout in [Layout::Dubbo, Layout::Plain] {
        follow_changes(&old, &real, layout, WatchMode::Auto).await;
    }
    assert!(
        shim.refused() >= 1,
        "the consumer asked for a persistent watch first"
    );
    // Asked for persistent watches only, the consumer reports the server's refusal.
    let path = ServicePath::new("dubbo", &unique("persistent"), Layout::Dubbo).unwrap();
    let mut pipeline = Pipeline::start(
        ZkSource::new(old, path).with_watch(WatchMode::Persistent),
        ControllerConfig::default(),
    );
    let st = wait_status(&mut pipeline.status, "the refusal", |s| {
        s.last_error.is_some()
    })
    .await;
    assert!(!st.one_shot_watches, "{st:?}");
}

// A connection cut (a network blip; the session lives on) loses no later change, whichever
// way the consumer watches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_after_a_connection_cut_are_seen() {
    let real = ZkConfig::new(require_zk!());
    for mode in [WatchMode::Persistent, WatchMode::OneShot] {
        let shim = ZkShim::start(&real.servers).await.expect("shim");
        let path = ServicePath::new("dubbo", &unique("cut"), Layout::Dubbo).unwrap();
        let mut pipeline = Pipeline::start(
            ZkSource::new(ZkConfig::new(shim.addr.to_string()), path.clone()).with_watch(mode),
            ControllerConfig::default(),
        );
        let ra = registered(&real, &path, provider("10.9.1.1:20880", 100)).await;
        pipeline.until("a", |s| has(s, "10.9.1.1:20880")).await;
        let before = pipeline.status.get().listings;
        shim.cut();
        wait_status(&mut pipeline.status, "listed after the cut", |s| {
            s.connected && s.listings > before
        })
        .await;
        assert_eq!(pipeline.status.get().sessions, 1, "{mode:?}: same session");
        let rb = registered(&real, &path, provider("10.9.1.2:20880", 100)).await;
        pipeline
            .until(&format!("{mode:?}: b, registered after the cut"), |s| {
                s.len() == 2
            })
            .await;
        ra.deregister().await;
        rb.deregister().await;
    }
}

/// An override rule as dubbo-admin writes it: a persistent node under `configurators` named by
/// the URL-encoded rule (Java's `URLEncoder`). Returns the node's path.
async fn write_rule(client: &Client, path: &ServicePath, rule: &str) -> String {
    let encoded =
        percent_encoding::utf8_percent_encode(rule, percent_encoding::NON_ALPHANUMERIC).to_string();
    let dir = path.rules_dir().expect("the Dubbo layout has rules");
    let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
    client.mkdir(&dir, &persistent).await.expect("mkdir");
    let node = format!("{dir}/{encoded}");
    client
        .create(&node, &[], &persistent)
        .await
        .expect("create the rule");
    node
}

fn weights(s: &Snapshot) -> Vec<u32> {
    s.endpoints().iter().map(|e| e.weight()).collect()
}

/// Override rules written, changed and removed while the consumer watches: weight and disabled,
/// for one provider and for all, scoped to an application, composed in Dubbo's order; a
/// malformed rule is skipped and counted.
async fn override_rules(mode: WatchMode) {
    let zk = ZkConfig::new(require_zk!());
    let client = Client::connect(&zk.servers).await.expect("connect");
    let service = unique("governed");
    let path = ServicePath::new("dubbo", &service, Layout::Dubbo).unwrap();
    let mut regs = Vec::new();
    for i in 1..=3 {
        let mut p = provider(&format!("10.5.0.{i}:20880"), 100);
        p.application = "shop".into();
        regs.push(registered(&zk, &path, p).await);
    }
    let mut pipeline = Pipeline::start(
        ZkSource::new(zk.clone(), path.clone())
            .with_watch(mode)
            .with_application("web"),
        ControllerConfig::default(),
    );
    pipeline.until("three providers", |s| s.len() == 3).await;

    // dubbo-admin's weight button: one provider doubled.
    let double = write_rule(
        &client,
        &path,
        &format!("override://10.5.0.1:20880/{service}?category=configurators&dynamic=false&enabled=true&weight=200"),
    )
    .await;
    let s = pipeline
        .until("10.5.0.1 doubled", |s| weights(s) == [200, 100, 100])
        .await;
    let rules = s.endpoints()[0].metadata()["dubbo.rules"].clone();
    assert!(
        rules.contains("override://10.5.0.1:20880/") && rules.ends_with("sets weight=200"),
        "{rules}"
    );
    assert!(!s.endpoints()[1].metadata().contains_key("dubbo.rules"));
    assert_eq!(pipeline.status.get().rules, 1);

    // Every provider disabled (0.0.0.0): the specific rule sorts after it but does not enable.
    let disable = write_rule(
        &client,
        &path,
        &format!("override://0.0.0.0/{service}?category=configurators&disabled=true&dynamic=false&enabled=true"),
    )
    .await;
    pipeline
        .until("all disabled", |s| weights(s) == [0, 0, 0])
        .await;
    client.delete(&disable, None).await.expect("delete");
    pipeline
        .until("the disable rule gone", |s| weights(s) == [200, 100, 100])
        .await;

    // A malformed rule is skipped and counted; the others stay in force.
    write_rule(
        &client,
        &path,
        &format!("override://0.0.0.0/{service}?weight=heavy"),
    )
    .await;
    wait_status(&mut pipeline.status, "the bad rule counted", |st| {
        st.rules_rejected == 1
    })
    .await;

    // Scoped to an application: the consumer's (`web`@) applies, another one's does not; the
    // rule for one provider still wins over the one for all.
    write_rule(
        &client,
        &path,
        &format!("override://web@0.0.0.0/{service}?weight=50"),
    )
    .await;
    write_rule(
        &client,
        &path,
        &format!("override://0.0.0.0/{service}?application=billing&weight=1"),
    )
    .await;
    pipeline
        .until("web's rule", |s| weights(s) == [200, 50, 50])
        .await;
    // The double, web's and billing's (which applies to no one).
    wait_status(&mut pipeline.status, "three rules in force", |st| {
        st.rules == 3
    })
    .await;

    // The rule nodes removed: back to the registered weights.
    client.delete(&double, None).await.expect("delete");
    let dir = path.rules_dir().unwrap();
    for child in client.list_children(&dir).await.expect("list") {
        client
            .delete(&format!("{dir}/{child}"), None)
            .await
            .expect("delete");
    }
    let s = pipeline
        .until("no rules", |s| weights(s) == [100, 100, 100])
        .await;
    assert!(s
        .endpoints()
        .iter()
        .all(|e| !e.metadata().contains_key("dubbo.rules")));
    assert_eq!(pipeline.status.get().rules_rejected, 1, "counted once");
    for r in regs {
        r.deregister().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn override_rules_apply_while_they_change() {
    override_rules(WatchMode::Auto).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn override_rules_apply_with_one_shot_watches() {
    override_rules(WatchMode::OneShot).await;
}

/// Dubbo 3's YAML configurators, as dubbo-admin writes them to the config center
/// (`/dubbo/config/dubbo/<interface>.configurators`, and the consumer application's): created,
/// changed, made malformed, deleted while the consumer watches.
async fn yaml_rules(mode: WatchMode) {
    let zk = ZkConfig::new(require_zk!());
    let client = Client::connect(&zk.servers).await.expect("connect");
    let service = unique("yaml");
    let path = ServicePath::new("dubbo", &service, Layout::Dubbo).unwrap();
    let mut regs = Vec::new();
    for i in 1..=2 {
        regs.push(registered(&zk, &path, provider(&format!("10.6.0.{i}:20880"), 100)).await);
    }
    let app = unique("web");
    let mut pipeline = Pipeline::start(
        ZkSource::new(zk.clone(), path.clone())
            .with_watch(mode)
            .with_application(app.clone()),
        ControllerConfig::default(),
    );
    pipeline.until("two providers", |s| s.len() == 2).await;
    let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
    let node = yaml_configurators_path("dubbo", &service);
    client
        .mkdir("/dubbo/config/dubbo", &persistent)
        .await
        .expect("mkdir");
    let weight = |w: u32| {
        format!("configVersion: v2.7\nscope: service\nkey: {service}\nenabled: true\nconfigs:\n- addresses: [10.6.0.1:20880]\n  side: provider\n  parameters:\n    weight: {w}\n")
    };
    client
        .create(&node, weight(200).as_bytes(), &persistent)
        .await
        .expect("create");
    let s = pipeline
        .until("10.6.0.1 at 200", |s| weights(s) == [200, 100])
        .await;
    assert!(s.endpoints()[0].metadata()["dubbo.rules"].contains("dynamicconfigurators"));
    client
        .set_data(&node, weight(50).as_bytes(), None)
        .await
        .expect("set");
    pipeline
        .until("10.6.0.1 at 50", |s| weights(s) == [50, 100])
        .await;

    // The consumer application's document: every provider of every service disabled.
    let app_node = yaml_configurators_path("dubbo", &app);
    let off = format!("configVersion: v2.7\nscope: application\nkey: {app}\nenabled: true\nconfigs:\n- side: consumer\n  parameters:\n    disabled: true\n");
    client
        .create(&app_node, off.as_bytes(), &persistent)
        .await
        .expect("create");
    pipeline.until("all off", |s| weights(s) == [0, 0]).await;
    client.delete(&app_node, None).await.expect("delete");
    pipeline
        .until("on again", |s| weights(s) == [50, 100])
        .await;

    // Malformed: skipped and counted; the node's last good rules stay in force.
    client
        .set_data(&node, b"configs: [", None)
        .await
        .expect("set");
    wait_status(&mut pipeline.status, "the bad document counted", |st| {
        st.rules_rejected == 1
    })
    .await;
    assert_eq!(weights(&pipeline.balancer.snapshot()), [50, 100]);
    client
        .set_data(&node, weight(300).as_bytes(), None)
        .await
        .expect("set");
    pipeline
        .until("10.6.0.1 at 300", |s| weights(s) == [300, 100])
        .await;
    client.delete(&node, None).await.expect("delete");
    pipeline
        .until("no rules", |s| weights(s) == [100, 100])
        .await;
    for r in regs {
        r.deregister().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn yaml_configurators_apply_while_they_change() {
    yaml_rules(WatchMode::Auto).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn yaml_configurators_apply_with_one_shot_watches() {
    yaml_rules(WatchMode::OneShot).await;
}

/// Every address a request with `tag` reaches in the pipeline's balancer (seeded picks), or the
/// pick's error.
fn reach(
    pipeline: &Pipeline,
    tag: Option<lbkit_core::RequestTag<'_>>,
) -> Result<Vec<String>, lbkit_core::PickError> {
    let mut rng = lbkit_core::FastRng::seed_from_u64(5);
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..60 {
        let mut cx = lbkit_core::PickContext::new(lbkit_core::Timestamp::ZERO, &mut rng);
        cx.tag = tag;
        let g = pipeline.balancer.pick(&mut cx)?;
        seen.insert(g.endpoint().address().to_owned());
        g.finish(lbkit_core::Outcome::Success);
    }
    Ok(seen.into_iter().collect())
}

/// Tag routing from the registry: a provider's own `dubbo.tag`, then Dubbo 3's YAML tag rule
/// for the providers' application (`/dubbo/config/dubbo/<application>.tag-router`) created,
/// changed, made malformed and deleted while the consumer watches.
async fn tag_rules(mode: WatchMode) {
    use lbkit_core::RequestTag;
    let zk = ZkConfig::new(require_zk!());
    let client = Client::connect(&zk.servers).await.expect("connect");
    let service = unique("tagged");
    let app = unique("shop");
    let path = ServicePath::new("dubbo", &service, Layout::Dubbo).unwrap();
    let mut regs = Vec::new();
    for i in 1..=3 {
        let mut p = provider(&format!("10.7.0.{i}:20880"), 100);
        p.application = app.clone();
        if i == 3 {
            p.metadata.insert("dubbo.tag", "blue");
        }
        regs.push(registered(&zk, &path, p).await);
    }
    let mut pipeline = Pipeline::start(
        ZkSource::new(zk.clone(), path.clone()).with_watch(mode),
        ControllerConfig::default(),
    );
    pipeline.until("three providers", |s| s.len() == 3).await;
    let (one, two, three) = ("10.7.0.1:20880", "10.7.0.2:20880", "10.7.0.3:20880");
    let owned = |v: &[&str]| Ok(v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    // The provider's own tag: blue requests go to it, the rest avoid it.
    assert_eq!(
        reach(&pipeline, Some(RequestTag::new(b"blue"))),
        owned(&[three])
    );
    assert_eq!(reach(&pipeline, None), owned(&[one, two]));
    assert_eq!(
        reach(&pipeline, Some(RequestTag::new(b"gray"))),
        owned(&[one, two])
    );
    assert_eq!(
        reach(&pipeline, Some(RequestTag::forced(b"gray"))),
        Err(lbkit_core::PickError::NoTagMatch)
    );

    // dubbo-admin's tag rule: gray is 10.7.0.1.
    let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
    client
        .mkdir("/dubbo/config/dubbo", &persistent)
        .await
        .expect("mkdir");
    let node = lbkit_discovery::governance::tag::tag_rule_path("dubbo", &app);
    let rule = |addr: &str| {
        format!("force: false\nruntime: true\nenabled: true\nkey: {app}\ntags:\n  - name: gray\n    addresses: [\"{addr}\"]\n")
    };
    client
        .create(&node, rule(one).as_bytes(), &persistent)
        .await
        .expect("create");
    let s = pipeline
        .until("the rule on every provider", |s| {
            s.endpoints()
                .iter()
                .all(|e| e.metadata().contains_key("dubbo.tag.rule"))
        })
        .await;
    assert_eq!(s.endpoints()[0].metadata()["dubbo.tag.groups"], "gray");
    assert_eq!(
        pipeline.status.get().tag_rule.as_deref(),
        Some(node.as_str())
    );
    assert_eq!(
        reach(&pipeline, Some(RequestTag::new(b"gray"))),
        owned(&[one])
    );
    assert_eq!(reach(&pipeline, None), owned(&[two, three]));
    // Blue is not a rule tag: still the provider's own.
    assert_eq!(
        reach(&pipeline, Some(RequestTag::new(b"blue"))),
        owned(&[three])
    );

    // Moved to 10.7.0.2 while it applies.
    client
        .set_data(&node, rule(two).as_bytes(), None)
        .await
        .expect("set");
    pipeline
        .until("gray moved", |s| {
            s.endpoints()[1]
                .metadata()
                .get("dubbo.tag.groups")
                .map(String::as_str)
                == Some("gray")
        })
        .await;
    assert_eq!(
        reach(&pipeline, Some(RequestTag::new(b"gray"))),
        owned(&[two])
    );

    // Malformed: skipped and counted; the last good rule stays.
    let before = pipeline.status.get().rules_rejected;
    client.set_data(&node, b"tags: [", None).await.expect("set");
    wait_status(&mut pipeline.status, "the bad rule counted", |st| {
        st.rules_rejected == before + 1
    })
    .await;
    assert_eq!(
        reach(&pipeline, Some(RequestTag::new(b"gray"))),
        owned(&[two])
    );

    // Deleted: the providers' own tags again.
    client.delete(&node, None).await.expect("delete");
    pipeline
        .until("no rule", |s| {
            !s.endpoints()
                .iter()
                .any(|e| e.metadata().contains_key("dubbo.tag.rule"))
        })
        .await;
    assert_eq!(pipeline.status.get().tag_rule, None);
    assert_eq!(
        reach(&pipeline, Some(RequestTag::new(b"gray"))),
        owned(&[one, two])
    );
    for r in regs {
        r.deregister().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tag_rules_route_while_they_change() {
    tag_rules(WatchMode::Auto).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tag_rules_route_with_one_shot_watches() {
    tag_rules(WatchMode::OneShot).await;
}

/// Providers deleted in one ZooKeeper transaction (a `multi`: an operator's script, or the
/// ephemeral nodes of sessions closed together) reach the controller as one update, not one
/// per node: after the first event the consumer makes one round trip, by whose answer
/// ZooKeeper has sent every event of the transactions committed before it. Before, the proxy
/// applied three deletions of one transaction one by one in 7 of 12 runs (3 → 2 → 1 → empty),
/// and empty-push protection kept one or two providers for the traffic of three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn providers_deleted_in_one_transaction_are_one_update() {
    let zk = ZkConfig::new(require_zk!());
    let client = Client::connect(&zk.servers).await.expect("connect");
    for round in 1..=4u8 {
        let path = ServicePath::new("dubbo", &unique("multi"), Layout::Dubbo).unwrap();
        let mut pipeline = Pipeline::start(
            ZkSource::new(zk.clone(), path.clone()),
            ControllerConfig {
                removal_protection: None,
                ..ControllerConfig::default()
            },
        );
        let mut regs = Vec::new();
        for i in 1..=5 {
            let p = provider(&format!("10.7.{round}.{i}:20880"), 100);
            regs.push(registered(&zk, &path, p).await);
        }
        pipeline.until("five", |s| s.len() == 5).await;
        let updates = pipeline.metrics.updates();
        let mut multi = client.new_multi_writer();
        for r in &regs[..3] {
            let node = r.status().get().node.expect("registered node");
            multi.add_delete(&node, None).expect("a delete");
        }
        multi.commit().await.expect("deleted in one transaction");
        let s = pipeline.until("two left", |s| s.len() < 5).await;
        assert_eq!(
            s.len(),
            2,
            "round {round}: all three deletions in one snapshot"
        );
        assert_eq!(
            pipeline.metrics.updates() - updates,
            1,
            "round {round}: one update"
        );
        for r in regs {
            r.deregister().await;
        }
    }
}
