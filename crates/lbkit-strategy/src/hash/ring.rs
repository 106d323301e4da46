//! The sorted hash ring shared by `consistent-hash` (Dubbo's MD5 layout) and `ketama` (nginx's
//! CRC32 layout): 32-bit points in ascending order, each owned by an endpoint.
//!
//! **What a change costs**: the points are cut into chunks of about [`CHUNK`], the chunks
//! gathered in groups of about [`GROUP`], and the points owned by slots, not snapshot indices,
//! so the ring of the next snapshot shares every group no point lands in or leaves, and in the
//! groups it makes again every chunk no point lands in or leaves
//! ([`patch`](RingPicker::patch)). A change of k endpoints with v points each hashes those k
//! (the ones that go, to find their points, and the ones that come), makes at most 2kv chunks
//! again (a chunk without shared points is spliced: its runs copied whole between the edits;
//! one with shared points is merged point by point, the collision rule settling each), renumbers
//! the O(n) slot table in one pass from [`diff::carried`](lbkit_core::diff::carried), copies the
//! O(P / (CHUNK · GROUP)) group list, and shares the O(kv · GROUP) chunks beside the remade
//! ones: one reference count for each shared group or chunk, where one for every chunk cost
//! most of a patch. At 10 000 endpoints what is left is mostly memory: the chunks a change
//! lands in, and the reference counts of the groups shared and dropped. A pick finds its group
//! through a radix index of the groups' first points (about one group a bucket of the 32-bit
//! space; a plain search for rings of up to 8 groups), then searches a group's chunks' first
//! points and one chunk: 0.53–0.79× the pick of a binary search over every group at 1 000
//! and 10 000 endpoints (the index is remade with each patch, O(groups + buckets)).
//!
//! **Changes faster than the rebuild interval** (`rebuild_interval_ms`, off unless set): a
//! change within the interval of the last build or full patch ("splice") shares the spliced ring's
//! points whole and makes only a slot table, O(n): the points of endpoints gone, down or
//! drained stay, walked past by picks (nginx's walk past a down server's points), and new
//! endpoints wait. The balancer's first tick (or publish) from the interval's end patches the
//! spliced ring with every change since in one splice (`pending.rs` has the rules). A change held costs
//! 0.18 ms at the ketama cap (10 000 endpoints at weight 100), where a patch remakes about
//! 3 200 chunks and groups (4.3 ms on the same machine); a splice of k changes costs about k
//! patches while they share few chunks (ten: 33 ms) and less once they do (25: 2.6 ms a
//! change), so under steady churn a long interval is what saves work (BENCHMARKS.md, "Hash
//! rings under churn: changes held between splices").
//! BENCHMARKS.md ("What a change costs a strategy", "Hash rings under churn: chunks in
//! groups", "Ring picks: a radix index of the groups") has the figures.

mod firsts;
mod patch;
mod pending;

use std::ops::Range;
use std::sync::Arc;

use lbkit_core::{EndpointIdx, PickContext, PickError, Picker, Snapshot, Timestamp};

use self::firsts::Firsts;
pub(crate) use self::pending::Next;
use self::pending::Spliced;
use super::bounded::Bound;
use super::walk::walk_cyclic;
use super::{consistent, fallback_hash, ketama};

/// Points a rebuild puts in one chunk; a chunk merged again splits above twice as many.
pub(crate) const CHUNK: usize = 64;

/// Chunks a rebuild puts in one group; a group made again splits above twice as many.
pub(crate) const GROUP: usize = 16;

/// Chunks a group holds at most.
const MAX_GROUP: usize = 2 * GROUP;

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

/// An endpoint's place in a ring's tables, kept while it stays on the ring (its index in the
/// snapshot may move as others come and go).
type Slot = u32;

/// A point and the slot that owns it.
type Point = (u32, Slot);

/// A point's place: group, chunk in the group, offset in the chunk.
type At = (usize, usize, usize);

/// The slot of an endpoint off the ring.
const NO_SLOT: Slot = Slot::MAX;

