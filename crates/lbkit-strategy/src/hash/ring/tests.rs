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

/// [`put`] with `per` points for each unit of an endpoint's weight (ketama's shape).
fn put_weighted(
    space: u32,
    per: u32,
) -> impl Fn(&Snapshot, EndpointIdx, &mut Vec<(u32, EndpointIdx)>) {
    move |snapshot, idx, out| put(space, per * snapshot.endpoint(idx).weight())(snapshot, idx, out)
}

fn ring(snapshot: &Arc<Snapshot>, collision: Collision, put: patch::Put<'_>) -> RingPicker {
    let mut all = Vec::new();
    for &idx in snapshot.eligible() {
        put(snapshot, idx, &mut all);
    }
    RingPicker::new(
        all,
        (collision, KeyPoint::Md5),
        None,
        snapshot,
        Timestamp::ZERO,
    )
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

/// An endpoint's address in the tests of changes that wait.
fn address(p: u32) -> String {
    format!("10.0.0.1:{}", 1000 + p)
}

/// One or two changes to `set` (port → weight, healthy): an endpoint gone or new, its weight
/// changed (0 drains it), its health flipped.
fn mutate(rng: &mut lbkit_core::FastRng, set: &mut std::collections::BTreeMap<u32, (u32, bool)>) {
    for _ in 0..=rng.below(2) {
        let p = rng.below(48) as u32;
        match (set.get(&p).copied(), rng.below(4)) {
            (None, _) => drop(set.insert(p, (1 + rng.below(2) as u32, true))),
            (Some(_), 0) => drop(set.remove(&p)),
            (Some((w, up)), 1) => drop(set.insert(p, (w, !up))),
            (Some((w, up)), _) => drop(set.insert(p, ((w + 1) % 3, up))),
        }
    }
}

/// What a ring made within the interval of the last splice (of `base`) shows for `next`, by
/// an independent model: `None` when the change must be spliced now (an endpoint off the
/// base ring is eligible again, the new endpoints are more than a tenth of the ones kept, or
/// none is kept); else the base ring's points whose owners are eligible in `next`, owned by
/// their indices there, and how many owners they have. `why` counts each reason to splice.
fn waiting_model(
    base_ring: &RingPicker,
    base: &Snapshot,
    next: &Snapshot,
    why: &mut [u32; 3],
) -> Option<(Points, usize)> {
    let find = |s: &Snapshot, a: &str| {
        (0..s.len()).find(|&i| s.endpoint(EndpointIdx::new(i)).address() == a)
    };
    let eligible = |s: &Snapshot, i: usize| s.is_eligible(EndpointIdx::new(i));
    let was = |a: &str| find(base, a).map(|i| eligible(base, i));
    let addresses = (0..next.len()).map(|i| (i, next.endpoint(EndpointIdx::new(i)).address()));
    let eligible_now: Vec<(usize, &str)> = addresses.filter(|&(i, _)| eligible(next, i)).collect();
    let back = eligible_now
        .iter()
        .filter(|(_, a)| was(a) == Some(false))
        .count();
    let fresh = eligible_now
        .iter()
        .filter(|(_, a)| was(a).is_none())
        .count();
    let kept = eligible_now.len() - back - fresh;
    let reason = [back > 0, fresh * 10 > kept, kept == 0]
        .iter()
        .position(|&r| r);
    if let Some(r) = reason {
        why[r] += 1;
        return None;
    }
    let now_of =
        |e: EndpointIdx| find(next, base.endpoint(e).address()).filter(|&i| eligible(next, i));
    let points: Points = base_ring
        .points()
        .filter_map(|(h, e)| now_of(e).map(|i| (h, EndpointIdx::new(i))))
        .collect();
    let owners: std::collections::BTreeSet<EndpointIdx> = points.iter().map(|p| p.1).collect();
    Some((points, owners.len()))
}

/// The specs of a set of the tests of changes that wait (port → weight, healthy).
fn wait_specs(set: &std::collections::BTreeMap<u32, (u32, bool)>) -> Vec<EndpointSpec> {
    let spec = |(&p, &(w, up))| {
        EndpointSpec::new(address(p))
            .with_weight(w)
            .with_healthy(up)
    };
    set.iter().map(spec).collect()
}

/// One step of [`changes_within_the_interval_wait_and_splice_as_a_rebuild`]: `made`, the ring
/// of `next` (at `now`), against `model` ([`waiting_model`], `None` past the interval) and
/// `rebuilt`, with `at` the last splice's time and `next_at` the strategy's arguments at a
/// time. Whether the ring was held, and the last splice's time after it.
fn check_step<'a>(
    made: &RingPicker,
    (next, now): (&Arc<Snapshot>, Timestamp),
    (model, rebuilt): (Option<(Points, usize)>, &RingPicker),
    (at, interval): (Timestamp, std::time::Duration),
    next_at: &dyn Fn(Timestamp) -> pending::Next<'a>,
) -> (bool, Timestamp) {
    let due = at.saturating_add(interval);
    if made.splice.last.is_some() {
        let (points, owners) = model.expect("the model splices");
        let (shown, _, distinct, _) = parts(made);
        assert_eq!((shown, distinct as usize), (points, owners));
        lookups_agree(made);
        assert_eq!(made.refresh_at(), Some(due));
        let ticked = made.next(next, next, &next_at(due)).expect("spliced");
        assert_eq!(parts(&ticked), parts(rebuilt));
        assert_eq!((ticked.refresh_at(), ticked.splice.at), (None, due));
        return (true, at);
    }
    assert_eq!(parts(made), parts(rebuilt));
    assert_eq!(made.refresh_at(), None);
    if made.splice.at != now {
        // Nothing waits: the last splice's ring, renumbered.
        assert!(model.is_some() && made.splice.at == at);
        return (false, at);
    }
    if now < due {
        assert!(
            model.is_none(),
            "spliced within the interval: the model holds"
        );
    }
    (false, now)
}

