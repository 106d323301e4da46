//! The sorted hash ring shared by `consistent-hash` (Dubbo's MD5 layout) and `ketama` (nginx's
//! CRC32 layout): 32-bit points in ascending order, each owned by an endpoint.

use std::sync::Arc;

use lbkit_core::{EndpointIdx, PickContext, PickError, Picker, Snapshot, Timestamp};

use super::bounded::Bound;
use super::walk::walk_cyclic;
use super::{consistent, fallback_hash, ketama};

/// Which endpoint keeps a point that two endpoints share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Collision {
    /// The first one put on the ring (nginx: a stable sort, then de-duplication).
    KeepFirst,
    /// The last one put on the ring (Dubbo: `TreeMap.put` overwrites).
    KeepLast,
}

/// How a request key becomes a point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyPoint {
    /// MD5 of the key, first 4 bytes little-endian (Dubbo).
    Md5,
    /// CRC32 of the key (nginx).
    Crc32,
}

/// Prepared ring of [`ConsistentHash`](super::ConsistentHash) or [`Ketama`](super::Ketama).
///
/// Built over the eligible endpoints of one snapshot; immutable after prepare.
#[derive(Debug)]
pub struct RingPicker {
    /// Points in ascending order, no duplicates.
    hashes: Box<[u32]>,
    /// Owner of each point.
    owners: Box<[EndpointIdx]>,
    /// Distinct owners.
    distinct: u32,
    key_point: KeyPoint,
    bound: Option<Bound>,
    empty: PickError,
}

// === impl RingPicker ===

impl RingPicker {
    /// A ring from `points` in the order they were put on it.
    pub(crate) fn new(
        mut points: Vec<(u32, EndpointIdx)>,
        collision: Collision,
        key_point: KeyPoint,
        bound: Option<Bound>,
        snapshot: &Arc<Snapshot>,
    ) -> Self {
        // Stable: points that collide stay in the order they were put on the ring.
        points.sort_by_key(|&(h, _)| h);
        let mut hashes: Vec<u32> = Vec::with_capacity(points.len());
        let mut owners: Vec<EndpointIdx> = Vec::with_capacity(points.len());
        for (h, owner) in points {
            if hashes.last() == Some(&h) {
                if let (Collision::KeepLast, Some(last)) = (collision, owners.last_mut()) {
                    *last = owner;
                }
            } else {
                hashes.push(h);
                owners.push(owner);
            }
        }
        let mut seen = vec![false; snapshot.len()];
        let distinct = owners
            .iter()
            .filter(|o| !std::mem::replace(&mut seen[o.get()], true))
            .count();
        RingPicker {
            hashes: hashes.into_boxed_slice(),
            owners: owners.into_boxed_slice(),
            distinct: u32::try_from(distinct).unwrap_or(u32::MAX),
            key_point,
            bound,
            empty: snapshot.empty_error(),
        }
    }

    /// Number of points on the ring (after de-duplication).
    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    /// Whether the ring has no points (no eligible endpoint).
    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }

    /// The points in ascending order with their owners.
    pub fn points(&self) -> impl Iterator<Item = (u32, EndpointIdx)> + '_ {
        self.hashes.iter().copied().zip(self.owners.iter().copied())
    }

    /// The owner of the first point at or after `point`, wrapping to the first point (Dubbo's
    /// `TreeMap.ceilingEntry`, nginx's `ngx_http_upstream_find_chash_point`).
    ///
    /// # Complexity
    /// O(log P) binary search over the points.
    pub fn owner_at(&self, point: u32) -> Option<EndpointIdx> {
        self.owners.get(self.position(point)).copied()
    }

    #[inline]
    fn position(&self, point: u32) -> usize {
        let i = self.hashes.partition_point(|&h| h < point);
        if i == self.hashes.len() {
            0
        } else {
            i
        }
    }

    #[inline]
    fn key_point(&self, cx: &mut PickContext<'_>) -> u32 {
        match (cx.key, self.key_point) {
            (Some(key), KeyPoint::Md5) => consistent::key_point(key),
            (Some(key), KeyPoint::Crc32) => ketama::key_point(key),
            // The low 32 bits of the caller's 64-bit hash, or of a random draw.
            (None, _) => fallback_hash(cx) as u32,
        }
    }

    /// Share of the 32-bit key space that lands on `idx`'s points, and its number of points.
    fn arc_of(&self, idx: EndpointIdx) -> (f64, usize) {
        let mut prev = self.hashes.last().copied().unwrap_or(0);
        let mut arc = 0u64;
        let mut points = 0;
        for (h, owner) in self.points() {
            if owner == idx {
                arc += u64::from(h.wrapping_sub(prev));
                points += 1;
            }
            prev = h;
        }
        if self.hashes.len() == 1 {
            arc = 1 << 32;
        }
        (arc as f64 / (1u64 << 32) as f64, points)
    }
}

impl Picker for RingPicker {
    #[inline]
    fn pick(&self, cx: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> {
        if self.hashes.is_empty() {
            return Err(self.empty);
        }
        let point = self.key_point(cx);
        let start = self.position(point);
        let first = self.owners[start];
        if cx.probe == 0 && self.bound.as_ref().is_none_or(|b| b.is_idle(first)) {
            return Ok(first);
        }
        Ok(walk_cyclic(
            &self.owners,
            start,
            cx.probe,
            self.distinct,
            self.bound.as_ref(),
        ))
    }

    fn explain(&self, idx: EndpointIdx, _now: Timestamp) -> Option<String> {
        let (share, points) = self.arc_of(idx);
        (points > 0).then(|| {
            format!(
                "{points} of {} ring points, {:.2}% of the key space",
                self.len(),
                share * 100.0
            )
        })
    }
}