/// The endpoint of a slot whose points wait for the next splice to leave the ring (see
/// `pending.rs`): picks walk past them. Never an endpoint's index (a snapshot holds fewer).
#[inline]
fn dead() -> EndpointIdx {
    EndpointIdx::new(u32::MAX as usize)
}

/// Prepared ring of [`ConsistentHash`](super::ConsistentHash) or [`Ketama`](super::Ketama).
///
/// Built over the eligible endpoints of one snapshot (or, while changes are held, over those of
/// the last snapshot spliced, the ones now gone marked dead); immutable after prepare. The next
/// snapshot's ring is patched from it and shares its unchanged chunks (see the module's
/// "What a change costs"); within the rebuild interval of the last patch, it shares all of
/// them and walks past the points of the endpoints gone (see
/// [`ConsistentHash::with_rebuild_interval`](super::ConsistentHash::with_rebuild_interval)).
#[derive(Debug)]
pub struct RingPicker {
    /// First point of each group, ascending, with their index.
    firsts: Firsts,
    /// The points in ascending order, no duplicates, cut into non-empty chunks gathered in
    /// non-empty groups.
    groups: Arc<[Arc<Group>]>,
    /// Chunks in all groups.
    chunks: usize,
    /// Each slot's endpoint (a slot on the free list: whichever it held last, never read), or
    /// [`dead`] for a slot whose points wait for the next splice to leave.
    endpoint: Box<[EndpointIdx]>,
    /// Each endpoint's slot, `NO_SLOT` for an endpoint off the ring (or waiting to join it).
    slot: Box<[Slot]>,
    /// Slots no endpoint holds, for endpoints to come (empty while changes are pending).
    free: Box<[Slot]>,
    /// Points each slot holds on the ring (a patch's count of distinct owners; empty while
    /// changes are pending).
    counts: Box<[u32]>,
    /// Points on the ring, the dead slots' included.
    stored: usize,
    /// Points on the ring of slots that are not dead: the ring picks see.
    live: usize,
    /// Distinct owners, dead slots left out.
    distinct: u32,
    /// When the ring was last spliced, what it waits for, and when it asks to be spliced.
    splice: Splice,
    collision: Collision,
    key_point: KeyPoint,
    bound: Option<Bound>,
    empty: PickError,
}

/// When a ring was last spliced (built, or patched with every change), and for a ring with
/// changes pending, the one spliced then and when the next splice is due.
#[derive(Debug, Clone, Default)]
struct Splice {
    at: Timestamp,
    /// The last ring spliced and its snapshot (`None`: this ring is spliced, none pending).
    last: Option<Arc<Spliced>>,
    /// When the pending changes ask to be spliced ([`Picker::refresh_at`]).
    due: Option<Timestamp>,
}

/// A run of the ring's chunks, shared whole by the rings that changed none of its points.
/// The chunks' first points, counts and handles are kept in the group's own memory, so a pick
/// reads the group, then one chunk.
#[derive(Debug)]
struct Group {
    /// Chunks in the group, at least 1 and at most [`MAX_GROUP`].
    len: usize,
    /// First point of each chunk, ascending (the first `len`).
    first: [u32; MAX_GROUP],
    /// How many of each chunk's points are on the ring; the rest are its shadowed points.
    main: [u32; MAX_GROUP],
    /// Each chunk (the first `len`): its points on the ring, ascending; then, by point then
    /// slot, the points that lost a collision to one of them (what a patch puts back when the
    /// holder leaves).
    chunk: [Option<Arc<[Point]>>; MAX_GROUP],
}

/// Chunks in the making: a group's, or a ring's before it is cut into groups.
#[derive(Default)]
struct Chunks {
    firsts: Vec<u32>,
    mains: Vec<u32>,
    chunks: Vec<Arc<[Point]>>,
}

// === impl Group ===

impl Group {
    /// Chunks in the group.
    #[inline]
    fn len(&self) -> usize {
        self.len
    }

