//! What changed between two sets of endpoints, in O(n) pointer comparisons and O(k) key
//! comparisons for k changes: a [`SnapshotBuilder`](crate::SnapshotBuilder) keeps an unchanged
//! endpoint the same object, so a walk of the last set beside the next compares pointers and
//! reads keys only where they differ; where both hold the same part of endpoints
//! ([`Endpoints`]), a whole part at once. `lbkit watch` prints changes with it; the tower pool
//! carries its client services over with it; a strategy carries its prepared structure over
//! with [`carried`] (the hash rings patch what changed instead of rebuilding).
//!
//! ```
//! use std::borrow::Cow;
//! use lbkit_core::{diff, EndpointSpec, SnapshotBuilder, Timestamp, Update};
//! let mut b = SnapshotBuilder::new();
//! let s1 = b.apply(Update::Reset(vec![EndpointSpec::new("a:1"), EndpointSpec::new("b:1")]), Timestamp::ZERO);
//! let s2 = b.apply(Update::Add(vec![EndpointSpec::new("c:1")]), Timestamp::ZERO);
//! let d = diff::between(s1.endpoints(), s2.endpoints(), None).expect("in key order");
//! assert_eq!(d.changed, vec![(2, None)]); // c:1 is new
//! assert!(d.gone.is_empty());
//! ```

use crate::Endpoints;

/// The endpoints of the next set that are new or not the same object as the last set's with
/// their key (index in the next set, and index in the last of the one with its key), then the
/// last set's endpoints whose key the next set lacks (index in the last); both in key order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Diff {
    /// New or changed: `(index in next, index in last of the same key)`.
    pub changed: Vec<(usize, Option<usize>)>,
    /// Gone: index in last.
    pub gone: Vec<usize>,
}

// === impl Diff ===

impl Diff {
    /// For each endpoint of the last set (`last` of them, in order), its index in the next
    /// set (of `next`) when it is unchanged there, else `None`: [`carried`] one index at a
    /// time, for a diff made by [`between`] without an `order` (its `gone`, and the old and
    /// the new indices of its `changed`, each ascending; an old index in one of the two
    /// only). O(n + k), nothing allocated.
    ///
    /// ```
    /// use lbkit_core::diff::Diff;
    /// // Last: a b c d; next: a c e d (b gone, e new).
    /// let d = Diff { changed: vec![(2, None)], gone: vec![1] };
    /// assert_eq!(d.pairs(4, 4).collect::<Vec<_>>(), [Some(0), None, Some(1), Some(3)]);
    /// ```
    pub fn pairs(&self, last: usize, next: usize) -> impl Iterator<Item = Option<usize>> + '_ {
        // What `between` without an order guarantees, and the walk below relies on.
        let olds = || self.changed.iter().filter_map(|&(_, o)| o);
        debug_assert!(self.gone.is_sorted() && olds().is_sorted());
        debug_assert!(self.changed.iter().map(|&(n, _)| n).is_sorted());
        debug_assert!(olds().all(|o| self.gone.binary_search(&o).is_err()));
        let mut gone = self.gone.iter().copied().peekable();
        let mut olds = self.changed.iter().filter_map(|&(_, o)| o).peekable();
        let mut news = self.changed.iter().map(|&(n, _)| n).peekable();
        let mut now = 0;
        (0..last).map(move |o| {
            if gone.next_if_eq(&o).is_some() || olds.next_if_eq(&o).is_some() {
                return None;
            }
            while news.next_if_eq(&now).is_some() {
                now += 1;
            }
            now += 1;
            (now <= next).then_some(now - 1)
        })
    }
}

/// The diff from `last` (in strictly ascending key order) to `next`, walked in `order` (indices
/// into `next`; its own order when `None`). `None` when `next` is not in ascending key order
/// that way: unchanged endpoints come in the last set's order, and each other one is checked
/// against its neighbours, so the check costs no more than the diff. Then walk it in
/// [`key_order`].
pub fn between(last: &Endpoints, next: &Endpoints, order: Option<&[usize]>) -> Option<Diff> {
    let n = order.map_or(next.len(), <[usize]>::len);
    let at_pos = |p: usize| order.map_or(p, |o| o[p]);
    let (mut at, mut d) = (0, Diff::default());
    let mut p = 0;
    while p < n {
        // A part both share: all of it unchanged, no endpoint read.
        let shared = if order.is_none() {
            next.shared_from(p, last, at)
        } else {
            0
        };
        if shared > 0 {
            (p, at) = (p + shared, at + shared);
            continue;
        }
        p += 1;
        let e = &next[at_pos(p - 1)];
        if last.get(at).is_some_and(|o| o.ptr_eq(e)) {
            at += 1; // unchanged: the same object, no text read
            continue;
        }
        let before = (p - 1).checked_sub(1).map(|q| &next[at_pos(q)]);
        let after = (p < n).then(|| &next[at_pos(p)]);
        if before.is_some_and(|b| b.key() >= e.key()) || after.is_some_and(|a| a.key() <= e.key()) {
            return None;
        }
        while last.get(at).is_some_and(|o| o.key() < e.key()) {
            d.gone.push(at);
            at += 1;
        }
        if last.get(at).is_some_and(|o| o.ptr_eq(e)) {
            at += 1; // unchanged, after some that are gone
            continue;
        }
        let old = last
            .get(at)
            .is_some_and(|o| o.key() == e.key())
            .then_some(at);
        at += usize::from(old.is_some());
        d.changed.push((at_pos(p - 1), old));
    }
    d.gone.extend(at..last.len());
    Some(d)
}

