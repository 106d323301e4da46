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
    aperture_coverage(servers, size, at)
        .into_iter()
        .map(|(p, _)| p)
        .collect()
}

/// [`aperture_slice`] with how much of each server the slice covers, in units of
/// `1 / (servers · count)` of the ring: a server wholly inside covers `count` units, one at
/// an edge fewer. Finagle's `Ring.weight`: a client draws its servers in proportion to these
/// (`Ring.pick2`), so a server at the edge of a slice takes only the part of that client's
/// load its overlap is worth, and every server's load comes out even over all clients (with
/// membership alone, a server covered by more edges than another takes more).
///
/// ```
/// use lbkit_core::stage::{aperture_coverage, Coordinates};
/// // Client 1 of 10 over 5 servers (each server 10 units of the ring's 50):
/// // [0.1, 0.5) covers half of server 0, all of server 1 and half of server 2.
/// assert_eq!(
///     aperture_coverage(5, 2, Coordinates { index: 1, count: 10 }),
///     vec![(0, 5), (1, 10), (2, 5)]
/// );
/// ```
pub fn aperture_coverage(servers: usize, size: u32, at: Coordinates) -> Vec<(usize, u64)> {
    let n = servers as u128;
    let count = u128::from(at.count.max(1));
    let size = size.max(1);
    let whole = u64::try_from(count).unwrap_or(u64::MAX);
    // In units of 1 / (servers · count) of the ring: server j holds [j·count, (j+1)·count).
    let ring = n * count;
    if n == 0 || u128::from(size) >= n {
        return (0..servers).map(|p| (p, whole)).collect();
    }
    let width = (u128::from(size) * count).div_ceil(n) * n;
    let start = u128::from(at.index.min(at.count.saturating_sub(1))) * n;
    let first = start / count;
    if width >= ring {
        let at = |k: u128| usize::try_from((first + k) % n).unwrap_or(0);
        return (0..n).map(|k| (at(k), whole)).collect();
    }
    let end = start + width;
    let last = (end - 1) / count;
    // Unwrapped positions first..=last, each with its overlap with [start, end). A slice that
    // starts inside a server and spans nearly the whole ring ends inside the same server: that
    // position comes round again (at most n + 1 of them), and its two overlaps add up.
    let mut covered: Vec<(usize, u64)> = Vec::with_capacity(servers.min(size as usize + 2));
    for p in first..=last {
        let overlap = end.min((p + 1) * count) - start.max(p * count);
        let overlap = u64::try_from(overlap).unwrap_or(u64::MAX);
        let at = usize::try_from(p % n).unwrap_or(0);
        match covered.first_mut() {
            Some(head) if p > first && head.0 == at => head.1 += overlap,
            _ => covered.push((at, overlap)),
        }
    }
    covered
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