    /// First point of each chunk.
    #[inline]
    fn firsts(&self) -> &[u32] {
        &self.first[..self.len]
    }

    /// How many of each chunk's points are on the ring.
    #[inline]
    fn lens(&self) -> &[u32] {
        &self.main[..self.len]
    }

    /// Chunk `c`: its points on the ring, then its shadowed points.
    #[inline]
    fn chunk(&self, c: usize) -> &[Point] {
        self.chunk[c].as_deref().unwrap_or(&[])
    }

    /// Chunk `c`'s points on the ring.
    #[inline]
    fn main(&self, c: usize) -> &[Point] {
        &self.chunk(c)[..self.main[c] as usize]
    }

    /// Each chunk's points on the ring, in order.
    fn mains(&self) -> impl Iterator<Item = &[Point]> + '_ {
        (0..self.len).map(|c| self.main(c))
    }
}

// === impl Chunks ===

impl Chunks {
    /// Share `group`'s chunks in `range`.
    fn share(&mut self, group: &Group, range: Range<usize>) {
        self.firsts
            .extend_from_slice(&group.firsts()[range.clone()]);
        self.mains.extend_from_slice(&group.lens()[range.clone()]);
        self.chunks
            .extend(group.chunk[range].iter().flatten().cloned());
    }

    /// Add chunks made again: `(first point, points on the ring, chunk)`.
    fn push(&mut self, chunks: impl Iterator<Item = (u32, u32, Arc<[Point]>)>) {
        for (first, main, chunk) in chunks {
            self.firsts.push(first);
            self.mains.push(main);
            self.chunks.push(chunk);
        }
    }

    /// Forget every chunk, keeping the memory for the next group.
    fn clear(&mut self) {
        self.firsts.clear();
        self.mains.clear();
        self.chunks.clear();
    }

    /// The chunks as one group when there are at most `whole` (none when there are none), else
    /// cut into groups of [`GROUP`]; the chunks leave `self`. `whole` is at most [`MAX_GROUP`].
    fn drain_groups(&mut self, whole: usize) -> impl Iterator<Item = Group> + '_ {
        debug_assert!(whole <= MAX_GROUP);
        let n = self.chunks.len();
        let size = if n <= whole { n.max(1) } else { GROUP };
        let Chunks {
            firsts,
            mains,
            chunks,
        } = self;
        let mut chunks = chunks.drain(..);
        (0..n).step_by(size).map(move |at| {
            let end = n.min(at + size);
            let (mut first, mut main) = ([0; MAX_GROUP], [0; MAX_GROUP]);
            first[..end - at].copy_from_slice(&firsts[at..end]);
            main[..end - at].copy_from_slice(&mains[at..end]);
            let mut taken = chunks.by_ref().take(end - at);
            Group {
                len: end - at,
                first,
                main,
                chunk: std::array::from_fn(|_| taken.next()),
            }
        })
    }
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

/// Points in ascending order, made into a run of a ring one at a time: one owner per point by
/// the collision rule, the others shadowed.
struct Builder<'a> {
    points: Vec<Point>,
    shadowed: Vec<Point>,
    collision: Collision,
    endpoint: &'a [EndpointIdx],
}

impl<'a> Builder<'a> {
    fn new(points: usize, collision: Collision, endpoint: &'a [EndpointIdx]) -> Self {
        Builder {
            points: Vec::with_capacity(points),
            shadowed: Vec::new(),
            collision,
            endpoint,
        }
    }

    /// Put a point at or after the last one put.
    #[inline]
    fn push(&mut self, (h, owner): Point) {
        match self.points.last_mut() {
            Some((last, held)) if *last == h => {
                let idx = |s: Slot| self.endpoint[s as usize];
                let lost = if self.collision.takes(idx(*held), idx(owner)) {
                    std::mem::replace(held, owner)
                } else {
                    owner
                };
                self.shadowed.push((h, lost));
            }
            _ => self.points.push((h, owner)),
        }
    }

