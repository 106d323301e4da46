//! Family-level tests: catalog entries, walking on probe, keyless calls, determinism.

use std::sync::Arc;

use lbkit_core::{
    BoxStrategy, EndpointIdx, EndpointSpec, FastRng, PickContext, Picker, Snapshot, Strategy,
    Timestamp,
};

use lbkit_core::stage::Stages;

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

/// Through the catalog's boxed strategies (as the proxy and `lbkit pick` build them), a picker
/// prepared from the last one ([`Strategy::prepare_next`]: the rings patch) picks as one
/// prepared from scratch, set after set: endpoints coming, going, going down and changing
/// weight, with several probes per key.
#[test]
fn pickers_prepared_from_the_last_pick_as_rebuilt_ones() {
    use std::borrow::Cow;
    let spec = |p: u32, w: u32, up: bool| {
        EndpointSpec::new(format!("10.0.{}.{}:20880", p / 200, p % 200 + 1))
            .with_weight(w)
            .with_healthy(up)
    };
    let mut rng = FastRng::seed_from_u64(44);
    let mut set: std::collections::BTreeMap<u32, (u32, bool)> =
        (0..60).map(|p| (p * 3, (1, true))).collect();
    for name in NAMES {
        let strategy = build(name, Params::new()).unwrap();
        let mut b = lbkit_core::SnapshotBuilder::new();
        let specs = |set: &std::collections::BTreeMap<u32, (u32, bool)>| -> Vec<EndpointSpec> {
            set.iter().map(|(&p, &(w, up))| spec(p, w, up)).collect()
        };
        let mut last = b.reset_from(specs(&set).iter().map(Cow::Borrowed), Timestamp::ZERO);
        let mut picker = strategy.prepare(&last, Timestamp::ZERO);
        for round in 1..=12 {
            // A second apart: past Maglev's rebuild interval, every table is built.
            let now = Timestamp::from_millis(1_000 * round);
            for _ in 0..4 {
                let p = rng.below(240) as u32;
                match set.get(&p).copied() {
                    Some((w, up)) if rng.below(3) == 0 => drop(set.insert(p, (w % 3 + 1, up))),
                    Some((w, up)) if rng.below(2) == 0 => drop(set.insert(p, (w, !up))),
                    Some(_) => drop(set.remove(&p)),
                    None => drop(set.insert(p, (1, true))),
                }
            }
            let next = b.reset_from(specs(&set).iter().map(Cow::Borrowed), now);
            picker = strategy.prepare_next(&last, &picker, &next, now);
            let rebuilt = strategy.prepare(&next, now);
            for k in 0..300u32 {
                let key = format!("user-{k}");
                for probe in 0..3 {
                    let (a, b) = (
                        pick(&*picker, key.as_bytes(), probe),
                        pick(&*rebuilt, key.as_bytes(), probe),
                    );
                    assert_eq!(a, b, "{name}: {key} probe {probe}");
                }
            }
            for &i in next.eligible() {
                assert_eq!(picker.explain(i, now), rebuilt.explain(i, now), "{name}");
            }
            last = next;
        }
    }
}

/// A balancer whose endpoints carry Dubbo tags prepares each tag subset's ring from the last
/// one (patched), and picks in every subset as a balancer made from scratch on the same set:
/// providers coming, going and moving between tags, for each tag, untagged requests and an
/// unknown tag (the fallback).
#[test]
fn tag_subsets_patched_pick_as_rebuilt_ones() {
    use lbkit_core::route::TAG_KEY;
    let tags = [Some("blue"), Some("green"), None];
    let spec = |s: EndpointSpec, t: usize| match tags[t] {
        Some(name) => s.with_meta(TAG_KEY, name),
        None => s,
    };
    patched_pick_as_rebuilt(spec, &[b"blue", b"green", b"", b"red"], &Stages::default());
}

/// Under priority tiers (tier 0 healthy: every request reaches its leaf, prepared from the last
/// main picker), the patched rings pick as a balancer made from scratch: providers coming,
/// going and moving between three priorities.
#[test]
fn the_healthy_tier_patched_picks_as_rebuilt() {
    let spec = |s: EndpointSpec, t: usize| s.with_priority(t as u32);
    patched_pick_as_rebuilt(spec, &[b""], &Stages::default());
}

