//! The ring of the next snapshot from the last one's: the slots renumbered, the chunks no point
//! lands in or leaves shared, the others merged again.

use std::ops::Range;
use std::sync::Arc;

use lbkit_core::{EndpointIdx, Snapshot};

use super::{carry, distinct, Builder, Carry, Point, RingPicker, Slot, CHUNK, NO_SLOT};
use crate::hash::bounded::Bound;

/// Puts an endpoint's points (an endpoint of the snapshot given).
pub(crate) type Put<'a> = &'a dyn Fn(&Snapshot, EndpointIdx, &mut Vec<(u32, EndpointIdx)>);

/// The chunks of the next ring, shared or merged again.
#[derive(Default)]
struct Merged {
    /// First point of each chunk: copied for the chunks shared (reading them would touch every
    /// chunk's memory), read for the chunks merged.
    firsts: Vec<u32>,
    mains: Vec<u32>,
    chunks: Vec<Arc<[Point]>>,
}

// === impl Merged ===

impl Merged {
    /// Share `ring`'s chunks in `range`.
    fn share(&mut self, ring: &RingPicker, range: Range<usize>) {
        self.firsts.extend_from_slice(&ring.firsts[range.clone()]);
        self.mains.extend_from_slice(&ring.mains[range.clone()]);
        self.chunks.extend_from_slice(&ring.chunks[range]);
    }

    /// Add chunks merged again.
    fn push(&mut self, chunks: impl Iterator<Item = (u32, u32, Arc<[Point]>)>) {
        for (first, main, chunk) in chunks {
            self.firsts.push(first);
            self.mains.push(main);
            self.chunks.push(chunk);
        }
    }
}

/// The slot tables of the next ring.
struct Slots {
    endpoint: Vec<EndpointIdx>,
    slot: Vec<Slot>,
    free: Vec<Slot>,
}

// === impl Slots ===

impl Slots {
    /// `ring`'s slots renumbered by `owners`; `fresh` endpoints take free slots (not the ones
    /// freed now, whose points are still to be found by slot) or new ones.
    fn next(
        ring: &RingPicker,
        owners: &[Option<EndpointIdx>],
        fresh: &[EndpointIdx],
        len: usize,
    ) -> Slots {
        let mut endpoint = ring.endpoint.to_vec();
        let mut slot = vec![NO_SLOT; len];
        let mut gone = Vec::new();
        for (o, &s) in ring.slot.iter().enumerate().filter(|&(_, &s)| s != NO_SLOT) {
            match owners[o] {
                Some(n) => {
                    endpoint[s as usize] = n;
                    slot[n.get()] = s;
                }
                None => gone.push(s),
            }
        }
        let mut free = ring.free.to_vec();
        for &e in fresh {
            let s = free.pop().unwrap_or_else(|| {
                endpoint.push(e);
                (endpoint.len() - 1) as Slot
            });
            endpoint[s as usize] = e;
            slot[e.get()] = s;
        }
        free.extend(gone);
        Slots {
            endpoint,
            slot,
            free,
        }
    }
}

impl RingPicker {
    /// The ring of `snapshot` from this one, the ring the same strategy prepared for `last`;
    /// `put` puts an endpoint's points. Equal to a rebuild (the same points and owners; see the
    /// module's "What a change costs"). `None` when a rebuild is due: [`carry`] says so, the
    /// ring is empty, `last` is not the size of the snapshot this ring was made for, or patches
    /// left more than twice the chunks a rebuild makes (plus 16).
    pub(crate) fn patch(
        &self,
        last: &Snapshot,
        snapshot: &Arc<Snapshot>,
        put: Put<'_>,
        bound: Option<Bound>,
    ) -> Option<RingPicker> {
        self.patch_carried(carry(last, snapshot)?, last, snapshot, put, bound)
    }

