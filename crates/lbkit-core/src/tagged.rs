//! A count that carries its time window: one atomic holding `epoch << VALUE_BITS | value`, so
//! a writer that finds an older window's count starts afresh in the same compare-and-swap.
//!
//! What the retry budget's slots use (the windowed response-time mean did too, until it moved
//! to one cumulative word with slot marks, `stats.rs`). The former design of both — a CAS on a
//! separate epoch word, then a reset of the counts — lost updates that
//! landed in that gap, let a late writer's update for a passed window count in the new one, and
//! let a reader see an old window's counts under the new epoch (the loom models in
//! `tests/loom.rs` fail on it). With the epoch in the same word none of that can happen.

use crate::sync::{AtomicU64, Ordering};

/// A windowed count: the low `64 − TAG_BITS` bits count, the high `TAG_BITS` bits hold the
/// window's epoch (modulo `2^TAG_BITS`; epochs are compared with wrap-around, so a writer more
/// than `2^(TAG_BITS−1)` epochs late is taken for a newer one's and dropped).
#[derive(Debug, Default)]
pub(crate) struct Tagged<const TAG_BITS: u32>(AtomicU64);

impl<const TAG_BITS: u32> Tagged<TAG_BITS> {
    const VALUE_BITS: u32 = 64 - TAG_BITS;
    /// The largest value; additions saturate there.
    pub(crate) const MAX: u64 = (1 << Self::VALUE_BITS) - 1;
    const TAG_MASK: u64 = (1 << TAG_BITS) - 1;

    #[inline]
    fn tag(epoch: u64) -> u64 {
        epoch & Self::TAG_MASK
    }

    /// What a word holding `v` counts for `epoch`: its value when it is that epoch's, 0 when
    /// it is an older one's or empty, `None` when it already belongs to a newer epoch (the
    /// caller's window is gone).
    ///
    /// An empty word (value 0) belongs to no epoch: a fresh word reads as tag 0, which the
    /// wrap-around comparison would take for *newer* than every epoch in the upper half of the
    /// tag space, refusing all writes to it (today's wall-clock epochs land there half the
    /// time).
    #[inline]
    pub(crate) fn value_for(v: u64, epoch: u64) -> Option<u64> {
        if v & Self::MAX == 0 {
            return Some(0);
        }
        let ahead = (v >> Self::VALUE_BITS).wrapping_sub(Self::tag(epoch)) & Self::TAG_MASK;
        if ahead == 0 {
            Some(v & Self::MAX)
        } else if ahead < 1 << (TAG_BITS - 1) {
            None
        } else {
            Some(0)
        }
    }

    /// The value for `epoch` (0 when the word holds another epoch's).
    #[inline]
    pub(crate) fn get(&self, epoch: u64, order: Ordering) -> u64 {
        self.value(epoch, order).unwrap_or(0)
    }

    /// The value for `epoch`: 0 when the word holds an older epoch's, `None` when it holds a
    /// newer one's.
    #[inline]
    pub(crate) fn value(&self, epoch: u64, order: Ordering) -> Option<u64> {
        Self::value_for(self.0.load(order), epoch)
    }

    /// Add `n` for `epoch` (saturating) when `allow(value so far)` says so; false when it does
    /// not, or when the word already belongs to a newer epoch.
    #[inline]
    pub(crate) fn add_if(
        &self,
        epoch: u64,
        n: u64,
        order: Ordering,
        allow: impl Fn(u64) -> bool,
    ) -> bool {
        let mut v = self.0.load(Ordering::Relaxed);
        loop {
            let Some(value) = Self::value_for(v, epoch) else {
                return false;
            };
            if !allow(value) {
                return false;
            }
            let next =
                (Self::tag(epoch) << Self::VALUE_BITS) | value.saturating_add(n).min(Self::MAX);
            match self
                .0
                .compare_exchange_weak(v, next, order, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(now) => v = now,
            }
        }
    }
}

#[cfg(all(test, not(lbkit_loom)))]
mod tests {
    use super::*;
    use crate::sync::Ordering::Relaxed;

    #[test]
    fn epochs_compare_with_wrap_around() {
        type T = Tagged<4>;
        let word = |epoch: u64, value: u64| (epoch & 15) << 60 | value;
        assert_eq!(T::value_for(word(3, 7), 3), Some(7));
        assert_eq!(
            T::value_for(word(3, 7), 4),
            Some(0),
            "an older window's count"
        );
        assert_eq!(T::value_for(word(4, 7), 3), None, "a newer window's count");
        assert_eq!(T::value_for(word(0, 7), 15), None, "16 wraps to 0: newer");
        assert_eq!(
            T::value_for(word(15, 7), 16),
            Some(0),
            "older across the wrap"
        );
        assert_eq!(
            T::value_for(word(3, 7), 3 + 16),
            Some(7),
            "2^TAG_BITS apart look alike"
        );
        assert_eq!(
            T::value_for(word(0, 0), 12),
            Some(0),
            "an empty word is no epoch's"
        );
        assert_eq!(
            T::value_for(word(13, 0), 12),
            Some(0),
            "not even a newer one's"
        );
    }

    #[test]
    fn a_fresh_word_takes_epochs_in_the_upper_half_of_the_tags() {
        // Epoch 2^19 + 5 has a tag in the upper half: the fresh word's tag 0 looked newer than
        // it, and every write was refused.
        let t = Tagged::<20>::default();
        let epoch = (1 << 19) + 5;
        assert!(t.add_if(epoch, 3, Relaxed, |_| true));
        assert_eq!(t.get(epoch, Relaxed), 3);
    }

    #[test]
    fn additions_saturate_and_respect_newer_windows() {
        let t = Tagged::<16>::default();
        assert!(t.add_if(5, Tagged::<16>::MAX - 1, Relaxed, |_| true));
        assert!(t.add_if(5, 10, Relaxed, |_| true));
        assert_eq!(t.get(5, Relaxed), Tagged::<16>::MAX);
        assert!(
            t.add_if(6, 2, Relaxed, |_| true),
            "a newer window starts afresh"
        );
        assert_eq!((t.get(6, Relaxed), t.get(5, Relaxed)), (2, 0));
        assert!(
            !t.add_if(5, 1, Relaxed, |_| true),
            "a late writer is dropped"
        );
        assert!(
            !t.add_if(6, 1, Relaxed, |v| v < 2),
            "refused by the condition"
        );
        assert_eq!(t.get(6, Relaxed), 2);
    }
}
