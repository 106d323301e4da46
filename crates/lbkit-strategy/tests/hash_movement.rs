//! Key movement of every hashing strategy when one of N endpoints is removed, added or marked
//! down: about 1/N of the keys move, and for rings and rendezvous only the keys that must.

use std::sync::Arc;

use lbkit_core::{EndpointSpec, FastRng, PickContext, Picker, Snapshot, Strategy, Timestamp};
use lbkit_strategy::catalog::{build, Params};
use proptest::prelude::*;
use proptest::test_runner::RngSeed;

const KEYS: u32 = 20_000;

/// Strategies whose only moved keys are those of the changed endpoint.
const MINIMAL: [&str; 3] = ["consistent-hash", "ketama", "rendezvous"];

#[derive(Clone, Debug)]
struct Fleet(Vec<(String, u32, bool)>);

impl Fleet {
    fn new(n: usize) -> Self {
        Fleet(
            (0..n)
                .map(|i| {
                    (
                        format!("10.3.{}.{}:9000", i / 200, i % 200),
                        1 + (i % 3) as u32,
                        true,
                    )
                })
                .collect(),
        )
    }

    fn snapshot(&self) -> Arc<Snapshot> {
        Arc::new(Snapshot::from_specs(
            self.0
                .iter()
                .map(|(a, w, up)| {
                    EndpointSpec::new(a.as_str())
                        .with_weight(*w)
                        .with_healthy(*up)
                })
                .collect(),
            Timestamp::ZERO,
        ))
    }

    /// The address each key goes to.
    fn assign(&self, name: &str, keys: u32) -> Vec<String> {
        let snap = self.snapshot();
        let picker = build(name, Params::new())
            .unwrap()
            .prepare(&snap, Timestamp::ZERO);
        let mut rng = FastRng::seed_from_u64(5);
        (0..keys)
            .map(|k| {
                let key = format!("session-{k}");
                let mut cx = PickContext::new(Timestamp::ZERO, &mut rng).with_key(key.as_bytes());
                snap.endpoint(picker.pick(&mut cx).unwrap())
                    .address()
                    .to_owned()
            })
            .collect()
    }
}

/// Keys that changed endpoint, and whether each moved key involved `changed`.
fn diff(before: &[String], after: &[String], changed: &str) -> (usize, bool) {
    let moved: Vec<usize> = (0..before.len())
        .filter(|&i| before[i] != after[i])
        .collect();
    let only_changed = moved
        .iter()
        .all(|&i| before[i] == changed || after[i] == changed);
    (moved.len(), only_changed)
}

#[test]
fn removing_one_of_n_moves_about_one_nth_and_only_its_keys() {
    let n = 20;
    let fleet = Fleet::new(n);
    for name in ["consistent-hash", "ketama", "rendezvous", "maglev"] {
        let before = fleet.assign(name, KEYS);
        for removed in [0, 7, 19] {
            let mut smaller = fleet.clone();
            let (gone, ..) = smaller.0.remove(removed);
            let after = smaller.assign(name, KEYS);
            let (moved, only_changed) = diff(&before, &after, &gone);
            let share = before.iter().filter(|a| **a == gone).count();
            let fraction = moved as f64 / f64::from(KEYS);
            if MINIMAL.contains(&name) {
                assert!(only_changed, "{name}: keys of other endpoints moved");
                assert_eq!(
                    moved, share,
                    "{name}: exactly the removed endpoint's keys move"
                );
                // Weights 1..3 (Σw = 40): the removed endpoint holds about w/Σw of the keys
                // (1/n for Dubbo's ring, which ignores weights).
                let ideal = if name == "consistent-hash" {
                    1.0 / n as f64
                } else {
                    fleet.0[removed].1 as f64 / 40.0
                };
                assert!(
                    fraction <= 1.5 * ideal,
                    "{name}: {fraction} moved removing {gone}"
                );
            } else {
                // Maglev: the removed endpoint's keys plus a little extra disruption (paper §5.3).
                assert!(moved >= share);
                assert!(
                    fraction <= 2.0 * fleet.0[removed].1 as f64 / 40.0 + 0.01,
                    "{name}: {fraction} moved"
                );
            }
        }
    }
}

#[test]
fn adding_one_moves_keys_only_to_the_new_endpoint() {
    let n = 20;
    let fleet = Fleet::new(n);
    let mut larger = fleet.clone();
    larger.0.insert(5, ("10.9.9.9:9000".to_owned(), 2, true));
    for name in ["consistent-hash", "ketama", "rendezvous", "maglev"] {
        let (before, after) = (fleet.assign(name, KEYS), larger.assign(name, KEYS));
        let (moved, only_new) = diff(&before, &after, "10.9.9.9:9000");
        let fraction = moved as f64 / f64::from(KEYS);
        // Weight 2 of Σw = 42, or 1 of 21 endpoints for Dubbo's ring: 1/21 either way.
        let ideal = 1.0 / 21.0;
        if MINIMAL.contains(&name) {
            assert!(only_new, "{name}: a key moved between old endpoints");
            assert!(fraction <= 1.5 * ideal, "{name}: {fraction} moved");
        } else {
            assert!(fraction <= 2.0 * ideal + 0.01, "{name}: {fraction} moved");
        }
        assert!(
            fraction >= 0.5 * ideal,
            "{name}: the new endpoint got only {fraction}"
        );
    }
}

