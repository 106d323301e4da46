//! The balancer's contract, with small strategies written for the test: the single-endpoint
//! shortcut, bounded re-picks around tried and unavailable endpoints, refresh scheduling, and
//! call guards.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lbkit_core::*;

/// Always proposes the same index (possibly a bad one).
struct Fixed(usize);
struct FixedPicker(usize, Arc<AtomicU64>);

static PREPARES: AtomicU64 = AtomicU64::new(0);

impl Strategy for Fixed {
    type Picker = FixedPicker;
    fn name(&self) -> &str {
        "fixed"
    }
    fn prepare(&self, _: &Arc<Snapshot>, _: Timestamp) -> FixedPicker {
        PREPARES.fetch_add(1, Ordering::Relaxed);
        FixedPicker(self.0, Arc::new(AtomicU64::new(0)))
    }
}

impl Picker for FixedPicker {
    fn pick(&self, _: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> {
        self.1.fetch_add(1, Ordering::Relaxed);
        Ok(EndpointIdx::new(self.0))
    }
}

const NOW: Timestamp = Timestamp::from_millis(1_000_000);

fn snap(specs: Vec<EndpointSpec>) -> Arc<Snapshot> {
    Arc::new(Snapshot::from_specs(specs, NOW))
}

fn trip(e: &Endpoint) {
    for _ in 0..3 {
        e.stats()
            .record(Duration::ZERO, NOW, Outcome::Failure(FailureKind::Connect));
    }
}

fn pick_addr<S: Strategy>(b: &Balancer<S>, tried: &TriedSet) -> Result<String, PickError> {
    let mut rng = FastRng::seed_from_u64(1);
    let mut cx = PickContext::new(NOW, &mut rng).with_tried(tried.len() as u32, tried);
    let g = b.pick(&mut cx)?;
    let a = g.endpoint().address().to_owned();
    g.finish_at(Outcome::Success, NOW);
    Ok(a)
}

fn three() -> Arc<Snapshot> {
    snap(vec![
        EndpointSpec::new("a:1"),
        EndpointSpec::new("b:1"),
        EndpointSpec::new("c:1"),
    ])
}

#[test]
fn tripped_endpoints_are_passed_over_while_others_remain() {
    let s = three();
    trip(&s.endpoints()[0]);
    let b = Balancer::new(Fixed(0), s.clone(), NOW);
    for _ in 0..20 {
        assert_ne!(pick_addr(&b, &TriedSet::new()).unwrap(), "a:1");
    }
    // The re-pick loop is bounded: MAX_PROBES proposals, then one scan.
    assert_eq!(
        b.current().picker().1.load(Ordering::Relaxed),
        20 * u64::from(MAX_PROBES)
    );
}

#[test]
fn when_everything_is_unavailable_the_filter_is_ignored() {
    let s = three();
    s.endpoints().iter().for_each(trip);
    let b = Balancer::new(Fixed(1), s, NOW);
    assert_eq!(
        pick_addr(&b, &TriedSet::new()).unwrap(),
        "b:1",
        "the picker's own choice"
    );
}

#[test]
fn untried_is_preferred_over_available() {
    let s = snap(vec![EndpointSpec::new("a:1"), EndpointSpec::new("b:1")]);
    trip(&s.endpoints()[1]);
    let mut tried = TriedSet::new();
    tried.insert(&s.endpoints()[0]);
    let b = Balancer::new(Fixed(0), s.clone(), NOW);
    assert_eq!(pick_addr(&b, &tried).unwrap(), "b:1");
    tried.insert(&s.endpoints()[1]);
    assert_eq!(
        pick_addr(&b, &tried).unwrap(),
        "a:1",
        "all tried: Dubbo re-selects among the tried"
    );
}

#[test]
fn a_single_eligible_endpoint_skips_the_strategy() {
    let s = snap(vec![
        EndpointSpec::new("a:1").with_healthy(false),
        EndpointSpec::new("b:1"),
    ]);
    trip(&s.endpoints()[1]);
    let b = Balancer::new(Fixed(99), s, NOW);
    assert_eq!(pick_addr(&b, &TriedSet::new()).unwrap(), "b:1");
    assert_eq!(
        b.current().picker().1.load(Ordering::Relaxed),
        0,
        "picker never ran"
    );
}

#[test]
fn a_picker_returning_a_foreign_index_is_an_error_not_a_panic() {
    let b = Balancer::new(Fixed(99), three(), NOW);
    assert!(matches!(
        pick_addr(&b, &TriedSet::new()),
        Err(PickError::Declined(_))
    ));
}

#[test]
fn warming_endpoints_schedule_refreshes_and_tick_runs_them() {
    let s = snap(vec![
        EndpointSpec::new("a:1").with_registered_at(NOW - Duration::from_secs(60)),
        EndpointSpec::new("b:1"),
    ]);
    let b = Balancer::new(Fixed(0), s, NOW);
    assert_eq!(b.current().refresh_at(), Some(NOW + WARMUP_REFRESH));
    assert!(!b.tick(NOW + Duration::from_millis(999)), "not due yet");
    let before = PREPARES.load(Ordering::Relaxed);
    assert!(b.tick(NOW + WARMUP_REFRESH));
    assert!(PREPARES.load(Ordering::Relaxed) > before);
    // Once warm, no more refreshes.
    let warm = NOW + Duration::from_secs(600);
    b.publish(b.snapshot(), warm);
    assert_eq!(b.current().refresh_at(), None);
    assert!(!b.tick(warm + Duration::from_secs(3600)));
}

#[test]
fn guards_track_in_flight_and_record_outcomes() {
    let (clock, hand) = Clock::manual(NOW);
    let b = Balancer::new(Fixed(0), three(), NOW).with_clock(clock);
    let mut rng = FastRng::seed_from_u64(1);
    let g1 = b.pick(&mut PickContext::new(NOW, &mut rng)).unwrap();
    let g2 = b.pick(&mut PickContext::new(NOW, &mut rng)).unwrap();
    let stats = b.snapshot().endpoints()[0].stats_arc().clone();
    assert_eq!(stats.in_flight(), 2);
    hand.advance(Duration::from_millis(40));
    g1.finish(Outcome::Success);
    drop(g2);
    assert_eq!(
        (stats.in_flight(), stats.successes(), stats.cancellations()),
        (0, 1, 1)
    );
    assert_eq!(
        stats.avg_response_at(hand.now(), Duration::from_secs(10)),
        Some(Duration::from_millis(40))
    );
    assert_eq!(stats.ewma_at(hand.now()), Some(Duration::from_millis(40)));
}

#[test]
fn stats_survive_a_publish_of_the_same_keys() {
    let mut builder = SnapshotBuilder::new();
    let s1 = builder.apply(
        Update::Reset(vec![EndpointSpec::new("a:1"), EndpointSpec::new("b:1")]),
        NOW,
    );
    let b = Balancer::new(Fixed(0), s1, NOW);
    let mut rng = FastRng::seed_from_u64(1);
    let g = b.pick(&mut PickContext::new(NOW, &mut rng)).unwrap();
    b.publish(
        builder.apply(
            Update::Add(vec![EndpointSpec::new("a:1").with_weight(5)]),
            NOW,
        ),
        NOW,
    );
    let a = b.snapshot().endpoints()[0].clone();
    assert_eq!(
        (a.weight(), a.stats().in_flight()),
        (5, 1),
        "new weight, same live stats"
    );
    g.finish_at(Outcome::Success, NOW);
    assert_eq!(a.stats().in_flight(), 0);
}

/// Asks to be prepared again at a set time only where its set is a restriction (a tag set's
/// or a stage leaf's: fewer eligible than endpoints), never for the whole snapshot.
struct AsksInSubsets;
struct AsksPicker(Option<Timestamp>);

impl Strategy for AsksInSubsets {
    type Picker = AsksPicker;
    fn name(&self) -> &str {
        "asks-in-subsets"
    }
    fn prepare(&self, s: &Arc<Snapshot>, now: Timestamp) -> AsksPicker {
        let subset = s.eligible().len() < s.len();
        AsksPicker(subset.then(|| now + Duration::from_millis(40)))
    }
}

impl Picker for AsksPicker {
    fn pick(&self, _: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> {
        Ok(EndpointIdx::new(0))
    }
    fn refresh_at(&self) -> Option<Timestamp> {
        self.0
    }
}

/// A tag set's picker asking to be prepared again sets the prepared snapshot's refresh time,
/// and the tick then re-prepares (`Picker::refresh_at`, folded over every picker).
#[test]
fn a_tag_sets_picker_asking_for_a_refresh_is_ticked() {
    let tagged = |a: &str, tag: &str| EndpointSpec::new(a).with_meta(route::TAG_KEY, tag);
    let s = snap(vec![
        tagged("a:1", "blue"),
        tagged("b:1", "green"),
        EndpointSpec::new("c:1"),
    ]);
    let lb = Balancer::new(AsksInSubsets, s, NOW);
    let now = lb.current();
    assert!(now.tag_sets() > 0);
    assert_eq!(now.picker().refresh_at(), None);
    assert_eq!(now.refresh_at(), Some(NOW + Duration::from_millis(40)));
    assert!(!lb.tick(NOW + Duration::from_millis(39)));
    assert!(lb.tick(NOW + Duration::from_millis(40)));
}
