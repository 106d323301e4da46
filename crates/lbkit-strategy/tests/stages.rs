//! Stages in front of real strategies: picks through every stage at once allocate nothing (the
//! counting allocator), and each built-in strategy keeps its own choice inside the leaf a
//! request reaches.

use std::collections::HashMap;
use std::sync::Arc;

use lbkit_core::stage::{
    Aperture, ApertureMode, Coordinates, Localities, Stages, SubsetFallback, Subsets,
};
use lbkit_core::{
    Balancer, BoxStrategy, EndpointSpec, FastRng, HealthOverlay, PickContext, Snapshot,
    SnapshotPolicy, Timestamp,
};
use lbkit_strategy::catalog::{build, strategies, Params};
use lbkit_testkit::alloc::{allocations_in, CountingAlloc};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// 120 endpoints: versions v1/v2, zones a/b/c, a tenth in tier 1, some down.
fn fleet() -> Arc<Snapshot> {
    let specs = (0..120)
        .map(|i| {
            EndpointSpec::new(format!("10.0.{}.{}:80", i / 100, i % 100))
                .with_meta("version", if i % 2 == 0 { "v1" } else { "v2" })
                .with_zone(["a", "b", "c"][i % 3])
                .with_priority(u32::from(i % 10 == 9))
                .with_healthy(i % 7 != 0)
        })
        .collect();
    let s = Snapshot::from_specs(specs, Timestamp::ZERO);
    Arc::new(s.derive(1, &SnapshotPolicy::envoy(), &HealthOverlay::default()))
}

fn every_stage() -> Stages {
    let mut loc = Localities::default();
    loc.weights.insert("a".into(), 3);
    Stages {
        subsets: Some(Subsets::new(
            vec![vec!["version".into()]],
            SubsetFallback::Any,
        )),
        localities: Some(loc),
        aperture: Some(Aperture {
            size: 12,
            mode: ApertureMode::Deterministic,
            coordinates: Some(Coordinates {
                index: 17,
                count: 100,
            }),
            seed: 1,
        }),
        ..Stages::default()
    }
}

#[test]
fn picks_through_every_stage_allocate_nothing() {
    for info in strategies() {
        let strategy: BoxStrategy = build(info.name, Params::new()).unwrap();
        let lb = Balancer::new(strategy, fleet(), Timestamp::ZERO)
            .with_stages(every_stage(), Timestamp::ZERO);
        let mut rng = FastRng::seed_from_u64(3);
        let attrs: &[(&[u8], &[u8])] = &[(b"version", b"v2")];
        let key = b"user-42";
        // Warm up (lazy statics, thread locals).
        for _ in 0..10 {
            let mut cx = PickContext::new(Timestamp::ZERO, &mut rng).with_attrs(attrs);
            drop(lb.pick(&mut cx));
        }
        let ((), n) = allocations_in(|| {
            for i in 0..1_000u32 {
                let mut cx = PickContext::new(Timestamp::from_millis(u64::from(i)), &mut rng)
                    .with_attrs(attrs)
                    .with_key(key);
                let g = lb.pick(&mut cx).expect("pick");
                g.finish(lbkit_core::Outcome::Success);
            }
        });
        assert_eq!(
            n, 0,
            "{}: picks through the stages allocated {n} times",
            info.name
        );
    }
}

#[test]
fn every_strategy_stays_in_its_leaf() {
    for info in strategies() {
        let strategy: BoxStrategy = build(info.name, Params::new()).unwrap();
        let snap = fleet();
        let lb = Balancer::new(strategy, snap.clone(), Timestamp::ZERO)
            .with_stages(every_stage(), Timestamp::ZERO);
        let mut rng = FastRng::seed_from_u64(5);
        let attrs: &[(&[u8], &[u8])] = &[(b"version", b"v1")];
        let mut seen: HashMap<String, u32> = HashMap::new();
        for i in 0..2_000u32 {
            let mut cx = PickContext::new(Timestamp::ZERO, &mut rng).with_attrs(attrs);
            let key = i.to_string();
            let mut cx2;
            let cx = if info.name.contains("hash") || info.name == "ketama" || info.name == "maglev"
            {
                cx2 = cx.with_key(key.as_bytes());
                &mut cx2
            } else {
                &mut cx
            };
            let g = lb.pick(cx).expect("pick");
            let e = g.endpoint();
            assert_eq!(
                e.metadata().get("version").map(String::as_str),
                Some("v1"),
                "{}",
                info.name
            );
            assert!(
                e.is_eligible(),
                "{}: picked a down endpoint {}",
                info.name,
                e.address()
            );
            *seen.entry(e.address().to_owned()).or_default() += 1;
            g.finish(lbkit_core::Outcome::Success);
        }
        // The aperture bounds each leaf to about 12 of its candidates per zone and tier.
        assert!(
            seen.len() <= 3 * 2 * 14,
            "{}: {} endpoints",
            info.name,
            seen.len()
        );
    }
}