#[test]
fn an_endpoint_going_down_moves_only_its_own_keys_for_every_strategy() {
    let fleet = Fleet::new(12);
    for name in ["consistent-hash", "ketama", "rendezvous", "maglev"] {
        let before = fleet.assign(name, KEYS);
        let mut degraded = fleet.clone();
        degraded.0[4].2 = false;
        // Draining (weight 0) is a weight change: Maglev rebuilds its table for it, the rings
        // and rendezvous merely leave the endpoint out. Mark another one down for Maglev.
        if name == "maglev" {
            degraded.0[9].2 = false;
        } else {
            degraded.0[9].1 = 0;
        }
        let after = degraded.assign(name, KEYS);
        for k in 0..before.len() {
            if before[k] != fleet.0[4].0 && before[k] != fleet.0[9].0 {
                assert_eq!(
                    before[k], after[k],
                    "{name}: key {k} of a healthy endpoint moved"
                );
            } else {
                assert_ne!(
                    before[k], after[k],
                    "{name}: key {k} stayed on a down endpoint"
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, rng_seed: RngSeed::Fixed(0x6d6f_7665), ..ProptestConfig::default() })]
    /// Ring and rendezvous: removing any endpoint of any fleet moves exactly its keys.
    #[test]
    fn removal_moves_exactly_the_removed_keys(n in 2usize..16, removed in 0usize..16, seed in 0u64..1000) {
        let removed = removed % n;
        let mut fleet = Fleet::new(n);
        let mut rng = FastRng::seed_from_u64(seed);
        fleet.0.iter_mut().for_each(|e| e.1 = 1 + rng.below(4) as u32);
        let mut smaller = fleet.clone();
        let (gone, ..) = smaller.0.remove(removed);
        for name in MINIMAL {
            let before = fleet.assign(name, 2_000);
            let after = smaller.assign(name, 2_000);
            let (moved, only) = diff(&before, &after, &gone);
            prop_assert!(only, "{}: other keys moved", name);
            prop_assert_eq!(moved, before.iter().filter(|a| **a == gone).count());
        }
    }
}

/// Through a [`Balancer`](lbkit_core::Balancer), the catalog's rings with `rebuild_interval_ms =
/// 100`: one endpoint out and one in, 20 ms after the ring was made, publish a ring whose picks send
/// the keys of the one gone where a ring without it does, give the new one no key, and ask to
/// be spliced when the interval ends; a tick before then changes nothing, the first tick from
/// then on picks as a ring made from scratch. Without the parameter (0, the default) every
/// change is applied at once; a value out of range is refused.
#[test]
fn catalog_rings_hold_changes_until_the_first_tick_after_the_interval() {
    use lbkit_core::{Balancer, SnapshotBuilder, Update};
    let ms = Timestamp::from_millis;
    let spec = |i: u32| EndpointSpec::new(format!("10.1.0.{i}:80"));
    for name in ["consistent-hash", "ketama"] {
        let strategy =
            || build(name, Params::from_pairs([("rebuild_interval_ms", "100")])).unwrap();
        let mut b = SnapshotBuilder::new();
        let first = b.apply(Update::Reset((0..40).map(spec).collect()), ms(1_000));
        let balancer = Balancer::new(strategy(), first.clone(), ms(1_000));
        let gone = first
            .endpoint(lbkit_core::EndpointIdx::new(5))
            .key()
            .clone();
        b.apply(Update::Remove(vec![gone]), ms(1_020));
        let second = b.apply(Update::Add(vec![spec(40)]), ms(1_020));
        balancer.publish(second.clone(), ms(1_020));
        let now = balancer.current();
        assert_eq!(now.refresh_at(), Some(ms(1_100)), "{name}");
        let without: Vec<_> = (0..40).filter(|&i| i != 5).map(spec).collect();
        let without = Arc::new(Snapshot::from_specs(without, ms(1_020)));
        let expected = picks(&strategy().prepare(&without, ms(1_020)), &without);
        assert_eq!(picks(now.picker(), &second), expected, "{name}: held");
        assert!(!balancer.tick(ms(1_099)), "{name}");
        assert!(balancer.tick(ms(1_100)), "{name}");
        let spliced = balancer.current();
        assert_eq!(spliced.refresh_at(), None, "{name}");
        let scratch = strategy().prepare(&second, ms(1_100));
        assert_eq!(
            picks(spliced.picker(), &second),
            picks(&scratch, &second),
            "{name}: spliced"
        );
        // By default every change is applied at once; out of range is refused.
        let every = build(name, Params::new()).unwrap();
        let last = every.prepare(&first, ms(1_000));
        let next = every.prepare_next(&first, &last, &second, ms(1_001));
        assert_eq!(next.refresh_at(), None, "{name}");
        assert_eq!(
            picks(&next, &second),
            picks(&scratch, &second),
            "{name}: at once"
        );
        let err = build(name, Params::from_pairs([("rebuild_interval_ms", "60001")])).unwrap_err();
        assert!(
            err.to_string().contains("rebuild_interval_ms"),
            "{name}: {err}"
        );
    }
}

/// Each of 2 000 keys' endpoint, by address, as `picker` picks it from `snapshot`.
fn picks(picker: &dyn Picker, snapshot: &Snapshot) -> Vec<String> {
    let mut rng = FastRng::seed_from_u64(1);
    (0..2_000)
        .map(|k| {
            let key = format!("key-{k}");
            let mut cx = PickContext::new(Timestamp::ZERO, &mut rng).with_key(key.as_bytes());
            snapshot
                .endpoint(picker.pick(&mut cx).unwrap())
                .address()
                .to_owned()
        })
        .collect()
}