/// With locality-weighted balancing over three zones (each zone's ring prepared from the last
/// one's of the same zone), the patched rings pick as a balancer made from scratch.
#[test]
fn zone_rings_patched_pick_as_rebuilt() {
    let spec = |s: EndpointSpec, t: usize| s.with_zone(["x", "y", "z"][t]);
    let stages = Stages {
        localities: Some(lbkit_core::stage::Localities::default()),
        ..Stages::default()
    };
    patched_pick_as_rebuilt(spec, &[b""], &stages);
}

/// With Dubbo tags and locality-weighted balancing together, each tag set's zone rings are
/// prepared from the last ones of the same requests' tag set and zone: the patched rings pick
/// as a balancer made from scratch for every tag, untagged and an unknown tag. An endpoint's
/// zone follows its address (two zones); its tag moves with its variant.
#[test]
fn tag_zone_rings_patched_pick_as_rebuilt() {
    use lbkit_core::route::TAG_KEY;
    let tags = [Some("blue"), Some("green"), None];
    let spec = |s: EndpointSpec, t: usize| {
        let zone = ["x", "y"][s.address.bytes().map(usize::from).sum::<usize>() % 2];
        let s = s.with_zone(zone);
        match tags[t] {
            Some(name) => s.with_meta(TAG_KEY, name),
            None => s,
        }
    };
    let stages = Stages {
        localities: Some(lbkit_core::stage::Localities::default()),
        ..Stages::default()
    };
    patched_pick_as_rebuilt(spec, &[b"blue", b"green", b"", b"red"], &stages);
    // Changes held within a rebuild interval, in every tag set's zone rings, then spliced at
    // the balancer's tick.
    pick_as_rebuilt(spec, &[b"blue", b"green", b"", b"red"], &stages, true);
}

/// With metadata subsets (`version`, three values moving with the variant; requests ask for
/// each), each subset's ring is prepared from the last one's of the same version: the patched
/// rings pick as a balancer made from scratch.
#[test]
fn subset_rings_patched_pick_as_rebuilt() {
    use lbkit_core::stage::{SubsetFallback, Subsets};
    let spec = |s: EndpointSpec, t: usize| s.with_meta("version", ["v0", "v1", "v2"][t]);
    let stages = Stages {
        subsets: Some(Subsets::new(
            vec![vec!["version".into()]],
            SubsetFallback::Any,
        )),
        ..Stages::default()
    };
    patched_pick_as_rebuilt(spec, &[b""], &stages);
}

/// Five changes to `set` (position → variant): an endpoint gone, new, or moved to the next
/// variant.
fn churn(rng: &mut FastRng, set: &mut std::collections::BTreeMap<u32, usize>) {
    for _ in 0..5 {
        let p = rng.below(240) as u32;
        match set.get(&p).copied() {
            Some(t) if rng.below(2) == 0 => drop(set.insert(p, (t + 1) % 3)),
            Some(_) => drop(set.remove(&p)),
            None => drop(set.insert(p, rng.below(3) as usize)),
        }
    }
}

/// Balancers of consistent hash and ketama over 90 endpoints, each in one of three variants
/// (`spec`), through eight rounds a second apart of five changes (an endpoint gone, new, or moved to the next
/// variant): each publish's picks, for 200 keys under each request tag of `tags`, equal those
/// of a balancer made from scratch on the same set, both under `stages`. Each request also
/// carries a `version` attribute (v0, v1 or v2 by its key), for metadata subsets.
fn patched_pick_as_rebuilt(
    spec: impl Fn(EndpointSpec, usize) -> EndpointSpec,
    tags: &[&[u8]],
    stages: &Stages,
) {
    pick_as_rebuilt(spec, tags, stages, false);
}

