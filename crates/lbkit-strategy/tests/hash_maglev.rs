//! Maglev: Envoy's weighted entry counts, balance over a million keys, the table size parameter.

use std::sync::Arc;

use lbkit_core::{
    BoxStrategy, EndpointIdx, EndpointSpec, FastRng, PickContext, Picker, Snapshot, Strategy,
    Timestamp,
};
use lbkit_strategy::catalog::{build, Params};
use lbkit_strategy::{Maglev, MaglevPicker, TICKED_REBUILD_INTERVAL};
use proptest::prelude::*;
use proptest::test_runner::RngSeed;

fn snap(specs: &[(String, u32)]) -> Arc<Snapshot> {
    Arc::new(Snapshot::from_specs(
        specs
            .iter()
            .map(|(a, w)| EndpointSpec::new(a.as_str()).with_weight(*w))
            .collect(),
        Timestamp::ZERO,
    ))
}

fn counts(picker: &MaglevPicker, n: usize) -> Vec<usize> {
    let mut c = vec![0; n];
    picker.table().iter().for_each(|i| c[i.get()] += 1);
    c
}

#[test]
fn weights_one_and_two_take_envoys_21846_and_43691_entries() {
    // Envoy's Maglev docs: weights 1 and 2 in a 65537-entry table.
    for specs in [
        [("a.example:80", 1), ("b.example:80", 2)],
        [("b.example:80", 2), ("a.example:80", 1)],
    ] {
        let s = snap(&specs.map(|(a, w)| (a.to_owned(), w)));
        let c = counts(&Maglev::new().prepare(&s, Timestamp::ZERO), 2);
        let (light, heavy) = if specs[0].1 == 1 {
            (c[0], c[1])
        } else {
            (c[1], c[0])
        };
        assert_eq!((light, heavy), (21_846, 43_691));
    }
}

#[test]
fn max_over_mean_load_of_a_million_keys_on_100_endpoints_is_at_most_1_05() {
    let specs: Vec<(String, u32)> = (0..100)
        .map(|i| (format!("10.1.{}.{}:8080", i / 10, i), 1))
        .collect();
    let picker = build("maglev", Params::new())
        .unwrap()
        .prepare(&snap(&specs), Timestamp::ZERO);
    let mut load = [0u64; 100];
    let mut rng = FastRng::seed_from_u64(2016);
    for k in 0..1_000_000u64 {
        let key = k.to_le_bytes();
        let mut cx = PickContext::new(Timestamp::ZERO, &mut rng).with_key(&key);
        load[picker.pick(&mut cx).unwrap().get()] += 1;
    }
    let max = *load.iter().max().unwrap() as f64;
    let ratio = max / 10_000.0;
    assert!(ratio <= 1.05, "max/mean = {ratio}");
}

#[test]
fn table_size_parameter_sets_the_table() {
    let specs: Vec<(String, u32)> = (0..3).map(|i| (format!("h{i}:1"), 1)).collect();
    let s = snap(&specs);
    let m = Maglev::try_with_table_size(251)
        .unwrap()
        .prepare(&s, Timestamp::ZERO);
    assert_eq!(m.table().len(), 251);
    let c = counts(&m, 3);
    assert!(c.iter().all(|&n| (83..=84).contains(&n)), "{c:?}");
    let boxed: BoxStrategy =
        build("maglev", Params::from_pairs([("table_size", "5000011")])).unwrap();
    let big = boxed.prepare(&s, Timestamp::ZERO);
    assert!(big
        .explain(EndpointIdx::new(0), Timestamp::ZERO)
        .unwrap()
        .contains("of 5000011 table entries"));
}

/// Through a [`Balancer`]: a change within the rebuild interval publishes the last table
/// patched, which asks to be built when the interval ends; a tick before then changes
/// nothing, the first tick from then on publishes the table built from scratch.
#[test]
fn a_balancer_builds_a_patched_table_at_the_first_tick_after_the_interval() {
    use lbkit_core::{Balancer, SnapshotBuilder, Update};
    let ms = Timestamp::from_millis;
    let spec = |i: u32| EndpointSpec::new(format!("10.1.0.{i}:80")).with_key(format!("k{i:03}"));
    let mut b = SnapshotBuilder::new();
    let first = b.apply(Update::Reset((0..40).map(spec).collect()), ms(1_000));
    let strategy = Maglev::new().with_rebuild_interval(TICKED_REBUILD_INTERVAL);
    let balancer = Balancer::new(strategy, first, ms(1_000));
    assert_eq!(balancer.current().refresh_at(), None);
    // One endpoint in, 20 ms later: patched; it asks for the build at 1 000 + 100 ms.
    let second = b.apply(Update::Add(vec![spec(40)]), ms(1_020));
    balancer.publish(second.clone(), ms(1_020));
    assert_eq!(balancer.current().refresh_at(), Some(ms(1_100)));
    let rebuilt = Maglev::new().prepare(&second, ms(1_020));
    let now = balancer.current();
    assert_ne!(now.picker().table(), rebuilt.table());
    assert!(
        now.picker().table().iter().all(|i| i.get() != 40),
        "the new one waits"
    );
    assert!(!balancer.tick(ms(1_099)));
    assert!(balancer.tick(ms(1_100)));
    let built = balancer.current();
    assert_eq!(built.picker().table(), rebuilt.table());
    assert_eq!(built.refresh_at(), None);
    // Calm since: the next change builds at once.
    let third = b.apply(Update::Add(vec![spec(41)]), ms(1_300));
    balancer.publish(third.clone(), ms(1_300));
    let rebuilt = Maglev::new().prepare(&third, ms(1_300));
    assert_eq!(balancer.current().picker().table(), rebuilt.table());
    // The parameter: 0 builds on every change; out of range is refused.
    let every: BoxStrategy =
        build("maglev", Params::from_pairs([("rebuild_interval_ms", "0")])).unwrap();
    let last = every.prepare(&second, ms(1_020));
    assert_eq!(
        every
            .prepare_next(&second, &last, &third, ms(1_021))
            .refresh_at(),
        None
    );
    let err = build(
        "maglev",
        Params::from_pairs([("rebuild_interval_ms", "-1")]),
    )
    .unwrap_err();
    assert!(err.to_string().contains("rebuild_interval_ms"), "{err}");
}

