use super::*;
use crate::source;

fn spec(a: &str, w: u32) -> EndpointSpec {
    EndpointSpec::new(a).with_weight(w)
}

fn addrs(s: &Snapshot) -> Vec<(&str, u32)> {
    s.endpoints()
        .iter()
        .map(|e| (e.address(), e.weight()))
        .collect()
}

/// Run a controller over `items` (all queued before it starts); return what it published.
async fn run_all(
    config: ControllerConfig,
    items: Vec<SourceItemT>,
) -> (Vec<Arc<Snapshot>>, Arc<ControllerMetrics>) {
    let (tx, stream) = source::channel();
    for item in items {
        tx.send(item).await.expect("receiver alive");
    }
    drop(tx);
    let controller = Controller::new(config);
    let metrics = controller.metrics();
    let mut out = Vec::new();
    controller.run(stream, |s| out.push(s)).await;
    (out, metrics)
}

type SourceItemT = Result<Update, DiscoveryError>;

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn queued_updates_form_one_batch_and_one_rebuild() {
    let (out, m) = run_all(
        ControllerConfig::default(),
        vec![
            Ok(Update::Reset(vec![spec("a:1", 1), spec("b:1", 1)])),
            Ok(Update::Add(vec![spec("c:1", 1), spec("a:1", 7)])),
            Ok(Update::Remove(vec![EndpointKey::from("b:1")])),
        ],
    )
    .await;
    assert_eq!(out.len(), 1, "one snapshot for the batch");
    assert_eq!(addrs(&out[0]), vec![("a:1", 7), ("c:1", 1)]);
    assert_eq!((m.updates(), m.batches(), m.published()), (3, 1, 1));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn batch_window_collects_updates_that_arrive_later() {
    let (tx, stream) = source::channel();
    let config = ControllerConfig {
        batch_window: Duration::from_millis(20),
        ..ControllerConfig::default()
    };
    let feeder = tokio::spawn(async move {
        tx.send(Ok(Update::Reset(vec![spec("a:1", 1)]))).await.ok();
        tokio::time::sleep(Duration::from_millis(5)).await; // inside the window (virtual time)
        tx.send(Ok(Update::Add(vec![spec("b:1", 1)]))).await.ok();
        tokio::time::sleep(Duration::from_millis(100)).await; // outside it
        tx.send(Ok(Update::Add(vec![spec("c:1", 1)]))).await.ok();
    });
    let mut out = Vec::new();
    Controller::new(config).run(stream, |s| out.push(s)).await;
    feeder.await.expect("feeder");
    assert_eq!(out.len(), 2);
    assert_eq!(addrs(&out[0]), vec![("a:1", 1), ("b:1", 1)]);
    assert_eq!(out[1].len(), 3);
}

#[test]
fn empty_push_is_held_and_counted_and_later_updates_apply_to_the_real_set() {
    let mut c = Controller::new(ControllerConfig::default());
    let first = c.apply_batch(vec![Update::Reset(vec![spec("a:1", 1), spec("b:1", 1)])]);
    assert_eq!(first.map(|s| s.len()), Some(2));
    let keys = vec![EndpointKey::from("a:1"), EndpointKey::from("b:1")];
    assert!(c.apply_batch(vec![Update::Remove(keys)]).is_none(), "held");
    assert!(c.apply_batch(vec![Update::Reset(vec![])]).is_none(), "held");
    assert_eq!(c.metrics().empty_held(), 2);
    assert!(c.desired().is_empty());
    let next = c
        .apply_batch(vec![Update::Add(vec![spec("c:1", 1)])])
        .expect("published");
    assert_eq!(
        addrs(&next),
        vec![("c:1", 1)],
        "the held-back removal still applies"
    );
}

#[test]
fn empty_protection_can_be_turned_off_and_never_guards_an_empty_start() {
    let mut c = Controller::new(ControllerConfig::default());
    let first = c.apply_batch(vec![Update::Reset(vec![])]);
    assert!(
        first.is_some_and(|s| s.is_empty()),
        "an empty start is published"
    );
    let mut off = Controller::new(ControllerConfig {
        empty_protection: false,
        ..ControllerConfig::default()
    });
    assert!(off
        .apply_batch(vec![Update::Reset(vec![spec("a:1", 1)])])
        .is_some());
    let emptied = off.apply_batch(vec![Update::Reset(vec![])]);
    assert!(emptied.is_some_and(|s| s.is_empty()));
    assert_eq!(off.metrics().empty_held(), 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn source_errors_keep_the_last_good_set() {
    let (out, m) = run_all(
        ControllerConfig::default(),
        vec![
            Ok(Update::Reset(vec![spec("a:1", 1)])),
            Err(DiscoveryError::Config {
                field: "test",
                reason: "broken".into(),
            }),
        ],
    )
    .await;
    assert_eq!(out.len(), 1);
    assert_eq!(m.source_errors(), 1);
}

#[test]
fn unchanged_sets_publish_nothing_and_staying_endpoints_keep_their_stats() {
    let mut c = Controller::new(ControllerConfig::default());
    let s1 = c
        .apply_batch(vec![Update::Reset(vec![spec("a:1", 1), spec("b:1", 1)])])
        .expect("first");
    assert!(c
        .apply_batch(vec![Update::Reset(vec![spec("a:1", 1), spec("b:1", 1)])])
        .is_none());
    assert_eq!(c.metrics().unchanged(), 1);
    let s2 = c
        .apply_batch(vec![Update::Add(vec![spec("b:1", 9)])])
        .expect("weight change");
    assert_eq!(addrs(&s2), vec![("a:1", 1), ("b:1", 9)]);
    assert!(Arc::ptr_eq(
        s1.endpoints()[1].stats_arc(),
        s2.endpoints()[1].stats_arc()
    ));
    assert!(s2.version() > s1.version());
}

#[test]
fn policy_is_applied_to_published_snapshots() {
    let mut c = Controller::new(ControllerConfig {
        policy: SnapshotPolicy::envoy(),
        ..ControllerConfig::default()
    });
    let s = c
        .apply_batch(vec![Update::Reset(vec![
            spec("a:1", 1).with_healthy(false),
            spec("b:1", 1).with_healthy(false),
            spec("c:1", 1),
        ])])
        .expect("published");
    assert!(s.in_panic(), "1 of 3 healthy < 50 %");
}