#[test]
fn turn_taking_strategies_keep_a_turn_per_subset() {
    // Requests alternate strictly between v1 and v2, two endpoints each. With one counter for
    // every set, each version saw every other turn and landed on one endpoint every time.
    let specs = ["a", "b", "c", "d"]
        .iter()
        .enumerate()
        .map(|(i, a)| EndpointSpec::new(format!("{a}:1")).with_meta("version", ["v1", "v2"][i % 2]))
        .collect();
    let snap = Arc::new(Snapshot::from_specs(specs, Timestamp::ZERO));
    let stages = Stages {
        subsets: Some(Subsets::new(
            vec![vec!["version".into()]],
            SubsetFallback::None,
        )),
        ..Stages::default()
    };
    for name in ["round-robin", "weighted-round-robin", "sticky-round-robin"] {
        let s: BoxStrategy = build(name, Params::new()).unwrap();
        let lb = Balancer::new(s, snap.clone(), Timestamp::ZERO)
            .with_stages(stages.clone(), Timestamp::ZERO);
        let mut rng = FastRng::seed_from_u64(3);
        let mut seen: HashMap<String, u32> = HashMap::new();
        for k in 0..400 {
            let attrs: &[(&[u8], &[u8])] = &[(b"version", [&b"v1"[..], b"v2"][k % 2])];
            let mut cx = PickContext::new(Timestamp::ZERO, &mut rng).with_attrs(attrs);
            let g = lb.pick(&mut cx).unwrap();
            *seen.entry(g.endpoint().address().to_owned()).or_default() += 1;
            g.abandon();
        }
        assert_eq!(
            seen.len(),
            4,
            "{name}: every endpoint takes turns: {seen:?}"
        );
        assert!(
            seen.values().all(|&n| (50..=150).contains(&n)),
            "{name}: {seen:?}"
        );
    }
}

/// Finagle's edge weighting: 7 clients, each behind its deterministic aperture of 2 over 10
/// servers (a slice is 2/7 of the ring: 2.86 servers, so most slices end inside a server).
/// A client draws an edge server in proportion to how much of it its slice covers, so summed
/// over the clients every server takes the same load. Counting members alone, as the
/// unweighted `round-robin` and `random` do (the control), the idlest server takes 0.71 of
/// the mean and the busiest 1.19.
#[test]
fn an_aperture_weighs_its_edges_so_every_server_takes_the_same_load() {
    let specs: Vec<EndpointSpec> = (0..10)
        .map(|i| EndpointSpec::new(format!("10.0.0.{i}:80")))
        .collect();
    let snap = Arc::new(Snapshot::from_specs(specs, Timestamp::ZERO));
    let spread = |name: &str| {
        let mut load: HashMap<String, u64> = HashMap::new();
        for index in 0..7u32 {
            let stages = Stages {
                aperture: Some(Aperture {
                    size: 2,
                    mode: ApertureMode::Deterministic,
                    coordinates: Some(Coordinates { index, count: 7 }),
                    seed: 1,
                }),
                ..Stages::default()
            };
            let strategy: BoxStrategy = build(name, Params::new()).unwrap();
            let lb = Balancer::new(strategy, snap.clone(), Timestamp::ZERO)
                .with_stages(stages, Timestamp::ZERO);
            let mut rng = FastRng::seed_from_u64(u64::from(index));
            // Chosen, not called: no latency sample tells the endpoints apart.
            for _ in 0..20_000 {
                let mut cx = PickContext::new(Timestamp::ZERO, &mut rng);
                let e = lb.select_untried(&mut cx).expect("pick");
                *load.entry(e.address().to_owned()).or_default() += 1;
            }
        }
        assert_eq!(load.len(), 10, "{name}: every server takes load");
        let mean = 7.0 * 20_000.0 / 10.0;
        let min = *load.values().min().unwrap() as f64 / mean;
        let max = *load.values().max().unwrap() as f64 / mean;
        (min, max)
    };
    // Exact for the deterministic weighted strategy; sampling noise (±1 %) for the others.
    let (min, max) = spread("weighted-round-robin");
    assert!(
        min >= 0.995 && max <= 1.005,
        "weighted-round-robin: {min:.3}..{max:.3}"
    );
    for name in [
        "p2c-ewma",
        "p2c-least-loaded",
        "least-request",
        "weighted-random",
        "least-active",
    ] {
        let (min, max) = spread(name);
        assert!(min >= 0.97 && max <= 1.03, "{name}: {min:.3}..{max:.3}");
    }
    for name in ["round-robin", "random"] {
        let (min, max) = spread(name);
        assert!(
            min < 0.75 && max > 1.15,
            "{name}, unweighted: {min:.3}..{max:.3}"
        );
    }
}
