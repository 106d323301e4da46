//! Maglev: Envoy's weighted entry counts, balance over a million keys, the table size parameter.

use std::sync::Arc;

use lbkit_core::{
    BoxStrategy, EndpointIdx, EndpointSpec, FastRng, PickContext, Picker, Snapshot, Strategy,
    Timestamp,
};
use lbkit_strategy::catalog::{build, Params};
use lbkit_strategy::{Maglev, MaglevPicker};
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
