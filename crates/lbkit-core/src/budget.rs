//! [`RetryBudget`]: a lock-free retry budget (Finagle's and linkerd's), so retries cannot turn an
//! outage into a storm.
//!
//! Every request deposits; every retry withdraws. Over a sliding window (`ttl`, 10 s by default,
//! in ten slots) a retry is allowed while
//! `min_per_sec × ttl + retry_ratio × deposits − withdrawals ≥ 1`. No locks, no allocation.
//!
//! Each counter of a slot is one atomic holding the slot's epoch (its low 32 bits) beside the
//! count, so a writer that finds an older window starts the count afresh in the same
//! compare-and-swap: no update is lost at a rollover, none from an old window lands in a new
//! one, and a reader never sees an old window's count under the new epoch (the former design,
//! a CAS on a separate epoch then a reset of the counts, lost updates in that gap; the loom
//! models in `tests/loom.rs` check all three). Withdrawals in one slot are exact: the balance is
//! checked and the withdrawal counted in one CAS. Two withdrawals in different slots (a slot
//! boundary between them) can each take the last retry.

use std::time::Duration;

use crate::sync::Ordering::Relaxed;
use crate::tagged::Tagged;
use crate::time::{duration_nanos, Timestamp};

const SLOTS: usize = 10;

/// A retry budget over a sliding window. Share it (`Arc`) across tasks.
///
/// ```
/// use std::time::Duration;
/// use lbkit_core::{RetryBudget, Timestamp};
/// let b = RetryBudget::new(Duration::from_secs(10), 0, 0.2);
/// let now = Timestamp::from_millis(1_000);
/// for _ in 0..10 {
///     b.deposit(now);
/// }
/// assert!(b.withdraw(now) && b.withdraw(now), "20 % of 10 requests: two retries");
/// assert!(!b.withdraw(now));
/// ```
#[derive(Debug)]
pub struct RetryBudget {
    slot_ns: u64,
    reserve: f64,
    ratio: f64,
    slots: [Slot; SLOTS],
}

#[derive(Debug, Default)]
struct Slot {
    deposits: Counter,
    withdrawals: Counter,
}

/// A slot's count with its epoch (`crate::tagged`): 32 bits of each.
type Counter = Tagged<32>;

impl Default for RetryBudget {
    /// 10 s window, 10 retries per second always allowed, plus 20 % of the requests (linkerd's
    /// and tower's defaults).
    fn default() -> Self {
        RetryBudget::new(Duration::from_secs(10), 10, 0.2)
    }
}

// === impl RetryBudget ===

impl RetryBudget {
    /// Allow `min_per_sec` retries per second regardless of traffic, plus `retry_ratio` (0–1000)
    /// of the requests deposited over `ttl` (1–60 s; clamped).
    pub fn new(ttl: Duration, min_per_sec: u32, retry_ratio: f64) -> Self {
        let ttl = ttl.clamp(Duration::from_secs(1), Duration::from_secs(60));
        let ratio = if retry_ratio.is_finite() {
            retry_ratio.clamp(0.0, 1000.0)
        } else {
            0.0
        };
        RetryBudget {
            slot_ns: (duration_nanos(ttl) / SLOTS as u64).max(1),
            reserve: f64::from(min_per_sec) * ttl.as_secs_f64(),
            ratio,
            slots: Default::default(),
        }
    }

    /// A request was made at `now`.
    #[inline]
    pub fn deposit(&self, now: Timestamp) {
        let epoch = self.epoch(now);
        self.slot(epoch)
            .deposits
            .add_if(epoch, 1, Relaxed, |_| true);
    }

    /// Take one retry at `now`; `false` when the budget is spent.
    pub fn withdraw(&self, now: Timestamp) -> bool {
        let current = self.epoch(now);
        let (deposits, mut withdrawals) = (self.sum(current, |s| &s.deposits), 0);
        for (epoch, slot) in self.window(current) {
            if epoch != current {
                withdrawals += slot.withdrawals.get(epoch, Relaxed);
            }
        }
        let allowance = self.reserve + self.ratio * deposits as f64 - withdrawals as f64;
        self.slot(current)
            .withdrawals
            .add_if(current, 1, Relaxed, |taken| allowance - taken as f64 >= 1.0)
    }