/// [`patched_pick_as_rebuilt`]; when `held`, with `rebuild_interval_ms = 100` and, in each
/// round, five more changes published 10 ms after the first (held in the rings that have
/// nothing to splice at once), then the balancer ticked at the interval's end: picks are
/// compared after the tick, and at least one round must have held its changes.
fn pick_as_rebuilt(
    spec: impl Fn(EndpointSpec, usize) -> EndpointSpec,
    tags: &[&[u8]],
    stages: &Stages,
    held: bool,
) {
    use lbkit_core::{Balancer, SnapshotBuilder};
    use std::borrow::Cow;
    use std::collections::BTreeMap;
    let mut rng = FastRng::seed_from_u64(44);
    let mut set: BTreeMap<u32, usize> = (0..90).map(|p| (p * 2, (p % 3) as usize)).collect();
    let specs = |set: &BTreeMap<u32, usize>| -> Vec<EndpointSpec> {
        let address = |p: u32| format!("10.1.{}.{}:20880", p / 200, p % 200 + 1);
        set.iter()
            .map(|(&p, &t)| spec(EndpointSpec::new(address(p)), t))
            .collect()
    };
    let now = Timestamp::ZERO;
    let params = || match held {
        true => Params::from_pairs([("rebuild_interval_ms", "100")]),
        false => Params::new(),
    };
    let ms = std::time::Duration::from_millis;
    for name in ["consistent-hash", "ketama"] {
        let mut b = SnapshotBuilder::new();
        let first = b.reset_from(specs(&set).iter().map(Cow::Borrowed), now);
        let lb = Balancer::new(build(name, params()).unwrap(), first, now)
            .with_stages(stages.clone(), now);
        let mut holds = 0;
        for round in 1..=8 {
            churn(&mut rng, &mut set);
            // A second apart: past any rebuild interval, every change is patched in.
            let at = now.saturating_add(ms(1_000 * round));
            let mut next = b.reset_from(specs(&set).iter().map(Cow::Borrowed), at);
            lb.publish(next.clone(), at);
            if held {
                churn(&mut rng, &mut set);
                let soon = at.saturating_add(ms(10));
                next = b.reset_from(specs(&set).iter().map(Cow::Borrowed), soon);
                lb.publish(next.clone(), soon);
                holds += usize::from(lb.current().refresh_at().is_some());
                lb.tick(at.saturating_add(ms(100)));
                assert_eq!(lb.current().refresh_at(), None, "{name}: spliced");
            }
            let fresh = Balancer::new(build(name, params()).unwrap(), next, at)
                .with_stages(stages.clone(), at);
            picks_agree(name, (&lb, &fresh), tags);
        }
        assert!(!held || holds > 0, "{name}: no round held its changes");
    }
}

/// `ours` and `theirs` have the same tag sets and stages, and pick alike for 200 keys under
/// each of `tags`; each request carries a `version` attribute (v0, v1 or v2 by its key).
fn picks_agree(
    name: &str,
    (ours, theirs): (
        &lbkit_core::Balancer<BoxStrategy>,
        &lbkit_core::Balancer<BoxStrategy>,
    ),
    tags: &[&[u8]],
) {
    use lbkit_core::{Balancer, Prepared, RequestTag};
    let pick = |p: &Prepared<Box<dyn Picker>>, lb: &Balancer<BoxStrategy>, key: &str, tag| {
        let mut r = FastRng::seed_from_u64(key.len() as u64);
        let version: &[u8] = [&b"v0"[..], b"v1", b"v2"][key.len() % 3];
        let attrs: &[lbkit_core::stage::Attr<'_>] = &[(b"version", version)];
        let mut cx = PickContext::new(Timestamp::ZERO, &mut r)
            .with_key(key.as_bytes())
            .with_tag(RequestTag::new(tag))
            .with_attrs(attrs);
        p.select(&mut cx, lb.availability())
    };
    let (a, b) = (ours.current(), theirs.current());
    assert_eq!(a.tag_sets(), b.tag_sets(), "{name}");
    assert_eq!(a.is_staged(), b.is_staged(), "{name}");
    for &tag in tags {
        for k in 0..200u32 {
            let key = format!("user-{k}");
            let picks = (pick(&a, ours, &key, tag), pick(&b, theirs, &key, tag));
            assert_eq!(picks.0, picks.1, "{name} {tag:?} {key}");
        }
    }
}
