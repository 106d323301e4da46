//! The ring of the next snapshot from the last one's: the slots renumbered, the groups and
//! chunks no point lands in or leaves shared, the others made again.

use std::ops::Range;
use std::sync::Arc;

use lbkit_core::{diff, EndpointIdx, Snapshot};

use super::firsts::Firsts;
use super::{
    distinct, Builder, Chunks, Group, Point, RingPicker, Slot, Splice, CHUNK, GROUP, NO_SLOT,
};
use crate::hash::bounded::Bound;

/// Puts an endpoint's points (an endpoint of the snapshot given).
pub(crate) type Put<'a> = &'a dyn Fn(&Snapshot, EndpointIdx, &mut Vec<(u32, EndpointIdx)>);

/// The groups of the next ring, shared or made again, with its counts of chunks and points.
struct Merged {
    /// First point of each group: copied for the groups shared (reading them would touch every
    /// group's memory), read for the groups made again.
    firsts: Vec<u32>,
    groups: Vec<Arc<Group>>,
    chunks: usize,
    len: usize,
}

// === impl Merged ===

impl Merged {
    /// Share `ring`'s groups in `range`.
    fn share(&mut self, ring: &RingPicker, range: Range<usize>) {
        self.firsts.extend_from_slice(&ring.firsts[range.clone()]);
        self.groups.extend_from_slice(&ring.groups[range]);
    }

    /// Put `chunks` (group `old`'s made again) in place of group `old`; they leave `chunks`.
    fn replace(&mut self, old: &Group, chunks: &mut Chunks) {
        self.chunks = self.chunks + chunks.chunks.len() - old.len();
        for group in chunks.drain_groups(2 * GROUP) {
            self.firsts.push(group.first[0]);
            self.groups.push(Arc::new(group));
        }
    }
}

/// Memory a patch reuses from one group it makes again to the next.
#[derive(Default)]
struct Scratch {
    /// A chunk's points spliced.
    points: Vec<Point>,
    /// The group's chunks.
    chunks: Chunks,
}

/// The slot tables of the next ring, and the endpoints whose points go and come.
struct Slots {
    endpoint: Vec<EndpointIdx>,
    slot: Vec<Slot>,
    free: Vec<Slot>,
    /// The last snapshot's endpoints on the ring that leave it: their points go.
    gone: Vec<EndpointIdx>,
    /// The snapshot's eligible endpoints not on the last ring: their points are to be made.
    fresh: Vec<EndpointIdx>,
}

// === impl Slots ===

impl Slots {
    /// `ring`'s slots renumbered for `snapshot`: an endpoint on the ring keeps its slot when
    /// `carried` (one item for each of the last snapshot's endpoints, as [`diff::carried`]
    /// gives them) pairs it with an eligible endpoint of `snapshot` (the same object), and its
    /// points stay; the others leave it. `snapshot`'s other eligible
    /// endpoints take free slots (not the ones freed now, whose points are still to be found by
    /// slot) or new ones. The endpoints that stay keep their order (`carried` walks both sets
    /// forward), so who keeps a point two of them share does not change. One pass over the
    /// ring's slots, one over the eligible endpoints.
    fn next(
        ring: &RingPicker,
        snapshot: &Snapshot,
        carried: impl Iterator<Item = Option<usize>>,
    ) -> Slots {
        let mut endpoint = ring.endpoint.to_vec();
        let mut slot = vec![NO_SLOT; snapshot.len()];
        let (mut freed, mut gone) = (Vec::new(), Vec::new());
        let on_ring = ring.slot.iter().zip(carried).enumerate();
        for (o, (&s, now)) in on_ring.filter(|&(_, (&s, _))| s != NO_SLOT) {
            let now = now.map(EndpointIdx::new);
            match now.filter(|&n| snapshot.is_eligible(n)) {
                Some(n) => {
                    endpoint[s as usize] = n;
                    slot[n.get()] = s;
                }
                None => {
                    freed.push(s);
                    gone.push(EndpointIdx::new(o));
                }
            }
        }
        let eligible = snapshot.eligible().iter().copied();
        let fresh: Vec<EndpointIdx> = eligible.filter(|e| slot[e.get()] == NO_SLOT).collect();
        let mut free = ring.free.to_vec();
        for &e in &fresh {
            let s = free.pop().unwrap_or_else(|| {
                endpoint.push(e);
                (endpoint.len() - 1) as Slot
            });
            endpoint[s as usize] = e;
            slot[e.get()] = s;
        }
        free.extend(freed);
        Slots {
            endpoint,
            slot,
            free,
            gone,
            fresh,
        }
    }
}

