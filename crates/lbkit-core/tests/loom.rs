//! loom models of lbkit-core's lock-free state: every interleaving (and every reordering the
//! memory model allows) of a few threads, exhaustively. Run with
//! `RUSTFLAGS="--cfg lbkit_loom" cargo test -p lbkit-core --test loom --release` (scripts/loom.sh).
#![cfg(lbkit_loom)]

use std::sync::Arc;
use std::time::Duration;

use lbkit_core::{RetryBudget, Timestamp};
use loom::thread;

/// 10 s window in 10 slots of 1 s: the slot of `epoch_s` seconds (slots reused every 10 s).
fn at(s: u64) -> Timestamp {
    Timestamp::from_millis(s * 1_000 + 500)
}

/// A budget of exactly its deposits: no reserve, ratio 1.
fn exact() -> Arc<RetryBudget> {
    Arc::new(RetryBudget::new(Duration::from_secs(10), 0, 1.0))
}

// Two deposits in one slot are both counted.
#[test]
fn concurrent_deposits_are_never_lost() {
    loom::model(|| {
        let b = exact();
        let hs: Vec<_> = (0..2)
            .map(|_| {
                let b = b.clone();
                thread::spawn(move || b.deposit(at(3)))
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(b.balance(at(3)), 2);
    });
}

// A late deposit for a window that has passed (second 3) races one for the window that reuses
// its slot (second 13): the new window counts exactly its own, whatever the order.
#[test]
fn a_slot_rollover_neither_loses_nor_carries_a_deposit() {
    loom::model(|| {
        let b = exact();
        let old = {
            let b = b.clone();
            thread::spawn(move || b.deposit(at(3)))
        };
        let new = {
            let b = b.clone();
            thread::spawn(move || b.deposit(at(13)))
        };
        old.join().unwrap();
        new.join().unwrap();
        assert_eq!(
            b.balance(at(13)),
            1,
            "only second 13's deposit is in its window"
        );
    });
}

// A reader during the rollover never sees the old window's count under the new epoch: it sees
// 0 or 1 of the new deposit, never the two old ones.
#[test]
fn a_reader_during_a_rollover_sees_no_old_count() {
    loom::model(|| {
        let b = exact();
        b.deposit(at(3));
        b.deposit(at(3));
        let writer = {
            let b = b.clone();
            thread::spawn(move || b.deposit(at(13)))
        };
        let seen = b.balance(at(13));
        writer.join().unwrap();
        assert!(seen <= 1, "saw {seen}");
        assert_eq!(b.balance(at(13)), 1);
    });
}

// With one retry left, two concurrent withdrawals in the same slot take it once.
#[test]
fn the_last_retry_is_taken_once() {
    loom::model(|| {
        let b = exact();
        b.deposit(at(5));
        let hs: Vec<_> = (0..2)
            .map(|_| {
                let b = b.clone();
                thread::spawn(move || b.withdraw(at(5)))
            })
            .collect();
        let taken = hs.into_iter().filter(|_| true).map(|h| h.join().unwrap());
        assert_eq!(taken.filter(|&t| t).count(), 1);
        assert_eq!(b.balance(at(5)), 0);
    });
}

// === The windowed response-time mean (EndpointStats' slots) ===

mod window {
    use super::*;
    use lbkit_core::{EndpointStats, Outcome};

    const MS: Duration = Duration::from_millis(1);
    const WINDOW: Duration = Duration::from_secs(60);

    /// 100 ms into second `s` of a minute (5-s slots, reused every 60 s).
    fn t(s: u64) -> Timestamp {
        Timestamp::from_millis(1_000_000 * 60 + s * 1_000 + 100)
    }

    fn record(stats: &EndpointStats, at: Timestamp, latency: Duration) {
        stats.record(latency, at, Outcome::Success);
    }

    // Two samples (10 and 30 ms) recorded at once in one slot, read meanwhile: the reader never
    // sees a mean below the smallest sample (a sum that lags its count would show a slow
    // endpoint as fast), and both samples are counted in the end.
    #[test]
    fn a_reader_never_sees_a_mean_below_the_samples() {
        loom::model(|| {
            let stats = Arc::new(EndpointStats::default());
            let hs: Vec<_> = [10, 30]
                .into_iter()
                .map(|ms| {
                    let s = stats.clone();
                    thread::spawn(move || record(&s, t(1), ms * MS))
                })
                .collect();
            let (n, sum) = stats.window_sum_at(t(1), WINDOW);
            assert!(
                sum >= n * 10 * MS.as_nanos() as u64,
                "{sum} ns over {n} samples"
            );
            for h in hs {
                h.join().unwrap();
            }
            assert_eq!(stats.window_sum_at(t(1), WINDOW), (2, 40_000_000));
        });
    }

    // A late sample (its `now` in second 1) races the first sample of the slot that opens a
    // minute later (second 61), with a reader of the new slot: the reader sees the new slot
    // empty, or its own sample, or both (the late one counts where it is recorded), never the
    // sample of a minute before nor a sum that lags its count; afterwards the slot holds its own
    // sample and, unless it landed before the slot opened, the late one.
    #[test]
    fn a_slot_rollover_neither_loses_nor_carries_a_sample() {
        loom::model(|| {
            let stats = Arc::new(EndpointStats::default());
            record(&stats, t(1), 50 * MS);
            let old = {
                let s = stats.clone();
                thread::spawn(move || record(&s, t(1), 40 * MS))
            };
            let new = {
                let s = stats.clone();
                thread::spawn(move || record(&s, t(61), 20 * MS))
            };
            let seen = stats.window_sum_at(t(61), Duration::from_secs(5));
            assert!(
                [(0, 0), (1, 20_000_000), (2, 60_000_000)].contains(&seen),
                "the new window read as {seen:?}"
            );
            old.join().unwrap();
            new.join().unwrap();
            let after = stats.window_sum_at(t(61), Duration::from_secs(5));
            assert!(
                after == (1, 20_000_000) || after == (2, 60_000_000),
                "the new window holds {after:?}"
            );
            assert_eq!(stats.successes(), 3, "every sample counted once");
        });
    }
}

// === Live statistics: in-flight counts and the peak EWMA ===

mod live {
    use super::*;
    use lbkit_core::{EndpointStats, Outcome};

    // A call finishes on one thread while another starts and finishes one: in flight is
    // never seen wrapped below zero and returns to zero; every outcome is counted once.
    #[test]
    fn in_flight_returns_to_zero() {
        loom::model(|| {
            let stats = Arc::new(EndpointStats::default());
            stats.start();
            let other = {
                let s = stats.clone();
                thread::spawn(move || {
                    s.start();
                    let seen = s.in_flight();
                    s.finish(Timestamp::ZERO, Timestamp::from_millis(1), Outcome::Success);
                    seen
                })
            };
            stats.finish(
                Timestamp::ZERO,
                Timestamp::from_millis(2),
                Outcome::Cancelled,
            );
            let seen = other.join().unwrap();
            assert!((1..=2).contains(&seen), "in flight read as {seen}");
            assert_eq!(stats.in_flight(), 0);
            assert_eq!((stats.successes(), stats.cancellations()), (1, 1));
        });
    }

    // Two latency samples race into the peak EWMA: the estimate is never lost (None), never NaN,
    // and within a hair of the larger sample (a new peak replaces the estimate).
    #[test]
    fn concurrent_ewma_samples_stay_within_the_samples() {
        loom::model(|| {
            let stats = Arc::new(EndpointStats::default());
            let at = |ms| Timestamp::from_millis(ms);
            let hs: Vec<_> = [(1, 10u64), (2, 40)]
                .into_iter()
                .map(|(when, ms)| {
                    let s = stats.clone();
                    thread::spawn(move || {
                        s.record(Duration::from_millis(ms), at(when), Outcome::Success)
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
            // Serially the estimate is 40 ms. A sample whose CAS lands before the other's
            // update of the estimate's time decays from the older time: a hair lower, tolerated.
            let ewma = stats.ewma_ns_at(at(2)).expect("a sample");
            assert!((39.9e6..=40.0e6).contains(&ewma), "EWMA {ewma} ns");
        });
    }
}

// === The snapshot swap with guards in flight ===

mod swap {
    use super::*;
    use lbkit_core::{
        Balancer, EndpointIdx, EndpointSpec, FastRng, Outcome, PickContext, PickError, Picker,
        Snapshot, Strategy,
    };
    use loom::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    /// The first eligible endpoint; counts its preparations; asks for a refresh every second.
    #[derive(Default)]
    struct First(Arc<AtomicUsize>);
    struct FirstPicker(EndpointIdx);

    impl Picker for FirstPicker {
        fn pick(&self, _: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> {
            Ok(self.0)
        }
    }

    impl Strategy for First {
        type Picker = FirstPicker;
        fn name(&self) -> &str {
            "first"
        }
        fn prepare(&self, snap: &Arc<Snapshot>, _: Timestamp) -> FirstPicker {
            self.0.fetch_add(1, Relaxed);
            FirstPicker(snap.eligible()[0])
        }
        fn refresh_interval(&self) -> Option<Duration> {
            Some(Duration::from_secs(1))
        }
    }

    fn snapshot(address: &str) -> Arc<Snapshot> {
        Arc::new(Snapshot::from_specs(
            vec![EndpointSpec::new(address)],
            Timestamp::ZERO,
        ))
    }

    fn pick(b: &Balancer<First>) -> lbkit_core::CallGuard {
        let mut rng = FastRng::seed_from_u64(1);
        b.pick(&mut PickContext::new(Timestamp::ZERO, &mut rng))
            .expect("an endpoint")
    }

    // A call picked from the old state finishes while two publishes replace its endpoint: the
    // guard keeps the endpoint's statistics alive, so the replaced endpoint's line in the slab
    // is reused (loom's slab chunks are two lines) only after the call is done, and the new
    // endpoints never see the old call.
    #[test]
    fn a_guard_outlives_the_snapshot_it_came_from() {
        loom::model(|| {
            let b = Arc::new(Balancer::new(
                First::default(),
                snapshot("a:1"),
                Timestamp::ZERO,
            ));
            let caller = {
                let b = b.clone();
                thread::spawn(move || {
                    let guard = pick(&b);
                    let ours = (
                        guard.endpoint().address().to_owned(),
                        guard.endpoint().stats().in_flight(),
                    );
                    guard.finish_at(Outcome::Success, Timestamp::from_millis(1));
                    ours
                })
            };
            b.publish(snapshot("b:1"), Timestamp::ZERO);
            b.publish(snapshot("c:1"), Timestamp::ZERO);
            let (address, in_flight) = caller.join().unwrap();
            assert!(["a:1", "b:1", "c:1"].contains(&address.as_str()));
            assert_eq!(in_flight, 1, "a guard's endpoint counts its call");
            let current = b.snapshot();
            let c = current.endpoints()[0].stats();
            assert_eq!(current.endpoints()[0].address(), "c:1");
            let expected = u64::from(address == "c:1");
            assert_eq!((c.in_flight(), c.successes()), (0, expected));
        });
    }

    // A refresh (tick) races a publish: the published snapshot is current afterwards, whatever
    // the order (a tick that stored instead of compare-and-swap would put the old one back).
    #[test]
    fn a_publish_during_a_refresh_wins() {
        loom::model(|| {
            let b = Arc::new(Balancer::new(
                First::default(),
                snapshot("a:1"),
                Timestamp::ZERO,
            ));
            let new = snapshot("b:1");
            let ticker = {
                let b = b.clone();
                thread::spawn(move || b.tick(Timestamp::from_millis(2_000)))
            };
            b.publish(new.clone(), Timestamp::from_millis(2_000));
            ticker.join().unwrap();
            assert!(Arc::ptr_eq(&b.snapshot(), &new));
        });
    }

    // New stages (an aperture's coordinates from the registry) race a publish (the control
    // loop's new snapshot): whatever the order, the published state holds the new snapshot
    // prepared with the new stages (a `set_stages` that stored the snapshot it had read put the
    // old one back; a publish that stored without looking again left the old stages).
    #[test]
    fn new_stages_during_a_publish_keep_both() {
        use lbkit_core::stage::{Aperture, ApertureMode, Coordinates, Stages};
        loom::model(|| {
            let b = Arc::new(Balancer::new(
                First::default(),
                snapshot("a:1"),
                Timestamp::ZERO,
            ));
            let new = snapshot("b:1");
            let stages = Stages {
                aperture: Some(Aperture {
                    size: 1,
                    mode: ApertureMode::Deterministic,
                    coordinates: Some(Coordinates { index: 0, count: 2 }),
                    seed: 0,
                }),
                ..Stages::default()
            };
            let setter = {
                let (b, stages) = (b.clone(), stages.clone());
                thread::spawn(move || b.set_stages(stages, Timestamp::ZERO))
            };
            b.publish(new.clone(), Timestamp::ZERO);
            setter.join().unwrap();
            assert!(Arc::ptr_eq(&b.snapshot(), &new), "the new snapshot");
            assert!(b.current().is_staged(), "prepared with the new stages");
            assert_eq!(*b.stages(), stages);
        });
    }

    // Two threads tick at once when a refresh is due: it is prepared once, and exactly one of
    // them reports publishing it.
    #[test]
    fn concurrent_ticks_prepare_once() {
        loom::model(|| {
            let prepared = Arc::new(AtomicUsize::new(0));
            let b = Arc::new(Balancer::new(
                First(prepared.clone()),
                snapshot("a:1"),
                Timestamp::ZERO,
            ));
            let other = {
                let b = b.clone();
                thread::spawn(move || b.tick(Timestamp::from_millis(2_000)))
            };
            let mine = b.tick(Timestamp::from_millis(2_000));
            let theirs = other.join().unwrap();
            assert_eq!(u8::from(mine) + u8::from(theirs), 1);
            assert_eq!(
                prepared.load(Relaxed),
                2,
                "the first preparation and one refresh"
            );
        });
    }
}
