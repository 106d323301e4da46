//! Formulas of the load-aware strategies, in virtual time.

use std::sync::Arc;
use std::time::Duration;

use lbkit_core::{
    Balancer, CallGuard, EndpointSpec, FailureKind, FastRng, Outcome, PickContext, Picker,
    Snapshot, Strategy, Timestamp,
};
use lbkit_testkit::dist::assert_fits;
use proptest::prelude::*;

use super::choose::IndexList;
use super::*;
use crate::SmoothWeightedRoundRobin;

const T: Timestamp = Timestamp::from_millis(1_000_000);

fn snap(weights: &[u32]) -> Arc<Snapshot> {
    Arc::new(Snapshot::from_specs(
        weights
            .iter()
            .enumerate()
            .map(|(i, &w)| EndpointSpec::new(format!("h{i}:1")).with_weight(w))
            .collect(),
        T,
    ))
}

fn load(s: &Snapshot, i: usize, n: u32) {
    (0..n).for_each(|_| s.endpoints()[i].stats().start());
}

fn counts<P: Picker>(p: &P, n: usize, picks: usize, now: Timestamp) -> Vec<u64> {
    let mut rng = FastRng::seed_from_u64(9);
    let mut c = vec![0u64; n];
    for _ in 0..picks {
        c[p.pick(&mut PickContext::new(now, &mut rng)).unwrap().get()] += 1;
    }
    c
}

#[test]
fn least_active_takes_the_idlest_and_breaks_ties_by_weight() {
    let s = snap(&[100, 300, 100, 50]);
    load(&s, 0, 2);
    load(&s, 2, 1);
    let p = LeastActive.prepare(&s, T);
    let c = counts(&p, 4, 8_000, T);
    assert_eq!((c[0], c[2]), (0, 0), "busy endpoints never win: {c:?}");
    assert_fits(&c, &[0.0, 300.0, 0.0, 50.0], "least-active ties by weight");
}

#[test]
fn least_active_at_scale_prefers_the_less_active_sample() {
    let weights = vec![100; 1_000];
    let s = snap(&weights);
    (0..500).for_each(|i| load(&s, i, 3)); // first half busy
    let c = counts(&LeastActive.prepare(&s, T), 1_000, 20_000, T);
    let busy: u64 = c[..500].iter().sum();
    // Both samples busy happens with probability 1/4.
    assert!((4_500..5_500).contains(&busy), "{busy}");
}

proptest! {
    #[test]
    fn p2c_never_returns_the_worse_of_its_two(loads in proptest::collection::vec(0u32..20, 2..40), seed in 0u64..1000) {
        let s = snap(&vec![100; loads.len()]);
        for (i, &l) in loads.iter().enumerate() {
            load(&s, i, l);
        }
        let p = P2cLeastLoaded.prepare(&s, T);
        let mut rng = FastRng::seed_from_u64(seed);
        for _ in 0..20 {
            let (a, b) = IndexList::new(s.eligible().into()).two_distinct(&mut rng.clone());
            let picked = p.pick(&mut PickContext::new(T, &mut rng)).unwrap();
            prop_assert!(picked == a || picked == b);
            let other = if picked == a { b } else { a };
            prop_assert!(loads[picked.get()] <= loads[other.get()]);
        }
    }
}

proptest! {
    /// The pick compares projections with one `exp` (`base_b × e^(x_b − x_a) < base_a`); it must
    /// agree with the two costs `P2cPicker::cost` reports, up to rounding.
    #[test]
    fn p2c_ewma_never_returns_the_costlier_of_its_two(
        eps in proptest::collection::vec((0u64..2_000, 0u64..120_000, 0u32..6), 2..30),
        seed in 0u64..1000,
    ) {
        let s = snap(&vec![100; eps.len()]);
        for (i, &(ms, ago_ms, busy)) in eps.iter().enumerate() {
            if ms > 0 {
                let at = T.saturating_sub(Duration::from_millis(ago_ms));
                s.endpoints()[i].stats().record(Duration::from_millis(ms), at, Outcome::Success);
            }
            load(&s, i, busy);
        }
        let p = P2cEwma::default().prepare(&s, T);
        let mut rng = FastRng::seed_from_u64(seed);
        for _ in 0..20 {
            let (a, b) = IndexList::new(s.eligible().into()).two_distinct(&mut rng.clone());
            let picked = p.pick(&mut PickContext::new(T, &mut rng)).unwrap();
            prop_assert!(picked == a || picked == b);
            let other = if picked == a { b } else { a };
            let (cp, co) = (p.cost(picked, T), p.cost(other, T));
            prop_assert!(cp <= co * (1.0 + 1e-9), "picked {cp} over {co}");
        }
    }
}

