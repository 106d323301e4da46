//! The groups' first points with a radix index over the 32-bit point space: a pick finds its
//! group with one read of the index and a search of the few first points in one bucket,
//! instead of a binary search over every group.

use std::ops::Deref;
use std::sync::Arc;

/// The first point of each group, ascending, and for each of `2^bits` equal buckets of the
/// point space (about one group a bucket), how many first points lie below the bucket's start.
/// Shared, not copied, by the rings made between splices (see `pending.rs`).
#[derive(Debug, Clone)]
pub(super) struct Firsts {
    firsts: Arc<[u32]>,
    /// `below[b]`: first points below `b << shift`, for `b` in `0..=buckets` (the last is all
    /// of them).
    below: Arc<[u32]>,
    /// `32 − bits`.
    shift: u32,
}

/// Most index bits: 65 536 buckets (256 KiB) for rings of more groups.
const MAX_BITS: u32 = 16;

/// Groups searched without the index (a ring of about 8 192 points or fewer): the index's two
/// reads cost more than the three steps of a search.
const SEARCHED: usize = 8;

// === impl Firsts ===

impl Firsts {
    /// `firsts` (ascending) with their index. O(groups + buckets).
    pub(super) fn new(firsts: Vec<u32>) -> Self {
        debug_assert!(firsts.windows(2).all(|w| w[0] < w[1]), "ascending, unique");
        let bits = if firsts.len() <= SEARCHED {
            0
        } else {
            firsts
                .len()
                .next_power_of_two()
                .trailing_zeros()
                .min(MAX_BITS)
        };
        let shift = 32 - bits;
        // Bucket `b` counts the first points in buckets before it: each first point raises
        // the counts of the buckets after its own.
        let mut below = vec![0u32; (1 << bits) + 1];
        for (i, &f) in firsts.iter().enumerate() {
            let b = (u64::from(f) >> shift) as usize;
            below[b + 1] = count(i + 1);
        }
        for b in 1..below.len() {
            below[b] = below[b].max(below[b - 1]);
        }
        Firsts {
            firsts: firsts.into(),
            below: below.into(),
            shift,
        }
    }

    /// First points below `point`: `partition_point(|&f| f < point)`.
    #[inline]
    pub(super) fn below(&self, point: u32) -> usize {
        if self.shift == 32 {
            return self.firsts.partition_point(|&f| f < point);
        }
        let b = (u64::from(point) >> self.shift) as usize;
        let (lo, hi) = (self.below[b] as usize, self.below[b + 1] as usize);
        lo + self.firsts[lo..hi].partition_point(|&f| f < point)
    }
}

impl Deref for Firsts {
    type Target = [u32];

    fn deref(&self) -> &[u32] {
        &self.firsts
    }
}

/// A count of groups as the index keeps it (rings hold far fewer than `u32::MAX` groups).
fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// More groups than buckets (several first points a bucket at 16 bits), and first points
    /// crowded into the first and the last bucket.
    #[test]
    fn crowded_buckets_equal_a_binary_search() {
        let many: Vec<u32> = (0..70_000u32).map(|i| i.wrapping_mul(61_357)).collect();
        let ends: Vec<u32> = (0..20).chain(u32::MAX - 20..=u32::MAX).collect();
        for mut firsts in [many, ends] {
            firsts.sort_unstable();
            firsts.dedup();
            let index = Firsts::new(firsts.clone());
            let points = (0..5_000u32)
                .map(|i| i.wrapping_mul(858_993))
                .chain([0, 1, 20, 21]);
            for p in points.chain([u32::MAX - 21, u32::MAX - 20, u32::MAX]) {
                assert_eq!(index.below(p), firsts.partition_point(|&f| f < p), "{p}");
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            rng_seed: proptest::test_runner::RngSeed::Fixed(44),
            ..ProptestConfig::default()
        })]

        /// The index finds what a binary search over all first points finds, for points
        /// anywhere, on first points, next to them and at both ends of the space.
        #[test]
        fn below_equals_a_binary_search(
            mut firsts in proptest::collection::vec(any::<u32>(), 0..300),
            small in any::<bool>(),
            points in proptest::collection::vec(any::<u32>(), 0..50),
        ) {
            if small {
                firsts.truncate(SEARCHED);
            }
            firsts.sort_unstable();
            firsts.dedup();
            let index = Firsts::new(firsts.clone());
            let near = firsts.iter().flat_map(|&f| [f, f.wrapping_sub(1), f.wrapping_add(1)]);
            for p in points.into_iter().chain(near).chain([0, u32::MAX]) {
                prop_assert_eq!(index.below(p), firsts.partition_point(|&f| f < p), "{}", p);
            }
        }
    }
}
