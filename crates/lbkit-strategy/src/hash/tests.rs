//! Family-level tests: catalog entries, walking on probe, keyless calls, determinism.

use std::sync::Arc;

use lbkit_core::{
    BoxStrategy, EndpointIdx, EndpointSpec, FastRng, PickContext, Picker, Snapshot, Strategy,
    Timestamp,
};

use crate::catalog::{build, Params};

const NAMES: [&str; 4] = ["consistent-hash", "ketama", "maglev", "rendezvous"];

fn snap(specs: &[(&str, u32, bool)]) -> Arc<Snapshot> {
    Arc::new(Snapshot::from_specs(
        specs
            .iter()
            .map(|&(a, w, up)| EndpointSpec::new(a).with_weight(w).with_healthy(up))
            .collect(),
        Timestamp::ZERO,
    ))
}

fn picker(name: &str, snapshot: &Arc<Snapshot>) -> Box<dyn Picker> {
    build(name, Params::new())
        .unwrap()
        .prepare(snapshot, Timestamp::ZERO)
}

fn pick(p: &dyn Picker, key: &[u8], probe: u32) -> usize {
    let mut rng = FastRng::seed_from_u64(9);
    let mut cx = PickContext::new(Timestamp::ZERO, &mut rng).with_key(key);
    cx.probe = probe;
    p.pick(&mut cx).unwrap().get()
}

const FIVE: &[(&str, u32, bool)] = &[
    ("10.0.0.1:80", 1, true),
    ("10.0.0.2:80", 2, true),
    ("10.0.0.3:80", 1, false),
    ("10.0.0.4:80", 1, true),
    ("10.0.0.5:80", 0, true),
    ("10.0.0.6:80", 3, true),
];

#[test]
fn probes_walk_through_every_eligible_endpoint_once_then_wrap() {
    let s = snap(FIVE);
    for name in NAMES {
        let p = picker(name, &s);
        for k in 0..200u32 {
            let key = format!("key-{k}");
            let walk: Vec<usize> = (0..4)
                .map(|probe| pick(&*p, key.as_bytes(), probe))
                .collect();
            let mut sorted = walk.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, [0, 1, 3, 5], "{name}: walk for {key}: {walk:?}");
            assert_eq!(
                pick(&*p, key.as_bytes(), 4),
                walk[0],
                "{name}: probe 4 wraps"
            );
            assert_eq!(
                pick(&*p, key.as_bytes(), 6),
                walk[2],
                "{name}: probe 6 wraps"
            );
        }
    }
}

#[test]
fn identical_snapshots_give_identical_picks() {
    let (a, b) = (snap(FIVE), snap(FIVE));
    for name in NAMES {
        let (pa, pb) = (picker(name, &a), picker(name, &b));
        for k in 0..500u32 {
            let key = k.to_le_bytes();
            assert_eq!(pick(&*pa, &key, 0), pick(&*pb, &key, 0), "{name}");
        }
    }
}

#[test]
fn keyless_calls_use_the_callers_hash_or_spread_randomly() {
    let s = snap(FIVE);
    for name in NAMES {
        let p = picker(name, &s);
        let mut rng = FastRng::seed_from_u64(3);
        let with_hash = |rng: &mut FastRng, h| {
            p.pick(&mut PickContext::new(Timestamp::ZERO, rng).with_hash(h))
                .unwrap()
        };
        for h in [1u64, 99, u64::MAX] {
            let first = with_hash(&mut rng, h);
            assert!((0..20).all(|_| with_hash(&mut rng, h) == first), "{name}");
        }
        let mut seen = [0u32; 6];
        for _ in 0..2_000 {
            seen[p
                .pick(&mut PickContext::new(Timestamp::ZERO, &mut rng))
                .unwrap()
                .get()] += 1;
        }
        assert!(
            [0, 1, 3, 5].iter().all(|&i| seen[i] > 50) && seen[2] + seen[4] == 0,
            "{name}: {seen:?}"
        );
    }
}

#[test]
fn catalog_parameters() {
    let ok = |name: &str, pairs: &[(&str, &str)]| {
        build(name, Params::from_pairs(pairs.iter().copied()))
            .map(|s: BoxStrategy| s.name().to_owned())
    };
    for name in NAMES {
        assert_eq!(ok(name, &[("balance_factor", "1.25")]).unwrap(), name);
        assert_eq!(ok(name, &[("balance_factor", "OFF")]).unwrap(), name);
        for bad in ["0.99", "-1", "inf", "NaN", "x"] {
            let e = ok(name, &[("balance_factor", bad)])
                .unwrap_err()
                .to_string();
            assert!(e.contains("balance_factor"), "{name} {bad}: {e}");
        }
    }
    assert!(ok("consistent-hash", &[("nodes", "320")]).is_ok());
    let e = ok("consistent-hash", &[("nodes", "2")])
        .unwrap_err()
        .to_string();
    assert!(e.contains("4..=65536"), "{e}");
    assert!(ok("maglev", &[("table_size", "5000011")]).is_ok());
    let e = ok("maglev", &[("table_size", "65536")])
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a prime"), "{e}");
    let e = ok("maglev", &[("table_size", "6000000")])
        .unwrap_err()
        .to_string();
    assert!(e.contains("table_size"), "{e}");
    let e = ok("ketama", &[("nodes", "3")]).unwrap_err().to_string();
    assert!(e.contains("no parameter \"nodes\""), "{e}");
}

#[test]
fn explain_describes_each_endpoints_share() {
    let s = snap(FIVE);
    for name in NAMES {
        let p = picker(name, &s);
        let text = p.explain(EndpointIdx::new(5), Timestamp::ZERO).unwrap();
        assert!(text.contains('%'), "{name}: {text}");
        assert_eq!(
            p.explain(EndpointIdx::new(2), Timestamp::ZERO),
            None,
            "{name}: down"
        );
    }
}
