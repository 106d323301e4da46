//! The write gate: the fast path's upstream writes of one scheduler round leave together,
//! grouped by upstream, so a backend wakes once for several requests instead of once per
//! request (BENCHMARKS.md: backend wake-ups per request 0.78 → 0.58 from the yield alone, the
//! backends' CPU per request −15 to −30 % from the grouping).
//!
//! # What it relies on
//!
//! The grouping comes from the order in which tokio's current-thread scheduler runs tasks, not
//! from anything the gate enforces:
//!
//! 1. `tokio::task::yield_now` wakes the yielding task only after the tasks already ready in
//!    this round have run (tokio defers the wake until the scheduler has gone through its run
//!    queue and polled the I/O driver), so the round's leader sees every writer of the round
//!    queue up behind it.
//! 2. The current-thread scheduler runs woken tasks in the order they were woken (one FIFO run
//!    queue; no LIFO slot, unlike the multi-threaded scheduler), so the writers go in the
//!    order [`release`] wakes them, and the leader — woken last, while it runs — goes after
//!    them.
//! 3. Every connection using the gate is polled by the one runtime driven from this thread for
//!    its whole life: the gate is thread-local state. Hence [`pin_runtime_thread`], a promise
//!    the caller makes, and [`gated`], which also requires a current-thread runtime.
//!
//! If a tokio release changed 1 or 2, the gate would stay correct — every waiting writer is
//! woken exactly once per round (the round counter, and [`Release`] when a leader is dropped
//! mid-round) — and only the grouping would be lost. Breaking 3 could strand a round, which is
//! why connections without the promise yield plainly instead.

use std::cell::RefCell;
use std::future::poll_fn;
use std::task::{Poll, Waker};

thread_local! {
    static GATE: RefCell<Gate> = RefCell::new(Gate::default());
}

/// The upstream writers of this thread's scheduler round, released together when the round
/// ends, in the order of their upstream (so an upstream gets its requests back to back).
#[derive(Default)]
struct Gate {
    /// Whether [`pin_runtime_thread`] was called on this thread.
    pinned: bool,
    /// Writers waiting: their upstream key and waker.
    waiting: Vec<(usize, Waker)>,
    /// Whether a writer is waiting for the round's end on behalf of all.
    leading: bool,
    /// Rounds released so far.
    round: u64,
}

/// Promise that the runtime serving connections on this thread is a current-thread runtime
/// driven from this thread only, for its whole life (built and `block_on`'d here, as worker
/// threads and `lbkit proxy` do). Connections accepted afterwards on this thread use the
/// thread's write gate ([`write_turn`]); without the promise they yield plainly, since a
/// runtime driven from another thread later would strand the gate's round.
pub(crate) fn pin_runtime_thread() {
    GATE.with(|g| g.borrow_mut().pinned = true);
}

/// Whether connections on this thread may use the write gate.
pub(super) fn gated() -> bool {
    GATE.with(|g| g.borrow().pinned)
        && tokio::runtime::Handle::current().runtime_flavor()
            == tokio::runtime::RuntimeFlavor::CurrentThread
}

/// Wait for this thread's scheduler round to end, then go in the order of `key` (the
/// upstream): the first writer of a round yields to the runtime once (the other ready
/// connections parse their requests and wait here meanwhile), then wakes every waiting writer
/// grouped by key, itself included, so each upstream gets its requests back to back. The
/// groups' order changes every round (no upstream is always last). Only where [`gated`].
pub(super) async fn write_turn(key: usize) {
    let (lead, round) = GATE.with(|g| {
        let mut g = g.borrow_mut();
        let lead = !g.leading;
        g.leading = true;
        (lead, g.round)
    });
    if lead {
        let mut pending = Release(true);
        tokio::task::yield_now().await;
        let mut released = false;
        poll_fn(|cx| {
            if released {
                return Poll::Ready(());
            }
            released = true;
            pending.0 = false;
            release(Some((key, cx.waker())));
            Poll::Pending
        })
        .await;
        return;
    }
    // Where this writer's waker is in the round's list (a second poll updates it in place).
    let mut slot: Option<usize> = None;
    poll_fn(|cx| {
        GATE.with(|g| {
            let mut g = g.borrow_mut();
            if g.round != round {
                return Poll::Ready(());
            }
            match slot.and_then(|i| g.waiting.get_mut(i)) {
                Some(entry) => entry.1.clone_from(cx.waker()),
                None => {
                    slot = Some(g.waiting.len());
                    g.waiting.push((key, cx.waker().clone()));
                }
            }
            Poll::Pending
        })
    })
    .await;
}