impl RingPicker {
    /// The ring of `snapshot` from this one, the ring the same strategy prepared for `last`;
    /// `put` puts an endpoint's points. Equal to a rebuild (the same points and owners; see the
    /// module's "What a change costs"). `None` when a rebuild is due: the two sets cannot be
    /// matched ([`diff::carried`]), more than half of the eligible endpoints are new (a rebuild
    /// then costs about as much), the ring is empty, `last` is not the size of the snapshot
    /// this ring was made for, or patches left more than twice the chunks or groups a rebuild
    /// makes (plus 16).
    pub(crate) fn patch(
        &self,
        last: &Snapshot,
        snapshot: &Arc<Snapshot>,
        put: Put<'_>,
        bound: Option<Bound>,
    ) -> Option<RingPicker> {
        let d = diff::between(last.endpoints(), snapshot.endpoints(), None)?;
        let carried = d.pairs(last.len(), snapshot.len());
        let most_fresh = snapshot.eligible().len() / 2;
        self.patch_all(carried, most_fresh, last, snapshot, put, bound)
            .filter(RingPicker::compact)
    }

    /// [`patch`](Self::patch) with `carried` ([`diff::carried`] of `last` and `snapshot`, an
    /// item for each endpoint of `last`), however scattered the patch leaves the ring. `None`
    /// when more than `most_fresh` endpoints are new, or the ring is empty, was not `last`'s or
    /// has changes pending (patch the ring they wait on instead). The ring made is spliced at
    /// [`Timestamp::ZERO`](lbkit_core::Timestamp::ZERO): the caller says when.
    pub(super) fn patch_all(
        &self,
        carried: impl IntoIterator<Item = Option<usize>>,
        most_fresh: usize,
        last: &Snapshot,
        snapshot: &Arc<Snapshot>,
        put: Put<'_>,
        bound: Option<Bound>,
    ) -> Option<RingPicker> {
        if self.is_empty() || self.slot.len() != last.len() || self.splice.last.is_some() {
            return None;
        }
        let slots = Slots::next(self, snapshot, carried.into_iter());
        if slots.fresh.len() > most_fresh {
            return None;
        }
        let removed = points_of(last, slots.gone.iter().copied(), &self.slot, put);
        let added = points_of(snapshot, slots.fresh.iter().copied(), &slots.slot, put);
        let mut counts = self.counts.to_vec();
        counts.resize(slots.endpoint.len(), 0);
        let merged = self.merge(&removed, &added, &slots.endpoint, &mut counts)?;
        Some(RingPicker {
            firsts: Firsts::new(merged.firsts),
            groups: merged.groups.into(),
            chunks: merged.chunks,
            distinct: distinct(&counts),
            endpoint: slots.endpoint.into(),
            slot: slots.slot.into(),
            free: slots.free.into(),
            counts: counts.into(),
            stored: merged.len,
            live: merged.len,
            splice: Splice::default(),
            collision: self.collision,
            key_point: self.key_point,
            bound,
            empty: snapshot.empty_error(),
        })
    }

    /// Whether the ring has at most twice the chunks and groups a rebuild makes (plus 16):
    /// patches that leave it more scattered give way to a rebuild.
    pub(super) fn compact(&self) -> bool {
        let chunks = usize::div_ceil(self.stored, CHUNK);
        self.chunks <= 2 * chunks + 16
            && self.groups.len() <= 2 * usize::div_ceil(chunks, GROUP) + 16
    }