#[test]
fn p2c_ewma_avoids_a_slow_endpoint_then_probes_it_after_decay() {
    let s = snap(&[100, 100, 100]);
    let (slow, fast) = (Duration::from_millis(400), Duration::from_millis(5));
    s.endpoints()[0].stats().record(slow, T, Outcome::Success);
    s.endpoints()[1].stats().record(fast, T, Outcome::Success);
    s.endpoints()[2].stats().record(fast, T, Outcome::Success);
    let p = P2cEwma::default().prepare(&s, T);
    assert_eq!(
        counts(&p, 3, 3_000, T)[0],
        0,
        "the slow endpoint loses every comparison"
    );
    // Idle for a minute: estimates decay toward zero at the same rate, so the ratio stays; but a
    // fresh fast sample elsewhere keeps the others ahead.
    let later = T + Duration::from_secs(60);
    let est = s.endpoints()[0].stats().ewma_at(later).unwrap();
    assert!(
        est < Duration::from_millis(1),
        "400 ms decays with a 10 s time constant: {est:?}"
    );
    // A new slow peak jumps straight back.
    s.endpoints()[0]
        .stats()
        .record(slow, later, Outcome::Success);
    assert_eq!(s.endpoints()[0].stats().ewma_at(later), Some(slow));
    let explain = p.explain(lbkit_core::EndpointIdx::new(0), later).unwrap();
    assert!(explain.contains("400.000 ms × 1"), "{explain}");
}

#[test]
fn p2c_ewma_default_rtt_for_unsampled_endpoints() {
    let s = snap(&[100, 100]);
    s.endpoints()[0]
        .stats()
        .record(Duration::from_millis(50), T, Outcome::Success);
    let p = P2cEwma::new(Duration::from_millis(30)).prepare(&s, T);
    assert_eq!(counts(&p, 2, 100, T), [0, 100]);
    let p = P2cEwma::new(Duration::from_millis(80)).prepare(&s, T);
    assert_eq!(counts(&p, 2, 100, T), [100, 0]);
}

#[test]
fn least_request_weighted_follows_weight_over_load() {
    let s = snap(&[100, 200, 400]);
    load(&s, 2, 3); // 400 / 4 = 100
    load(&s, 1, 1); // 200 / 2 = 100
    let p = LeastRequest::default().prepare(&s, T);
    assert_fits(
        &counts(&p, 3, 30_000, T),
        &[1.0, 1.0, 1.0],
        "weight / (in_flight + 1)",
    );
    let squared = LeastRequest::new(2, 2.0).prepare(&s, T);
    // 100, 200/4 = 50, 400/16 = 25
    assert_fits(
        &counts(&squared, 3, 30_000, T),
        &[100.0, 50.0, 25.0],
        "bias 2",
    );
}

#[test]
fn least_request_bias_zero_is_weighted_round_robin() {
    let s = snap(&[5, 1, 1]);
    load(&s, 0, 10);
    let lr = LeastRequest::new(2, 0.0).prepare(&s, T);
    let swrr = SmoothWeightedRoundRobin::new().prepare(&s, T);
    let mut rng = FastRng::seed_from_u64(1);
    for _ in 0..14 {
        let a = lr.pick(&mut PickContext::new(T, &mut rng)).unwrap();
        let b = swrr.pick(&mut PickContext::new(T, &mut rng)).unwrap();
        assert_eq!(a, b);
    }
}

#[test]
fn least_request_equal_weights_best_of_choices() {
    let s = snap(&[100; 4]);
    load(&s, 0, 5);
    let c = counts(&LeastRequest::new(100, 1.0).prepare(&s, T), 4, 4_000, T);
    assert_eq!(
        c[0], 0,
        "with 100 choices the busy one is always beaten: {c:?}"
    );
}