/// Changes within the rebuild interval of the last splice wait: 150 sets 10, 30 or 150 ms
/// apart (endpoints coming, going, drained, re-weighted: their points change, down and up),
/// under either collision
/// rule, in rings of many chunks, with collisions and of one chunk. A ring made within the
/// interval shows, point by point, what the model shows (the last spliced ring's points less
/// those of endpoints gone, down or drained, new ones waiting) or splices when the model says
/// it must; it finds owners as a scan of its points does, asks to be spliced at the interval's
/// end, and spliced then (at the balancer's tick, the same snapshot) equals a rebuild. Every
/// ring spliced equals a rebuild.
#[test]
fn changes_within_the_interval_wait_and_splice_as_a_rebuild() {
    use lbkit_core::FastRng;
    use std::time::Duration;
    let interval = Duration::from_millis(100);
    for (space, per) in [(u32::MAX, 40), (4096, 40), (u32::MAX, 2)] {
        for collision in [Collision::KeepFirst, Collision::KeepLast] {
            let put = put_weighted(space, per);
            let next_at = |now| pending::Next {
                put: &put,
                same_points: |a, b| a.address() == b.address() && a.weight() == b.weight(),
                balance: None,
                interval,
                now,
            };
            let mut rng = FastRng::seed_from_u64(44);
            let mut set = (0..40).map(|p| (p, (1, true))).collect();
            let mut b = SnapshotBuilder::new();
            let mut now = Timestamp::ZERO;
            let mut last = b.reset_from(wait_specs(&set).iter().map(Cow::Borrowed), now);
            let mut made = ring(&last, collision, &put);
            let (mut base, mut base_at) = (last.clone(), now);
            let (mut held, mut why) = (0, [0u32; 3]);
            for _ in 0..150 {
                mutate(&mut rng, &mut set);
                let step = Duration::from_millis([10, 30, 150][rng.below(3) as usize]);
                now = now.saturating_add(step);
                let next = b.reset_from(wait_specs(&set).iter().map(Cow::Borrowed), now);
                let model = (now < base_at.saturating_add(interval))
                    .then(|| waiting_model(&ring(&base, collision, &put), &base, &next, &mut why))
                    .flatten();
                made = made.next(&last, &next, &next_at(now)).expect("not rebuilt");
                let rebuilt = ring(&next, collision, &put);
                let step = (model, &rebuilt);
                let (was_held, at) =
                    check_step(&made, (&next, now), step, (base_at, interval), &next_at);
                held += usize::from(was_held);
                if at != base_at {
                    (base, base_at) = (next.clone(), at);
                }
                last = next;
            }
            assert!(held >= 40, "{held} held ({space}, {per})");
            // The third reason (none kept) has its own test.
            let met = why[..2].iter().all(|&n| n > 0);
            assert!(met, "reasons to splice met: {why:?}");
        }
    }
}

