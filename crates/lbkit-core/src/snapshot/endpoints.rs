//! [`Endpoints`]: a snapshot's endpoints, held in parts of about 64 that snapshots share.
//!
//! A registry's churn changes a few endpoints of thousands at a time. A snapshot that held its
//! endpoints in one array paid, per publish, a reference-count increment on every endpoint
//! (and a decrement when the old snapshot went), each a cache miss behind a locked
//! instruction: at 10 000 endpoints most of the cost of a change. Parts that no change falls
//! in are shared by reference instead, one count for 64 endpoints, and each part keeps what a
//! snapshot reads of its endpoints ([`Tally`], flags, statistics lines), read once when the
//! part is made. What is still O(n) per snapshot is sequential: the dense arrays a pick reads,
//! a few bytes an endpoint. A position is found in O(1) through two small tables (one entry per
//! part and one per 64 positions) that stay in cache, so looking an endpoint up costs the same
//! cache misses as in one array: its slot and the endpoint.

use std::fmt;
use std::iter::FusedIterator;
use std::ops::Index;
use std::sync::Arc;

use crate::endpoint::{Endpoint, EndpointKey, Weighing};
use crate::live::LiveStats;
use crate::snapshot::EndpointIdx;
use crate::time::Timestamp;

/// Endpoints in a part cut from a list.
const PART: usize = 64;
/// At most this many endpoints in a part.
const MAX_PART: usize = 128;
/// A part patched below this size joins the part before it when both fit in one.
const MIN_PART: usize = 16;
/// Positions per entry of the directory (`Endpoints::dir`), as a shift.
const DIR_SHIFT: u32 = 6;

/// A snapshot's endpoints, in source order: [`Snapshot::endpoints`](crate::Snapshot::endpoints)
/// and [`SnapshotBuilder::current`](crate::SnapshotBuilder::current). Indexed like a slice in
/// O(1); [`iter`](Self::iter) walks them in order. Cloning it is two reference counts, and a
/// [`SnapshotBuilder`](crate::SnapshotBuilder) that changes k of them shares every part no
/// change falls in with the last snapshot.
///
/// ```
/// use lbkit_core::{EndpointSpec, Snapshot, Timestamp};
/// let snap = Snapshot::from_specs(vec![EndpointSpec::new("a:1"), EndpointSpec::new("b:1")], Timestamp::ZERO);
/// let all = snap.endpoints();
/// assert_eq!(all.len(), 2);
/// assert_eq!(all[1].address(), "b:1");
/// assert_eq!(all.iter().map(|e| e.address()).collect::<Vec<_>>(), ["a:1", "b:1"]);
/// ```
#[derive(Clone)]
pub struct Endpoints {
    parts: Arc<[Part]>,
    /// Per part, the position of its first endpoint; then the number of endpoints.
    starts: Arc<[u32]>,
    /// Per 64 positions (`i >> DIR_SHIFT`), the part that holds the first of them: the part of
    /// position `i` is that one or one of the next 64.
    dir: Arc<[u32]>,
}

#[derive(Clone)]
struct Part {
    endpoints: Arc<[Endpoint]>,
    read: Arc<Read>,
}

/// What a part read of its endpoints when it was made.
struct Read {
    /// Per endpoint: [`Tally::WEIGHTED`] and [`Tally::SERVING`] (no ejection considered).
    flags: Box<[u8]>,
    live: Box<[&'static LiveStats]>,
    /// Per endpoint, what its effective weight is computed from.
    weighing: Box<[Weighing]>,
    tally: Tally,
}

/// What a snapshot counts of its endpoints, read once per endpoint.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tally {
    pub(crate) weighted: usize,
    pub(crate) serving: usize,
    pub(crate) unhealthy: usize,
    pub(crate) drained: usize,
    pub(crate) ejected: usize,
    pub(crate) tagged: usize,
    /// The end of the latest warm-up window of an endpoint with weight.
    pub(crate) warm_until: Timestamp,
    /// The lowest and highest priority.
    pub(crate) priorities: (u32, u32),
}

// === impl Tally ===

impl Tally {
    /// Weight above 0.
    pub(crate) const WEIGHTED: u8 = 1;
    /// Healthy, weight above 0 and not ejected.
    pub(crate) const SERVING: u8 = 2;

