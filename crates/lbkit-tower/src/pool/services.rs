//! [`ServiceMap`]: the pool's client services by endpoint key hash, copied per publish in time
//! that follows the change, not the fleet.
//!
//! A publish needs two maps besides the one calls are reading (the services of the old and the new
//! endpoints while the balancer swaps snapshots, then the new ones alone), and calls read whichever
//! is current without a lock. A plain hash map copied for each would cost two O(n) copies and two
//! O(n) drops per change (issue 44: at 10 000 endpoints the copies alone were a fifth of a tower
//! `Pool`'s CPU under churn). Here a map is a shared *base* and a small *layer* of what changed
//! since it: a copy copies the layer, and the layer is folded into a new base once it outgrows 2·√n
//! entries, so a change of k endpoints costs O(k + √n) amortized. A lookup reads the layer first
//! (skipped while it is empty), then the base.
//!
//! A service removed or replaced must be dropped when its endpoint goes (its connections, its
//! tasks), not when the layer next folds: the map a publish leaves in place is folded whenever
//! its layer hides an entry of the base ([`ServiceMap::hides`]), so only additions stay layered.
//! Under churn that is one O(n) copy a publish instead of two.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use super::{Entry, KeyHashHasher};

type Map<V> = HashMap<u64, V, BuildHasherDefault<KeyHashHasher>>;

/// Layers smaller than this are never folded (a small pool copies its layer for nothing).
const MIN_LAYER: usize = 32;

/// Endpoint services by [`Endpoint::key_hash`](lbkit_core::Endpoint::key_hash); the entry's
/// key is checked on lookup. Cloning copies the layer only.
pub(crate) struct ServiceMap<Svc> {
    base: Arc<Map<Arc<Entry<Svc>>>>,
    /// What differs from `base`: `Some` added or replaced, `None` removed from it.
    layer: Map<Option<Arc<Entry<Svc>>>>,
    len: usize,
}

impl<Svc> Default for ServiceMap<Svc> {
    fn default() -> Self {
        ServiceMap {
            base: Arc::default(),
            layer: Map::default(),
            len: 0,
        }
    }
}

impl<Svc> Clone for ServiceMap<Svc> {
    fn clone(&self) -> Self {
        ServiceMap {
            base: self.base.clone(),
            layer: self.layer.clone(),
            len: self.len,
        }
    }
}

impl<Svc> ServiceMap<Svc> {
    /// The entry under `hash`.
    #[inline]
    pub(crate) fn get(&self, hash: &u64) -> Option<&Arc<Entry<Svc>>> {
        if !self.layer.is_empty() {
            if let Some(v) = self.layer.get(hash) {
                return v.as_ref();
            }
        }
        self.base.get(hash)
    }

    /// Services held.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Put `entry` under `hash`, replacing what was there.
    pub(crate) fn insert(&mut self, hash: u64, entry: Arc<Entry<Svc>>) {
        if self.get(&hash).is_none() {
            self.len += 1;
        }
        self.layer.insert(hash, Some(entry));
    }

    /// Take out the entry under `hash`, if any.
    pub(crate) fn remove(&mut self, hash: &u64) {
        if self.get(hash).is_none() {
            return;
        }
        self.len -= 1;
        if self.base.contains_key(hash) {
            self.layer.insert(*hash, None);
        } else {
            self.layer.remove(hash);
        }
    }

    /// Every entry with its hash, in no order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, &Arc<Entry<Svc>>)> {
        let base = self
            .base
            .iter()
            .filter(|(h, _)| !self.layer.contains_key(*h))
            .map(|(h, e)| (*h, e));
        let layer = self
            .layer
            .iter()
            .filter_map(|(h, e)| e.as_ref().map(|e| (*h, e)));
        base.chain(layer)
    }

    /// Every entry, in no order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &Arc<Entry<Svc>>> {
        self.iter().map(|(_, e)| e)
    }

    /// Fold the layer into a new base once it has grown past 2·√n entries (and 32): O(n), at
    /// most once per √n changes, so copies of the map stay O(√n).
    pub(crate) fn settle(&mut self) {
        if self.layer.len() > MIN_LAYER.max(2 * self.len.isqrt()) {
            self.fold();
        }
    }

    /// Whether the layer hides an entry of the base (removed or replaced): the base still
    /// holds that service alive.
    pub(crate) fn hides(&self) -> bool {
        self.layer.keys().any(|h| self.base.contains_key(h))
    }

    /// Fold the layer into a new base now, O(n): the entries it hid are no longer held by
    /// this map (they go when the last map sharing the old base does).
    pub(crate) fn fold(&mut self) {
        let mut base = Map::with_capacity_and_hasher(self.len, Default::default());
        base.extend(self.iter().map(|(h, e)| (h, e.clone())));
        self.base = Arc::new(base);
        self.layer = Map::default();
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn entry(n: u64) -> Arc<Entry<u64>> {
        Arc::new(Entry {
            key: lbkit_core::EndpointKey::from(format!("10.0.0.{n}:80").as_str()),
            address: Arc::from("a"),
            svc: n,
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 200,
            rng_seed: proptest::test_runner::RngSeed::Fixed(44),
            ..ProptestConfig::default()
        })]

        /// Any sequence of inserts, removals, copies and folds reads like a plain map.
        #[test]
        fn reads_like_a_plain_map(ops in prop::collection::vec((0u8..4, 0u64..200, 0u64..1000), 0..600)) {
            let mut map = ServiceMap::default();
            let mut plain: HashMap<u64, u64> = HashMap::new();
            for (op, h, v) in ops {
                match op {
                    0 | 1 => { map.insert(h, entry(v)); plain.insert(h, v); }
                    2 => { map.remove(&h); plain.remove(&h); }
                    _ => { map = map.clone(); map.settle(); }
                }
                prop_assert_eq!(map.len(), plain.len());
                prop_assert_eq!(map.get(&h).map(|e| e.svc), plain.get(&h).copied());
            }
            let mut seen: Vec<(u64, u64)> = map.iter().map(|(h, e)| (h, e.svc)).collect();
            let mut want: Vec<(u64, u64)> = plain.into_iter().collect();
            seen.sort_unstable();
            want.sort_unstable();
            prop_assert_eq!(seen, want);
        }
    }

    /// Copies share the base; the layer folds once it outgrows √n, not before.
    #[test]
    fn the_layer_folds_past_its_bound() {
        let mut map = ServiceMap::default();
        for h in 0..10_000 {
            map.insert(h, entry(h));
        }
        map.settle();
        assert!(map.layer.is_empty(), "a whole set folds into the base");
        let copy = map.clone();
        assert!(Arc::ptr_eq(&map.base, &copy.base));
        for h in 0..150 {
            map.remove(&h);
            map.settle();
        }
        assert_eq!(map.layer.len(), 150, "150 ≤ 2·√9 850: still layered");
        assert!(Arc::ptr_eq(&map.base, &copy.base));
        let folded = (150..300).find(|h| {
            map.remove(h);
            map.settle();
            map.layer.is_empty()
        });
        // Removing 198 makes a layer of 199 over 9 801 services: 2·√9 801 = 198.
        assert_eq!(folded, Some(198));
        assert!(!Arc::ptr_eq(&map.base, &copy.base));
        assert_eq!(copy.len(), 10_000, "a copy keeps what it had");
        assert_eq!(map.len(), 9_801);
        assert!(map.get(&5).is_none() && map.get(&9_999).is_some());
    }
}
