//! loom models of the round-robin counter every picker of one strategy shares (it survives
//! snapshot swaps): concurrent picks, also across a swap, take distinct turns. Run with
//! `scripts/loom.sh`.
#![cfg(lbkit_loom)]

use std::sync::Arc;

use lbkit_core::{EndpointSpec, FastRng, PickContext, Picker, Snapshot, Strategy, Timestamp};
use lbkit_strategy::RoundRobin;
use loom::thread;

fn snapshot(n: usize) -> Arc<Snapshot> {
    Arc::new(Snapshot::from_specs(
        (0..n)
            .map(|i| EndpointSpec::new(format!("10.0.0.{i}:80")))
            .collect(),
        Timestamp::ZERO,
    ))
}

fn pick(p: &impl Picker) -> usize {
    let mut rng = FastRng::seed_from_u64(1);
    p.pick(&mut PickContext::new(Timestamp::ZERO, &mut rng))
        .expect("an endpoint")
        .get()
}

// Three concurrent picks over three endpoints take each endpoint once.
#[test]
fn concurrent_picks_take_distinct_turns() {
    loom::model(|| {
        let picker = Arc::new(RoundRobin::new().prepare(&snapshot(3), Timestamp::ZERO));
        let hs: Vec<_> = (0..2)
            .map(|_| {
                let p = picker.clone();
                thread::spawn(move || pick(&*p))
            })
            .collect();
        let mut picks = vec![pick(&*picker)];
        picks.extend(hs.into_iter().map(|h| h.join().unwrap()));
        picks.sort_unstable();
        assert_eq!(picks, [0, 1, 2]);
    });
}

// A pick on the old picker races one on the picker prepared for the next snapshot (same
// endpoints): they share the counter, so they still take distinct turns.
#[test]
fn picks_across_a_snapshot_swap_share_the_turns() {
    loom::model(|| {
        let rr = RoundRobin::new();
        let old = Arc::new(rr.prepare(&snapshot(2), Timestamp::ZERO));
        let new = rr.prepare(&snapshot(2), Timestamp::ZERO);
        let h = {
            let old = old.clone();
            thread::spawn(move || pick(&*old))
        };
        let mine = pick(&new);
        let theirs = h.join().unwrap();
        assert_ne!(mine, theirs);
    });
}