/// For each endpoint of `last`, its index in `next` when `next` holds the very same object
/// (same key, same spec, the same live statistics), else `None` (gone or changed): what a
/// strategy may carry over from the structure it prepared for `last`. `None` overall when
/// `next` is not in ascending key order (see [`between`]). O(n) pointer comparisons and O(k)
/// key reads for k changes.
///
/// ```
/// use lbkit_core::{diff, EndpointIdx, EndpointSpec, SnapshotBuilder, Timestamp, Update};
/// let mut b = SnapshotBuilder::new();
/// let spec = |a: &str| EndpointSpec::new(a);
/// let s1 = b.apply(Update::Reset(vec![spec("a:1"), spec("b:1"), spec("c:1")]), Timestamp::ZERO);
/// let s2 = b.apply(Update::Add(vec![spec("d:1")]), Timestamp::ZERO);
/// let s3 = b.apply(Update::Remove(vec![s1.endpoint(EndpointIdx::new(1)).key().clone()]), Timestamp::ZERO);
/// assert_eq!(diff::carried(s1.endpoints(), s3.endpoints()), Some(vec![Some(0), None, Some(1)]));
/// ```
pub fn carried(last: &Endpoints, next: &Endpoints) -> Option<Vec<Option<usize>>> {
    let d = between(last, next, None)?;
    let map: Vec<Option<usize>> = d.pairs(last.len(), next.len()).collect();
    // `between` classed every endpoint of both sets once, the unchanged ones paired in order:
    // the pairs are the very same objects (walked again only where assertions are on, as this
    // O(n) walk was a fifth of a hash ring's patch).
    debug_assert!(same_objects(last, next, &map));
    Some(map)
}

/// Whether each endpoint of `last` that `map` pairs (ascending) is the very same object as
/// its pair in `next`: both walked forward once, part by part, no position looked up.
fn same_objects(last: &Endpoints, next: &Endpoints, map: &[Option<usize>]) -> bool {
    let mut now = next.iter();
    let mut at = 0;
    last.iter().zip(map).all(|(e, n)| {
        let Some(n) = *n else { return true };
        let paired = now.nth(n - at);
        at = n + 1;
        paired.is_some_and(|p| e.ptr_eq(p))
    })
}

/// The order that walks `endpoints` by key (a key listed twice: the later one). O(n log n).
pub fn key_order(endpoints: &Endpoints) -> Vec<usize> {
    let mut order: Vec<usize> = (0..endpoints.len()).collect();
    order.sort_by(|&a, &b| endpoints[a].key().cmp(endpoints[b].key()));
    order.dedup_by(|later, earlier| {
        let same = endpoints[*later].key() == endpoints[*earlier].key();
        if same {
            *earlier = (*earlier).max(*later);
        }
        same
    });
    order
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use proptest::prelude::*;

    use super::*;
    use crate::{EndpointSpec, SnapshotBuilder, Timestamp};

    proptest! {
        #![proptest_config(ProptestConfig {
            rng_seed: proptest::test_runner::RngSeed::Fixed(44),
            ..ProptestConfig::default()
        })]
        /// Over sets in key order (as sources list them), `carried` pairs exactly the
        /// endpoints a builder kept as the same object, and `between` names every other one.
        #[test]
        fn carried_pairs_exactly_the_same_objects(sets in proptest::collection::vec(proptest::collection::btree_map(0u8..16, 1u32..3, 0..12), 1..8)) {
            let mut b = SnapshotBuilder::new();
            let mut last = b.apply(crate::Update::Reset(Vec::new()), Timestamp::ZERO);
            for set in sets {
                let specs: Vec<EndpointSpec> = set
                    .iter()
                    .map(|(k, w)| EndpointSpec::new(format!("10.0.0.1:{}", 1000 + u32::from(*k))).with_weight(*w))
                    .collect();
                let next = b.reset_from(specs.iter().map(Cow::Borrowed), Timestamp::ZERO);
                let map = carried(last.endpoints(), next.endpoints()).expect("key order");
                for (o, e) in last.endpoints().iter().enumerate() {
                    let same = next.endpoints().iter().position(|n| n.ptr_eq(e));
                    prop_assert_eq!(map[o], same);
                }
                let d = between(last.endpoints(), next.endpoints(), None).expect("key order");
                let moved = d.changed.len() + map.iter().filter(|m| m.is_some()).count();
                prop_assert_eq!(moved, next.len());
                last = next;
            }
        }

        /// Over patched sets of hundreds, whose parts the snapshots share, `between` finds what
        /// it finds over copies that share no part (every endpoint compared).
        #[test]
        fn shared_parts_change_no_diff(
            start in proptest::collection::btree_set(0u16..1500, 0..500),
            rounds in proptest::collection::vec(proptest::collection::btree_map(0u16..1500, any::<Option<u8>>(), 0..30), 1..5),
        ) {
            let spec = |k: u16, w: u8| EndpointSpec::new(format!("h{k:05}:80")).with_weight(u32::from(w) + 1);
            let key = |k: u16| spec(k, 0).key;
            let mut b = SnapshotBuilder::new();
            let specs: Vec<EndpointSpec> = start.iter().map(|&k| spec(k, 0)).collect();
            let mut last = b.reset_from(specs.iter().map(Cow::Borrowed), Timestamp::ZERO);
            for changes in rounds {
                let mut changes: Vec<_> = changes.into_iter().map(|(k, w)| (key(k), w.map(|w| Cow::Owned(spec(k, w))))).collect();
                changes.sort_by(|a, b| a.0.cmp(&b.0));
                let next = b.patch(changes, Timestamp::ZERO);
                let fast = between(last.endpoints(), next.endpoints(), None);
                let copies = |s: &crate::Snapshot| Endpoints::from(s.endpoints().to_vec());
                let slow = between(&copies(&last), &copies(&next), None);
                prop_assert!(fast.is_some());
                prop_assert_eq!(fast, slow);
                last = next;
            }
        }
    }
}
