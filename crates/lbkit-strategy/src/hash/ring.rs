//! The sorted hash ring shared by `consistent-hash` (Dubbo's MD5 layout) and `ketama` (nginx's
//! CRC32 layout): 32-bit points in ascending order, each owned by an endpoint.

use std::sync::Arc;

use lbkit_core::{diff, EndpointIdx, PickContext, PickError, Picker, Snapshot, Timestamp};

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
/// Built over the eligible endpoints of one snapshot; immutable after prepare. The next
/// snapshot's ring is patched from it ([`RingPicker::patch`]): O(P) to copy the points that
/// stay plus the hashing of the endpoints that came, instead of hashing and sorting all P.
#[derive(Debug)]
pub struct RingPicker {
    /// Points in ascending order, no duplicates.
    hashes: Box<[u32]>,
    /// Owner of each point.
    owners: Box<[EndpointIdx]>,
    /// Points that lost a collision to an owner in `owners`, by hash then owner: what a patch
    /// puts back when the winner leaves (a few hundred among millions of points).
    shadowed: Box<[(u32, EndpointIdx)]>,
    /// Distinct owners.
    distinct: u32,
    collision: Collision,
    key_point: KeyPoint,
    bound: Option<Bound>,
    empty: PickError,
}

// === impl Collision ===

impl Collision {
    /// Whether `put` takes a point `held` holds. Endpoints go on the ring in eligible order,
    /// ascending index, so "first put" is the lower index: the rule needs no order of arrival,
    /// and a patch settles a collision as a rebuild would.
    fn takes(self, held: EndpointIdx, put: EndpointIdx) -> bool {
        match self {
            Collision::KeepFirst => put < held,
            Collision::KeepLast => put > held,
        }
    }
}

/// Points in ascending order of hash, made into a ring one at a time.
struct Builder {
    hashes: Vec<u32>,
    owners: Vec<EndpointIdx>,
    shadowed: Vec<(u32, EndpointIdx)>,
    collision: Collision,
}

impl Builder {
    fn new(points: usize, collision: Collision) -> Self {
        Builder {
            hashes: Vec::with_capacity(points),
            owners: Vec::with_capacity(points),
            shadowed: Vec::new(),
            collision,
        }
    }

    /// Put a point at or after the last one put.
    #[inline]
    fn push(&mut self, h: u32, owner: EndpointIdx) {
        match (self.hashes.last(), self.owners.last_mut()) {
            (Some(&last), Some(held)) if last == h => {
                let lost = if self.collision.takes(*held, owner) {
                    std::mem::replace(held, owner)
                } else {
                    owner
                };
                self.shadowed.push((h, lost));
            }
            _ => {
                self.hashes.push(h);
                self.owners.push(owner);
            }
        }
    }

    fn finish(
        mut self,
        key_point: KeyPoint,
        bound: Option<Bound>,
        snapshot: &Arc<Snapshot>,
    ) -> RingPicker {
        let mut seen = vec![false; snapshot.len()];
        let distinct = self
            .owners
            .iter()
            .filter(|o| !std::mem::replace(&mut seen[o.get()], true))
            .count();
        self.shadowed.sort_unstable();
        RingPicker {
            hashes: self.hashes.into_boxed_slice(),
            owners: self.owners.into_boxed_slice(),
            shadowed: self.shadowed.into_boxed_slice(),
            distinct: u32::try_from(distinct).unwrap_or(u32::MAX),
            collision: self.collision,
            key_point,
            bound,
            empty: snapshot.empty_error(),
        }
    }
}

/// Each last index's index now (`None`: its points go), and the eligible endpoints whose
/// points are to be made.
pub(crate) type Carry = (Vec<Option<EndpointIdx>>, Vec<EndpointIdx>);

/// What the ring of `snapshot` keeps of the ring of `last`: for each endpoint of `last`, its
/// index in `snapshot` when it is the same object and eligible in both (its points stay, under
/// that index), and `snapshot`'s eligible endpoints not kept (their points are to be made).
/// `None` when the two sets cannot be matched ([`diff::carried`]) or more than half of the
/// eligible endpoints are new: a rebuild then costs about as much.
pub(crate) fn carry(last: &Snapshot, snapshot: &Snapshot) -> Option<Carry> {
    carry_all(last, snapshot).filter(|(_, fresh)| fresh.len() * 2 <= snapshot.eligible().len())
}

/// [`carry`], however much changed.
fn carry_all(last: &Snapshot, snapshot: &Snapshot) -> Option<Carry> {
    let carried = diff::carried(last.endpoints(), snapshot.endpoints())?;
    let mut kept = vec![false; snapshot.len()];
    let owners: Vec<Option<EndpointIdx>> = carried
        .iter()
        .enumerate()
        .map(|(o, now)| {
            let now = now.map(EndpointIdx::new);
            let stays = last.is_eligible(EndpointIdx::new(o));
            let n = now.filter(|&n| stays && snapshot.is_eligible(n))?;
            kept[n.get()] = true;
            Some(n)
        })
        .collect();
    let fresh: Vec<EndpointIdx> = snapshot
        .eligible()
        .iter()
        .copied()
        .filter(|i| !kept[i.get()])
        .collect();
    Some((owners, fresh))
}