/// End the round: wake its writers grouped by key, the leader's (`own`) group last, then the
/// leader (a task woken while it runs is queued after everything it woke).
fn release(own: Option<(usize, &Waker)>) {
    // During thread-local teardown (a runtime dropped then) there is nobody left to wake.
    let Ok((mut waiting, round)) = GATE.try_with(|g| {
        let mut g = g.borrow_mut();
        g.leading = false;
        g.round = g.round.wrapping_add(1);
        (std::mem::take(&mut g.waiting), g.round)
    }) else {
        return;
    };
    // Equal keys stay together (a stable sort on a bijection of the key); which group goes
    // first changes with the round.
    let mix = (round as usize).wrapping_mul(0x9E37_79B9_7F4A_7C15_u64 as usize);
    let lead = own.map(|(key, _)| key);
    waiting.sort_by_key(|&(key, _)| (Some(key) == lead, key ^ mix));
    for (_, waker) in waiting.drain(..) {
        waker.wake();
    }
    if let Some((_, waker)) = own {
        waker.wake_by_ref();
    }
    // Keep the room for the next round.
    let _ = GATE.try_with(|g| {
        let mut g = g.borrow_mut();
        if g.waiting.is_empty() {
            g.waiting = waiting;
        }
    });
}

/// Releases a round whose leader is dropped before it could (its writers would wait forever).
struct Release(bool);

impl Drop for Release {
    fn drop(&mut self) {
        if self.0 {
            release(None);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::Context;

    use super::*;

    // The writers of one round go in the order of their upstream, each upstream's together;
    // a later round starts a new order.
    #[tokio::test(flavor = "current_thread")]
    async fn a_round_of_writers_goes_grouped_by_upstream() {
        pin_runtime_thread();
        for _ in 0..4 {
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let mut tasks = Vec::new();
            for key in [3, 1, 2, 3, 1, 2, 1] {
                let tx = tx.clone();
                tasks.push(tokio::spawn(async move {
                    write_turn(key).await;
                    tx.send(key).unwrap();
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
            let mut order = Vec::new();
            while let Ok(key) = rx.try_recv() {
                order.push(key);
            }
            // Grouped (the groups' order changes with the round).
            let mut groups = order.clone();
            groups.dedup();
            assert_eq!((groups.len(), order.len()), (3, 7), "{order:?}");
        }
        // The gate is free again: a lone writer passes on its own.
        write_turn(7).await;
        assert!(!GATE.with(|g| g.borrow().leading));
    }

    // A leader dropped while it waits for the round's end still wakes the writers waiting on
    // it, and a writer polled twice is listed once.
    #[tokio::test(flavor = "current_thread")]
    async fn a_dropped_leader_releases_its_round() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        struct Count(AtomicUsize);
        impl std::task::Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let poll = |f: &mut Pin<Box<dyn Future<Output = ()>>>, w: &Arc<Count>| {
            let waker = Waker::from(w.clone());
            f.as_mut().poll(&mut Context::from_waker(&waker))
        };
        let (leader_woken, follower_woken) = (
            Arc::new(Count(AtomicUsize::new(0))),
            Arc::new(Count(AtomicUsize::new(0))),
        );
        let mut leader: Pin<Box<dyn Future<Output = ()>>> = Box::pin(write_turn(1));
        let mut follower: Pin<Box<dyn Future<Output = ()>>> = Box::pin(write_turn(2));
        assert!(poll(&mut leader, &leader_woken).is_pending()); // leads, yields
        assert!(poll(&mut follower, &follower_woken).is_pending()); // waits
        assert!(poll(&mut follower, &follower_woken).is_pending()); // a spurious poll
        assert_eq!(GATE.with(|g| g.borrow().waiting.len()), 1);
        drop(leader);
        assert_eq!(follower_woken.0.load(Ordering::SeqCst), 1);
        assert!(poll(&mut follower, &follower_woken).is_ready());
        assert!(!GATE.with(|g| g.borrow().leading));
    }
}
