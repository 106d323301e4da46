//! The user-defined strategy of `examples/custom_strategy.rs` runs here: its demo, the shared
//! conformance suite, and a concurrent run proving the rule holds across threads.

#[path = "../examples/custom_strategy.rs"]
mod example;

use std::collections::HashMap;
use std::sync::Arc;

use example::CallsThenSwitch;
use lbkit::{Balancer, FastRng, Outcome, PickContext, Timestamp};
use lbkit_testkit::alloc::CountingAlloc;
use lbkit_testkit::conformance::{check, Shares};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

#[test]
fn demo_switches_after_three_calls() {
    let picks = example::demo(10);
    let short: Vec<&str> = picks.iter().map(|a| &a[7..8]).collect();
    assert_eq!(short, ["1", "1", "1", "2", "2", "2", "3", "3", "3", "1"]);
}

#[test]
fn passes_the_conformance_suite() {
    check(|| CallsThenSwitch::new(3), Shares::Uniform);
}

#[test]
fn the_rule_holds_under_concurrency() {
    let snap = lbkit_testkit::snapshot(&[("a:1", 100), ("b:1", 100), ("c:1", 100)]);
    let balancer = Arc::new(Balancer::new(
        CallsThenSwitch::new(3),
        snap,
        Timestamp::ZERO,
    ));
    let per_thread = 22_500;
    let counts: Vec<HashMap<String, u64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4u64)
            .map(|t| {
                let b = balancer.clone();
                s.spawn(move || {
                    let mut rng = FastRng::seed_from_u64(t);
                    let mut counts = HashMap::new();
                    for _ in 0..per_thread {
                        let g = b
                            .pick(&mut PickContext::new(Timestamp::ZERO, &mut rng))
                            .unwrap();
                        *counts.entry(g.endpoint().address().to_owned()).or_insert(0) += 1;
                        g.finish_at(Outcome::Success, Timestamp::ZERO);
                    }
                    counts
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // 90 000 calls = 30 000 runs of 3 over 3 endpoints: exactly 30 000 each, whatever the
    // interleaving (the unsynchronised original lost and doubled counts here).
    for addr in ["a:1", "b:1", "c:1"] {
        let total: u64 = counts
            .iter()
            .map(|c| c.get(addr).copied().unwrap_or(0))
            .sum();
        assert_eq!(total, 30_000, "{addr}");
    }
}
