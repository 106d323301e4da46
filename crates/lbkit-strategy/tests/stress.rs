//! Multi-threaded stress: millions of picks on several threads while another thread swaps
//! snapshots (random adds, removals, weight and health flips) and re-prepares. Every picked
//! endpoint must be eligible in the snapshot it came from (a picker never pairs with another
//! snapshot), and when the dust settles every in-flight counter is back at zero.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use lbkit_core::{
    Balancer, BoxStrategy, EndpointSpec, EndpointStats, FailureKind, FastRng, Outcome, PickContext,
    SnapshotBuilder, Timestamp, TriedSet, Update,
};
use lbkit_strategy::catalog::{build, strategies, Params};

const PICKERS: u64 = 3;
const PICKS_PER_THREAD: u64 = 400_000;

fn spec(rng: &mut FastRng, i: u64) -> EndpointSpec {
    EndpointSpec::new(format!("10.0.{}.{}:80", i / 250, i % 250))
        .with_weight(rng.below(5) as u32 * 50) // 0 = drained, sometimes
        .with_healthy(rng.below(8) != 0)
}

fn stress(strategy: BoxStrategy) {
    let name = lbkit_core::Strategy::name(&strategy).to_owned();
    let mut rng = FastRng::seed_from_u64(11);
    let mut builder = SnapshotBuilder::new();
    let first = builder.apply(
        Update::Reset((0..40).map(|i| spec(&mut rng, i)).collect()),
        Timestamp::ZERO,
    );
    let mut all_stats: Vec<Arc<EndpointStats>> = first
        .endpoints()
        .iter()
        .map(|e| e.stats_arc().clone())
        .collect();
    let balancer = Arc::new(Balancer::new(strategy, first, Timestamp::ZERO));
    let done = AtomicBool::new(false);

    std::thread::scope(|s| {
        let pickers: Vec<_> = (0..PICKERS)
            .map(|t| {
                let b = balancer.clone();
                s.spawn(move || {
                    let mut rng = FastRng::seed_from_u64(100 + t);
                    let mut picked = 0u64;
                    for i in 0..PICKS_PER_THREAD {
                        let now = Timestamp::from_millis(i);
                        let mut tried = TriedSet::new();
                        let mut cx = PickContext::new(now, &mut rng);
                        let Ok(first) = b.pick(&mut cx) else { continue };
                        assert!(
                            first.endpoint().is_eligible(),
                            "picked an ineligible endpoint"
                        );
                        tried.insert(first.endpoint());
                        picked += 1;
                        match i % 4 {
                            0 => first.finish_at(Outcome::Success, now),
                            1 => first.finish_at(Outcome::Failure(FailureKind::Server), now),
                            2 => drop(first), // cancelled
                            _ => {
                                // a retry while the first attempt is still in flight
                                let mut cx = PickContext::new(now, &mut rng).with_tried(1, &tried);
                                if let Ok(retry) = b.pick(&mut cx) {
                                    retry.finish_at(Outcome::Success, now);
                                }
                                first.finish_at(Outcome::Success, now);
                            }
                        }
                    }
                    picked
                })
            })
            .collect();
        let publisher = s.spawn(|| {
            let mut rng = FastRng::seed_from_u64(7);
            let mut next_key = 40;
            let mut swaps = 0u64;
            while !done.load(Ordering::Relaxed) {
                let update = match rng.below(3) {
                    0 => Update::Add(
                        (0..3)
                            .map(|_| {
                                next_key += 1;
                                spec(&mut rng, next_key % 120)
                            })
                            .collect(),
                    ),
                    // At most a sixth removed, and only from sets above eight endpoints: the set
                    // still shrinks and empties of eligible endpoints now and then, but does not
                    // drift to a handful, where most picks would find nothing eligible and the
                    // share of picks that succeed would depend on the threads' timing.
                    1 if builder.current().len() > 8 => Update::Remove(
                        builder
                            .current()
                            .iter()
                            .filter(|_| rng.below(6) == 0)
                            .map(|e| e.key().clone())
                            .collect(),
                    ),
                    _ => {
                        // weight and health flips of existing endpoints
                        let addrs: Vec<String> = builder
                            .current()
                            .iter()
                            .take(10)
                            .map(|e| e.address().to_owned())
                            .collect();
                        Update::Add(
                            addrs
                                .into_iter()
                                .map(|a| {
                                    EndpointSpec::new(a)
                                        .with_weight(rng.below(5) as u32 * 50)
                                        .with_healthy(rng.below(8) != 0)
                                })
                                .collect(),
                        )
                    }
                };
                let snap = builder.apply(update, Timestamp::from_millis(swaps));
                all_stats.extend(snap.endpoints().iter().map(|e| e.stats_arc().clone()));
                balancer.publish(snap, Timestamp::from_millis(swaps));
                balancer.tick(Timestamp::from_millis(swaps * 1_000));
                swaps += 1;
                std::thread::yield_now();
            }
            swaps
        });
        let picked: u64 = pickers
            .into_iter()
            .map(|h| h.join().expect("picker thread"))
            .sum();
        done.store(true, Ordering::Relaxed);
        let swaps = publisher.join().expect("publisher thread");
        assert!(
            picked > PICKERS * PICKS_PER_THREAD / 2,
            "{name}: only {picked} picks succeeded"
        );
        assert!(
            swaps > 10,
            "{name}: only {swaps} snapshot swaps happened during the run"
        );
    });
    for stats in &all_stats {
        assert_eq!(
            stats.in_flight(),
            0,
            "{name}: in-flight counter left at {}",
            stats.in_flight()
        );
    }
}

#[test]
fn every_strategy_under_concurrent_picks_and_swaps() {
    for info in strategies() {
        stress(build(info.name, Params::new()).expect("catalog entry builds"));
    }
}
