use std::borrow::Cow;

use lbkit_core::{EndpointSpec, SnapshotBuilder};
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
/// chunk is well formed (its first point, points ascending, shadowed points at its points).
fn parts(r: &RingPicker) -> (Points, Points, u32, usize) {
    let mut shadowed = Points::new();
    for c in 0..r.chunks.len() {
        let (main, rest) = r.chunks[c].split_at(r.mains[c] as usize);
        assert!(!main.is_empty() && main[0].0 == r.firsts[c]);
        assert!(main.windows(2).all(|w| w[0].0 < w[1].0));
        assert!(rest
            .iter()
            .all(|p| main.binary_search_by_key(&p.0, |m| m.0).is_ok()));
        shadowed.extend(rest.iter().map(|&(h, s)| (h, r.endpoint[s as usize])));
    }
    shadowed.sort_unstable();
    (r.points().collect(), shadowed, r.distinct, r.len())
}

proptest! {
    #![proptest_config(ProptestConfig {
        rng_seed: proptest::test_runner::RngSeed::Fixed(44),
        ..ProptestConfig::default()
    })]
    /// A chain of patches builds, set after set, the ring a rebuild builds: the same points,
    /// owners, shadowed points and distinct owners, under either collision rule, with endpoints
    /// coming, going, changing weight and health, in rings of one chunk and of many, with
    /// collisions everywhere or nowhere.
    #[test]
    fn patches_build_what_a_rebuild_builds(sets in proptest::collection::vec(proptest::collection::btree_map(0u32..40, (1u32..3, any::<bool>()), 0..30), 1..10), keep_first in any::<bool>(), space in prop_oneof![Just(16u32), Just(4096), Just(u32::MAX)], per in prop_oneof![Just(4u32), Just(40)]) {
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
            let carried = carry_all(&last, &next).expect("key order");
            // None: the last ring was empty (or patches left it in too many chunks).
            patched = patched
                .patch_carried(carried, &last, &next, &put, None)
                .unwrap_or_else(|| ring(&next, collision, &put));
            prop_assert_eq!(parts(&patched), parts(&rebuilt));
            last = next;
        }
    }
}