/// Within the interval: every endpoint gone splices at once (an empty ring, not one of dead
/// points); one new endpoint among ten waits, weighing 0 in the load bound, and two splice;
/// an endpoint down and back is the spliced ring again, asking for nothing.
#[test]
fn no_endpoint_left_splices_and_waiting_endpoints_take_no_load() {
    use crate::hash::bounded::BalanceFactor;
    use std::time::Duration;
    let put = put(u32::MAX, 40);
    let factor = BalanceFactor::new(1.25).unwrap();
    let next_at = |ms| pending::Next {
        put: &put,
        same_points: |a, b| a.address() == b.address(),
        balance: Some((factor, |_: &lbkit_core::Endpoint| 1)),
        interval: Duration::from_millis(100),
        now: Timestamp::from_millis(ms),
    };
    let specs = |ports: &[u32], down: Option<u32>| -> Vec<EndpointSpec> {
        let spec = |&p: &u32| EndpointSpec::new(address(p)).with_healthy(Some(p) != down);
        ports.iter().map(spec).collect()
    };
    let ten: Vec<u32> = (0..10).collect();
    let mut b = SnapshotBuilder::new();
    let mut snap = |ports: &[u32], down| {
        b.reset_from(
            specs(ports, down).iter().map(Cow::Borrowed),
            Timestamp::ZERO,
        )
    };
    let s0 = snap(&ten, None);
    let r0 = ring(&s0, Collision::KeepFirst, &put);
    // From a builder of its own: one endpoint object for each key in the sets below.
    let empty = SnapshotBuilder::new().reset_from(std::iter::empty(), Timestamp::ZERO);
    let gone = r0.next(&s0, &empty, &next_at(10)).expect("spliced");
    assert!(gone.is_empty() && gone.splice.last.is_none() && gone.refresh_at().is_none());
    let eleven: Vec<u32> = (0..11).collect();
    let s1 = snap(&eleven, None);
    let r1 = r0.next(&s0, &s1, &next_at(10)).expect("held");
    assert_eq!(r1.refresh_at(), Some(Timestamp::from_millis(100)));
    assert!(
        r1.points().all(|(_, e)| e.get() < 10),
        "the new endpoint waits"
    );
    let bound = r1.bound.as_ref().unwrap();
    assert_eq!(bound.weight(EndpointIdx::new(10)), (0.0, 10.0));
    assert_eq!(bound.weight(EndpointIdx::new(9)), (1.0, 10.0));
    let twelve: Vec<u32> = (0..12).collect();
    let s2 = snap(&twelve, None);
    let r2 = r1.next(&s1, &s2, &next_at(20)).expect("spliced");
    assert!(r2.refresh_at().is_none() && r2.splice.at == Timestamp::from_millis(20));
    assert_eq!(parts(&r2), parts(&ring(&s2, Collision::KeepFirst, &put)));
    let s3 = snap(&twelve, Some(4));
    let r3 = r2.next(&s2, &s3, &next_at(30)).expect("held");
    assert!(r3.points().all(|(_, e)| e.get() != 4) && r3.refresh_at().is_some());
    // Picks walk past the dead points, first and further candidates (`probe`), with a load
    // bound: as a ring built without the endpoint that is down.
    picks_walk_past_dead_points(&r3, &ring(&s3, Collision::KeepFirst, &put));
    let s4 = snap(&twelve, None);
    let r4 = r3.next(&s3, &s4, &next_at(40)).expect("back");
    assert_eq!((r4.refresh_at(), r4.splice.at), (None, r2.splice.at));
    assert_eq!(parts(&r4), parts(&r2));
}

/// Picks of `held` (a ring with dead slots) equal those of `without` (built without their
/// endpoints), for 2 000 keys at probes 0 to 2, more than 50 of the keys landing on a dead
/// point.
fn picks_walk_past_dead_points(held: &RingPicker, without: &RingPicker) {
    let mut rng = lbkit_core::FastRng::seed_from_u64(4);
    let mut walked = 0;
    for k in 0..2_000u32 {
        let key = format!("key-{k}");
        for probe in 0..3 {
            let mut pick = |r: &RingPicker| {
                let cx = lbkit_core::PickContext::new(Timestamp::ZERO, &mut rng);
                let mut cx = cx.with_key(key.as_bytes());
                cx.probe = probe;
                r.pick(&mut cx).unwrap()
            };
            assert_eq!(pick(held), pick(without), "{key} probe {probe}");
        }
        walked +=
            usize::from(held.owner(held.position(consistent::key_point(key.as_bytes()))) == dead());
    }
    assert!(walked > 50, "{walked} keys landed on a dead point");
}