    /// The points as one chunk (none when there are none) with their shadowed points:
    /// `(first point, points on the ring, chunk)`.
    fn whole(self) -> impl Iterator<Item = (u32, u32, Arc<[Point]>)> {
        let (first, main) = (self.points.first().map(|p| p.0), self.points.len() as u32);
        let mut chunk = self.points;
        let mut shadowed = self.shadowed;
        shadowed.sort_unstable();
        chunk.extend(shadowed);
        first
            .map(|first| (first, main, Arc::from(chunk)))
            .into_iter()
    }

    /// The points, cut into chunks of `CHUNK` with their shadowed points: `(first point,
    /// points on the ring, chunk)`.
    fn cut(mut self) -> impl Iterator<Item = (u32, u32, Arc<[Point]>)> {
        self.shadowed.sort_unstable();
        let mut shadowed = self.shadowed.into_iter().peekable();
        let points = self.points;
        (0..points.len()).step_by(CHUNK).map(move |at| {
            let main = &points[at..points.len().min(at + CHUNK)];
            let last = main[main.len() - 1].0;
            let mut chunk = main.to_vec();
            while let Some(p) = shadowed.next_if(|&(h, _)| h <= last) {
                chunk.push(p);
            }
            (main[0].0, main.len() as u32, Arc::from(chunk))
        })
    }
}

/// Points each of `slots` slots holds among `points`.
fn counts(points: &[Point], slots: usize) -> Box<[u32]> {
    let mut counts = vec![0; slots];
    for &(_, s) in points {
        counts[s as usize] += 1;
    }
    counts.into()
}

/// Slots that hold a point.
fn distinct(counts: &[u32]) -> u32 {
    u32::try_from(counts.iter().filter(|&&n| n > 0).count()).unwrap_or(u32::MAX)
}

// === impl RingPicker ===

impl RingPicker {
    /// A ring from `points` (any order; the collision rule decides who keeps a shared point),
    /// spliced at `now`.
    pub(crate) fn new(
        points: Vec<(u32, EndpointIdx)>,
        (collision, key_point): (Collision, KeyPoint),
        bound: Option<Bound>,
        snapshot: &Arc<Snapshot>,
        now: Timestamp,
    ) -> Self {
        let endpoint: Box<[EndpointIdx]> = snapshot.eligible().into();
        let mut slot = vec![NO_SLOT; snapshot.len()];
        for (s, e) in endpoint.iter().enumerate() {
            slot[e.get()] = s as Slot;
        }
        let mut points: Vec<Point> = points
            .into_iter()
            .map(|(h, e)| (h, slot[e.get()]))
            .collect();
        points.sort_unstable();
        let mut ring = Builder::new(points.len(), collision, &endpoint);
        for p in points {
            ring.push(p);
        }
        let counts = counts(&ring.points, endpoint.len());
        let len = ring.points.len();
        let mut chunks = Chunks::default();
        chunks.push(ring.cut());
        let chunks_len = chunks.chunks.len();
        let groups: Vec<Group> = chunks.drain_groups(GROUP).collect();
        RingPicker {
            firsts: Firsts::new(groups.iter().map(|g| g.first[0]).collect()),
            groups: groups.into_iter().map(Arc::new).collect(),
            chunks: chunks_len,
            distinct: distinct(&counts),
            endpoint,
            slot: slot.into(),
            free: Box::new([]),
            counts,
            stored: len,
            live: len,
            splice: Splice {
                at: now,
                ..Splice::default()
            },
            collision,
            key_point,
            bound,
            empty: snapshot.empty_error(),
        }
    }

