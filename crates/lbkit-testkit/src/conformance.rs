//! One conformance suite for every strategy, built-in or user-defined (after grpc-go's
//! `testWRRNext`).
//!
//! [`check`] runs, through a real [`Balancer`]:
//! * an empty snapshot gives [`PickError::NoEndpoints`]; all endpoints down or at weight 0 give
//!   [`PickError::AllIneligible`];
//! * a single endpoint is always picked;
//! * endpoints marked down or with weight 0 are never picked;
//! * endpoints in the call's tried set are never picked while others remain;
//! * the distribution over 20 000 picks matches the declared [`Shares`] (chi-square, p = 0.001,
//!   fixed seed, so the test is deterministic);
//! * picks — through the picker and through the balancer with its guard — allocate nothing.

use std::sync::Arc;

use lbkit_core::{
    Availability, Balancer, EndpointSpec, FastRng, Outcome, PickContext, PickError, Picker,
    Snapshot, Strategy, Timestamp, TriedSet,
};

use crate::alloc::allocations_in;
use crate::dist::assert_fits;

/// Which distribution the strategy promises over idle, healthy endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shares {
    /// Every eligible endpoint equally often.
    Uniform,
    /// Proportional to the configured weight.
    Weighted,
    /// No promise (load- or key-driven strategies).
    Any,
}

const SEED: u64 = 0x5eed;
const PICKS: usize = 20_000;

/// Run the suite on strategies made by `make` (a fresh one per check).
///
/// # Panics
/// On the first violated property, naming it.
pub fn check<S: Strategy>(make: impl Fn() -> S, shares: Shares) {
    let name = make().name().to_owned();
    empty_and_ineligible(&make, &name);
    single_endpoint(&make, &name);
    mixed_set(&make, &name, shares);
    retry_exclusion(&make, &name);
    no_allocation(&make, &name);
}

fn balancer<S: Strategy>(s: S, snap: Arc<Snapshot>) -> Balancer<S> {
    Balancer::new(s, snap, Timestamp::ZERO).with_availability(Availability::OFF)
}

fn specs(list: &[(&str, u32, bool)]) -> Arc<Snapshot> {
    Arc::new(Snapshot::from_specs(
        list.iter()
            .map(|&(a, w, up)| EndpointSpec::new(a).with_weight(w).with_healthy(up))
            .collect(),
        Timestamp::ZERO,
    ))
}

fn pick_idx<S: Strategy>(
    b: &Balancer<S>,
    rng: &mut FastRng,
    tried: &TriedSet,
) -> Result<usize, PickError> {
    let mut cx = PickContext::new(Timestamp::ZERO, rng).with_tried(tried.len() as u32, tried);
    let guard = b.pick(&mut cx)?;
    let snap = b.snapshot();
    let idx = snap
        .find(guard.endpoint().key())
        .expect("picked endpoint is in the snapshot");
    guard.finish_at(Outcome::Success, Timestamp::ZERO);
    Ok(idx.get())
}

fn empty_and_ineligible<S: Strategy>(make: &impl Fn() -> S, name: &str) {
    let mut rng = FastRng::seed_from_u64(SEED);
    let b = balancer(make(), specs(&[]));
    assert_eq!(
        pick_idx(&b, &mut rng, &TriedSet::new()),
        Err(PickError::NoEndpoints),
        "{name}: empty set"
    );
    let b = balancer(make(), specs(&[("a:1", 100, false), ("b:1", 0, true)]));
    assert_eq!(
        pick_idx(&b, &mut rng, &TriedSet::new()),
        Err(PickError::AllIneligible {
            unhealthy: 1,
            drained: 1,
            ejected: 0
        }),
        "{name}: nothing eligible"
    );
}

