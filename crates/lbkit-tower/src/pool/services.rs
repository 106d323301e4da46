//! [`ServiceMap`]: the pool's client services by endpoint key hash, copied per publish in time
//! that follows the change, not the fleet.
//!
//! A publish needs two maps besides the one calls are reading (the services of the old and the new
//! endpoints while the balancer swaps snapshots, then the new ones alone), and calls read whichever
//! is current without a lock. A plain hash map copied for each would cost two O(n) copies and two
//! O(n) drops per change (issue 44: at 10 000 endpoints the copies alone were a fifth of a tower
//! `Pool`'s CPU under churn). Here a map is about √n *shards* by hash, each shared by the copies
//! until one of them changes it: a copy copies the shards' handles, a change copies the shard
//! it falls in. A change of k endpoints costs O((k + 1)·√n) reference counts, and an entry removed
//! is no longer held by the map it was removed from, so a service goes with its endpoint (its
//! connections, its tasks) once the maps calls may still read are gone.
//!
//! (The twenty-fourth session's map was a shared base and a layer of changes, folded into a new
//! base past 2·√n changes and whenever the layer hid a removed entry, so that it was dropped:
//! under churn that fold, O(n) a publish, was a third of a `Pool`'s CPU.)

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use super::{Entry, KeyHashHasher};

type Map<V> = HashMap<u64, V, BuildHasherDefault<KeyHashHasher>>;
/// One shard: the entries whose hash picks it.
type Shard<Svc> = Arc<Map<Arc<Entry<Svc>>>>;

/// The hash bits that pick a shard start here: above those a shard's own table indexes by (a
/// shard of thousands uses the low dozen), below the 7 top bits its control bytes take.
const SHARD_SHIFT: u32 = 32;

/// Endpoint services by [`Endpoint::key_hash`](lbkit_core::Endpoint::key_hash) (a SipHash: its
/// bits are even); the entry's key is checked on lookup. Cloning copies the shards' handles.
pub(crate) struct ServiceMap<Svc> {
    shards: Arc<Vec<Shard<Svc>>>,
    /// `shards.len() - 1` (a power of two, less one).
    mask: u64,
    len: usize,
}

impl<Svc> Default for ServiceMap<Svc> {
    fn default() -> Self {
        ServiceMap::with_shards(1)
    }
}

impl<Svc> Clone for ServiceMap<Svc> {
    fn clone(&self) -> Self {
        ServiceMap {
            shards: self.shards.clone(),
            mask: self.mask,
            len: self.len,
        }
    }
}

/// Shards for `n` entries: the power of two nearest below √n (at least 1).
fn shards_for(n: usize) -> usize {
    1 << (n.isqrt().max(1).ilog2())
}

impl<Svc> ServiceMap<Svc> {
    fn with_shards(shards: usize) -> Self {
        debug_assert!(shards.is_power_of_two());
        ServiceMap {
            shards: Arc::new((0..shards).map(|_| Arc::default()).collect()),
            mask: shards as u64 - 1,
            len: 0,
        }
    }

    #[inline]
    fn shard(&self, hash: u64) -> usize {
        ((hash >> SHARD_SHIFT) & self.mask) as usize
    }

    /// The shard of `hash`, copied first if another map shares it (or the list of shards).
    fn shard_mut(&mut self, hash: u64) -> &mut Map<Arc<Entry<Svc>>> {
        let i = self.shard(hash);
        Arc::make_mut(&mut Arc::make_mut(&mut self.shards)[i])
    }

    /// The entry under `hash`.
    #[inline]
    pub(crate) fn get(&self, hash: &u64) -> Option<&Arc<Entry<Svc>>> {
        self.shards[self.shard(*hash)].get(hash)
    }

    /// Services held.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Put `entry` under `hash`, replacing what was there.
    pub(crate) fn insert(&mut self, hash: u64, entry: Arc<Entry<Svc>>) {
        if self.get(&hash).is_some_and(|e| Arc::ptr_eq(e, &entry)) {
            return;
        }
        let was = self.shard_mut(hash).insert(hash, entry);
        self.len += usize::from(was.is_none());
    }