#[test]
fn shortest_response_estimates_and_probes_unsampled() {
    let s = snap(&[100, 100, 100]);
    let rec = |i: usize, ms: u64| {
        s.endpoints()[i]
            .stats()
            .record(Duration::from_millis(ms), T, Outcome::Success)
    };
    rec(0, 10);
    rec(1, 4);
    rec(2, 30);
    load(&s, 1, 2); // 4 ms × 3 = 12 > 10 ms × 1
    let p = ShortestResponse::default().prepare(&s, T);
    assert_eq!(counts(&p, 3, 200, T), [200, 0, 0]);
    assert!(p
        .explain(lbkit_core::EndpointIdx::new(1), T)
        .unwrap()
        .starts_with("estimate 12.000 ms"));
    let fresh = snap(&[100, 100]);
    fresh.endpoints()[0]
        .stats()
        .record(Duration::from_millis(1), T, Outcome::Success);
    assert_eq!(
        counts(&ShortestResponse::default().prepare(&fresh, T), 2, 50, T),
        [0, 50],
        "no samples: estimate 0"
    );
    // A success after prepare counts at once: (4 + 40) / 2 ms × 3 in flight + 1.
    let one = lbkit_core::EndpointIdx::new(1);
    rec(1, 40);
    assert_eq!(p.estimate(one, T), 66e6);
    // Failures never make an endpoint look fast.
    s.endpoints()[1].stats().record(
        Duration::from_millis(1),
        T,
        Outcome::Failure(FailureKind::Server),
    );
    assert_eq!(p.estimate(one, T), 66e6);
    // Old samples leave the window when the picker is prepared again (every slot, as
    // `Balancer::tick` does); samples after that count.
    let later = T + Duration::from_secs(40);
    let q = ShortestResponse::default().prepare(&s, later);
    assert_eq!(q.estimate(lbkit_core::EndpointIdx::new(0), later), 0.0);
    assert_eq!(q.estimate(one, later), 0.0);
    s.endpoints()[1]
        .stats()
        .record(Duration::from_millis(8), later, Outcome::Success);
    assert_eq!(q.estimate(one, later), 24e6);
    assert_eq!(
        ShortestResponse::default().refresh_interval(),
        Some(lbkit_core::SLOT)
    );
}

#[test]
fn shortest_response_window_follows_balancer_ticks() {
    let s = snap(&[100, 100]);
    let rec = |i: usize, ms: u64, at: Timestamp| {
        s.endpoints()[i]
            .stats()
            .record(Duration::from_millis(ms), at, Outcome::Success)
    };
    let b = Balancer::new(ShortestResponse::default(), s.clone(), T);
    let mut rng = FastRng::seed_from_u64(3);
    let mut first = |now| {
        let g = b.pick(&mut PickContext::new(now, &mut rng)).unwrap();
        let host = g.endpoint().address().to_owned();
        g.finish_at(Outcome::Cancelled, now);
        host
    };
    rec(0, 60, T);
    rec(1, 10, T);
    rec(1, 100, T + Duration::from_secs(5));
    // h1 averages (10 + 100) / 2 = 55 ms < 60 ms: the sample after prepare counts at once.
    let later = T + Duration::from_secs(32);
    assert_eq!(first(later), "h1:1");
    // The tick re-prepares: the samples at T left the 30 s window, h1 keeps its 100 ms one and
    // h0 has none, so it estimates 0 and is probed.
    assert!(b.tick(later));
    assert_eq!(first(later), "h0:1");
}

#[test]
fn best_available_skips_tripped_then_falls_back_to_round_robin() {
    let s = snap(&[100, 100, 100]);
    let fail = |i: usize| {
        for _ in 0..3 {
            s.endpoints()[i].stats().record(
                Duration::ZERO,
                T,
                Outcome::Failure(FailureKind::Connect),
            );
        }
    };
    fail(0);
    load(&s, 2, 1);
    let p = BestAvailable::default().prepare(&s, T);
    assert_eq!(counts(&p, 3, 50, T), [0, 50, 0]);
    fail(1);
    fail(2);
    assert_eq!(
        counts(&p, 3, 30, T),
        [10, 10, 10],
        "all tripped: round robin"
    );
    assert_eq!(
        counts(&p, 3, 30, T + Duration::from_secs(10)),
        [30, 0, 0],
        "breakers closed after 10 s: fewest in flight, earliest on ties"
    );
}

fn zoned(zones: &[&str]) -> Arc<Snapshot> {
    Arc::new(Snapshot::from_specs(
        zones
            .iter()
            .enumerate()
            .map(|(i, z)| EndpointSpec::new(format!("h{i}:1")).with_zone(*z))
            .collect(),
        T,
    ))
}