    pub(crate) const EMPTY: Tally = Tally {
        weighted: 0,
        serving: 0,
        unhealthy: 0,
        drained: 0,
        ejected: 0,
        tagged: 0,
        warm_until: Timestamp::ZERO,
        priorities: (u32::MAX, 0),
    };

    /// Count `e` (`ejected`: by an outlier overlay); its flag byte.
    pub(crate) fn read(&mut self, e: &Endpoint, ejected: bool) -> u8 {
        let (weighted, healthy) = (e.weight() > 0, e.is_healthy());
        let serving = weighted && healthy && !ejected;
        self.weighted += usize::from(weighted);
        self.serving += usize::from(serving);
        self.unhealthy += usize::from(!healthy);
        self.drained += usize::from(healthy && !weighted);
        self.ejected += usize::from(ejected);
        self.tagged += usize::from(e.is_tagged());
        self.priorities = (
            self.priorities.0.min(e.priority()),
            self.priorities.1.max(e.priority()),
        );
        self.warm_until = self.warm_until.max(e.warm_end());
        (u8::from(weighted) * Tally::WEIGHTED) | (u8::from(serving) * Tally::SERVING)
    }

    /// Both counts together.
    fn add(&mut self, o: &Tally) {
        self.weighted += o.weighted;
        self.serving += o.serving;
        self.unhealthy += o.unhealthy;
        self.drained += o.drained;
        self.ejected += o.ejected;
        self.tagged += o.tagged;
        self.warm_until = self.warm_until.max(o.warm_until);
        self.priorities = (
            self.priorities.0.min(o.priorities.0),
            self.priorities.1.max(o.priorities.1),
        );
    }
}

// === impl Part ===

impl Part {
    /// A part of `endpoints` (not empty), read once.
    fn new(endpoints: Vec<Endpoint>) -> Part {
        debug_assert!(!endpoints.is_empty() && endpoints.len() <= MAX_PART);
        let mut tally = Tally::EMPTY;
        let flags = endpoints.iter().map(|e| tally.read(e, false)).collect();
        let live = endpoints.iter().map(Endpoint::live_line).collect();
        let weighing = endpoints.iter().map(Endpoint::weighing).collect();
        Part {
            endpoints: endpoints.into(),
            read: Arc::new(Read {
                flags,
                live,
                weighing,
                tally,
            }),
        }
    }

    fn endpoints(&self) -> &[Endpoint] {
        &self.endpoints
    }

    fn ptr_eq(&self, other: &Part) -> bool {
        Arc::ptr_eq(&self.endpoints, &other.endpoints)
    }
}

// === impl Endpoints ===

impl Endpoints {
    /// Number of endpoints.
    #[inline]
    pub fn len(&self) -> usize {
        self.starts.last().map_or(0, |&n| n as usize)
    }

    /// Whether there are none.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The endpoint at position `i`, if there is one. O(1): at most 64 steps through a table
    /// of one entry per part (a few when parts hold dozens, as they do).
    #[inline]
    pub fn get(&self, i: usize) -> Option<&Endpoint> {
        if let [only] = &*self.parts {
            // Up to 128 endpoints (most services): one part, no table read.
            return only.endpoints.get(i);
        }
        let j = self.part_of(i)?;
        self.parts[j].endpoints.get(i - self.starts[j] as usize)
    }

    /// The part that holds position `i`.
    #[inline]
    fn part_of(&self, i: usize) -> Option<usize> {
        if i >= self.len() {
            return None;
        }
        let mut j = self.dir[i >> DIR_SHIFT] as usize;
        while self.starts[j + 1] as usize <= i {
            j += 1;
        }
        Some(j)
    }

    /// The first endpoint, if any.
    pub fn first(&self) -> Option<&Endpoint> {
        self.parts.first().and_then(|p| p.endpoints().first())
    }

    /// The last endpoint, if any.
    pub fn last(&self) -> Option<&Endpoint> {
        self.parts.last().and_then(|p| p.endpoints().last())
    }

