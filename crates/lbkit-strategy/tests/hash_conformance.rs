//! Every hashing strategy, with and without a load bound, passes the shared conformance suite;
//! keyed picks, walks and bounded picks allocate nothing.

use std::sync::Arc;

use lbkit_core::{
    Availability, Balancer, CallGuard, EndpointSpec, FastRng, Outcome, PickContext, Picker,
    Snapshot, Strategy, Timestamp, TriedSet,
};
use lbkit_strategy::catalog::{build, Params};
use lbkit_strategy::*;
use lbkit_testkit::alloc::{allocations_in, CountingAlloc};
use lbkit_testkit::conformance::{check, Shares};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

fn factor() -> BalanceFactor {
    BalanceFactor::new(1.25).unwrap()
}

#[test]
fn consistent_hash() {
    check(ConsistentHash::new, Shares::Any);
    check(
        || ConsistentHash::with_nodes(8).with_balance_factor(factor()),
        Shares::Any,
    );
}

#[test]
fn ketama() {
    check(Ketama::new, Shares::Any);
    check(|| Ketama::new().with_balance_factor(factor()), Shares::Any);
}

#[test]
fn maglev() {
    check(Maglev::new, Shares::Any);
    check(
        || {
            Maglev::try_with_table_size(251)
                .unwrap()
                .with_balance_factor(factor())
        },
        Shares::Any,
    );
}

#[test]
fn rendezvous() {
    check(Rendezvous::new, Shares::Any);
    check(
        || Rendezvous::new().with_balance_factor(factor()),
        Shares::Any,
    );
}

/// Keyless picks land on random positions, so they spread like the key space: by weight for
/// ketama's 16 000 points per endpoint, Maglev's table and rendezvous. (Dubbo's 160 points per
/// endpoint give arcs that differ by several percent, too much for the chi-square test.)
#[test]
fn keyless_picks_follow_the_weights() {
    check(Ketama::new, Shares::Weighted);
    check(Maglev::new, Shares::Weighted);
    check(Rendezvous::new, Shares::Weighted);
}

#[test]
fn keyed_walking_and_bounded_picks_allocate_nothing() {
    let snap = Arc::new(Snapshot::from_specs(
        (0..30)
            .map(|i| {
                EndpointSpec::new(format!("10.5.0.{i}:80"))
                    .with_weight(1 + i % 4)
                    .with_healthy(i % 7 != 3)
            })
            .collect(),
        Timestamp::ZERO,
    ));
    let keys: Vec<String> = (0..256).map(|k| format!("key-{k}")).collect();
    for info in
        catalog::strategies().filter(|s| s.params.iter().any(|p| p.name == "balance_factor"))
    {
        let strategy = build(info.name, Params::from_pairs([("balance_factor", "1.25")])).unwrap();
        let picker = strategy.prepare(&snap, Timestamp::ZERO);
        let b = Balancer::new(strategy, snap.clone(), Timestamp::ZERO)
            .with_availability(Availability::OFF);
        let mut tried = TriedSet::new();
        tried.insert(&snap.endpoints()[0]);
        tried.insert(&snap.endpoints()[1]);
        let mut held: Vec<CallGuard> = Vec::with_capacity(keys.len());
        let mut rng = FastRng::seed_from_u64(3);
        let run = |rng: &mut FastRng, held: &mut Vec<CallGuard>| {
            for key in &keys {
                for probe in 0..12 {
                    let mut cx = PickContext::new(Timestamp::ZERO, rng).with_key(key.as_bytes());
                    cx.probe = probe;
                    let _ = picker.pick(&mut cx);
                }
                let mut cx = PickContext::new(Timestamp::ZERO, rng)
                    .with_key(key.as_bytes())
                    .with_tried(2, &tried);
                held.push(b.pick(&mut cx).expect("eligible endpoints"));
            }
            held.drain(..)
                .for_each(|g| g.finish_at(Outcome::Success, Timestamp::ZERO));
        };
        run(&mut rng, &mut held);
        let ((), n) = allocations_in(|| run(&mut rng, &mut held));
        assert_eq!(n, 0, "{}: {n} allocations", info.name);
    }
}
