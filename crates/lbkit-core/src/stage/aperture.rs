//! Aperture slices: Finagle's deterministic ring coordinates and gRPC's A68 random subsetting.
//! Positions index a ring the caller orders the same way on every client (by endpoint key).

use super::Coordinates;
use crate::rng::FastRng;

/// The ring positions (of `servers`) in the deterministic aperture of `size` for the client at
/// `at`: the servers overlapping `[index / count, index / count + width)`, where each server
/// holds `1 / servers` of the ring and `width = ⌈size · count / servers⌉ / count` (Finagle's
/// `DeterministicAperture`). In ring order from the slice's start.
///
/// ```
/// use lbkit_core::stage::{aperture_slice, Coordinates};
/// // 10 clients, 5 servers, aperture 2: width ⌈2·10/5⌉/10 = 0.4 of the ring, 2 servers.
/// assert_eq!(aperture_slice(5, 2, Coordinates { index: 0, count: 10 }), vec![0, 1]);
/// // Client 1 starts at 0.1: [0.1, 0.5) overlaps servers 0, 1 and 2.
/// assert_eq!(aperture_slice(5, 2, Coordinates { index: 1, count: 10 }), vec![0, 1, 2]);
/// ```
pub fn aperture_slice(servers: usize, size: u32, at: Coordinates) -> Vec<usize> {
    let n = servers as u128;
    let count = u128::from(at.count.max(1));
    let size = size.max(1);
    if n == 0 || u128::from(size) >= n {
        return (0..servers).collect();
    }
    // In units of 1 / (servers · count) of the ring: server j holds [j·count, (j+1)·count).
    let ring = n * count;
    let start = u128::from(at.index.min(at.count.saturating_sub(1))) * n;
    let width = (u128::from(size) * count).div_ceil(n) * n;
    let width = width.min(ring);
    let first = start / count;
    let last = (start + width - 1) / count;
    let span = (last - first + 1).min(n);
    (0..span)
        .map(|k| usize::try_from((first + k) % n).unwrap_or(0))
        .collect()
}

/// The ring positions (of `servers`) in a random aperture of `size`: the first `size` of the
/// ring shuffled with `seed` (gRPC's A68 `random_subsetting`).
///
/// ```
/// use lbkit_core::stage::random_slice;
/// let a = random_slice(60, 12, 7);
/// assert_eq!(a.len(), 12);
/// assert_eq!(a, random_slice(60, 12, 7), "the same seed, the same slice");
/// ```
pub fn random_slice(servers: usize, size: u32, seed: u64) -> Vec<usize> {
    let mut ring: Vec<usize> = (0..servers).collect();
    let take = (size.max(1) as usize).min(servers);
    let mut rng = FastRng::seed_from_u64(seed);
    for i in 0..take {
        let j = i + rng.index(servers - i);
        ring.swap(i, j);
    }
    ring.truncate(take);
    ring
}
