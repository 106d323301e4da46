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
