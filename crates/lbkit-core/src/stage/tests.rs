use std::collections::HashMap;
use std::sync::Arc;

use super::tiers::{plan, TierCounts};
use super::*;
use crate::{
    Balancer, EndpointIdx, EndpointSpec, FastRng, HealthOverlay, PickContext, PickError, Picker,
    Snapshot, SnapshotPolicy, Strategy, Timestamp,
};

/// Uniform over the eligible endpoints.
struct Uniform;
struct UniformPicker(Vec<EndpointIdx>);
impl Picker for UniformPicker {
    fn pick(&self, cx: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> {
        Ok(self.0[cx.rng.index(self.0.len())])
    }
}
impl Strategy for Uniform {
    type Picker = UniformPicker;
    fn name(&self) -> &str {
        "uniform"
    }
    fn prepare(&self, s: &Arc<Snapshot>, _: Timestamp) -> UniformPicker {
        UniformPicker(s.eligible().to_vec())
    }
}

/// Envoy's two-tier table: P0's healthy share → P0's load (P1 fully healthy).
#[test]
fn envoy_two_tier_vectors() {
    for (healthy, want) in [(100, 100), (72, 100), (71, 99), (50, 70), (25, 35), (0, 0)] {
        let p = plan(
            &[
                TierCounts {
                    endpoints: 100,
                    healthy,
                },
                TierCounts {
                    endpoints: 100,
                    healthy: 100,
                },
            ],
            1.4,
            0.5,
        );
        assert_eq!(p.load, vec![want, 100 - want], "P0 {healthy} % healthy");
        assert_eq!(p.panic, vec![false, false], "total health is 100: no panic");
    }
}

#[test]
fn envoy_three_tier_normalised_vector() {
    let t = |healthy| TierCounts {
        endpoints: 100,
        healthy,
    };
    // Envoy's documented split leaves panic aside (threshold 0).
    let p = plan(&[t(25), t(25), t(20)], 1.4, 0.0);
    assert_eq!(p.health, vec![35, 35, 28]);
    assert_eq!(p.load, vec![36, 36, 28]);
    assert_eq!(p.panic, vec![false, false, false]);
    // With Envoy's default 50 % threshold all three are in panic: load follows the counts.
    let p = plan(&[t(25), t(25), t(20)], 1.4, 0.5);
    assert_eq!(p.panic, vec![true, true, true]);
    assert_eq!(p.load, vec![34, 33, 33]);
}

#[test]
fn panic_per_tier_and_total_panic() {
    let t = |endpoints, healthy| TierCounts { endpoints, healthy };
    // P0 40 % (health 56), P1 30 % (42): total 98 < 100, both under 50 %: total panic, load by
    // endpoint counts.
    let p = plan(&[t(10, 4), t(30, 9)], 1.4, 0.5);
    assert_eq!(p.panic, vec![true, true]);
    assert_eq!(p.load, vec![25, 75]);
    // P0 40 % (56), P1 60 % (84): total 100, nobody panics.
    let p = plan(&[t(10, 4), t(10, 6)], 1.4, 0.5);
    assert_eq!(
        (p.load.clone(), p.panic.clone()),
        (vec![56, 44], vec![false, false])
    );
    // P0 30 % (42), P1 50 % (70): total 100 → no panic; with P1 at 40 % (56): 98, P0 panics,
    // P1 too (40 < 50).
    let p = plan(&[t(10, 3), t(10, 5)], 1.4, 0.5);
    assert_eq!(p.panic, vec![false, false]);
    // Panic off and nothing healthy: everything to P0 (Envoy's corner case).
    let p = plan(&[t(10, 0), t(10, 0)], 1.4, 0.0);
    assert_eq!(p.load, vec![100, 0]);
}

#[test]
fn loads_add_up_to_100() {
    let mut rng = FastRng::seed_from_u64(5);
    for _ in 0..2_000 {
        let n = 1 + rng.index(5);
        let tiers: Vec<TierCounts> = (0..n)
            .map(|_| {
                let endpoints = 1 + rng.below(50) as u32;
                TierCounts {
                    endpoints,
                    healthy: rng.below(u64::from(endpoints) + 1) as u32,
                }
            })
            .collect();
        let p = plan(&tiers, 1.0 + rng.unit_f64(), 0.5);
        assert_eq!(p.load.iter().sum::<u32>(), 100, "{tiers:?} → {p:?}");
    }
}

fn balancer(specs: Vec<EndpointSpec>, stages: Stages, policy: SnapshotPolicy) -> Balancer<Uniform> {
    let base = Snapshot::from_specs(specs, Timestamp::ZERO);
    let snap = Arc::new(base.derive(1, &policy, &HealthOverlay::default()));
    Balancer::new(Uniform, snap, Timestamp::ZERO).with_stages(stages, Timestamp::ZERO)
}

fn shares(lb: &Balancer<Uniform>, attrs: &[Attr<'_>], n: u32) -> HashMap<String, u32> {
    tagged_shares(lb, None, attrs, n)
}

/// Picks per endpoint address over `n` requests with `tag` and `attrs`.
fn tagged_shares(
    lb: &Balancer<Uniform>,
    tag: Option<crate::RequestTag<'_>>,
    attrs: &[Attr<'_>],
    n: u32,
) -> HashMap<String, u32> {
    let mut rng = FastRng::seed_from_u64(9);
    let mut out = HashMap::new();
    for _ in 0..n {
        let mut cx = PickContext::new(Timestamp::ZERO, &mut rng).with_attrs(attrs);
        if let Some(t) = tag {
            cx = cx.with_tag(t);
        }
        let g = lb.pick(&mut cx).expect("pick");
        *out.entry(g.endpoint().address().to_owned()).or_insert(0) += 1;
        g.abandon();
    }
    out
}

fn tier_of(out: &HashMap<String, u32>, prefix: &str) -> u32 {
    out.iter()
        .filter(|(k, _)| k.starts_with(prefix))
        .map(|(_, v)| v)
        .sum()
}

#[test]
fn picks_follow_tier_loads() {
    // P0: 10 endpoints, 5 up (health 70); P1 (backup): 10 up. 70 / 30 within 1.5 points.
    let mut specs: Vec<EndpointSpec> = (0..10)
        .map(|i| EndpointSpec::new(format!("p0-{i}:1")).with_healthy(i < 5))
        .collect();
    specs.extend((0..10).map(|i| EndpointSpec::new(format!("p1-{i}:1")).with_priority(1)));
    let lb = balancer(specs, Stages::default(), SnapshotPolicy::envoy());
    let report = lb.current().stage_report(None, &[]).unwrap().unwrap();
    let loads: Vec<u32> = report.tiers.iter().map(|t| t.load_percent).collect();
    assert_eq!(loads, vec![70, 30]);
    let out = shares(&lb, &[], 40_000);
    let p0 = f64::from(tier_of(&out, "p0-")) / 40_000.0;
    assert!((p0 - 0.70).abs() < 0.015, "P0 took {p0}");
    assert!(
        (5..10).all(|i| !out.contains_key(&format!("p0-{i}:1"))),
        "down endpoints are never picked: {out:?}"
    );
}

#[test]
fn tiers_replace_the_snapshot_wide_panic() {
    // 12 of 22 down overall (45 % healthy < 50 %: the snapshot alone would panic and send
    // traffic to dead P0 endpoints). P0 has 2 of 14 up; P1 all 8 up: P1 takes what P0 cannot.
    let mut specs: Vec<EndpointSpec> = (0..14)
        .map(|i| EndpointSpec::new(format!("p0-{i}:1")).with_healthy(i < 2))
        .collect();
    specs.extend((0..8).map(|i| EndpointSpec::new(format!("p1-{i}:1")).with_priority(1)));
    let lb = balancer(specs, Stages::default(), SnapshotPolicy::envoy());
    assert!(lb.snapshot().in_panic());
    let out = shares(&lb, &[], 10_000);
    assert!(
        (2..14).all(|i| !out.contains_key(&format!("p0-{i}:1"))),
        "no pick lands on a dead P0 endpoint: {out:?}"
    );
    // P0 health ⌊140 · 2 / 14⌋ = 20: 20 % of the picks.
    let p0 = f64::from(tier_of(&out, "p0-")) / 10_000.0;
    assert!((p0 - 0.20).abs() < 0.02, "P0 took {p0}");
}

#[test]
fn envoy_locality_vector() {
    // Envoy's table: X weight 1, Y weight 2 fully healthy; X's healthy share → X's traffic.
    for (healthy, want) in [(10, 33.3), (7, 32.9), (5, 25.9), (0, 0.0)] {
        let mut specs: Vec<EndpointSpec> = (0..10)
            .map(|i| {
                EndpointSpec::new(format!("x{i}:1"))
                    .with_zone("x")
                    .with_healthy(i < healthy)
            })
            .collect();
        specs.extend((0..10).map(|i| EndpointSpec::new(format!("y{i}:1")).with_zone("y")));
        let mut loc = Localities::default();
        loc.weights.insert("x".into(), 1);
        loc.weights.insert("y".into(), 2);
        let stages = Stages {
            localities: Some(loc),
            ..Stages::default()
        };
        let lb = balancer(specs, stages, SnapshotPolicy::default());
        let r = lb.current().stage_report(None, &[]).unwrap().unwrap();
        let x = &r.tiers[0].localities[0];
        assert!((x.share_percent - want).abs() < 0.1, "{healthy}: {x:?}");
        let out = shares(&lb, &[], 30_000);
        let got = 100.0 * f64::from(tier_of(&out, "x")) / 30_000.0;
        assert!(
            (got - want).abs() < 1.5,
            "X {healthy}/10 healthy: {got} %, want {want}"
        );
    }
}

fn versioned() -> Vec<EndpointSpec> {
    let e = |a: &str, v: &str, z: &str| {
        EndpointSpec::new(a)
            .with_meta("version", v)
            .with_meta("zone", z)
    };
    vec![
        e("a:1", "v1", "eu"),
        e("b:1", "v1", "us"),
        e("c:1", "v2", "eu"),
        e("d:1", "v2", "us"),
        EndpointSpec::new("e:1")
            .with_meta("version", "v3")
            .with_healthy(false),
    ]
}

fn subsets(fallback: SubsetFallback) -> Stages {
    let mut s = Subsets::new(
        vec![
            vec!["version".into(), "zone".into()],
            vec!["version".into()],
        ],
        fallback,
    );
    if fallback == SubsetFallback::Default {
        s.default = vec![("version".into(), "v1".into())];
    }
    Stages {
        subsets: Some(s),
        ..Stages::default()
    }
}

#[test]
fn subsets_try_key_sets_in_order_then_fall_back() {
    let lb = balancer(
        versioned(),
        subsets(SubsetFallback::None),
        SnapshotPolicy::default(),
    );
    let both: &[Attr<'_>] = &[(b"zone", b"us"), (b"version", b"v2")];
    assert_eq!(
        shares(&lb, both, 50).keys().collect::<Vec<_>>(),
        vec!["d:1"]
    );
    let version: &[Attr<'_>] = &[(b"version", b"v2")];
    let out = shares(&lb, version, 400);
    assert_eq!(out.len(), 2, "v2's two endpoints: {out:?}");
    assert!(out.contains_key("c:1") && out.contains_key("d:1"));
    // v2 in a zone nobody has: the (version, zone) set has no such subset, (version) does.
    let other_zone: &[Attr<'_>] = &[(b"version", b"v2"), (b"zone", b"ap")];
    assert_eq!(shares(&lb, other_zone, 200).len(), 2);
    let mut rng = FastRng::seed_from_u64(1);
    let mut pick = |attrs: &[Attr<'_>]| {
        lb.pick(&mut PickContext::new(Timestamp::ZERO, &mut rng).with_attrs(attrs))
            .map(|g| g.endpoint().address().to_owned())
    };
    assert_eq!(pick(&[(b"version", b"v9")]), Err(PickError::NoSubset));
    assert_eq!(pick(&[]), Err(PickError::NoSubset));
    // v3's only endpoint is down: the subset matches but cannot serve.
    assert_eq!(
        pick(&[(b"version", b"v3")]),
        Err(PickError::SubsetUnavailable)
    );
}

#[test]
fn fallback_any_and_default_also_cover_a_subset_with_nothing_eligible() {
    let lb = balancer(
        versioned(),
        subsets(SubsetFallback::Any),
        SnapshotPolicy::default(),
    );
    let v3: &[Attr<'_>] = &[(b"version", b"v3")];
    assert_eq!(shares(&lb, v3, 400).len(), 4, "any: every serving endpoint");
    let lb = balancer(
        versioned(),
        subsets(SubsetFallback::Default),
        SnapshotPolicy::default(),
    );
    let out = shares(&lb, v3, 400);
    assert_eq!(out.len(), 2, "default v1: {out:?}");
    assert!(out.contains_key("a:1") && out.contains_key("b:1"));
    let r = lb.current().stage_report(None, v3).unwrap().unwrap();
    assert_eq!(
        r.subset,
        SubsetChoice::Fallback {
            policy: SubsetFallback::Default,
            matched_empty: true
        }
    );
}

#[test]
fn default_subset_with_nothing_eligible_is_an_error() {
    let mut stages = subsets(SubsetFallback::Default);
    if let Some(s) = &mut stages.subsets {
        s.default = vec![("version".into(), "v3".into())];
    }
    let lb = balancer(versioned(), stages, SnapshotPolicy::default());
    let mut rng = FastRng::seed_from_u64(1);
    let r = lb.pick(&mut PickContext::new(Timestamp::ZERO, &mut rng));
    assert_eq!(r.err(), Some(PickError::DefaultSubsetEmpty));
}

#[test]
fn deterministic_aperture_covers_every_server_evenly() {
    // Finagle's coverage: every server is in the aperture of about size · clients / servers
    // clients (here 12 · 100 / 60 = 20; each slice overlaps up to 2 partial servers more).
    let (servers, clients, size) = (60usize, 100u32, 12u32);
    let mut seen = vec![0u32; servers];
    for index in 0..clients {
        let slice = aperture_slice(
            servers,
            size,
            Coordinates {
                index,
                count: clients,
            },
        );
        assert!(
            (12..=14).contains(&slice.len()),
            "client {index}: {}",
            slice.len()
        );
        for p in slice {
            seen[p] += 1;
        }
    }
    let (min, max) = (*seen.iter().min().unwrap(), *seen.iter().max().unwrap());
    assert!(
        min >= 20 && max <= 23,
        "clients per server {min}..{max}: {seen:?}"
    );
}

#[test]
fn every_server_is_covered_alike_over_all_clients() {
    // The slices start count units apart and span a whole number of servers' worth of
    // units, so every unit of the ring is covered by the same number of clients: each
    // server's coverage summed over the clients is the same, whatever its edges.
    // (3, 11, 2) and (10, 19, 9): slices that start inside a server and end inside it again,
    // round the ring, where the first version listed the server twice.
    let cases = [
        (60usize, 100u32, 12u32),
        (10, 7, 2),
        (20, 7, 3),
        (7, 3, 6),
        (3, 11, 2),
        (10, 19, 9),
    ];
    for (servers, clients, size) in cases {
        let mut total = vec![0u64; servers];
        for index in 0..clients {
            let at = Coordinates {
                index,
                count: clients,
            };
            let covered = aperture_coverage(servers, size, at);
            let mut positions: Vec<usize> = covered.iter().map(|&(p, _)| p).collect();
            positions.sort_unstable();
            positions.dedup();
            assert_eq!(
                positions.len(),
                covered.len(),
                "{covered:?}: a server twice"
            );
            let width: u64 = covered.iter().map(|&(_, c)| c).sum();
            let whole = u64::from(clients) * servers as u64;
            assert!(width < whole || covered.len() == servers, "{covered:?}");
            for (p, c) in covered {
                assert!(c > 0 && c <= u64::from(clients), "{p}: {c}");
                total[p] += c;
            }
        }
        assert!(
            total.iter().all(|&t| t == total[0]),
            "{servers} servers, {clients} clients, aperture {size}: {total:?}"
        );
    }
}

#[test]
fn aperture_restricts_the_leaf_and_reports_it() {
    let specs: Vec<EndpointSpec> = (0..60)
        .map(|i| EndpointSpec::new(format!("s{i:02}:1")))
        .collect();
    for mode in [ApertureMode::Deterministic, ApertureMode::Random] {
        let stages = Stages {
            aperture: Some(Aperture {
                size: 12,
                mode,
                coordinates: Some(Coordinates {
                    index: 7,
                    count: 100,
                }),
                seed: 3,
            }),
            ..Stages::default()
        };
        let lb = balancer(specs.clone(), stages, SnapshotPolicy::default());
        let r = lb.current().stage_report(None, &[]).unwrap().unwrap();
        let t = &r.tiers[0];
        assert!(t.aperture && t.candidates == 60, "{mode}: {t:?}");
        let out = shares(&lb, &[], 5_000);
        assert_eq!(
            out.len(),
            t.picks_from as usize,
            "{mode}: picks stay in the aperture"
        );
        assert!((12..=14).contains(&out.len()), "{mode}: {}", out.len());
    }
}

#[test]
fn aperture_with_a_dead_slice_reslices_over_the_serving_ones() {
    let specs: Vec<EndpointSpec> = (0..10)
        .map(|i| EndpointSpec::new(format!("s{i}:1")).with_healthy(i >= 5))
        .collect();
    let stages = Stages {
        aperture: Some(Aperture {
            size: 2,
            mode: ApertureMode::Deterministic,
            coordinates: Some(Coordinates {
                index: 0,
                count: 10,
            }),
            seed: 0,
        }),
        ..Stages::default()
    };
    let lb = balancer(specs, stages, SnapshotPolicy::default());
    // s0 and s1 (its slice) are down: client 0's slice of the ring of s5..s9 is s5 and s6.
    let mut got: Vec<String> = shares(&lb, &[], 500).into_keys().collect();
    got.sort();
    assert_eq!(got, vec!["s5:1", "s6:1"]);
}

#[test]
fn a_hash_key_keeps_its_tier() {
    let mut specs: Vec<EndpointSpec> = (0..4)
        .map(|i| EndpointSpec::new(format!("p0-{i}:1")).with_healthy(i < 2))
        .collect();
    specs.extend((0..4).map(|i| EndpointSpec::new(format!("p1-{i}:1")).with_priority(1)));
    let lb = balancer(specs, Stages::default(), SnapshotPolicy::default());
    let mut rng = FastRng::seed_from_u64(1);
    for key in ["alpha", "beta", "gamma", "delta"] {
        let tiers: std::collections::HashSet<bool> = (0..50)
            .map(|_| {
                let mut cx = PickContext::new(Timestamp::ZERO, &mut rng).with_key(key.as_bytes());
                let g = lb.pick(&mut cx).unwrap();
                g.endpoint().address().starts_with("p0")
            })
            .collect();
        assert_eq!(tiers.len(), 1, "{key} stays in one tier");
    }
}

#[test]
fn tags_compose_with_tiers() {
    let spec = |a: &str, tag: Option<&str>, p: u32, up: bool| {
        let s = EndpointSpec::new(a).with_priority(p).with_healthy(up);
        match tag {
            Some(t) => s.with_meta(crate::route::TAG_KEY, t),
            None => s,
        }
    };
    let lb = balancer(
        vec![
            spec("g0:1", Some("gray"), 0, true),
            spec("g1:1", Some("gray"), 1, true),
            spec("u0:1", None, 0, true),
            spec("u1:1", None, 1, true),
        ],
        Stages::default(),
        SnapshotPolicy::default(),
    );
    let mut rng = FastRng::seed_from_u64(1);
    for _ in 0..100 {
        let mut cx =
            PickContext::new(Timestamp::ZERO, &mut rng).with_tag(crate::RequestTag::new(b"gray"));
        let g = lb.pick(&mut cx).unwrap();
        assert_eq!(g.endpoint().address(), "g0:1", "gray's tier 0 takes it all");
        let mut cx = PickContext::new(Timestamp::ZERO, &mut rng);
        let g = lb.pick(&mut cx).unwrap();
        assert_eq!(
            g.endpoint().address(),
            "u0:1",
            "untagged tier 0 takes it all"
        );
    }
}

#[test]
fn validation_names_the_problem() {
    let mut s = Stages {
        overprovisioning: 0.5,
        ..Stages::default()
    };
    assert!(s.validate().unwrap_err().contains("overprovisioning"));
    s.overprovisioning = 1.4;
    s.subsets = Some(Subsets::new(vec![vec![]], SubsetFallback::Any));
    assert!(s.validate().unwrap_err().contains("key set #1"));
    s.subsets = Some(Subsets::new(
        vec![vec!["v".into()]],
        SubsetFallback::Default,
    ));
    assert!(s.validate().unwrap_err().contains("default subset"));
    s.subsets = None;
    s.aperture = Some(Aperture {
        size: 3,
        mode: ApertureMode::Deterministic,
        coordinates: Some(Coordinates { index: 4, count: 4 }),
        seed: 0,
    });
    assert!(s.validate().unwrap_err().contains("client index 4"));
}

#[test]
fn a_keys_zone_does_not_depend_on_its_tier_draw() {
    // Tiers 70 / 30 (P0 half down), three zones alike in each: keyed requests that stay in P0
    // still spread over its three zones (one draw for both levels sent P0's keys to the first
    // zones only).
    let mut specs: Vec<EndpointSpec> = (0..12)
        .map(|i| {
            EndpointSpec::new(format!("p0-{i}:1"))
                .with_zone(["a", "b", "c"][i % 3])
                .with_healthy(i < 6)
        })
        .collect();
    specs.extend((0..6).map(|i| {
        EndpointSpec::new(format!("p1-{i}:1"))
            .with_zone(["a", "b", "c"][i % 3])
            .with_priority(1)
    }));
    let stages = Stages {
        localities: Some(Localities::default()),
        ..Stages::default()
    };
    let lb = balancer(specs, stages, SnapshotPolicy::default());
    let mut rng = FastRng::seed_from_u64(1);
    let mut zones: HashMap<String, u32> = HashMap::new();
    let mut p0 = 0;
    for k in 0..6_000u32 {
        let key = k.to_string();
        let mut cx = PickContext::new(Timestamp::ZERO, &mut rng).with_key(key.as_bytes());
        let g = lb.pick(&mut cx).unwrap();
        if g.endpoint().priority() == 0 {
            p0 += 1;
            *zones
                .entry(g.endpoint().zone().unwrap().to_owned())
                .or_default() += 1;
        }
    }
    for z in ["a", "b", "c"] {
        let share = f64::from(zones[z]) / f64::from(p0);
        assert!(
            (share - 1.0 / 3.0).abs() < 0.04,
            "zone {z}: {share} of P0's keys"
        );
    }
}

#[test]
fn drained_endpoints_count_in_no_tier() {
    // P0: 4 endpoints, 2 drained (weight 0) and 2 up: its health is that of the 2 that carry
    // weight (100), so nothing spills to the backups.
    let specs = vec![
        EndpointSpec::new("a:1"),
        EndpointSpec::new("b:1"),
        EndpointSpec::new("c:1").with_weight(0),
        EndpointSpec::new("d:1").with_weight(0),
        EndpointSpec::new("z:1").with_priority(1),
    ];
    let lb = balancer(specs, Stages::default(), SnapshotPolicy::envoy());
    let r = lb.current().stage_report(None, &[]).unwrap().unwrap();
    let loads: Vec<u32> = r.tiers.iter().map(|t| t.load_percent).collect();
    assert_eq!(loads, vec![100, 0]);
}

#[test]
fn stages_set_unvalidated_do_not_panic() {
    // Through the library, nothing validates: a key set of 9 keys (one too many) and an
    // aperture of 0 must still pick.
    let keys: Vec<String> = (0..9).map(|i| format!("k{i}")).collect();
    let mut spec = EndpointSpec::new("a:1");
    for k in &keys {
        spec = spec.with_meta(k.clone(), "v");
    }
    let stages = Stages {
        subsets: Some(Subsets::new(vec![keys.clone()], SubsetFallback::Any)),
        aperture: Some(Aperture {
            size: 0,
            mode: ApertureMode::Deterministic,
            coordinates: Some(Coordinates { index: 0, count: 3 }),
            seed: 0,
        }),
        ..Stages::default()
    };
    let lb = balancer(
        vec![spec, EndpointSpec::new("b:1")],
        stages,
        SnapshotPolicy::default(),
    );
    let attrs: Vec<Attr<'_>> = keys.iter().map(|k| (k.as_bytes(), &b"v"[..])).collect();
    let mut rng = FastRng::seed_from_u64(1);
    for _ in 0..10 {
        let mut cx = PickContext::new(Timestamp::ZERO, &mut rng).with_attrs(&attrs);
        assert!(lb.pick(&mut cx).is_ok());
    }
}

#[test]
fn a_tier_in_panic_is_not_split_by_zone() {
    // One tier, 1 of 4 up (25 % < 50 %): panic, all four weighted endpoints; zone b (none up)
    // still gets its share.
    let specs = vec![
        EndpointSpec::new("a1:1").with_zone("a"),
        EndpointSpec::new("a2:1").with_zone("a").with_healthy(false),
        EndpointSpec::new("b1:1").with_zone("b").with_healthy(false),
        EndpointSpec::new("b2:1").with_zone("b").with_healthy(false),
    ];
    let stages = Stages {
        localities: Some(Localities::default()),
        ..Stages::default()
    };
    let lb = balancer(specs, stages, SnapshotPolicy::envoy());
    let out = shares(&lb, &[], 2_000);
    assert_eq!(out.len(), 4, "all four in panic: {out:?}");
}

#[test]
fn a_shadow_picks_behind_the_same_stages() {
    let lb = balancer(
        versioned(),
        subsets(SubsetFallback::None),
        SnapshotPolicy::default(),
    );
    let shadow = lb.start_shadow("uniform", crate::BoxStrategy::new(Uniform), Timestamp::ZERO);
    // v1 in eu is a:1 alone: the shadow, behind the same subset, agrees on every request.
    let attrs: &[Attr<'_>] = &[(b"version", b"v1"), (b"zone", b"eu")];
    shares(&lb, attrs, 200);
    let r = shadow.report(&lb.snapshot());
    assert_eq!((r.picks, r.disagreements), (200, 0), "{r:?}");
}

#[test]
fn bytes_eq_agrees_with_slice_equality() {
    // Every length up to 40 (inline word compares to 16, `==` beyond), equal and differing
    // in each single byte, and differing lengths.
    let mut rng = FastRng::seed_from_u64(5);
    for n in 0..40usize {
        let a: Vec<u8> = (0..n).map(|_| rng.below(256) as u8).collect();
        assert!(super::tree::bytes_eq(&a, &a.clone()), "len {n}");
        for at in 0..n {
            let mut b = a.clone();
            b[at] ^= 1 << rng.below(8);
            assert!(!super::tree::bytes_eq(&a, &b), "len {n}, byte {at}");
        }
        assert!(!super::tree::bytes_eq(&a, &a[..n.saturating_sub(1)]) || n == 0);
    }
}

#[test]
fn healthy_tiers_fold_into_the_main_picker() {
    // All of P0 up: P0 takes every request, so its leaf becomes the main picker (no per-pick
    // stage at all), and the report still shows both tiers.
    let mut specs: Vec<EndpointSpec> = (0..4)
        .map(|i| EndpointSpec::new(format!("p0-{i}:1")))
        .collect();
    specs.extend((0..4).map(|i| EndpointSpec::new(format!("p1-{i}:1")).with_priority(1)));
    let lb = balancer(specs, Stages::default(), SnapshotPolicy::default());
    let prepared = lb.current();
    let main: Vec<usize> = prepared.picker().0.iter().map(|i| i.get()).collect();
    assert_eq!(main, vec![0, 1, 2, 3], "the main picker is P0's");
    let r = prepared.stage_report(None, &[]).unwrap().unwrap();
    let loads: Vec<u32> = r.tiers.iter().map(|t| t.load_percent).collect();
    assert_eq!(loads, vec![100, 0]);
    assert_eq!(tier_of(&shares(&lb, &[], 2_000), "p0-"), 2_000);
    // With a third down and P1 spilling, nothing is folded: the picker is the whole set's.
    let mut specs: Vec<EndpointSpec> = (0..3)
        .map(|i| EndpointSpec::new(format!("p0-{i}:1")).with_healthy(i > 0))
        .collect();
    specs.push(EndpointSpec::new("p1-0:1").with_priority(1));
    let lb = balancer(specs, Stages::default(), SnapshotPolicy::default());
    assert_eq!(lb.current().picker().0.len(), 3, "all eligible");
}

#[test]
fn unkeyed_picks_follow_the_product_of_tier_and_zone_shares() {
    // P0: zones a and b, 10 each, half up (health 70: load 70); P1: a and b, 10 each, all up.
    // Weights a 1, b 3: a quarter of each tier goes to a. One draw over the four leaves.
    let mut specs = Vec::new();
    for (p, up) in [(0u32, 5), (1, 10)] {
        for z in ["a", "b"] {
            specs.extend((0..10).map(|i| {
                EndpointSpec::new(format!("p{p}{z}-{i}:1"))
                    .with_zone(z)
                    .with_priority(p)
                    .with_healthy(i < up)
            }));
        }
    }
    let mut loc = Localities::default();
    loc.weights.insert("a".into(), 1);
    loc.weights.insert("b".into(), 3);
    let stages = Stages {
        localities: Some(loc),
        ..Stages::default()
    };
    let lb = balancer(specs, stages, SnapshotPolicy::default());
    let out = shares(&lb, &[], 40_000);
    for (prefix, want) in [("p0a", 17.5), ("p0b", 52.5), ("p1a", 7.5), ("p1b", 22.5)] {
        let got = 100.0 * f64::from(tier_of(&out, prefix)) / 40_000.0;
        assert!((got - want).abs() < 1.0, "{prefix}: {got} %, want {want}");
    }
}

#[test]
fn many_long_subset_values_are_found_by_binary_search() {
    // 12 versions (more than the scan's 8), each name longer than the 16 inline bytes.
    let specs: Vec<EndpointSpec> = (0..24)
        .map(|i| {
            EndpointSpec::new(format!("e{i}:1"))
                .with_meta("version", format!("release-2026-12-{:02}-canary", i % 12))
        })
        .collect();
    let stages = Stages {
        subsets: Some(Subsets::new(
            vec![vec!["version".into()]],
            SubsetFallback::None,
        )),
        ..Stages::default()
    };
    let lb = balancer(specs, stages, SnapshotPolicy::default());
    for v in 0..12 {
        let value = format!("release-2026-12-{v:02}-canary");
        let attrs: &[Attr<'_>] = &[(b"version", value.as_bytes())];
        let mut got: Vec<String> = shares(&lb, attrs, 200).into_keys().collect();
        got.sort();
        let mut want = vec![format!("e{v}:1"), format!("e{}:1", v + 12)];
        want.sort();
        assert_eq!(got, want, "version {v}");
    }
    let mut rng = FastRng::seed_from_u64(1);
    let attrs: &[Attr<'_>] = &[(b"version", b"release-2026-12-99-canary")];
    let miss = lb.pick(&mut PickContext::new(Timestamp::ZERO, &mut rng).with_attrs(attrs));
    assert_eq!(miss.err(), Some(PickError::NoSubset));
}

#[test]
fn a_tags_tiers_spill_gradually() {
    // gray: P0 10 endpoints, 5 up (health 70); P1 10 up. Counting only the eligible, gray's
    // P0 looked fully healthy and took everything; with its down members counted, 70 / 30 as
    // for the whole snapshot. Untagged endpoints take no gray traffic.
    let mut specs = Vec::new();
    for (p, up) in [(0u32, 5), (1, 10)] {
        specs.extend((0..10).map(|i| {
            EndpointSpec::new(format!("g{p}-{i}:1"))
                .with_meta(crate::route::TAG_KEY, "gray")
                .with_priority(p)
                .with_healthy(i < up)
        }));
    }
    specs.extend((0..4).map(|i| EndpointSpec::new(format!("u-{i}:1"))));
    let lb = balancer(specs, Stages::default(), SnapshotPolicy::default());
    let gray = crate::RequestTag::new(b"gray");
    let r = lb.current().stage_report(Some(gray), &[]).unwrap().unwrap();
    let loads: Vec<u32> = r.tiers.iter().map(|t| t.load_percent).collect();
    assert_eq!(loads, vec![70, 30], "{r:?}");
    let out = tagged_shares(&lb, Some(gray), &[], 20_000);
    let p0 = f64::from(tier_of(&out, "g0-")) / 20_000.0;
    assert!((p0 - 0.70).abs() < 0.015, "gray P0 took {p0}");
    assert_eq!(tier_of(&out, "u-"), 0);
    assert!(
        (5..10).all(|i| !out.contains_key(&format!("g0-{i}:1"))),
        "{out:?}"
    );
}

#[test]
fn a_tags_tier_never_panics_onto_its_down_members() {
    // Envoy's policy (panic under 50 %): gray has 4 of 10 up, the untagged 10 of 10. The tag's
    // tier counts its down members for health but never panics, so no gray request lands on a
    // down gray provider (a panic would have sent 60 % there).
    let mut specs: Vec<EndpointSpec> = (0..10)
        .map(|i| {
            EndpointSpec::new(format!("g-{i}:1"))
                .with_meta(crate::route::TAG_KEY, "gray")
                .with_healthy(i < 4)
        })
        .collect();
    // A tier of untagged backups, so the snapshot has tiers (and stages) at all.
    specs.push(EndpointSpec::new("u-backup:1").with_priority(1));
    specs.extend((0..10).map(|i| EndpointSpec::new(format!("u-{i}:1"))));
    let lb = balancer(specs, Stages::default(), SnapshotPolicy::envoy());
    let gray = crate::RequestTag::new(b"gray");
    let r = lb.current().stage_report(Some(gray), &[]).unwrap().unwrap();
    assert!(r.tiers.iter().all(|t| !t.panic), "{r:?}");
    let out = tagged_shares(&lb, Some(gray), &[], 5_000);
    assert!(
        (4..10).all(|i| !out.contains_key(&format!("g-{i}:1"))),
        "{out:?}"
    );
    assert_eq!(
        tier_of(&out, "g-"),
        5_000,
        "all of gray's requests on its 4 up"
    );
}
