use super::*;
use crate::source;
use lbkit_core::Timestamp;

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

/// Empty-push protection alone: what it holds and lets go of, without mass-removal protection
/// (which holds more: see the `mass_removal` tests).
fn empty_push_only() -> ControllerConfig {
    ControllerConfig {
        removal_protection: None,
        ..ControllerConfig::default()
    }
}

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
    let mut c = Controller::new(empty_push_only());
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
fn the_held_set_is_the_published_one_exactly() {
    let mut c = Controller::new(empty_push_only());
    c.apply_batch(vec![Update::Reset(vec![spec("a:1", 1), spec("b:1", 1)])])
        .expect("published");
    // A batch that changes the set and then empties it holds the set published before it,
    // not the unpublished state in between.
    let keys = vec![EndpointKey::from("a:1"), EndpointKey::from("c:1")];
    let batch = vec![
        Update::Add(vec![spec("c:1", 1), spec("b:1", 9)]),
        Update::Remove(vec![EndpointKey::from("b:1")]),
        Update::Remove(keys),
    ];
    assert!(c.apply_batch(batch).is_none(), "held");
    assert!(c.desired().is_empty());
    let served: Vec<_> = c
        .serving()
        .iter()
        .map(|s| (s.key.as_str(), s.weight))
        .collect();
    assert_eq!(served, [("a:1", 1), ("b:1", 1)]);
    // A rejected endpoint leaves the held set too; rebuilding from it publishes the rest.
    let rest = c
        .reject(&[EndpointKey::from("a:1")])
        .expect("the held set shrank");
    assert_eq!(addrs(&rest), vec![("b:1", 1)]);
    // Rejecting the last one leaves nothing to hold: the next empty push is published.
    assert!(c.reject(&[EndpointKey::from("b:1")]).is_some());
    assert!(c.serving().is_empty());
    assert!(c
        .apply_batch(vec![Update::Reset(vec![])])
        .is_some_and(|s| s.is_empty()));
    // A reset repeating a key, then that key removed: emptied, and the set before is held.
    c.apply_batch(vec![Update::Reset(vec![spec("e:1", 1), spec("f:1", 1)])])
        .expect("published");
    let batch = vec![
        Update::Reset(vec![spec("g:1", 1), spec("g:1", 2)]),
        Update::Remove(vec![EndpointKey::from("g:1")]),
    ];
    assert!(c.apply_batch(batch).is_none(), "held");
    assert_eq!(c.serving().len(), 2);
    // Without a held set the serving set is the desired one.
    let back = c
        .apply_batch(vec![Update::Reset(vec![spec("d:1", 2)])])
        .expect("published");
    assert_eq!(addrs(&back), vec![("d:1", 2)]);
    assert_eq!(c.serving(), c.desired());
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

/// The keys of a snapshot's eligible endpoints.
fn eligible(s: &Snapshot) -> Vec<&str> {
    s.eligible()
        .iter()
        .map(|&i| s.endpoint(i).address())
        .collect()
}

#[test]
fn a_held_empty_push_stays_held_through_health_changes_and_ejections() {
    let outlier = OutlierConfig {
        consecutive_failures: Some(2),
        max_ejection_percent: 50,
        ..OutlierConfig::default()
    };
    let clock = Clock::Manual(Arc::new(lbkit_core::ManualClock::new(
        Timestamp::from_millis(1_000),
    )));
    let mut c = Controller::new(ControllerConfig {
        outlier: Some(outlier),
        ..empty_push_only()
    })
    .with_clock(clock);
    let first = c
        .apply_batch(vec![Update::Reset(vec![spec("a:1", 1), spec("b:1", 1)])])
        .expect("published");
    assert!(c.apply_batch(vec![Update::Reset(vec![])]).is_none(), "held");
    // A health flip rebuilds from the serving set, not from the empty desired one.
    let flipped = c
        .set_health(EndpointKey::from("a:1"), false)
        .expect("a health change publishes");
    assert_eq!(flipped.len(), 2, "the held set is still served");
    assert_eq!(eligible(&flipped), ["b:1"]);
    let back = c
        .set_health(EndpointKey::from("a:1"), true)
        .expect("up again");
    assert_eq!(eligible(&back), ["a:1", "b:1"]);
    assert!(Arc::ptr_eq(
        first.endpoints()[0].stats_arc(),
        back.endpoints()[0].stats_arc()
    ));
    // An ejection too.
    for _ in 0..3 {
        back.endpoints()[1].stats().record(
            Duration::ZERO,
            Timestamp::from_millis(1_000),
            lbkit_core::Outcome::Failure(lbkit_core::FailureKind::Server),
        );
    }
    let ejected = c
        .tick_outliers(Timestamp::from_millis(2_000))
        .expect("an ejection publishes");
    assert_eq!((ejected.len(), eligible(&ejected)), (2, vec!["a:1"]));
    assert_eq!(c.ejections().get(&EndpointKey::from("b:1")), Some(&1));
    assert_eq!(c.metrics().empty_held(), 1);
    assert!(c.desired().is_empty() && c.serving().len() == 2);
    // The next real set replaces it all.
    let next = c
        .apply_batch(vec![Update::Add(vec![spec("c:1", 1)])])
        .expect("published");
    assert_eq!(addrs(&next), vec![("c:1", 1)]);
}

/// A target that counts publishes and ticks, and hands each snapshot published to a channel;
/// alive while that channel is.
struct Probe {
    snaps: tokio::sync::mpsc::UnboundedSender<Arc<Snapshot>>,
    ticks: Arc<std::sync::atomic::AtomicUsize>,
    published: Arc<std::sync::atomic::AtomicUsize>,
}

impl Probe {
    fn new() -> (Probe, tokio::sync::mpsc::UnboundedReceiver<Arc<Snapshot>>) {
        let (snaps, rx) = tokio::sync::mpsc::unbounded_channel();
        let probe = Probe {
            snaps,
            ticks: Arc::default(),
            published: Arc::default(),
        };
        (probe, rx)
    }
}

impl Target for Probe {
    fn publish(&mut self, s: Arc<Snapshot>, _: Timestamp) -> Vec<EndpointKey> {
        self.published.fetch_add(1, Relaxed);
        let _ = self.snaps.send(s);
        Vec::new()
    }
    fn tick(&mut self, _: Timestamp) {
        self.ticks.fetch_add(1, Relaxed);
    }
    fn alive(&self) -> bool {
        !self.snaps.is_closed()
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_run_loop_holds_the_set_through_health_results_and_ticks() {
    let (tx, stream) = source::channel();
    let (health_tx, health_rx) = tokio::sync::mpsc::channel(4);
    let config = ControllerConfig {
        refresh: Some(Duration::from_millis(250)),
        ..ControllerConfig::default()
    };
    let (probe, mut snaps) = Probe::new();
    let (ticks, published) = (probe.ticks.clone(), probe.published.clone());
    let task = tokio::spawn(
        Controller::new(config)
            .with_health(health_rx)
            .run(stream, probe),
    );
    tx.send(Ok(Update::Reset(vec![spec("a:1", 1), spec("b:1", 1)])))
        .await
        .expect("send");
    assert_eq!(snaps.recv().await.expect("first").len(), 2);
    tx.send(Ok(Update::Reset(vec![]))).await.expect("send");
    health_tx
        .send((EndpointKey::from("b:1"), false))
        .await
        .expect("send");
    let after_flip = snaps.recv().await.expect("the flip publishes");
    assert_eq!(
        (after_flip.len(), eligible(&after_flip)),
        (2, vec!["a:1"]),
        "the empty push is still held"
    );
    tokio::time::sleep(Duration::from_secs(1)).await; // virtual time: four refresh ticks
    assert!(ticks.load(Relaxed) >= 4);
    assert_eq!(published.load(Relaxed), 2, "ticks publish nothing new");
    drop(snaps);
    health_tx.send((EndpointKey::from("b:1"), true)).await.ok();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the loop ends when its target is gone")
        .expect("no panic");
}

#[test]
fn rejected_endpoints_stay_out_until_the_source_sends_them_again() {
    let mut c = Controller::new(ControllerConfig::default());
    c.apply_batch(vec![Update::Reset(vec![spec("a:1", 1), spec("b:1", 1)])]);
    let s = c.reject(&[EndpointKey::from("b:1")]).expect("published");
    assert_eq!(addrs(&s), vec![("a:1", 1)]);
    let s = c
        .apply_batch(vec![Update::Add(vec![spec("c:1", 1)])])
        .expect("published");
    assert_eq!(addrs(&s), vec![("a:1", 1), ("c:1", 1)]);
    let s = c
        .apply_batch(vec![Update::Add(vec![spec("b:1", 2)])])
        .expect("published");
    // Back at its place in key order.
    assert_eq!(addrs(&s), vec![("a:1", 1), ("b:1", 2), ("c:1", 1)]);
}

/// The reference for `apply`: a map by key (later wins), listed in key order when the list was
/// in key order, else in first-seen order with replacements in place.
fn model(ops: &[(u8, Vec<u8>)]) -> Vec<(String, u32)> {
    let mut list: Vec<(String, u32)> = Vec::new();
    for (i, (kind, keys)) in ops.iter().enumerate() {
        // Each spec's weight names its update and its place in it (later wins).
        let w = |j: usize| (i * 100 + j) as u32;
        match kind % 3 {
            0 => {
                list.clear();
                let mut set: Vec<(String, u32)> = keys
                    .iter()
                    .enumerate()
                    .map(|(j, k)| (format!("h{k}:1"), w(j)))
                    .collect();
                set.sort();
                set.dedup_by(|a, b| a.0 == b.0);
                list = set;
            }
            1 => {
                for (j, k) in keys.iter().enumerate() {
                    let key = format!("h{k}:1");
                    match list.iter_mut().find(|(a, _)| *a == key) {
                        Some(e) => e.1 = w(j),
                        None => list.push((key, w(j))),
                    }
                }
                list.sort();
            }
            _ => list.retain(|(a, _)| !keys.iter().any(|k| format!("h{k}:1") == *a)),
        }
    }
    list
}

proptest::proptest! {
    /// Sources in key order (resets sorted and unique), any mix of additions and removals, few
    /// or many at a time: the list `apply` keeps is the model's, in key order.
    #[test]
    fn updates_keep_an_ordered_list_ordered(
        ops in proptest::collection::vec(
            (0u8..3, proptest::collection::vec(0u8..40, 0..24)),
            1..12,
        )
    ) {
        let mut specs = Vec::new();
        let mut ordered = true;
        for (i, (kind, keys)) in ops.iter().enumerate() {
            let specs_of = || {
                keys.iter()
                    .enumerate()
                    .map(|(j, k)| spec(&format!("h{k}:1"), (i * 100 + j) as u32))
                    .collect::<Vec<_>>()
            };
            let update = match kind % 3 {
                0 => {
                    let mut v = specs_of();
                    v.sort_by(|a, b| a.key.cmp(&b.key));
                    v.dedup_by(|a, b| a.key == b.key);
                    Update::Reset(v)
                }
                1 => Update::Add(specs_of()),
                _ => Update::Remove(keys.iter().map(|k| EndpointKey::from(format!("h{k}:1").as_str())).collect()),
            };
            let keys_of = |v: &[Spec]| v.iter().map(|s| s.key.as_str().to_owned()).collect::<std::collections::BTreeSet<_>>();
            let before = keys_of(&specs);
            let was: HashMap<EndpointKey, Spec> = specs.iter().map(|s| (s.key.clone(), s.clone())).collect();
            let mut removed = Vec::new();
            let mut touched = Touched::none();
            apply(&mut specs, &mut ordered, update, Some(&mut removed), &mut touched);
            proptest::prop_assert!(ordered);
            // Every key listed with a spec it did not have is said to have changed.
            for s in &specs {
                if was.get(&s.key) != Some(s) {
                    proptest::prop_assert!(touched.contains(&s.key), "{} changed unsaid", s.key);
                }
            }
            // What left the list is what `apply` says it removed, each once.
            let mut gone: Vec<String> = removed.iter().map(|s| s.key.as_str().to_owned()).collect();
            gone.sort();
            let expected: Vec<String> = before.difference(&keys_of(&specs)).cloned().collect();
            proptest::prop_assert_eq!(gone, expected);
        }
        let got: Vec<(String, u32)> = specs.iter().map(|s| (s.key.as_str().to_owned(), s.weight)).collect();
        proptest::prop_assert_eq!(got, model(&ops));
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { rng_seed: proptest::test_runner::RngSeed::Fixed(44), ..Default::default() })]
    /// Any mix of resets, additions, removals (mass ones too, held by both protections), time
    /// letting held removals go, rejections and health results: every endpoint published
    /// describes its spec as served (the serving set under the health overlay), though the
    /// builder changes only the keys the controller marked; and an endpoint whose spec did not
    /// change stays the same object.
    #[test]
    fn published_endpoints_describe_what_is_served(
        ops in proptest::collection::vec(
            (0u8..7, proptest::collection::vec((0u8..24, 1u32..4), 0..12)),
            1..24,
        )
    ) {
        let (clock, manual) = Clock::manual(Timestamp::from_millis(1_000));
        let mut c = Controller::new(ControllerConfig::default()).with_clock(clock);
        let mut last: Option<Arc<Snapshot>> = None;
        for (kind, items) in ops {
            let specs = || items.iter().map(|&(k, w)| spec(&format!("h{k:02}:1"), w)).collect::<Vec<_>>();
            let key = |k: u8| EndpointKey::from(format!("h{k:02}:1"));
            let published: Vec<Arc<Snapshot>> = match kind {
                0 => {
                    let mut v = specs();
                    v.sort_by(|a, b| a.key.cmp(&b.key));
                    v.dedup_by(|a, b| a.key == b.key);
                    c.apply_batch(vec![Update::Reset(v)]).into_iter().collect()
                }
                1 => c.apply_batch(vec![Update::Add(specs())]).into_iter().collect(),
                2 => c.apply_batch(vec![Update::Remove(items.iter().map(|&(k, _)| key(k)).collect())]).into_iter().collect(),
                // Time lets held removals go; a target that cannot serve some leaves them out.
                3 => {
                    manual.advance(Duration::from_secs(u64::from(items.len() as u8) * 15));
                    c.expire_held(manual.now()).into_iter().collect()
                }
                4 => c.reject(&items.iter().map(|&(k, _)| key(k)).collect::<Vec<_>>()).into_iter().collect(),
                // Each health result is its own snapshot; the checks below read the last.
                _ => {
                    let mut all: Vec<_> = items.iter().filter_map(|&(k, w)| c.set_health(key(k), w > 1)).collect();
                    let last_one = all.pop();
                    if let Some(before_last) = all.pop() {
                        last = Some(before_last);
                    }
                    last_one.into_iter().collect()
                }
            };
            let Some(snap) = published.into_iter().last() else { continue };
            let serving: Vec<EndpointSpec> = c.serving().iter().map(|s| {
                let down = c.down.contains(&s.key);
                s.clone().with_healthy(s.healthy && !down)
            }).collect();
            proptest::prop_assert_eq!(snap.len(), serving.len());
            for (e, s) in snap.endpoints().iter().zip(&serving) {
                proptest::prop_assert!(e.describes(s), "{} does not describe its spec", e.key());
                let before = last.as_ref().and_then(|l| l.find(e.key()).map(|i| l.endpoint(i).clone()));
                if let Some(b) = before.filter(|b| b.describes(s)) {
                    proptest::prop_assert!(b.ptr_eq(e), "{} unchanged but rebuilt", e.key());
                }
            }
            last = Some(snap);
        }
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_initial_set_is_served_before_the_source_speaks() {
    let (tx, stream) = source::channel();
    let (snap_tx, mut snaps) = tokio::sync::mpsc::unbounded_channel();
    let publish = move |s: Arc<Snapshot>| {
        let _ = snap_tx.send(s);
    };
    let task = tokio::spawn(
        Controller::new(ControllerConfig::default())
            .with_initial(vec![spec("a:1", 1)])
            .run(stream, publish),
    );
    assert_eq!(
        addrs(&snaps.recv().await.expect("initial")),
        vec![("a:1", 1)]
    );
    tx.send(Ok(Update::Reset(vec![]))).await.expect("send");
    tx.send(Ok(Update::Reset(vec![spec("b:1", 1)])))
        .await
        .expect("send");
    drop(tx);
    assert_eq!(addrs(&snaps.recv().await.expect("next")), vec![("b:1", 1)]);
    task.await.expect("ends with its source");
}

/// What a target was told of mass-removal protection.
#[derive(Default)]
struct Told {
    published: Vec<Arc<Snapshot>>,
    events: Vec<RemovalEvent>,
}

impl Target for Told {
    fn publish(&mut self, snapshot: Arc<Snapshot>, _now: Timestamp) -> Vec<EndpointKey> {
        self.published.push(snapshot);
        Vec::new()
    }

    fn removal(&mut self, event: &RemovalEvent) {
        self.events.push(event.clone());
    }
}

fn ten() -> Vec<EndpointSpec> {
    (0..10).map(|i| spec(&format!("p{i}:1"), 1)).collect()
}

fn keys(range: std::ops::Range<usize>) -> Vec<EndpointKey> {
    range
        .map(|i| EndpointKey::from(format!("p{i}:1").as_str()))
        .collect()
}

/// Six of ten providers removed at once: all ten stay served, counted and told; each leaves
/// when confirmed gone — a failed health check, an ejection, or the confirmation time.
#[test]
fn mass_removal_of_six_of_ten_is_held_until_each_is_confirmed() {
    let (clock, manual) = Clock::manual(Timestamp::from_millis(1_000));
    let outlier = OutlierConfig {
        consecutive_failures: Some(2),
        max_ejection_percent: 100,
        ..OutlierConfig::default()
    };
    let mut c = Controller::new(ControllerConfig {
        outlier: Some(outlier),
        ..ControllerConfig::default()
    })
    .with_clock(clock);
    let mut told = Told::default();
    c.apply_into(vec![Update::Reset(ten())], &mut told);
    c.apply_into(vec![Update::Remove(keys(0..6))], &mut told);
    let held = told.published.last().expect("published");
    assert_eq!(held.len(), 10, "all ten served");
    assert_eq!(c.desired().len(), 4);
    let m = c.metrics();
    assert_eq!((m.removals_held(), m.held()), (6, 6));
    assert!(matches!(&told.events[0], RemovalEvent::Held { keys, serving: 10 } if keys.len() == 6));
    // A failed health check confirms one.
    let s = c
        .set_health(keys(0..1)[0].clone(), false)
        .expect("published");
    assert_eq!(s.len(), 9);
    // An ejection another.
    for _ in 0..2 {
        let e = s
            .endpoints()
            .iter()
            .find(|e| e.address() == "p1:1")
            .expect("p1");
        e.stats().record(
            Duration::ZERO,
            Timestamp::from_millis(1_500),
            lbkit_core::Outcome::Failure(lbkit_core::FailureKind::Server),
        );
    }
    let s = c
        .tick_outliers(Timestamp::from_millis(2_000))
        .expect("published");
    assert_eq!(s.len(), 8);
    // The rest by time.
    manual.advance(Duration::from_secs(119));
    assert!(c.expire_held(manual.now()).is_none());
    manual.advance(Duration::from_secs(1));
    let s = c.expire_held(manual.now()).expect("published");
    assert_eq!(s.len(), 4);
    assert_eq!((m.removals_confirmed(), m.held()), (6, 0));
    assert_eq!(c.serving(), c.desired());
}

/// Removals that come one by one within the window (each transaction's own, or a source that
/// sends them apart) are held together once they pass the share, earlier ones back in; the
/// last one empties the set, and empty-push protection holds all of it.
#[test]
fn removals_one_by_one_within_the_window_are_held_together() {
    let (clock, manual) = Clock::manual(Timestamp::from_millis(1_000));
    let mut c = Controller::new(ControllerConfig::default()).with_clock(clock);
    let three = vec![spec("a:1", 1), spec("b:1", 1), spec("c:1", 1)];
    c.apply_batch(vec![Update::Reset(three.clone())]);
    let one = |k: &str| vec![Update::Remove(vec![EndpointKey::from(k)])];
    assert_eq!(c.apply_batch(one("a:1")).map(|s| s.len()), Some(2));
    manual.advance(Duration::from_secs(1));
    assert_eq!(c.apply_batch(one("b:1")).map(|s| s.len()), Some(3));
    manual.advance(Duration::from_secs(1));
    assert!(
        c.apply_batch(one("c:1")).is_none(),
        "held by empty-push protection"
    );
    assert_eq!(c.serving().len(), 3);
    // All back: nothing held any more.
    let back = c
        .apply_batch(vec![Update::Reset(three)])
        .expect("published");
    assert_eq!(back.len(), 3);
    assert_eq!(c.metrics().held(), 0);
    assert_eq!(c.serving(), c.desired());
}

/// Leaving a held empty push with a set that lacks most of the old one (the first provider to
/// register again after a registry outage) holds the rest, which rejoin as they come back.
#[test]
fn leaving_an_empty_push_holds_what_the_new_set_lacks() {
    let mut c = Controller::new(ControllerConfig::default());
    c.apply_batch(vec![Update::Reset(ten())]);
    assert!(c.apply_batch(vec![Update::Reset(vec![])]).is_none());
    let first = c
        .apply_batch(vec![Update::Reset(ten()[..1].to_vec())])
        .expect("published");
    assert_eq!(first.len(), 10, "the nine others held");
    assert_eq!(c.metrics().held(), 9);
    let all = c
        .apply_batch(vec![Update::Reset(ten())])
        .expect("published");
    assert_eq!((all.len(), c.metrics().held()), (10, 0));
}

/// A set replaced whole (blue/green: every address new, as many endpoints as before) is no
/// mass removal: the old endpoints go at once, nothing is held.
#[test]
fn a_set_replaced_whole_is_not_held() {
    let mut c = Controller::new(ControllerConfig::default());
    c.apply_batch(vec![Update::Reset(ten())]);
    let green: Vec<EndpointSpec> = (0..10).map(|i| spec(&format!("g{i}:1"), 1)).collect();
    let s = c
        .apply_batch(vec![Update::Reset(green)])
        .expect("published");
    assert_eq!(s.len(), 10);
    assert!(s.endpoints().iter().all(|e| e.address().starts_with('g')));
    assert_eq!(c.metrics().held(), 0);
}

/// Off, or under the share, removals apply at once.
#[test]
fn removals_under_the_share_or_with_protection_off_apply_at_once() {
    let mut on = Controller::new(ControllerConfig::default());
    on.apply_batch(vec![Update::Reset(ten())]);
    let s = on
        .apply_batch(vec![Update::Remove(keys(0..5))])
        .expect("published");
    assert_eq!(s.len(), 5, "half is not more than half");
    let mut off = Controller::new(ControllerConfig {
        removal_protection: None,
        ..ControllerConfig::default()
    });
    off.apply_batch(vec![Update::Reset(ten())]);
    let s = off
        .apply_batch(vec![Update::Remove(keys(0..6))])
        .expect("published");
    assert_eq!(s.len(), 4);
}

/// The run loop lets held endpoints go when their confirmation time runs out, with no other
/// event (tokio's paused clock).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_run_loop_lets_held_endpoints_go_on_time() {
    let (tx, stream) = source::channel();
    let config = ControllerConfig {
        removal_protection: Some(RemovalProtection {
            confirm_after: Duration::from_secs(5),
            ..RemovalProtection::default()
        }),
        ..ControllerConfig::default()
    };
    let (snap_tx, mut snaps) = tokio::sync::mpsc::unbounded_channel();
    let publish = move |s: Arc<Snapshot>| {
        let _ = snap_tx.send(s);
    };
    let (clock, manual) = Clock::manual(Timestamp::from_millis(1_000));
    let c = Controller::new(config).with_clock(clock);
    let task = tokio::spawn(c.run(stream, publish));
    tx.send(Ok(Update::Reset(ten()))).await.expect("send");
    assert_eq!(snaps.recv().await.expect("first").len(), 10);
    tx.send(Ok(Update::Remove(keys(0..8)))).await.expect("send");
    assert_eq!(snaps.recv().await.expect("held").len(), 10);
    let started = tokio::time::Instant::now();
    // The controller's clock moves with tokio's (both virtual here).
    manual.advance(Duration::from_secs(5));
    assert_eq!(snaps.recv().await.expect("let go").len(), 2);
    assert!(started.elapsed() >= Duration::from_secs(5));
    drop(tx);
    task.await.expect("ends");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { rng_seed: proptest::test_runner::RngSeed::Fixed(44), ..Default::default() })]
    /// Full listings in key order (a file source's file rewritten) touch exactly the keys that
    /// came, went or changed spec, or all of them when more than half did.
    #[test]
    fn listings_touch_what_changed(
        first in proptest::collection::btree_map(0u8..40, 1u32..4, 0..30),
        steps in proptest::collection::vec(proptest::collection::vec((0u8..40, 0u32..4), 0..6), 1..8),
    ) {
        let mut specs = Vec::new();
        let mut ordered = true;
        let mut set = first;
        let mut all = 0;
        for (n, step) in std::iter::once(Vec::new()).chain(steps).enumerate() {
            // A step edits a few keys: weight 0 removes one, another weight sets it.
            for (k, w) in step {
                if w == 0 { set.remove(&k); } else { set.insert(k, w); }
            }
            let new: Vec<EndpointSpec> = set.iter().map(|(k, &w)| spec(&format!("h{k:02}:1"), w)).collect();
            let was: HashMap<EndpointKey, EndpointSpec> = specs.iter().map(|s: &Spec| (s.key.clone(), (**s).clone())).collect();
            let now: HashMap<EndpointKey, EndpointSpec> = new.iter().map(|s| (s.key.clone(), s.clone())).collect();
            let mut differ: Vec<&EndpointKey> = was.keys().chain(now.keys()).filter(|k| was.get(*k) != now.get(*k)).collect();
            differ.sort();
            differ.dedup();
            let mut touched = Touched::none();
            apply(&mut specs, &mut ordered, Update::Reset(new), None, &mut touched);
            match &touched {
                Touched::All => {
                    all += usize::from(n > 0);
                    proptest::prop_assert!(differ.len() * 2 > was.len().max(now.len()));
                }
                Touched::Keys(keys) => proptest::prop_assert_eq!(keys.iter().collect::<Vec<_>>(), differ),
            }
        }
        // Small edits of a set of up to 30: mostly patched.
        proptest::prop_assert!(all <= 8);
    }
}