// === impl RingPicker ===

impl RingPicker {
    /// A ring from `points` (any order; the collision rule decides who keeps a shared point).
    pub(crate) fn new(
        mut points: Vec<(u32, EndpointIdx)>,
        collision: Collision,
        key_point: KeyPoint,
        bound: Option<Bound>,
        snapshot: &Arc<Snapshot>,
    ) -> Self {
        points.sort_unstable();
        let mut ring = Builder::new(points.len(), collision);
        for (h, owner) in points {
            ring.push(h, owner);
        }
        ring.finish(key_point, bound, snapshot)
    }

    /// The ring of `snapshot` from this one (the ring of the snapshot before it, by the same
    /// strategy): `owners` maps each last index to its index now, or `None` when its points
    /// go ([`carry`]); `added` are the points of the endpoints that came (any order). Equal to
    /// [`new`](Self::new) over all of `snapshot`'s points. O(P + a log a) for P points kept and
    /// a added: one merge, no hashing of the endpoints that stay.
    pub(crate) fn patch(
        &self,
        owners: &[Option<EndpointIdx>],
        mut added: Vec<(u32, EndpointIdx)>,
        bound: Option<Bound>,
        snapshot: &Arc<Snapshot>,
    ) -> Self {
        let now = |o: EndpointIdx| owners.get(o.get()).copied().flatten();
        // A point shadowed here may win now that its holder left, or lose again: it goes
        // through the same collision rule as the points that came.
        added.extend(
            self.shadowed
                .iter()
                .filter_map(|&(h, o)| Some((h, now(o)?))),
        );
        added.sort_unstable();
        let mut ring = Builder::new(self.hashes.len() + added.len(), self.collision);
        let mut extra = added.into_iter().peekable();
        for (&h, &o) in self.hashes.iter().zip(self.owners.iter()) {
            while let Some((eh, eo)) = extra.next_if(|&(eh, _)| eh <= h) {
                ring.push(eh, eo);
            }
            if let Some(o) = now(o) {
                ring.push(h, o);
            }
        }
        for (h, o) in extra {
            ring.push(h, o);
        }
        ring.finish(self.key_point, bound, snapshot)
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

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use lbkit_core::{EndpointSpec, SnapshotBuilder};
    use proptest::prelude::*;

    use super::*;

    /// Four points per endpoint in a space of 16, so that endpoints collide all the time.
    fn points(snapshot: &Snapshot, idx: EndpointIdx, out: &mut Vec<(u32, EndpointIdx)>) {
        let port = snapshot.endpoint(idx).address().rsplit(':').next().unwrap();
        let port: u32 = port.parse().unwrap();
        out.extend((0..4).map(|i| ((port * 7 + i * 5) % 16, idx)));
    }

    fn ring(snapshot: &Arc<Snapshot>, collision: Collision) -> RingPicker {
        let mut all = Vec::new();
        for &idx in snapshot.eligible() {
            points(snapshot, idx, &mut all);
        }
        RingPicker::new(all, collision, KeyPoint::Md5, None, snapshot)
    }

    type Points = Vec<(u32, EndpointIdx)>;

    fn parts(r: &RingPicker) -> (Points, Points, u32) {
        (r.points().collect(), r.shadowed.to_vec(), r.distinct)
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            rng_seed: proptest::test_runner::RngSeed::Fixed(44),
            ..ProptestConfig::default()
        })]
        /// A chain of patches builds, set after set, the ring a rebuild builds: the same points,
        /// owners, shadowed points and distinct owners, under either collision rule, with
        /// endpoints coming, going, changing weight and health.
        #[test]
        fn patches_build_what_a_rebuild_builds(sets in proptest::collection::vec(proptest::collection::btree_map(0u32..24, (1u32..3, any::<bool>()), 0..16), 1..10), keep_first in any::<bool>()) {
            let collision = if keep_first { Collision::KeepFirst } else { Collision::KeepLast };
            let mut b = SnapshotBuilder::new();
            let mut last = b.apply(lbkit_core::Update::Reset(Vec::new()), Timestamp::ZERO);
            let mut patched = ring(&last, collision);
            for set in sets {
                let specs: Vec<EndpointSpec> = set
                    .iter()
                    .map(|(p, &(w, up))| {
                        EndpointSpec::new(format!("10.0.0.1:{}", 1000 + p)).with_weight(w).with_healthy(up)
                    })
                    .collect();
                let next = b.reset_from(specs.iter().map(Cow::Borrowed), Timestamp::ZERO);
                let (owners, fresh) = carry_all(&last, &next).expect("key order");
                let mut added = Vec::new();
                for idx in fresh {
                    points(&next, idx, &mut added);
                }
                patched = patched.patch(&owners, added, None, &next);
                prop_assert_eq!(parts(&patched), parts(&ring(&next, collision)));
                last = next;
            }
        }
    }
}