    /// The endpoints in order.
    pub fn iter(&self) -> EndpointsIter<'_> {
        EndpointsIter {
            parts: self.parts.iter(),
            part: [].iter(),
            left: self.len(),
        }
    }

    /// A copy of each endpoint (by reference: no endpoint is copied deeply).
    pub fn to_vec(&self) -> Vec<Endpoint> {
        self.iter().cloned().collect()
    }

    /// Whether the two hold the very same parts: every endpoint the same object, with no
    /// endpoint read. O(parts).
    pub fn ptr_eq(&self, other: &Endpoints) -> bool {
        Arc::ptr_eq(&self.parts, &other.parts)
            || (self.parts.len() == other.parts.len()
                && (self.parts.iter().zip(other.parts.iter())).all(|(a, b)| a.ptr_eq(b)))
    }

    /// When position `i` here and position `j` of `other` start the same part: its length (the
    /// endpoints from there on are the same objects in both); else 0. O(1).
    pub(crate) fn shared_from(&self, i: usize, other: &Endpoints, j: usize) -> usize {
        let (Some(p), Some(q)) = (self.part_of(i), other.part_of(j)) else {
            return 0;
        };
        let starts = self.starts[p] as usize == i && other.starts[q] as usize == j;
        if starts && self.parts[p].ptr_eq(&other.parts[q]) {
            self.parts[p].endpoints.len()
        } else {
            0
        }
    }

    /// The flag bytes, statistics lines and counts of every endpoint, as each part read them
    /// (no ejection considered): sequential copies, no endpoint read.
    pub(crate) fn read(&self) -> (Vec<u8>, Vec<&'static LiveStats>, Tally) {
        let n = self.len();
        let (mut flags, mut live, mut tally) =
            (Vec::with_capacity(n), Vec::with_capacity(n), Tally::EMPTY);
        for part in self.parts.iter() {
            flags.extend_from_slice(&part.read.flags);
            live.extend_from_slice(&part.read.live);
            tally.add(&part.read.tally);
        }
        (flags, live, tally)
    }

    /// The parts with an endpoint of weight whose warm-up lasts past `now` (as their counts
    /// say), each as the position of its first endpoint and its endpoints.
    pub(crate) fn warming_parts(
        &self,
        now: Timestamp,
    ) -> impl Iterator<Item = (usize, &[Endpoint])> + '_ {
        (self.parts.iter().zip(self.starts.iter()))
            .filter(move |(p, _)| now < p.read.tally.warm_until)
            .map(|(p, &start)| (start as usize, p.endpoints()))
    }

    /// The effective weight at `now` ([`Endpoint::effective_weight`]) of the endpoint at each
    /// of `positions`, in their order: computed from the parts' dense copies ([`Weighing`]),
    /// no endpoint read. O(positions), sequential when they ascend (a snapshot's eligible list
    /// does); any order is answered.
    ///
    /// # Panics
    /// When a position is not below [`len`](Self::len).
    pub(crate) fn effective_weights(
        &self,
        positions: &[EndpointIdx],
        now: Timestamp,
    ) -> Vec<(EndpointIdx, u32)> {
        (self.weighings(positions))
            .map(|(idx, w)| (idx, w.at(now)))
            .collect()
    }

    /// The sum of the configured weights ([`Endpoint::weight`]) at `positions`, from the same
    /// dense copies as [`effective_weights`](Self::effective_weights).
    ///
    /// # Panics
    /// When a position is not below [`len`](Self::len).
    pub(crate) fn weight_total(&self, positions: &[EndpointIdx]) -> u64 {
        (self.weighings(positions))
            .map(|(_, w)| u64::from(w.weight()))
            .sum()
    }

    /// The dense copy ([`Weighing`]) of the endpoint at each of `positions`, in their order.
    fn weighings<'a>(
        &'a self,
        positions: &'a [EndpointIdx],
    ) -> impl Iterator<Item = (EndpointIdx, &'a Weighing)> + 'a {
        let (mut j, mut start, mut end) = (0, 0, 0);
        positions.iter().map(move |&idx| {
            let i = idx.get();
            if !(start..end).contains(&i) {
                j = self.part_of(i).expect("a position within the endpoints");
                (start, end) = (self.starts[j] as usize, self.starts[j + 1] as usize);
            }
            (idx, &self.parts[j].read.weighing[i - start])
        })
    }

    /// These endpoints (strictly ascending keys) with `changes` (strictly ascending keys)
    /// applied: `(key, Some(spec))` puts `make(spec, the endpoint of key)` in key order,
    /// `(key, None)` removes the key's endpoint. The parts no change falls in are shared; each
    /// other part is copied with its changes (O(64) references) and read again. k changes
    /// cost O(k · 64 + n / 64), the part tables included.
    pub(crate) fn patch<S>(
        &self,
        changes: impl IntoIterator<Item = (EndpointKey, Option<S>)>,
        mut make: impl FnMut(S, Option<&Endpoint>) -> Endpoint,
    ) -> Endpoints {
        let mut changes = changes.into_iter().peekable();
        let mut parts: Vec<Part> = Vec::with_capacity(self.parts.len() + 1);
        for (j, part) in self.parts.iter().enumerate() {
            // A change falls in the part before the next part's first key; the last takes the rest.
            let bound = self.parts.get(j + 1).and_then(|p| p.endpoints().first());
            let within = |k: &EndpointKey| bound.is_none_or(|b| k < b.key());
            if !changes.peek().is_some_and(|(k, _)| within(k)) {
                parts.push(part.clone());
                continue;
            }
            let mut out = Vec::with_capacity(part.endpoints().len() + 1);
            let mut rest = part.endpoints();
            while let Some((key, spec)) = changes.next_if(|(k, _)| within(k)) {
                let before = rest.partition_point(|e| *e.key() < key);
                out.extend_from_slice(&rest[..before]);
                rest = &rest[before..];
                let prev = rest.first().filter(|e| *e.key() == key);
                if let Some(spec) = spec {
                    out.push(make(spec, prev));
                }
                rest = &rest[usize::from(prev.is_some())..];
            }
            out.extend_from_slice(rest);
            push_patched(&mut parts, out);
        }
        // Into no endpoints: what the changes add.
        let added: Vec<Endpoint> = changes.filter_map(|(_, s)| Some(make(s?, None))).collect();
        cut(&mut parts, added);
        Endpoints::of_parts(parts)
    }

    fn of_parts(parts: Vec<Part>) -> Endpoints {
        let count =
            |n: usize| u32::try_from(n).expect("a snapshot holds at most u32::MAX endpoints");
        let mut starts = Vec::with_capacity(parts.len() + 1);
        let mut n = 0;
        for part in &parts {
            starts.push(count(n));
            n += part.endpoints.len();
        }
        starts.push(count(n));
        let mut dir = Vec::with_capacity(n.div_ceil(1 << DIR_SHIFT));
        let mut j = 0;
        for first in (0..n).step_by(1 << DIR_SHIFT) {
            while starts[j + 1] as usize <= first {
                j += 1;
            }
            dir.push(count(j));
        }
        Endpoints {
            parts: parts.into(),
            starts: starts.into(),
            dir: dir.into(),
        }
    }
}