/// With tags: an endpoint moving from tag `blue` to `green` changes only which sets it is
/// eligible in (a tag set's picker is prepared on a restriction of the snapshot, whose table
/// is built over every endpoint of positive weight), so every table, the whole set's and the
/// tag sets', is patched exactly and nothing waits for a build; an endpoint leaving patches
/// them, and the ticks at their intervals' ends build them, then nothing is due.
#[test]
fn with_tags_a_move_between_tags_is_exact_and_a_removal_is_built_at_the_tick() {
    use lbkit_core::route::TAG_KEY;
    use lbkit_core::{Balancer, EndpointKey, SnapshotBuilder, Update};
    let ms = Timestamp::from_millis;
    let spec = |i: u32, tag: &str| {
        let s = EndpointSpec::new(format!("10.2.0.{i}:80")).with_key(format!("k{i:03}"));
        if tag.is_empty() {
            s
        } else {
            s.with_meta(TAG_KEY, tag)
        }
    };
    let tag = |i: u32| ["blue", "green", ""][(i / 12) as usize];
    let mut b = SnapshotBuilder::new();
    let first = b.apply(
        Update::Reset((0..36).map(|i| spec(i, tag(i))).collect()),
        ms(1_000),
    );
    let strategy = Maglev::new().with_rebuild_interval(TICKED_REBUILD_INTERVAL);
    let balancer = Balancer::new(strategy, first, ms(1_000));
    assert_eq!(balancer.current().tag_sets(), 3);
    let moved = b.apply(Update::Add(vec![spec(5, "green")]), ms(1_010));
    balancer.publish(moved.clone(), ms(1_010));
    let now = balancer.current();
    assert_eq!(now.refresh_at(), None, "exact: nothing to build");
    assert_eq!(
        now.picker().table(),
        strategy.prepare(&moved, ms(1_010)).table()
    );
    let gone = b.apply(Update::Remove(vec![EndpointKey::from("k020")]), ms(1_020));
    balancer.publish(gone.clone(), ms(1_020));
    assert_eq!(balancer.current().refresh_at(), Some(ms(1_100)));
    assert!(balancer.tick(ms(1_100)));
    // The green set's table was built at 1 010 (endpoint 5 came to it), so it is due at 1 110;
    // the others, built now, patch exactly at that tick and ask for nothing more.
    assert_eq!(balancer.current().refresh_at(), Some(ms(1_110)));
    assert!(balancer.tick(ms(1_110)));
    let built = balancer.current();
    assert_eq!(built.refresh_at(), None);
    let fresh = strategy.prepare(&gone, ms(1_110));
    assert_eq!(built.picker().table(), fresh.table());
    assert!(!balancer.tick(ms(1_500)));
}

#[test]
fn more_endpoints_than_entries_still_fills_the_table() {
    let specs: Vec<(String, u32)> = (0..20).map(|i| (format!("h{i}:1"), 1)).collect();
    let s = snap(&specs);
    let m = Maglev::try_with_table_size(7)
        .unwrap()
        .prepare(&s, Timestamp::ZERO);
    assert_eq!(m.table().len(), 7);
    let distinct: std::collections::HashSet<_> = m.table().iter().collect();
    assert_eq!(distinct.len(), 7);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, rng_seed: RngSeed::Fixed(0x6d61_676c), ..ProptestConfig::default() })]
    /// Every endpoint's share of the table is within `2 + (n + 1) · w / W` entries of `M · w / W`:
    /// Envoy's turn rule gives each endpoint ⌊r · w / wmax⌋ + 1 turns after r rounds, and the
    /// last, partial round shifts the total by at most n + 1 turns.
    #[test]
    fn table_shares_follow_weights(weights in proptest::collection::vec(1u32..10, 1..20)) {
        let specs: Vec<(String, u32)> = weights.iter().enumerate().map(|(i, &w)| (format!("10.9.0.{i}:80"), w)).collect();
        let m = Maglev::new().prepare(&snap(&specs), Timestamp::ZERO);
        let total: u32 = weights.iter().sum();
        for (i, &c) in counts(&m, weights.len()).iter().enumerate() {
            let ideal = 65_537.0 * f64::from(weights[i]) / f64::from(total);
            let slack = 2.0 + (weights.len() + 1) as f64 * f64::from(weights[i]) / f64::from(total);
            prop_assert!((c as f64 - ideal).abs() <= slack, "endpoint {i}: {c} entries, ideal {ideal}");
        }
    }
}