    /// Take out the entry under `hash`, if any.
    pub(crate) fn remove(&mut self, hash: &u64) {
        if self.get(hash).is_some() {
            self.shard_mut(*hash).remove(hash);
            self.len -= 1;
        }
    }

    /// Every entry with its hash, in no order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, &Arc<Entry<Svc>>)> {
        (self.shards.iter()).flat_map(|s| s.iter().map(|(h, e)| (*h, e)))
    }

    /// Every entry, in no order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &Arc<Entry<Svc>>> {
        self.iter().map(|(_, e)| e)
    }

    /// Shard it again, O(n), when its size has moved four times away from what its shards
    /// suit (√n a shard): at most once per fourfold growth or shrinkage.
    pub(crate) fn settle(&mut self) {
        let (now, want) = (self.shards.len(), shards_for(self.len));
        if want >= now * 4 || want * 4 <= now {
            let mut map = ServiceMap::with_shards(want);
            for (h, e) in self.iter() {
                map.insert(h, e.clone());
            }
            *self = map;
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// A spread hash of `n` (odd multiplier: distinct for distinct `n`).
    fn hash(n: u64) -> u64 {
        n.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }

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

        /// Any sequence of inserts, removals, copies and reshardings reads like a plain map.
        #[test]
        fn reads_like_a_plain_map(ops in prop::collection::vec((0u8..4, 0u64..200, 0u64..1000), 0..600)) {
            let mut map = ServiceMap::default();
            let mut plain: HashMap<u64, u64> = HashMap::new();
            for (op, h, v) in ops {
                match op {
                    0 | 1 => { map.insert(h, entry(v)); plain.insert(h, v); }
                    2 => { map.remove(&h); plain.remove(&h); }
                    _ => { let copy = map.clone(); map.settle(); drop(copy); }
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

    /// A copy shares every shard; a change copies the one shard it falls in, and the map it
    /// was made on no longer holds what it removed.
    #[test]
    fn a_change_copies_one_shard() {
        let mut map = ServiceMap::default();
        for h in 0..10_000u64 {
            map.insert(hash(h), entry(h));
        }
        map.settle();
        assert_eq!(map.shards.len(), 64, "√10 000 = 100: 64 shards");
        let copy = map.clone();
        let gone = hash(5);
        let held = Arc::clone(map.get(&gone).expect("held"));
        map.remove(&gone);
        map.insert(hash(10_001), entry(10_001));
        let shared = (map.shards.iter().zip(copy.shards.iter()))
            .filter(|(a, b)| Arc::ptr_eq(a, b))
            .count();
        assert!(
            shared >= 62,
            "only the shards changed are copies: {shared} shared"
        );
        assert_eq!(Arc::strong_count(&held), 2, "held here and by the copy");
        drop(copy);
        assert_eq!(Arc::strong_count(&held), 1, "no map holds it");
        assert_eq!((map.len(), map.iter().count()), (10_000, 10_000));
        assert!(map.get(&gone).is_none() && map.get(&hash(10_001)).is_some());
    }

    /// Growth and shrinkage past four times shard it again; a copy keeps what it had.
    #[test]
    fn it_shards_again_as_it_grows_and_shrinks() {
        let mut map = ServiceMap::default();
        map.insert(hash(7), entry(7));
        map.settle();
        assert_eq!(map.shards.len(), 1);
        for h in 0..4_000 {
            map.insert(hash(h + 10), entry(h));
        }
        map.settle();
        assert_eq!(map.shards.len(), 32);
        let copy = map.clone();
        for h in 0..3_990 {
            map.remove(&hash(h + 10));
        }
        map.settle();
        assert_eq!((map.shards.len(), map.len()), (2, 11));
        assert_eq!(copy.len(), 4_001);
        assert!(map.get(&hash(7)).is_some() && copy.get(&hash(15)).is_some());
    }
}
