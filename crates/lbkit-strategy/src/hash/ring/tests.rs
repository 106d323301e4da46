use std::borrow::Cow;

use lbkit_core::{diff, EndpointSpec, SnapshotBuilder};
use proptest::prelude::*;

use super::*;

/// `per` points per endpoint in a space of `space`: small spaces make endpoints collide all the
/// time, large ones make many chunks.
fn put(space: u32, per: u32) -> impl Fn(&Snapshot, EndpointIdx, &mut Vec<(u32, EndpointIdx)>) {
    move |snapshot, idx, out| {
        let port = snapshot.endpoint(idx).address().rsplit(':').next().unwrap();
        let port: u32 = port.parse().unwrap();
        out.extend((0..per).map(|i| {
            let h = (port.wrapping_mul(2_654_435_761) ^ i.wrapping_mul(40_503)).wrapping_mul(i + 1);
            (h % space, idx)
        }));
    }
}

fn ring(snapshot: &Arc<Snapshot>, collision: Collision, put: patch::Put<'_>) -> RingPicker {
    let mut all = Vec::new();
    for &idx in snapshot.eligible() {
        put(snapshot, idx, &mut all);
    }
    RingPicker::new(all, collision, KeyPoint::Md5, None, snapshot)
}

type Points = Vec<(u32, EndpointIdx)>;

/// Points, shadowed points (by endpoint, not slot), distinct owners and length; and that every
/// group and chunk is well formed (each group's first point, non-empty groups and chunks, each
/// chunk's first point, points ascending, shadowed points at its points, the counts of chunks
/// and points kept).
fn parts(r: &RingPicker) -> (Points, Points, u32, usize) {
    let mut shadowed = Points::new();
    assert_eq!(r.firsts.len(), r.groups.len());
    for (g, group) in r.groups.iter().enumerate() {
        assert!(group.len() > 0 && group.firsts()[0] == r.firsts[g]);
        assert!((0..MAX_GROUP).all(|c| group.chunk[c].is_some() == (c < group.len())));
        for c in 0..group.len() {
            let (main, rest) = group.chunk(c).split_at(group.lens()[c] as usize);
            assert!(!main.is_empty() && main[0].0 == group.firsts()[c]);
            assert!(main.windows(2).all(|w| w[0].0 < w[1].0));
            assert!(rest
                .iter()
                .all(|p| main.binary_search_by_key(&p.0, |m| m.0).is_ok()));
            shadowed.extend(rest.iter().map(|&(h, s)| (h, r.endpoint[s as usize])));
        }
    }
    let points: Points = r.points().collect();
    assert!(points.windows(2).all(|w| w[0].0 < w[1].0));
    assert_eq!(r.chunks, r.groups.iter().map(|g| g.len()).sum::<usize>());
    assert_eq!(r.len(), points.len());
    shadowed.sort_unstable();
    (points, shadowed, r.distinct, r.len())
}