fn single_endpoint<S: Strategy>(make: &impl Fn() -> S, name: &str) {
    let mut rng = FastRng::seed_from_u64(SEED);
    let b = balancer(
        make(),
        specs(&[("down:1", 100, false), ("only:1", 7, true)]),
    );
    for _ in 0..100 {
        assert_eq!(
            pick_idx(&b, &mut rng, &TriedSet::new()),
            Ok(1),
            "{name}: single eligible endpoint"
        );
    }
}

const MIXED: &[(&str, u32, bool)] = &[
    ("a:1", 100, true),
    ("b:1", 100, false),
    ("c:1", 0, true),
    ("d:1", 300, true),
    ("e:1", 100, true),
];

fn mixed_set<S: Strategy>(make: &impl Fn() -> S, name: &str, shares: Shares) {
    let mut rng = FastRng::seed_from_u64(SEED);
    let b = balancer(make(), specs(MIXED));
    let mut counts = vec![0u64; MIXED.len()];
    for _ in 0..PICKS {
        counts[pick_idx(&b, &mut rng, &TriedSet::new()).expect("eligible endpoints exist")] += 1;
    }
    assert_eq!(
        (counts[1], counts[2]),
        (0, 0),
        "{name}: picked a down or weight-0 endpoint: {counts:?}"
    );
    let expected: Vec<f64> = match shares {
        Shares::Uniform => MIXED
            .iter()
            .map(|&(_, w, up)| f64::from(u8::from(up && w > 0)))
            .collect(),
        Shares::Weighted => MIXED
            .iter()
            .map(|&(_, w, up)| if up { f64::from(w) } else { 0.0 })
            .collect(),
        Shares::Any => return,
    };
    assert_fits(&counts, &expected, name);
}

fn retry_exclusion<S: Strategy>(make: &impl Fn() -> S, name: &str) {
    let mut rng = FastRng::seed_from_u64(SEED);
    let snap = specs(MIXED);
    let b = balancer(make(), snap.clone());
    let mut tried = TriedSet::new();
    tried.insert(&snap.endpoints()[0]);
    tried.insert(&snap.endpoints()[3]);
    for _ in 0..500 {
        assert_eq!(
            pick_idx(&b, &mut rng, &tried),
            Ok(4),
            "{name}: picked an endpoint already tried"
        );
    }
    // Everything tried: the call still gets an endpoint (Dubbo re-selects among the tried).
    tried.insert(&snap.endpoints()[4]);
    assert!(pick_idx(&b, &mut rng, &tried).is_ok(), "{name}: all tried");
}

fn no_allocation<S: Strategy>(make: &impl Fn() -> S, name: &str) {
    let snap = specs(MIXED);
    let b = balancer(make(), snap.clone());
    let picker = make().prepare(&snap, Timestamp::ZERO);
    let mut rng = FastRng::seed_from_u64(SEED);
    let run = |b: &Balancer<S>, rng: &mut FastRng| {
        for _ in 0..1_000 {
            let _ = picker.pick(&mut PickContext::new(Timestamp::ZERO, rng));
            let guard = b
                .pick(&mut PickContext::new(Timestamp::ZERO, rng))
                .expect("eligible endpoints exist");
            guard.finish_at(Outcome::Success, Timestamp::ZERO);
        }
    };
    run(&b, &mut rng); // warm up thread-locals (arc-swap registers this thread once)
    let ((), n) = allocations_in(|| run(&b, &mut rng));
    assert_eq!(n, 0, "{name}: picks allocated {n} times");
    // The default availability filter (breaker, pushback) with an endpoint pushed back (a 429
    // with Retry-After), which picks pass over: still none.
    let filtered = Balancer::new(make(), snap.clone(), Timestamp::ZERO);
    snap.endpoints()[0]
        .stats()
        .push_back(Timestamp::ZERO, std::time::Duration::from_secs(1));
    run(&filtered, &mut rng);
    let ((), n) = allocations_in(|| run(&filtered, &mut rng));
    assert_eq!(n, 0, "{name}: picks around a pushback allocated {n} times");
}
