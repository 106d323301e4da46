//! A table patched rather than built, while changes come faster than the rebuild interval
//! ([`Maglev::with_rebuild_interval`]).
//!
//! The last table's entries follow their endpoints to their positions in the next snapshot.
//! The entries of an endpoint that is gone, drained to weight 0 or down go to the next entry
//! of one that is still there: the resolution a down endpoint's entries get at a build, so
//! the keys of every other endpoint stay where they were. An endpoint new to the set takes no
//! entries until the table is built. One gather over the table and a few passes over the
//! endpoints' positions and weights (the seeds); no endpoint is read, except by a load bound.
//!
//! When the endpoints of positive weight and their weights are the ones the last table was
//! built from (only health changed), the patch is the table a build would make: it keeps the
//! last one's build time and asks for no build.

use std::sync::Arc;

use lbkit_core::{EndpointIdx, Snapshot, Timestamp};

use super::{Carried, Maglev, MaglevPicker, Seed, GONE};

impl Maglev {
    /// `last`'s table patched for `next`, asking to be built at `due` unless it is exact. `Err`
    /// with the seeds to build it from when it must be built now: an endpoint that should
    /// have owned no entries in `last` (down, or of weight 0) now should, the new endpoints
    /// weigh more than a tenth of the ones that keep their entries, or no entry is left.
    pub(super) fn patched(
        &self,
        last: &MaglevPicker,
        last_snapshot: &Snapshot,
        next: &Arc<Snapshot>,
        carried: Carried,
        due: Timestamp,
    ) -> Result<MaglevPicker, Vec<Seed>> {
        let Carried { seeds, mut now } = carried;
        if !owners(&mut now, &last.seeds, last_snapshot, &seeds, next) {
            return Err(seeds);
        }
        let Some(table) = follow(&last.table, &now) else {
            return Err(seeds);
        };
        let mut holds = vec![false; next.len()].into_boxed_slice();
        for (&at, &held) in now.iter().zip(&last.holds[..]) {
            if at != GONE && held {
                holds[at as usize] = true;
            }
        }
        let exact = same_build(&last.seeds, &seeds);
        let refresh_at = if exact { last.refresh_at } else { Some(due) };
        Ok(self.assemble(next, table, holds, seeds, last.built_at, refresh_at))
    }
}

/// Whether a build from `next` would walk the permutations `last` did: the same endpoints of
/// positive weight in the same address order, with the same weights.
fn same_build(last: &[Seed], next: &[Seed]) -> bool {
    let input = |s: &Seed| (s.weight, s.offset, s.skip);
    last.len() == next.len() && last.iter().zip(next).all(|(a, b)| input(a) == input(b))
}

/// Leaves in `now` (each endpoint of the last snapshot's position in the next one) the
/// endpoints that keep their entries (present, eligible, weight > 0), the others [`GONE`].
/// `false` when the table must be built instead: an endpoint that should own no entries in
/// the last snapshot (`last_seeds`, the ones of positive weight there) should in the next
/// (`next_seeds`), or the endpoints new to the table weigh more than a tenth of those kept.
fn owners(
    now: &mut [u32],
    last_seeds: &[Seed],
    last: &Snapshot,
    next_seeds: &[Seed],
    next: &Snapshot,
) -> bool {
    let owned_last = owning(last_seeds, last);
    let owns_next = owning(next_seeds, next);
    let mut kept = 0u64;
    for (was, at) in now.iter_mut().enumerate() {
        if *at == GONE {
            continue;
        }
        let weight = owns_next[*at as usize];
        if weight == 0 {
            *at = GONE;
        } else if owned_last[was] == 0 {
            return false;
        } else {
            kept += u64::from(weight);
        }
    }
    let all: u64 = owns_next.iter().map(|&w| u64::from(w)).sum();
    (all - kept) * 10 <= kept
}

/// The weight of each endpoint of `snapshot` in the table: its seed's (`weighted`, the ones of
/// positive weight) when it is eligible, else 0.
fn owning(weighted: &[Seed], snapshot: &Snapshot) -> Vec<u32> {
    let mut owns = vec![0; snapshot.len()];
    for s in weighted {
        let p = EndpointIdx::new(s.position as usize);
        owns[p.get()] = if snapshot.is_eligible(p) { s.weight } else { 0 };
    }
    owns
}