/// Every point's owner as `owner_at` finds it, and the owners of points between and around
/// them, against a scan of the points.
fn lookups_agree(r: &RingPicker) {
    let points: Points = r.points().collect();
    let scan = |x: u32| {
        let at = points.partition_point(|&(h, _)| h < x);
        points.get(at).or(points.first()).map(|&(_, e)| e)
    };
    for &(h, _) in &points {
        for x in [h.wrapping_sub(1), h, h.wrapping_add(1)] {
            assert_eq!(r.owner_at(x), scan(x), "point {x}");
        }
    }
    assert_eq!(r.owner_at(u32::MAX), scan(u32::MAX));
    assert_eq!(r.owner_at(0), scan(0));
    // Clockwise from a few points, across chunks and groups: every point once, in ring order.
    for at in (0..points.len()).step_by(points.len() / 5 + 1) {
        let walked: Vec<EndpointIdx> = r.clockwise(r.position(points[at].0)).collect();
        let (before, after) = points.split_at(at);
        let scanned: Vec<EndpointIdx> = after.iter().chain(before).map(|&(_, e)| e).collect();
        assert_eq!(walked, scanned, "clockwise from point {at}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        rng_seed: proptest::test_runner::RngSeed::Fixed(44),
        ..ProptestConfig::default()
    })]
    /// A chain of patches builds, set after set, the ring a rebuild builds: the same points,
    /// owners, shadowed points and distinct owners, under either collision rule, with endpoints
    /// coming, going, changing weight and health, in rings of one chunk, of many chunks and of
    /// many groups, with collisions everywhere or nowhere; and a patched ring finds each point's
    /// owner as a scan does.
    #[test]
    fn patches_build_what_a_rebuild_builds(sets in proptest::collection::vec(proptest::collection::btree_map(0u32..40, (1u32..3, any::<bool>()), 0..30), 1..10), keep_first in any::<bool>(), space in prop_oneof![Just(16u32), Just(4096), Just(u32::MAX)], per in prop_oneof![Just(4u32), Just(40), Just(160)]) {
        let collision = if keep_first { Collision::KeepFirst } else { Collision::KeepLast };
        let put = put(space, per);
        let mut b = SnapshotBuilder::new();
        let mut last = b.apply(lbkit_core::Update::Reset(Vec::new()), Timestamp::ZERO);
        let mut patched = ring(&last, collision, &put);
        for set in sets {
            let specs: Vec<EndpointSpec> = set
                .iter()
                .map(|(p, &(w, up))| {
                    EndpointSpec::new(format!("10.0.0.1:{}", 1000 + p)).with_weight(w).with_healthy(up)
                })
                .collect();
            let next = b.reset_from(specs.iter().map(Cow::Borrowed), Timestamp::ZERO);
            let rebuilt = ring(&next, collision, &put);
            lookups_agree(&rebuilt);
            let carried = diff::carried(last.endpoints(), next.endpoints()).expect("key order");
            // None only when the last ring was empty: a patch that gives up (a removed point
            // not found where it looked) would hide its mistakes behind a rebuild. A ring left
            // too scattered is checked, then rebuilt, as `patch` does.
            patched = match patched.patch_all(carried, usize::MAX, &last, &next, &put, None) {
                Some(p) => {
                    prop_assert_eq!(parts(&p), parts(&rebuilt));
                    lookups_agree(&p);
                    if p.compact() { p } else { ring(&next, collision, &put) }
                }
                None => {
                    prop_assert!(patched.is_empty(), "a patch of a non-empty ring gave up");
                    ring(&next, collision, &put)
                }
            };
            last = next;
        }
    }
}

/// A patch whose removed points are not on the ring (the ring was not made from the last
/// snapshot's points) gives up instead of removing whatever sits where they would be: points
/// outside a space of 16 (chunks full of collisions), and points each one before a point of
/// the endpoint that goes (chunks without collisions, where the point after the one not found
/// is the one to remove).
#[test]
fn a_patch_gives_up_when_a_removed_point_is_not_on_the_ring() {
    let specs = |ports: &[u32]| -> Vec<EndpointSpec> {
        let address = |p| EndpointSpec::new(format!("10.0.0.1:{p}"));
        ports.iter().map(|&p| address(p)).collect()
    };
    for (space, shift) in [(16, 16), (u32::MAX, u32::MAX)] {
        let mut b = SnapshotBuilder::new();
        let last = b.reset_from(
            specs(&[1000, 1001, 1002]).iter().map(Cow::Borrowed),
            Timestamp::ZERO,
        );
        let next = b.reset_from(
            specs(&[1000, 1002]).iter().map(Cow::Borrowed),
            Timestamp::ZERO,
        );
        let made_with = put(space, 40);
        let other = |s: &Snapshot, e: EndpointIdx, out: &mut Vec<(u32, EndpointIdx)>| {
            let from = out.len();
            made_with(s, e, out);
            out[from..]
                .iter_mut()
                .for_each(|p| p.0 = p.0.wrapping_add(shift));
        };
        let made = ring(&last, Collision::KeepFirst, &made_with);
        let carried = diff::carried(last.endpoints(), next.endpoints()).expect("key order");
        assert!(
            made.patch_all(carried, usize::MAX, &last, &next, &other, None)
                .is_none(),
            "space {space}"
        );
    }
}