    /// Retries available at `now` (rounded down).
    pub fn balance(&self, now: Timestamp) -> u64 {
        let current = self.epoch(now);
        let deposits = self.sum(current, |s| &s.deposits);
        let withdrawals = self.sum(current, |s| &s.withdrawals);
        (self.reserve + self.ratio * deposits as f64 - withdrawals as f64).max(0.0) as u64
    }

    /// The slot number of `now`, from 1.
    #[inline]
    fn epoch(&self, now: Timestamp) -> u64 {
        now.as_nanos() / self.slot_ns + 1
    }

    #[inline]
    fn slot(&self, epoch: u64) -> &Slot {
        &self.slots[(epoch % SLOTS as u64) as usize]
    }

    /// The window ending at `current`: each of its epochs (from 1) with its slot.
    fn window(&self, current: u64) -> impl Iterator<Item = (u64, &Slot)> {
        let oldest = current.saturating_sub(SLOTS as u64 - 1).max(1);
        (oldest..=current).map(move |e| (e, self.slot(e)))
    }

    fn sum(&self, current: u64, counter: impl Fn(&Slot) -> &Counter) -> u64 {
        self.window(current)
            .map(|(epoch, slot)| counter(slot).get(epoch, Relaxed))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Timestamp {
        Timestamp::from_millis(1_000_000 + ms)
    }

    #[test]
    fn ratio_and_reserve() {
        let b = RetryBudget::new(Duration::from_secs(10), 1, 0.1);
        // 1/s × 10 s reserve = 10 retries with no traffic at all.
        assert_eq!(b.balance(at(0)), 10);
        for _ in 0..100 {
            b.deposit(at(0));
        }
        assert_eq!(b.balance(at(0)), 20);
        let taken = (0..50).filter(|_| b.withdraw(at(0))).count();
        assert_eq!(taken, 20);
    }

    #[test]
    fn the_window_slides() {
        let b = RetryBudget::new(Duration::from_secs(10), 0, 0.5);
        for _ in 0..10 {
            b.deposit(at(0));
        }
        assert_eq!(b.balance(at(9_000)), 5);
        assert_eq!(
            b.balance(at(10_500)),
            0,
            "deposits older than the window are gone"
        );
        assert!(b.withdraw(at(0)));
        b.deposit(at(20_000));
        b.deposit(at(20_000));
        assert_eq!(b.balance(at(20_000)), 1, "a reused slot starts from zero");
    }

    #[test]
    fn wall_clock_times_count() {
        // Wall-clock epochs (here 100 ms slots of a 1 s window, in 2031) have tags in the
        // upper half of 32 bits half the time: deposits on fresh counters must count there.
        let b = RetryBudget::new(Duration::from_secs(1), 0, 1.0);
        let now = Timestamp::from_millis(1_932_735_283_200);
        assert!(((now.as_nanos() / 100_000_000 + 1) & 0xFFFF_FFFF) >= 1 << 31);
        b.deposit(now);
        b.deposit(now);
        assert_eq!(b.balance(now), 2);
        assert!(b.withdraw(now));
    }

    #[test]
    fn concurrent_use_never_overspends_much() {
        let b = std::sync::Arc::new(RetryBudget::new(Duration::from_secs(10), 0, 0.2));
        let taken: usize = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    let b = b.clone();
                    s.spawn(move || {
                        (0..10_000)
                            .filter(|_| {
                                b.deposit(at(0));
                                b.withdraw(at(0))
                            })
                            .count()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("thread")).sum()
        });
        // 20 % of 40 000, give or take the races between reading and taking.
        assert!((7_900..=8_100).contains(&taken), "{taken}");
    }
}