#[test]
fn zone_aware_prefers_local_and_spills() {
    let s = zoned(&["a", "a", "a", "b", "b"]);
    let za = ZoneAware::new(crate::RoundRobin::new(), "a");
    let p = za.prepare(&s, T);
    assert!(!p.spills());
    assert_eq!(counts(&p, 5, 30, T), [10, 10, 10, 0, 0]);
    // Overloaded: 3 calls per local endpoint vs 0 remote (floor 1): 3 > 2 × 1.
    (0..3).for_each(|i| load(&s, i, 3));
    let p = za.prepare(&s, T);
    assert!(p.spills());
    assert!(p
        .explain(lbkit_core::EndpointIdx::new(3), T)
        .unwrap()
        .contains("local zone overloaded"));
    // Degraded: 1 of 3 local endpoints eligible.
    let d = Arc::new(Snapshot::from_specs(
        ["a", "a", "a", "b"]
            .iter()
            .enumerate()
            .map(|(i, z)| {
                EndpointSpec::new(format!("h{i}:1"))
                    .with_zone(*z)
                    .with_healthy(i == 0 || i == 3)
            })
            .collect(),
        T,
    ));
    assert!(za.prepare(&d, T).spills());
    assert!(
        ZoneAware::new(crate::RoundRobin::new(), "c")
            .prepare(&s, T)
            .spills(),
        "no local endpoints"
    );
    assert_eq!(za.refresh_interval(), Some(Duration::from_secs(1)));
}

#[test]
fn adaptive_through_a_balancer_follows_reports() {
    let s = snap(&[100, 100]);
    let since = T - Duration::from_secs(30);
    for (e, util) in s.endpoints().iter().zip([0.25, 0.75]) {
        e.stats().report_load(since, util, 100.0, 0.0);
        e.stats().report_load(T, util, 100.0, 0.0);
    }
    let b = Balancer::new(Adaptive::default(), s.clone(), T);
    let mut rng = FastRng::seed_from_u64(1);
    let mut c = [0u64; 2];
    let guards: Vec<CallGuard> = (0..4_000)
        .map(|_| {
            let g = b.pick(&mut PickContext::new(T, &mut rng)).unwrap();
            c[s.find(g.endpoint().key()).unwrap().get()] += 1;
            g
        })
        .collect();
    drop(guards);
    // 100/0.25 = 400 vs 100/0.75 = 133: 3 to 1 (scaled to 1 000 : 333).
    assert!((c[0] as f64 / c[1] as f64 - 3.0).abs() < 0.01, "{c:?}");
}

/// `p2c-ewma:decay_ms=…` gives every endpoint its balancer publishes that time constant: one
/// decay later an idle endpoint's estimate is 1/e of its last sample. A shadow running the same
/// strategy reads the statistics and leaves their decay alone.
#[test]
fn p2c_ewma_sets_its_decay_on_what_its_balancer_publishes_and_a_shadow_does_not() {
    let s = snap(&[100, 100]);
    fn stats(s: &Snapshot, i: usize) -> &lbkit_core::EndpointStats {
        s.endpoints()[i].stats()
    }
    stats(&s, 0).record(Duration::from_millis(100), T, Outcome::Success);
    let after = |d: Duration| T.saturating_add(d);
    let ms = |s: &Snapshot, d: Duration| stats(s, 0).ewma_at(after(d)).unwrap().as_secs_f64() * 1e3;
    let default_decay = ms(&s, Duration::from_secs(10));
    assert!(
        (default_decay - 100.0 / std::f64::consts::E).abs() < 0.5,
        "{default_decay}"
    );

    let shadowed = Balancer::new(LeastActive, s.clone(), T);
    let one_second = crate::catalog::build(
        "p2c-ewma",
        crate::catalog::Params::from_pairs([("decay_ms", "1000")]),
    )
    .unwrap();
    assert_eq!(one_second.ewma_decay(), Some(Duration::from_secs(1)));
    shadowed.start_shadow("p2c-ewma:decay_ms=1000", one_second.clone(), T);
    assert!(
        (ms(&s, Duration::from_secs(10)) - default_decay).abs() < 1e-9,
        "a shadow leaves the decay alone"
    );

    let b = Balancer::new(one_second, s.clone(), T);
    let got = ms(&s, Duration::from_secs(1));
    assert!((got - 100.0 / std::f64::consts::E).abs() < 0.5, "{got}");
    // An endpoint that joins later gets it when the balancer publishes it.
    let grown = snap(&[100, 100, 100]);
    stats(&grown, 2).record(Duration::from_millis(100), T, Outcome::Success);
    b.publish(grown.clone(), T);
    let later = stats(&grown, 2)
        .ewma_at(after(Duration::from_secs(1)))
        .unwrap();
    assert!((later.as_secs_f64() * 1e3 - 100.0 / std::f64::consts::E).abs() < 0.5);
    // Without the parameter the strategy asks for nothing.
    assert_eq!(P2cEwma::default().ewma_decay(), None);
}