impl Default for Endpoints {
    fn default() -> Self {
        Endpoints::of_parts(Vec::new())
    }
}

/// Append `out`, a patched part, to `parts`: joined to the part before when it has fallen
/// below [`MIN_PART`] and both fit in one, cut in two or more when it outgrew [`MAX_PART`].
fn push_patched(parts: &mut Vec<Part>, mut out: Vec<Endpoint>) {
    if out.len() < MIN_PART {
        if let Some(last) = parts
            .last()
            .filter(|l| l.endpoints().len() + out.len() <= MAX_PART)
        {
            let mut joined = last.endpoints().to_vec();
            joined.append(&mut out);
            parts.pop();
            out = joined;
        }
    }
    if out.len() <= MAX_PART {
        if !out.is_empty() {
            parts.push(Part::new(out));
        }
        return;
    }
    cut(parts, out);
}

/// Append `endpoints` to `parts` cut into parts of [`PART`] or fewer, of about equal size.
fn cut(parts: &mut Vec<Part>, endpoints: Vec<Endpoint>) {
    if endpoints.is_empty() {
        return;
    }
    let size = endpoints.len().div_ceil(endpoints.len().div_ceil(PART));
    let mut rest = endpoints.into_iter();
    while rest.len() > 0 {
        parts.push(Part::new(rest.by_ref().take(size).collect()));
    }
}

impl From<Vec<Endpoint>> for Endpoints {
    fn from(endpoints: Vec<Endpoint>) -> Self {
        let mut parts = Vec::with_capacity(endpoints.len().div_ceil(PART));
        cut(&mut parts, endpoints);
        Endpoints::of_parts(parts)
    }
}