    /// This ring's points less `removed`, plus `added` (both ascending), owned by the slots of
    /// `endpoint`: the groups and chunks an edit lands in are made again, the others shared.
    /// `counts` follows the points each slot holds. `None` when a removed point is not on the
    /// ring (the ring was not the last snapshot's: rebuild).
    fn merge(
        &self,
        removed: &[Point],
        added: &[Point],
        endpoint: &[EndpointIdx],
        counts: &mut [u32],
    ) -> Option<Merged> {
        let mut touched: Vec<(usize, usize)> = removed
            .iter()
            .chain(added)
            .map(|&(h, _)| self.chunk_of(h))
            .collect();
        touched.sort_unstable();
        touched.dedup();
        let mut out = Merged {
            firsts: Vec::with_capacity(self.groups.len() + 1),
            groups: Vec::with_capacity(self.groups.len() + 1),
            chunks: self.chunks,
            len: self.stored,
        };
        let edits = Edits {
            removed,
            added,
            endpoint,
        };
        let mut scratch = Scratch::default();
        let mut next = 0;
        for run in touched.chunk_by(|a, b| a.0 == b.0) {
            let g = run[0].0;
            out.share(self, next..g);
            let touched = run.iter().map(|&(_, c)| c);
            self.remake(g, touched, &edits, counts, &mut out, &mut scratch)?;
            out.replace(&self.groups[g], &mut scratch.chunks);
            next = g + 1;
        }
        out.share(self, next..self.groups.len());
        Some(out)
    }

    /// Group and chunk that answer for point `h`: the last chunk whose first point is at or
    /// before it, else the first chunk.
    fn chunk_of(&self, h: u32) -> (usize, usize) {
        let g = self.firsts.partition_point(|&f| f <= h).saturating_sub(1);
        let firsts = self.groups[g].firsts();
        (g, firsts.partition_point(|&f| f <= h).saturating_sub(1))
    }

    /// Group `g`'s chunks into `scratch.chunks`: the `touched` ones (ascending) merged again
    /// with their edits, the others shared; `out.len` follows the points on the ring.
    fn remake(
        &self,
        g: usize,
        touched: impl Iterator<Item = usize>,
        edits: &Edits<'_>,
        counts: &mut [u32],
        out: &mut Merged,
        scratch: &mut Scratch,
    ) -> Option<()> {
        let group = &self.groups[g];
        let Scratch { points, chunks } = scratch;
        chunks.clear();
        let mut next = 0;
        for c in touched {
            chunks.share(group, next..c);
            let range = self.range(g, c);
            let removed = &edits.removed[within(edits.removed, &range)];
            let added = &edits.added[within(edits.added, &range)];
            let main = group.lens()[c] as usize;
            if main == group.chunk(c).len() && splice(group.main(c), removed, added, points) {
                recount(removed, added, counts);
                out.len = out.len + points.len() - main;
                chunks.push(pieces(points));
            } else {
                let ring = self.remerge(group, c, removed, added, edits.endpoint, counts)?;
                out.len = out.len + ring.points.len() - main;
                if one_chunk(ring.points.len()) {
                    chunks.push(ring.whole());
                } else {
                    chunks.push(ring.cut());
                }
            }
            next = c + 1;
        }
        chunks.share(group, next..group.len());
        Some(())
    }

    /// The points chunk `c` of group `g` answers for: from its first point (from 0 for the
    /// ring's first chunk) up to the next chunk's.
    fn range(&self, g: usize, c: usize) -> Range<u64> {
        let group = &self.groups[g];
        let lo = if g == 0 && c == 0 {
            0
        } else {
            u64::from(group.first[c])
        };
        let next = group.firsts().get(c + 1).or_else(|| self.firsts.get(g + 1));
        lo..next.map_or(1 << 32, |&f| u64::from(f))
    }

    /// Chunk `c` of `group`: its points and shadowed points, less `removed` and plus `added`
    /// (both ascending), settled again by the collision rule. Three sorted runs merged, no sort.
    fn remerge<'a>(
        &self,
        group: &Group,
        c: usize,
        removed: &[Point],
        added: &[Point],
        endpoint: &'a [EndpointIdx],
        counts: &mut [u32],
    ) -> Option<Builder<'a>> {
        let (main, shadowed) = group.chunk(c).split_at(group.lens()[c] as usize);
        for &(_, s) in main {
            counts[s as usize] = counts[s as usize].saturating_sub(1);
        }
        let mut ring = Builder::new(main.len() + added.len(), self.collision, endpoint);
        let mut gone = removed.iter().peekable();
        let kept = Merge::new(main, shadowed).filter(|p| gone.next_if_eq(p).is_none());
        for &p in Merge::new(kept, added) {
            ring.push(p);
        }
        if gone.peek().is_some() {
            return None;
        }
        for &(_, s) in &ring.points {
            counts[s as usize] += 1;
        }
        Some(ring)
    }
}