    pub(super) fn patch_carried(
        &self,
        (owners, fresh): Carry,
        last: &Snapshot,
        snapshot: &Arc<Snapshot>,
        put: Put<'_>,
        bound: Option<Bound>,
    ) -> Option<RingPicker> {
        if self.is_empty() || self.slot.len() != last.len() || owners.len() != last.len() {
            return None;
        }
        let slots = Slots::next(self, &owners, &fresh, snapshot.len());
        let gone = (0..owners.len()).filter(|&o| owners[o].is_none() && self.slot[o] != NO_SLOT);
        let removed = points_of(last, gone.map(EndpointIdx::new), &self.slot, put);
        let added = points_of(snapshot, fresh.into_iter(), &slots.slot, put);
        let mut counts = self.counts.to_vec();
        counts.resize(slots.endpoint.len(), 0);
        let merged = self.merge(&removed, &added, &slots.endpoint, &mut counts)?;
        let len = merged.mains.iter().map(|&m| m as usize).sum();
        if merged.chunks.len() > 2 * usize::div_ceil(len, CHUNK) + 16 {
            return None;
        }
        Some(RingPicker {
            firsts: merged.firsts.into(),
            mains: merged.mains.into(),
            chunks: merged.chunks.into(),
            distinct: distinct(&counts),
            endpoint: slots.endpoint.into(),
            slot: slots.slot.into(),
            free: slots.free.into(),
            counts: counts.into(),
            len,
            collision: self.collision,
            key_point: self.key_point,
            bound,
            empty: snapshot.empty_error(),
        })
    }

    /// This ring's points less `removed`, plus `added` (both ascending), owned by the slots of
    /// `endpoint`: the chunks an edit lands in are merged again, the others shared. `counts`
    /// follows the points each slot holds. `None` when a removed point is not on the ring (the
    /// ring was not the last snapshot's: rebuild).
    fn merge(
        &self,
        removed: &[Point],
        added: &[Point],
        endpoint: &[EndpointIdx],
        counts: &mut [u32],
    ) -> Option<Merged> {
        let chunk_of = |h: u32| self.firsts.partition_point(|&f| f <= h).saturating_sub(1);
        let mut touched: Vec<usize> = removed
            .iter()
            .chain(added)
            .map(|&(h, _)| chunk_of(h))
            .collect();
        touched.sort_unstable();
        touched.dedup();
        let mut out = Merged::default();
        let mut next = 0;
        for &c in &touched {
            out.share(self, next..c);
            let range = self.range(c);
            let (removed, added) = (
                &removed[within(removed, &range)],
                &added[within(added, &range)],
            );
            let ring = self.remerge(c, removed, added, endpoint, counts)?;
            if ring.points.len() <= 2 * CHUNK {
                out.push(ring.whole());
            } else {
                out.push(ring.cut());
            }
            next = c + 1;
        }
        out.share(self, next..self.chunks.len());
        Some(out)
    }

    /// The points chunk `c` answers for: from its first point (from 0 for the first chunk) up
    /// to the next chunk's.
    fn range(&self, c: usize) -> Range<u64> {
        let lo = if c == 0 { 0 } else { u64::from(self.firsts[c]) };
        let hi = self.firsts.get(c + 1).map_or(1 << 32, |&f| u64::from(f));
        lo..hi
    }

    /// Chunk `c`'s points and shadowed points, less `removed` and plus `added`, settled again
    /// by the collision rule.
    fn remerge<'a>(
        &self,
        c: usize,
        removed: &[Point],
        added: &[Point],
        endpoint: &'a [EndpointIdx],
        counts: &mut [u32],
    ) -> Option<Builder<'a>> {
        let mut points: Vec<Point> = self.chunks[c].to_vec();
        for &(_, s) in self.main(c) {
            counts[s as usize] = counts[s as usize].saturating_sub(1);
        }
        for gone in removed {
            let at = points.iter().position(|p| p == gone)?;
            points.swap_remove(at);
        }
        points.extend_from_slice(added);
        points.sort_unstable();
        let mut ring = Builder::new(points.len(), self.collision, endpoint);
        for p in points {
            ring.push(p);
        }
        for &(_, s) in &ring.points {
            counts[s as usize] += 1;
        }
        Some(ring)
    }
}

/// The points `put` gives `endpoints` of `snapshot`, owned by their slots, ascending.
fn points_of(
    snapshot: &Snapshot,
    endpoints: impl Iterator<Item = EndpointIdx>,
    slot: &[Slot],
    put: Put<'_>,
) -> Vec<Point> {
    let mut points = Vec::new();
    for e in endpoints {
        put(snapshot, e, &mut points);
    }
    let mut points: Vec<Point> = points
        .into_iter()
        .map(|(h, e)| (h, slot[e.get()]))
        .collect();
    points.sort_unstable();
    points
}

/// The positions of `points` (ascending) inside `range`.
fn within(points: &[Point], range: &Range<u64>) -> Range<usize> {
    let at = |bound: u64| points.partition_point(|&(h, _)| u64::from(h) < bound);
    at(range.start)..at(range.end)
}