impl FromIterator<Endpoint> for Endpoints {
    fn from_iter<I: IntoIterator<Item = Endpoint>>(iter: I) -> Self {
        Endpoints::from(iter.into_iter().collect::<Vec<_>>())
    }
}

impl Index<usize> for Endpoints {
    type Output = Endpoint;

    /// # Panics
    /// When `i` is not below [`len`](Endpoints::len).
    #[inline]
    fn index(&self, i: usize) -> &Endpoint {
        match self.get(i) {
            Some(e) => e,
            None => panic!("endpoint {i} of {}", self.len()),
        }
    }
}

impl<'a> IntoIterator for &'a Endpoints {
    type Item = &'a Endpoint;
    type IntoIter = EndpointsIter<'a>;

    fn into_iter(self) -> EndpointsIter<'a> {
        self.iter()
    }
}

impl fmt::Debug for Endpoints {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// The endpoints of an [`Endpoints`], in order.
#[derive(Clone, Debug)]
pub struct EndpointsIter<'a> {
    parts: std::slice::Iter<'a, Part>,
    part: std::slice::Iter<'a, Endpoint>,
    left: usize,
}

impl fmt::Debug for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.endpoints()).finish()
    }
}

impl<'a> Iterator for EndpointsIter<'a> {
    type Item = &'a Endpoint;

    #[inline]
    fn next(&mut self) -> Option<&'a Endpoint> {
        loop {
            if let Some(e) = self.part.next() {
                self.left -= 1;
                return Some(e);
            }
            self.part = self.parts.next()?.endpoints().iter();
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for EndpointsIter<'_> {}

impl FusedIterator for EndpointsIter<'_> {}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::{EndpointSpec, EndpointStats};

    /// An endpoint of key `k` (keys sort as numbers); `w` picks weight, health, priority and
    /// warm-up (registered at 0–12 s, a window of up to 9.4 s; or none).
    fn ep(k: u16, w: u8) -> Endpoint {
        let mut spec = EndpointSpec::new(format!("h{k:05}:1"))
            .with_weight(u32::from(w % 4) * 50)
            .with_healthy(!w.is_multiple_of(5))
            .with_priority(u32::from(w % 3));
        if w % 7 < 4 {
            spec = (spec.with_registered_at(Timestamp::from_millis(u64::from(k % 13) * 1_000)))
                .with_warmup(Duration::from_millis(u64::from(w) * 37));
        }
        Endpoint::new(spec, Arc::new(EndpointStats::default()), Timestamp::ZERO)
    }

    /// The parts' copies of the weights give each endpoint's effective weight, at times
    /// before, within and after warm-up windows, for positions in order and out of it.
    fn check_weights(all: &Endpoints, model: &[Endpoint]) {
        let mut positions: Vec<EndpointIdx> = (0..model.len()).map(EndpointIdx::new).collect();
        for now in [0, 999, 1_000, 4_321, 12_000, 21_399, 21_400, 60_000] {
            let now = Timestamp::from_millis(now);
            let want = |p: &[EndpointIdx]| -> Vec<(EndpointIdx, u32)> {
                (p.iter())
                    .map(|&i| (i, model[i.get()].effective_weight(now)))
                    .collect()
            };
            assert_eq!(all.effective_weights(&positions, now), want(&positions));
            positions.reverse();
            assert_eq!(all.effective_weights(&positions, now), want(&positions));
        }
    }

    fn tally_of<'a>(all: impl Iterator<Item = &'a Endpoint>) -> (Vec<u8>, Tally) {
        let mut t = Tally::EMPTY;
        (all.map(|e| t.read(e, false)).collect(), t)
    }