    /// Number of points on the ring (after de-duplication), not counting those of endpoints
    /// gone that wait for the next splice to leave it.
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether the ring has no points (no eligible endpoint).
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// The points in ascending order with their owners.
    pub fn points(&self) -> impl Iterator<Item = (u32, EndpointIdx)> + '_ {
        self.groups
            .iter()
            .flat_map(|g| g.mains())
            .flatten()
            .map(|&(h, s)| (h, self.endpoint[s as usize]))
            .filter(|&(_, e)| e != dead())
    }

    /// The owner of the first point at or after `point`, wrapping to the first point (Dubbo's
    /// `TreeMap.ceilingEntry`, nginx's `ngx_http_upstream_find_chash_point`).
    ///
    /// # Complexity
    /// O(log P) at worst; the group found in O(1) expected up to 65 536 groups (a read of the
    /// groups' radix index and a search of the first points in one bucket), then a search over
    /// a group's chunks' first points and one over one chunk.
    pub fn owner_at(&self, point: u32) -> Option<EndpointIdx> {
        if self.is_empty() {
            return None;
        }
        let at = self.position(point);
        Some(self.owner(at))
            .filter(|&e| e != dead())
            .or_else(|| self.clockwise(at).next())
    }

    /// Group, chunk and offset of the first point at or after `point`, wrapping to the first
    /// point. The ring is not empty.
    #[inline]
    fn position(&self, point: u32) -> At {
        let g = self.firsts.below(point);
        if let Some(before) = g.checked_sub(1) {
            let group = &self.groups[before];
            // At least 1: the group's first chunk starts at the group's first point.
            let c = group.firsts().partition_point(|&f| f < point);
            debug_assert!(c > 0, "a group's first point is the ring's group first");
            let prev = c.saturating_sub(1);
            let main = group.main(prev);
            let i = main.partition_point(|&(h, _)| h < point);
            if i < main.len() {
                return (before, prev, i);
            }
            if c < group.len() {
                return (before, c, 0);
            }
        }
        (if g == self.groups.len() { 0 } else { g }, 0, 0)
    }

    /// The owner of the point at `(g, c, i)`: [`dead`] for a point waiting to leave.
    #[inline]
    fn owner(&self, (g, c, i): At) -> EndpointIdx {
        self.endpoint[self.groups[g].chunk(c)[i].1 as usize]
    }

    /// The owners clockwise from `(g, c, i)`, once around, past the points waiting to leave.
    fn clockwise(&self, (g, c, i): At) -> impl Iterator<Item = EndpointIdx> + '_ {
        let group = &self.groups[g];
        let here = group.main(c);
        let rest = (c + 1..group.len()).map(move |c| group.main(c));
        let others = (g + 1..self.groups.len())
            .chain(0..g)
            .flat_map(|g| self.groups[g].mains());
        let start = (0..c).map(move |c| group.main(c));
        here[i..]
            .iter()
            .chain(rest.chain(others).chain(start).flatten())
            .chain(&here[..i])
            .map(|&(_, s)| self.endpoint[s as usize])
            .filter(|&e| e != dead())
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
        let mut prev = self.points().last().map_or(0, |(h, _)| h);
        let mut arc = 0u64;
        let mut points = 0;
        for (h, owner) in self.points() {
            if owner == idx {
                arc += u64::from(h.wrapping_sub(prev));
                points += 1;
            }
            prev = h;
        }
        if self.live == 1 {
            arc = 1 << 32;
        }
        (arc as f64 / (1u64 << 32) as f64, points)
    }
}

impl Picker for RingPicker {
    #[inline]
    fn pick(&self, cx: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> {
        if self.is_empty() {
            return Err(self.empty);
        }
        let point = self.key_point(cx);
        let at = self.position(point);
        let first = self.owner(at);
        if cx.probe == 0 && first != dead() && self.bound.as_ref().is_none_or(|b| b.is_idle(first))
        {
            return Ok(first);
        }
        // A dead owner: the first live one clockwise (there is one: the ring is not empty).
        let live = Some(first).filter(|&e| e != dead());
        let Some(first) = live.or_else(|| self.clockwise(at).next()) else {
            return Err(self.empty);
        };
        Ok(walk_cyclic(
            || self.clockwise(at),
            first,
            cx.probe,
            self.distinct,
            self.bound.as_ref(),
        ))
    }

    fn refresh_at(&self) -> Option<Timestamp> {
        self.splice.due
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
mod tests;