/// `main` (a chunk's points, none shadowed) less `removed`, plus `added` (all ascending), into
/// `out`: runs of `main` copied whole between the edits. `false` when the rule for shared
/// points could have work to do (an added point's hash is its neighbour's in `main` or `out`)
/// or a removed point is not in `main`: [`RingPicker::remerge`] settles those (a few chunks in
/// a hundred hold a collision at 10 000 endpoints).
fn splice(main: &[Point], removed: &[Point], added: &[Point], out: &mut Vec<Point>) -> bool {
    out.clear();
    let (mut r, mut a) = (removed.iter().peekable(), added.iter().peekable());
    let mut at = 0;
    loop {
        let (point, add) = match (r.peek(), a.peek()) {
            (Some(&&x), Some(&&y)) => (x.min(y), y < x),
            (Some(&&x), None) => (x, false),
            (None, Some(&&y)) => (y, true),
            (None, None) => break,
        };
        let pos = at + main[at..].partition_point(|p| *p < point);
        out.extend_from_slice(&main[at..pos]);
        let hash = |p: Option<&Point>| p.map(|p| p.0);
        if add {
            if hash(out.last()) == Some(point.0) || hash(main.get(pos)) == Some(point.0) {
                return false;
            }
            a.next();
            out.push(point);
            at = pos;
        } else {
            if main.get(pos) != Some(&point) {
                return false;
            }
            r.next();
            at = pos + 1;
        }
    }
    out.extend_from_slice(&main[at..]);
    true
}

/// `counts` after [`splice`]: each removed point's slot holds one point fewer, each added
/// point's one more.
fn recount(removed: &[Point], added: &[Point], counts: &mut [u32]) {
    for &(_, s) in removed {
        counts[s as usize] = counts[s as usize].saturating_sub(1);
    }
    for &(_, s) in added {
        counts[s as usize] += 1;
    }
}

/// Chunks of `points` (none shadowed) as a patch makes them: one when there are at most twice
/// [`CHUNK`] (none when there are none), else cut into chunks of `CHUNK`; `(first point,
/// points on the ring, chunk)`.
fn pieces(points: &[Point]) -> impl Iterator<Item = (u32, u32, Arc<[Point]>)> + '_ {
    let size = if one_chunk(points.len()) {
        points.len().max(1)
    } else {
        CHUNK
    };
    points
        .chunks(size)
        .map(|c| (c[0].0, c.len() as u32, Arc::from(c)))
}

/// Whether a chunk made again with `points` points on the ring stays one chunk (up to twice
/// [`CHUNK`]), else it is cut into chunks of `CHUNK`.
fn one_chunk(points: usize) -> bool {
    points <= 2 * CHUNK
}

/// The points that go and come in a patch (each ascending), and the next ring's slots.
struct Edits<'a> {
    removed: &'a [Point],
    added: &'a [Point],
    endpoint: &'a [EndpointIdx],
}

/// The points of two ascending runs, ascending.
struct Merge<'a, A: Iterator<Item = &'a Point>> {
    a: std::iter::Peekable<A>,
    b: std::slice::Iter<'a, Point>,
    b_next: Option<&'a Point>,
}

impl<'a, A: Iterator<Item = &'a Point>> Merge<'a, A> {
    fn new(a: impl IntoIterator<IntoIter = A>, b: &'a [Point]) -> Self {
        let mut b = b.iter();
        let b_next = b.next();
        Merge {
            a: a.into_iter().peekable(),
            b,
            b_next,
        }
    }
}

impl<'a, A: Iterator<Item = &'a Point>> Iterator for Merge<'a, A> {
    type Item = &'a Point;

    #[inline]
    fn next(&mut self) -> Option<&'a Point> {
        match (self.a.peek(), self.b_next) {
            (Some(x), Some(y)) if y < *x => std::mem::replace(&mut self.b_next, self.b.next()),
            (Some(_), _) => self.a.next(),
            (None, _) => std::mem::replace(&mut self.b_next, self.b.next()),
        }
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