    fn check(all: &Endpoints, model: &[Endpoint]) {
        assert_eq!(all.len(), model.len());
        assert_eq!(all.iter().len(), model.len());
        for (i, m) in model.iter().enumerate() {
            assert!(all[i].ptr_eq(m) && all.get(i).is_some_and(|e| e.ptr_eq(m)));
        }
        assert!(all.get(model.len()).is_none());
        assert!(all.iter().zip(model).all(|(a, m)| a.ptr_eq(m)));
        assert!(all
            .parts
            .iter()
            .all(|p| (1..=MAX_PART).contains(&p.endpoints().len())));
        let (flags, live, tally) = all.read();
        let (want, t) = tally_of(model.iter());
        assert_eq!(flags, want);
        assert!(live
            .iter()
            .zip(model)
            .all(|(l, e)| std::ptr::eq(*l, e.live_line())));
        let counts = |t: Tally| {
            let c = (t.weighted, t.serving, t.unhealthy, t.drained, t.tagged);
            (c, t.priorities, t.warm_until)
        };
        assert_eq!(counts(tally), counts(t));
        check_weights(all, model);
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            rng_seed: proptest::test_runner::RngSeed::Fixed(44),
            ..ProptestConfig::default()
        })]
        /// Patches in a row give what the same changes give to a map in key order: every
        /// endpoint kept the same object, each part within its bounds, what the parts read
        /// equal to a pass over the endpoints.
        #[test]
        fn patches_keep_the_set_a_map_would(
            start in proptest::collection::btree_map(0u16..2000, any::<u8>(), 0..600),
            rounds in proptest::collection::vec(
                proptest::collection::btree_map(0u16..2000, proptest::option::of(any::<u8>()), 0..80),
                1..6,
            ),
        ) {
            let mut model: BTreeMap<u16, Endpoint> =
                start.iter().map(|(&k, &w)| (k, ep(k, w))).collect();
            let mut all: Endpoints = model.values().cloned().collect();
            check(&all, &model.values().cloned().collect::<Vec<_>>());
            for changes in rounds {
                let keyed = changes.iter().map(|(&k, w)| (ep(k, 0).key().clone(), w.map(|w| (k, w))));
                let mut made = BTreeMap::new();
                let next = all.patch(keyed, |(k, w), prev| {
                    // Handed the endpoint the key had, if any.
                    let had = model.get(&k);
                    assert!(prev.is_some() == had.is_some() && prev.zip(had).is_none_or(|(p, h)| p.ptr_eq(h)));
                    let e = ep(k, w);
                    made.insert(k, e.clone());
                    e
                });
                for (&k, w) in &changes {
                    match w {
                        Some(_) => model.insert(k, made[&k].clone()),
                        None => model.remove(&k),
                    };
                }
                check(&next, &model.values().cloned().collect::<Vec<_>>());
                all = next;
            }
        }
    }

    /// One change among 10 000 copies one part: every other part is the last set's.
    #[test]
    fn a_change_copies_only_its_part() {
        let all: Endpoints = (0..10_000).map(|k| ep(k * 2, 1)).collect();
        let parts = all.parts.len();
        assert_eq!(parts, 10_000usize.div_ceil(PART));
        let added = all.patch([(ep(5_001, 1).key().clone(), Some(()))], |(), _| {
            ep(5_001, 1)
        });
        let gone = added.patch([(ep(5_001, 1).key().clone(), None::<()>)], |(), _| ep(0, 0));
        for next in [&added, &gone] {
            let shared = (next.parts.iter())
                .filter(|p| all.parts.iter().any(|o| o.ptr_eq(p)))
                .count();
            assert_eq!(shared, parts - 1);
        }
        assert_eq!(added.len(), 10_001);
        assert_eq!(added[2_501].key(), ep(5_001, 1).key());
        assert!(!gone.ptr_eq(&all) && gone.len() == all.len());
    }

    /// Growth cuts a part in two past its bound; shrinking joins it to the one before.
    #[test]
    fn parts_are_cut_and_joined() {
        let all: Endpoints = (0..128).map(|k| ep(k * 4, 1)).collect();
        assert_eq!(all.parts.len(), 2);
        // 80 added inside the first part: 144 > 128, cut into three of 48.
        let adds = (0..80).map(|k| k / 2 * 4 + 1 + k % 2);
        let adds = adds.map(|k| (ep(k, 1).key().clone(), Some(k)));
        let grown = all.patch(adds, |k, _| ep(k, 1));
        assert_eq!(grown.len(), 208);
        assert_eq!(grown.parts.len(), 4);
        assert!(grown.parts[..3].iter().all(|p| p.endpoints().len() == 48));
        // All but 3 of the second part removed: it joins the first.
        let removes = (67..128).map(|k| (ep(k * 4, 1).key().clone(), None::<u16>));
        let shrunk = all.patch(removes, |k, _| ep(k, 1));
        assert_eq!((shrunk.len(), shrunk.parts.len()), (67, 1));
        check(&shrunk, &all.iter().take(67).cloned().collect::<Vec<_>>());
    }
}
