//! Consistent hashing with bounded loads under a skewed (Zipf) key distribution: with calls held
//! in flight by their guards, no pick ever puts an endpoint above ⌈c · T · w / W⌉.

use std::sync::Arc;

use lbkit_core::{
    Availability, Balancer, CallGuard, EndpointSpec, FastRng, Outcome, PickContext, Snapshot,
    Timestamp,
};
use lbkit_strategy::catalog::{build, Params};

const FACTOR: f64 = 1.25;

/// Zipf(s) over `n` ranks, sampled by inverting the cumulative distribution.
struct Zipf(Vec<f64>);

impl Zipf {
    fn new(n: usize, s: f64) -> Self {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (1..=n)
            .map(|r| {
                acc += 1.0 / (r as f64).powf(s);
                acc
            })
            .collect();
        cdf.iter_mut().for_each(|c| *c /= acc);
        Zipf(cdf)
    }

    fn sample(&self, rng: &mut FastRng) -> usize {
        let u = rng.unit_f64();
        self.0.partition_point(|&c| c < u).min(self.0.len() - 1)
    }
}

fn fleet(weighted: bool) -> Arc<Snapshot> {
    Arc::new(Snapshot::from_specs(
        (0..10)
            .map(|i| {
                let w = if weighted { 1 + i % 3 } else { 1 };
                EndpointSpec::new(format!("10.4.0.{i}:7000")).with_weight(w)
            })
            .collect(),
        Timestamp::ZERO,
    ))
}

/// Run 4 000 Zipf-keyed picks holding guards (releasing a random one 40% of the time); return
/// the worst ratio `in_flight / cap` the picked endpoint reached right after its pick.
fn run(name: &str, factor: Option<f64>, weighted: bool) -> f64 {
    let snap = fleet(weighted);
    let mut params = Params::new();
    if let Some(f) = factor {
        params.insert("balance_factor", f.to_string());
    }
    let b = Balancer::new(build(name, params).unwrap(), snap.clone(), Timestamp::ZERO)
        .with_availability(Availability::OFF);
    // Dubbo's ring ignores weights, and so does its bound.
    let weight = |i: usize| {
        if name == "consistent-hash" {
            1.0
        } else {
            f64::from(snap.endpoints()[i].weight())
        }
    };
    let total_weight: f64 = (0..10).map(weight).sum();
    let zipf = Zipf::new(1_000, 1.1);
    let mut rng = FastRng::seed_from_u64(42);
    let mut held: Vec<CallGuard> = Vec::new();
    let mut worst: f64 = 0.0;
    for _ in 0..4_000 {
        if !held.is_empty() && rng.below(10) < 4 {
            let i = rng.index(held.len());
            held.swap_remove(i)
                .finish_at(Outcome::Success, Timestamp::ZERO);
        }
        let key = format!("user-{}", zipf.sample(&mut rng));
        let mut krng = FastRng::seed_from_u64(0);
        let mut cx = PickContext::new(Timestamp::ZERO, &mut krng).with_key(key.as_bytes());
        let guard = b.pick(&mut cx).unwrap();
        let idx = snap.find(guard.endpoint().key()).unwrap().get();
        held.push(guard);
        let total: u64 = snap
            .endpoints()
            .iter()
            .map(|e| u64::from(e.stats().in_flight()))
            .sum();
        let cap = (FACTOR * total as f64 * weight(idx) / total_weight).ceil();
        worst = worst.max(f64::from(snap.endpoints()[idx].stats().in_flight()) / cap);
    }
    worst
}

#[test]
fn the_cap_holds_for_every_strategy_under_zipf_keys() {
    for name in ["consistent-hash", "ketama", "maglev", "rendezvous"] {
        for weighted in [false, true] {
            let bounded = run(name, Some(FACTOR), weighted);
            assert!(
                bounded <= 1.0,
                "{name} (weighted: {weighted}): in-flight reached {bounded} x the cap"
            );
            // Without the bound the hot keys pile onto their endpoints far beyond it.
            let unbounded = run(name, None, weighted);
            assert!(unbounded > 1.5, "{name} (weighted: {weighted}): the skew is too mild to test anything ({unbounded})");
        }
    }
}

#[test]
fn an_idle_fleet_keeps_every_key_where_it_hashes() {
    for name in ["consistent-hash", "ketama", "maglev", "rendezvous"] {
        let snap = fleet(true);
        let plain = build(name, Params::new()).unwrap();
        let bounded = build(name, Params::from_pairs([("balance_factor", "1.25")])).unwrap();
        let (p, q) = (
            Balancer::new(plain, snap.clone(), Timestamp::ZERO),
            Balancer::new(bounded, snap.clone(), Timestamp::ZERO),
        );
        let mut rng = FastRng::seed_from_u64(1);
        for k in 0..500 {
            let key = format!("k{k}");
            let mut cx = PickContext::new(Timestamp::ZERO, &mut rng).with_key(key.as_bytes());
            // The first guard is dropped here, so the bounded pick sees an idle fleet.
            let a = p.pick(&mut cx).unwrap().endpoint().key().clone();
            let mut cx = PickContext::new(Timestamp::ZERO, &mut rng).with_key(key.as_bytes());
            let b = q.pick(&mut cx).unwrap();
            assert_eq!(&a, b.endpoint().key(), "{name}: {key}");
        }
    }
}