/// `table`'s entries moved to their owners' positions `now[owner]`; an entry of a [`GONE`]
/// owner takes the next entry's (cyclically) that is not. `None` when every owner is gone.
fn follow(table: &[EndpointIdx], now: &[u32]) -> Option<Box<[EndpointIdx]>> {
    let mut gone = Vec::new();
    let mut out: Box<[EndpointIdx]> = (table.iter().enumerate())
        .map(|(j, e)| {
            let at = now[e.get()];
            if at == GONE {
                gone.push(j);
            }
            EndpointIdx::new(at as usize)
        })
        .collect();
    // Backwards: the entry after `j` is kept or already resolved, except past the end, where
    // the first kept entry is the next one. O(M) however many are gone.
    let first = out.iter().copied().find(|e| e.get() != GONE as usize)?;
    for &j in gone.iter().rev() {
        out[j] = out.get(j + 1).copied().unwrap_or(first);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::collections::{BTreeMap, HashMap};
    use std::time::Duration;

    use lbkit_core::{EndpointKey, EndpointSpec, FastRng, Picker, SnapshotBuilder, Strategy};

    use super::super::TICKED_REBUILD_INTERVAL;
    use super::*;

    /// The patch as the module says it, key by key: an entry keeps its owner's key where the
    /// next snapshot has that key eligible and of positive weight, else takes the next such
    /// entry's owner, cyclically.
    fn reference_patch(table: &[EndpointIdx], last: &Snapshot, next: &Snapshot) -> Vec<usize> {
        let usable: HashMap<&EndpointKey, usize> = (next.eligible().iter())
            .filter(|&&i| next.endpoint(i).weight() > 0)
            .map(|&i| (next.endpoint(i).key(), i.get()))
            .collect();
        let owner = |e: EndpointIdx| usable.get(last.endpoint(e).key()).copied();
        let n = table.len();
        (0..n)
            .map(|j| (0..n).find_map(|s| owner(table[(j + s) % n])).unwrap())
            .collect()
    }

    /// Keys eligible with weight > 0 in `s`, with their weights.
    fn owners_of(s: &Snapshot) -> HashMap<&EndpointKey, u32> {
        (s.eligible().iter())
            .filter(|&&i| s.endpoint(i).weight() > 0)
            .map(|&i| (s.endpoint(i).key(), s.endpoint(i).weight()))
            .collect()
    }

    /// Whether the change from `last` to `next` must build the table (else a patch will do):
    /// a key present in both owns entries in `next` only, or the keys new to the owners weigh
    /// more than a tenth of those kept.
    fn must_build(last: &Snapshot, next: &Snapshot) -> bool {
        let (before, after) = (owners_of(last), owners_of(next));
        let present: Vec<&EndpointKey> = last.endpoints().iter().map(|e| e.key()).collect();
        let back = (after.keys()).any(|k| present.contains(k) && !before.contains_key(k));
        let kept: u32 = (after.iter().filter(|(k, _)| before.contains_key(*k)))
            .map(|(_, w)| w)
            .sum();
        let new: u32 = (after.iter().filter(|(k, _)| !before.contains_key(*k)))
            .map(|(_, w)| w)
            .sum();
        back || new * 10 > kept
    }

    /// The build's input: address and weight of every endpoint of positive weight.
    fn build_input(s: &Snapshot) -> Vec<(String, u32)> {
        let mut input: Vec<(String, u32)> = (s.endpoints().iter())
            .filter(|e| e.weight() > 0)
            .map(|e| (e.address().to_string(), e.weight()))
            .collect();
        input.sort();
        input
    }

    /// `p`, prepared within the interval from `picker` (for `last`) for `next`, is the patch
    /// the reference says; it asks for the build at `picker`'s build time plus `interval`,
    /// unless the build's input did not change (then it is exact, and asks as `picker` did);
    /// built at its time, it is `rebuilt`.
    fn check_patch(
        (strategy, interval): (&Maglev, Duration),
        (last, picker): (&Snapshot, &MaglevPicker),
        (next, p): (&Arc<Snapshot>, &MaglevPicker),
        rebuilt: &MaglevPicker,
        at: &str,
    ) {
        let want = reference_patch(picker.table(), last, next);
        let got: Vec<usize> = p.table().iter().map(|i| i.get()).collect();
        assert_eq!(got, want, "{at}");
        let mut distinct = want.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(p.distinct as usize, distinct.len(), "{at}");
        assert_eq!(p.built_at, picker.built_at, "{at}");
        if build_input(last) == build_input(next) {
            assert_eq!(p.refresh_at(), picker.refresh_at(), "{at}: exact");
        } else {
            assert_eq!(p.refresh_at(), Some(picker.built_at + interval), "{at}");
        }
        let Some(due) = p.refresh_at() else {
            return assert_eq!(p.table(), rebuilt.table(), "{at}: exact");
        };
        let done = strategy.prepare_next(next, p, next, due);
        assert_eq!(done.table(), rebuilt.table(), "{at}");
        assert_eq!(done.refresh_at(), None, "{at}");
    }

    /// One round's changes to `set`: 1 to 3 endpoints come, go, change weight or flip health.
    fn churn(set: &mut BTreeMap<u32, (u32, bool)>, rng: &mut FastRng) {
        for _ in 0..1 + rng.below(3) {
            let p = rng.below(150) as u32;
            let v = match set.get(&p).copied() {
                Some((w, up)) if rng.below(3) == 0 => Some(((w + 1) % 3, up)),
                Some((w, up)) if rng.below(2) == 0 => Some((w, !up)),
                Some(_) => None,
                None => Some((1 + rng.below(2) as u32, true)),
            };
            match v {
                Some(v) => set.insert(p, v),
                None => set.remove(&p),
            };
        }
    }

    /// A chain of sets at uneven times: within the rebuild interval of the last build the
    /// table is the last one patched, key by key as the reference says ([`check_patch`]);
    /// past it, or when the change must build ([`must_build`]), it equals the table built
    /// from scratch.
    #[test]
    fn tables_within_the_interval_are_the_last_ones_patched() {
        let interval = Duration::from_millis(100);
        let spec = |(&p, &(w, up)): (&u32, &(u32, bool))| {
            EndpointSpec::new(format!("10.{}.0.{}:20880", p % 7, 250 - p))
                .with_key(format!("k{p:04}"))
                .with_weight(w)
                .with_healthy(up)
        };
        let mut rng = FastRng::seed_from_u64(44);
        let (mut patched, mut built, mut forced) = (0, 0, 0);
        for size in [251, 1_009] {
            let strategy =
                (Maglev::try_with_table_size(size).unwrap()).with_rebuild_interval(interval);
            let mut set: BTreeMap<u32, (u32, bool)> = (0..30).map(|p| (p * 5, (1, true))).collect();
            let mut b = SnapshotBuilder::new();
            let mut now = Timestamp::from_millis(1_000);
            let specs: Vec<EndpointSpec> = set.iter().map(spec).collect();
            let mut last = b.reset_from(specs.iter().map(Cow::Borrowed), now);
            let mut picker = strategy.prepare(&last, now);
            for round in 0..60 {
                churn(&mut set, &mut rng);
                now = now + Duration::from_millis([10, 30, 150][rng.below(3) as usize]);
                let specs: Vec<EndpointSpec> = set.iter().map(spec).collect();
                let next = b.reset_from(specs.iter().map(Cow::Borrowed), now);
                let rebuilt = strategy.prepare(&next, now);
                let within = now < picker.built_at + interval;
                let p = strategy.prepare_next(&last, &picker, &next, now);
                let at = format!("size {size}, round {round}");
                if within && !must_build(&last, &next) {
                    patched += 1;
                    let pair = ((&strategy, interval), (&*last, &picker), (&next, &p));
                    check_patch(pair.0, pair.1, pair.2, &rebuilt, &at);
                } else {
                    (built, forced) = (built + 1, forced + usize::from(within));
                    assert_eq!(p.table(), rebuilt.table(), "{at}");
                    assert_eq!((p.refresh_at(), p.built_at), (None, now), "{at}");
                }
                (last, picker) = (next, p);
            }
        }
        let counts = format!("{patched} {built} {forced}");
        assert!(patched > 30 && built > 30 && forced >= 2, "{counts}");
    }

    /// Entries of gone owners take the next kept entry's owner, across the table's end too.
    #[test]
    fn gone_entries_take_the_next_kept_owner_across_the_end() {
        let table: Vec<EndpointIdx> = [0, 1, 2, 0, 0].map(EndpointIdx::new).to_vec();
        let got = follow(&table, &[GONE, 5, 7]).unwrap();
        let got: Vec<usize> = got.iter().map(|e| e.get()).collect();
        assert_eq!(got, [5, 5, 7, 5, 5]);
        assert!(follow(&table, &[GONE, GONE, GONE]).is_none());
    }

    /// A patched table's owners keep their entries; a new endpoint gets none until the table
    /// is built; the entries of a removed one go to the next entry's owner.
    #[test]
    fn a_patch_keeps_entries_where_they_were() {
        let specs = |r: std::ops::Range<u32>| -> Vec<EndpointSpec> {
            // Keys in the order of the sets, as the controller publishes them.
            let spec = |i| EndpointSpec::new(format!("10.0.0.{i}:80")).with_key(format!("k{i:02}"));
            r.map(spec).collect()
        };
        let mut b = SnapshotBuilder::new();
        let t0 = Timestamp::from_millis(5_000);
        let strategy = (Maglev::try_with_table_size(1_009).unwrap())
            .with_rebuild_interval(TICKED_REBUILD_INTERVAL);
        let s1 = b.reset_from(specs(0..20).iter().map(Cow::Borrowed), t0);
        let p1 = strategy.prepare(&s1, t0);
        // 10.0.0.0 out, 10.0.0.20 in, 10 ms later.
        let t1 = t0 + Duration::from_millis(10);
        let s2 = b.reset_from(specs(1..21).iter().map(Cow::Borrowed), t1);
        let p2 = strategy.prepare_next(&s1, &p1, &s2, t1);
        assert_eq!(p2.refresh_at(), Some(t0 + TICKED_REBUILD_INTERVAL));
        let key = |s: &Snapshot, i: EndpointIdx| s.endpoint(i).address().to_string();
        let (old, new) = ("10.0.0.0:80", "10.0.0.20:80");
        for (j, (&a, &b)) in p1.table().iter().zip(p2.table().iter()).enumerate() {
            assert_ne!(
                key(&s2, b),
                new,
                "entry {j}: the new endpoint waits for the build"
            );
            if key(&s1, a) != old {
                assert_eq!(key(&s1, a), key(&s2, b), "entry {j} moved");
            } else {
                let after = (1..).map(|s| p1.table()[(j + s) % 1_009]);
                let heir = after.map(|i| key(&s1, i)).find(|k| k != old).unwrap();
                assert_eq!(key(&s2, b), heir, "entry {j}: the next entry's owner");
            }
        }
        assert_eq!(p2.distinct, 19);
        // With no interval the table is built at once, the new endpoint in it.
        let envoy = strategy.with_rebuild_interval(Duration::ZERO);
        let p3 = envoy.prepare_next(&s1, &p1, &s2, t1);
        assert_eq!((p3.refresh_at(), p3.distinct), (None, 20));
    }

    /// Within the interval: a change of health alone patches to the very table a build makes
    /// (it asks for no build); new endpoints of more than a tenth of the weight kept build.
    #[test]
    fn health_alone_patches_exactly_and_many_new_endpoints_build() {
        let spec = |i: u32, up: bool| {
            EndpointSpec::new(format!("10.0.0.{i}:80"))
                .with_key(format!("k{i:02}"))
                .with_healthy(up)
        };
        let specs = |r: std::ops::Range<u32>, down: u32| -> Vec<EndpointSpec> {
            r.map(|i| spec(i, i != down)).collect()
        };
        let mut b = SnapshotBuilder::new();
        let strategy = (Maglev::try_with_table_size(1_009).unwrap())
            .with_rebuild_interval(TICKED_REBUILD_INTERVAL);
        let (t0, t1) = (Timestamp::from_millis(5_000), Timestamp::from_millis(5_010));
        let s0 = b.reset_from(specs(0..20, 99).iter().map(Cow::Borrowed), t0);
        let p0 = strategy.prepare(&s0, t0);
        let s1 = b.reset_from(specs(0..20, 7).iter().map(Cow::Borrowed), t1);
        let p1 = strategy.prepare_next(&s0, &p0, &s1, t1);
        assert_eq!((p1.refresh_at(), p1.built_at), (None, t0));
        assert_eq!(p1.table(), strategy.prepare(&s1, t1).table());
        // Three new beside 20 kept, all of weight 100: 3 > 20 / 10, built at once.
        let s2 = b.reset_from(specs(0..23, 99).iter().map(Cow::Borrowed), t1);
        let p2 = strategy.prepare_next(&s0, &p0, &s2, t1);
        assert_eq!((p2.refresh_at(), p2.built_at, p2.distinct), (None, t1, 23));
        // Two: 2 <= 20 / 10, patched; under a load bound they weigh nothing until the build.
        let s3 = b.reset_from(specs(0..22, 99).iter().map(Cow::Borrowed), t1);
        let p3 = strategy.prepare_next(&s0, &p0, &s3, t1);
        assert_eq!((p3.built_at, p3.distinct), (t0, 20));
        let bounded = strategy.with_balance_factor(super::super::BalanceFactor::new(1.25).unwrap());
        let p3 = bounded.prepare_next(&s0, &bounded.prepare(&s0, t0), &s3, t1);
        let bound = p3.bound.as_ref().unwrap();
        assert_eq!(bound.weight(EndpointIdx::new(21)), (0.0, 2_000.0));
        assert_eq!(bound.weight(EndpointIdx::new(3)), (100.0, 2_000.0));
        // With no interval, never patched, even with a clock behind the last build.
        let envoy = strategy.with_rebuild_interval(Duration::ZERO);
        let p4 = envoy.prepare_next(&s0, &p0, &s3, Timestamp::from_millis(4_000));
        assert_eq!((p4.refresh_at(), p4.distinct), (None, 22));
    }
}
