//! Tag routing against Dubbo's own `TagStateRouterTest` and the behaviour its `TagStateRouter`
//! code spells out (3.0/3.1), branch by branch.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::*;
use crate::{
    Balancer, EndpointSpec, FastRng, PickContext, PickError, Picker, Strategy, Timestamp, TriedSet,
};

/// Picks an eligible endpoint at random (the context's seeded source).
struct Uniform;
struct UniformPicker(Arc<Snapshot>);

impl Picker for UniformPicker {
    fn pick(&self, cx: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> {
        let e = self.0.eligible();
        Ok(e[cx.rng.index(e.len())])
    }
}

impl Strategy for Uniform {
    type Picker = UniformPicker;
    fn name(&self) -> &str {
        "uniform"
    }
    fn prepare(&self, s: &Arc<Snapshot>, _: Timestamp) -> UniformPicker {
        UniformPicker(s.clone())
    }
}

fn spec(addr: &str, tag: Option<&str>) -> EndpointSpec {
    let s = EndpointSpec::new(addr);
    match tag {
        Some(t) => s.with_meta(TAG_KEY, t),
        None => s,
    }
}

/// The rule, written on every endpoint as the ZooKeeper consumer writes it; `groups[i]` are
/// the tags whose addresses match endpoint `i`.
fn ruled(
    mut specs: Vec<EndpointSpec>,
    force: bool,
    tags: &[(&str, bool)],
    groups: &[&str],
) -> Vec<EndpointSpec> {
    let names: Vec<&str> = tags.iter().map(|t| t.0).collect();
    let listed: Vec<&str> = tags.iter().filter(|t| t.1).map(|t| t.0).collect();
    for (i, s) in specs.iter_mut().enumerate() {
        let mut m = std::mem::replace(s, EndpointSpec::new("x:1"));
        m = m
            .with_meta(TAG_RULE_KEY, "demo-provider")
            .with_meta(TAG_RULE_FORCE_KEY, force.to_string())
            .with_meta(TAG_RULE_NAMES_KEY, names.join(","))
            .with_meta(TAG_RULE_LISTED_KEY, listed.join(","));
        if let Some(g) = groups.get(i).filter(|g| !g.is_empty()) {
            m = m.with_meta(TAG_GROUPS_KEY, *g);
        }
        *s = m;
    }
    specs
}

/// Every address a request with `tag` can reach (200 seeded picks), or its error.
fn reach(
    specs: Vec<EndpointSpec>,
    tag: Option<RequestTag<'_>>,
) -> Result<BTreeSet<String>, PickError> {
    let now = Timestamp::ZERO;
    let b = Balancer::new(Uniform, Arc::new(Snapshot::from_specs(specs, now)), now);
    let mut rng = FastRng::seed_from_u64(3);
    let mut seen = BTreeSet::new();
    for _ in 0..200 {
        let mut cx = PickContext::new(now, &mut rng);
        cx.tag = tag;
        let g = b.pick(&mut cx)?;
        seen.insert(g.endpoint().address().to_string());
        g.finish(crate::Outcome::Success);
    }
    Ok(seen)
}

fn set(addrs: &[&str]) -> Result<BTreeSet<String>, PickError> {
    Ok(addrs.iter().map(|a| a.to_string()).collect())
}

fn tag(name: &str) -> Option<RequestTag<'_>> {
    Some(RequestTag::new(name.as_bytes()))
}

fn forced(name: &str) -> Option<RequestTag<'_>> {
    Some(RequestTag::forced(name.as_bytes()))
}

/// Dubbo's `testTagRoutePickInvokers`: 7777 carries `dubbo.tag=tag2`, 7778 and 7779 none.
fn dubbo_static() -> Vec<EndpointSpec> {
    vec![
        spec("127.0.0.1:7777", Some("tag2")),
        spec("127.0.0.1:7778", None),
        spec("127.0.0.1:7779", None),
    ]
}

#[test]
fn a_tagged_request_goes_to_its_tag_as_in_dubbos_test() {
    assert_eq!(reach(dubbo_static(), tag("tag2")), set(&["127.0.0.1:7777"]));
}

#[test]
fn requests_without_a_tag_avoid_tagged_providers() {
    let untagged = set(&["127.0.0.1:7778", "127.0.0.1:7779"]);
    assert_eq!(reach(dubbo_static(), None), untagged);
    // An empty tag is no tag (StringUtils.isEmpty).
    assert_eq!(reach(dubbo_static(), tag("")), untagged);
}

#[test]
fn an_unknown_tag_falls_back_to_untagged_providers_unless_forced() {
    let untagged = set(&["127.0.0.1:7778", "127.0.0.1:7779"]);
    assert_eq!(reach(dubbo_static(), tag("gray")), untagged);
    assert_eq!(
        reach(dubbo_static(), forced("gray")),
        Err(PickError::NoTagMatch)
    );
    // Forcing a tag that exists changes nothing.
    assert_eq!(
        reach(dubbo_static(), forced("tag2")),
        set(&["127.0.0.1:7777"])
    );
}

#[test]
fn without_any_tag_every_request_but_a_forced_one_reaches_everything() {
    let plain = || vec![spec("a:1", None), spec("b:1", None)];
    let all = set(&["a:1", "b:1"]);
    assert_eq!(reach(plain(), None), all);
    assert_eq!(reach(plain(), tag("gray")), all);
    assert_eq!(reach(plain(), forced("gray")), Err(PickError::NoTagMatch));
}

#[test]
fn when_every_provider_is_tagged_untagged_requests_find_none() {
    let tagged = vec![spec("a:1", Some("blue")), spec("b:1", Some("green"))];
    assert_eq!(reach(tagged.clone(), None), Err(PickError::AllTagged));
    // A tag nobody has: the fall back is the untagged providers, and there are none.
    assert_eq!(reach(tagged, tag("red")), Err(PickError::NoTagMatch));
}

#[test]
fn an_ineligible_tagged_provider_sends_its_tag_to_the_fallback() {
    let specs = vec![
        spec("a:1", Some("gray")).with_healthy(false),
        spec("b:1", None),
    ];
    assert_eq!(reach(specs.clone(), tag("gray")), set(&["b:1"]));
    assert_eq!(reach(specs, forced("gray")), Err(PickError::NoTagMatch));
}

/// The documentation's rule: tag1 → 7777, tag2 → 7778, on three providers of which 7779 is
/// untagged and 7780 carries a static tag the rule does not name.
fn documented() -> Vec<EndpointSpec> {
    ruled(
        vec![
            spec("127.0.0.1:7777", None),
            spec("127.0.0.1:7778", Some("tag1")),
            spec("127.0.0.1:7779", None),
            spec("127.0.0.1:7780", Some("blue")),
        ],
        false,
        &[("tag1", true), ("tag2", true)],
        &["tag1", "tag2", "", ""],
    )
}

#[test]
fn a_rule_tags_by_address_before_the_providers_own_tags() {
    // tag1 lists 7777: the static tag1 on 7778 does not count.
    assert_eq!(reach(documented(), tag("tag1")), set(&["127.0.0.1:7777"]));
    assert_eq!(reach(documented(), tag("tag2")), set(&["127.0.0.1:7778"]));
    // A tag the rule does not list: the providers' own tags.
    assert_eq!(reach(documented(), tag("blue")), set(&["127.0.0.1:7780"]));
}

#[test]
fn with_a_rule_untagged_requests_skip_listed_addresses_and_named_static_tags() {
    // 7777 and 7778 are listed; 7780's own tag `blue` is not a rule tag, so it stays.
    assert_eq!(
        reach(documented(), None),
        set(&["127.0.0.1:7779", "127.0.0.1:7780"])
    );
    // Named by the rule (with no addresses): a static tag of that name is reserved.
    let specs = ruled(
        vec![spec("a:1", Some("blue")), spec("b:1", None)],
        false,
        &[("blue", false)],
        &[],
    );
    assert_eq!(reach(specs.clone(), None), set(&["b:1"]));
    // And a request for it matches the static tag (the rule gives it no addresses).
    assert_eq!(reach(specs, tag("blue")), set(&["a:1"]));
}

#[test]
fn with_a_rule_the_fallback_skips_listed_and_statically_tagged_providers() {
    // 7780 (static blue) is not a fall back for an unknown tag: only 7779 is.
    assert_eq!(reach(documented(), tag("red")), set(&["127.0.0.1:7779"]));
    assert_eq!(
        reach(documented(), forced("red")),
        Err(PickError::NoTagMatch)
    );
}

#[test]
fn a_listed_tag_whose_addresses_are_gone_falls_back_unless_the_rule_or_request_forces() {
    // tag3 lists an address no provider has (its group is on nobody).
    let gone = |force| {
        ruled(
            vec![spec("a:1", None), spec("b:1", Some("tag3"))],
            force,
            &[("tag3", true)],
            &[],
        )
    };
    // Not the static tag3 on b: the rule decides tag3, then falls back to a.
    assert_eq!(reach(gone(false), tag("tag3")), set(&["a:1"]));
    assert_eq!(
        reach(gone(false), forced("tag3")),
        Err(PickError::NoTagMatch)
    );
    assert_eq!(reach(gone(true), tag("tag3")), Err(PickError::NoTagMatch));
}

#[test]
fn a_rule_listing_every_provider_leaves_untagged_requests_nothing() {
    let specs = ruled(
        vec![spec("a:1", None), spec("b:1", None)],
        false,
        &[("gray", true)],
        &["gray", "gray"],
    );
    assert_eq!(reach(specs.clone(), None), Err(PickError::AllTagged));
    assert_eq!(reach(specs, tag("gray")), set(&["a:1", "b:1"]));
}

#[test]
fn retries_stay_within_the_tag_and_sets_are_prepared_once() {
    let now = Timestamp::ZERO;
    let specs = vec![
        spec("a:1", Some("gray")),
        spec("b:1", Some("gray")),
        spec("c:1", None),
        spec("d:1", None),
    ];
    let b = Balancer::new(Uniform, Arc::new(Snapshot::from_specs(specs, now)), now);
    let prepared = b.current();
    // gray, the untagged (also the fall back): two subsets.
    assert_eq!(prepared.tag_sets(), 2);
    let (routed, s) = prepared.routed(tag("gray")).expect("routed");
    assert_eq!((routed, s.len()), (Routed::Tagged, 2));
    assert_eq!(
        prepared.routed(tag("nope")).map(|r| r.0),
        Ok(Routed::Fallback)
    );
    assert_eq!(prepared.routed(None).map(|r| r.0), Ok(Routed::Untagged));
    let mut rng = FastRng::seed_from_u64(9);
    let mut tried = TriedSet::new();
    for attempt in 0..2 {
        let mut cx = PickContext::new(now, &mut rng)
            .with_tried(attempt, &tried)
            .with_tag(RequestTag::new(b"gray"));
        let g = b.pick_untried(&mut cx).expect("an untried gray provider");
        assert!(["a:1", "b:1"].contains(&g.endpoint().address()));
        tried.insert(g.endpoint());
        g.finish(crate::Outcome::Success);
    }
    let mut cx = PickContext::new(now, &mut rng)
        .with_tried(2, &tried)
        .with_tag(RequestTag::new(b"gray"));
    assert_eq!(b.pick_untried(&mut cx).err(), Some(PickError::AllTried));
}

#[test]
fn beyond_the_prepared_sets_tags_pick_among_their_members() {
    // 40 tags of one provider and one of two (the largest set gets a picker first), plus four
    // untagged providers.
    let mut specs: Vec<EndpointSpec> = (0..40)
        .map(|i| spec(&format!("10.0.0.{i}:1"), Some(&format!("t{i}"))))
        .collect();
    specs.push(spec("10.0.1.1:1", Some("pair")));
    specs.push(spec("10.0.1.2:1", Some("pair")));
    specs.extend((0..4).map(|i| spec(&format!("10.0.2.{i}:1"), None)));
    let now = Timestamp::ZERO;
    let b = Balancer::new(
        Uniform,
        Arc::new(Snapshot::from_specs(specs.clone(), now)),
        now,
    );
    assert_eq!(b.current().tag_sets(), MAX_TAG_SETS);
    for i in 0..40 {
        let name = format!("t{i}");
        assert_eq!(
            reach(specs.clone(), tag(&name)),
            set(&[&format!("10.0.0.{i}:1")])
        );
    }
    assert_eq!(
        reach(specs.clone(), tag("pair")),
        set(&["10.0.1.1:1", "10.0.1.2:1"])
    );
    let untagged: Vec<String> = (0..4).map(|i| format!("10.0.2.{i}:1")).collect();
    let untagged: Vec<&str> = untagged.iter().map(String::as_str).collect();
    assert_eq!(reach(specs.clone(), None), set(&untagged));
    // A member-list tag: the retry finds nothing untried within it.
    let mut rng = FastRng::seed_from_u64(2);
    let mut tried = TriedSet::new();
    let mut cx = PickContext::new(now, &mut rng).with_tag(RequestTag::new(b"t39"));
    let g = b.pick_untried(&mut cx).expect("t39's provider");
    tried.insert(g.endpoint());
    g.finish(crate::Outcome::Success);
    let mut cx = PickContext::new(now, &mut rng)
        .with_tried(1, &tried)
        .with_tag(RequestTag::new(b"t39"));
    assert_eq!(b.pick_untried(&mut cx).err(), Some(PickError::AllTried));
}

/// A subset of the next table is paired with the last table's subset of the same requests (its
/// picker is prepared from that one's): by tag, else as the untagged set. A tag new to the
/// next table has none.
#[test]
fn a_subset_is_paired_with_the_last_subset_of_the_same_requests() {
    let now = Timestamp::ZERO;
    let table = |tags: &[(u8, Option<&str>)]| {
        let specs = tags
            .iter()
            .map(|&(i, t)| spec(&format!("10.0.0.{i}:1"), t))
            .collect();
        TagTable::of(&Snapshot::from_specs(specs, now)).expect("tagged")
    };
    let (a, b, c) = (Some("a"), Some("b"), Some("c"));
    let last = table(&[(1, a), (2, a), (3, b), (4, None), (5, None)]);
    let next = table(&[(1, a), (2, a), (6, a), (3, b), (7, c), (4, None), (5, None)]);
    let subset = |t: &TagTable, name: Option<&str>| match t.lead(name.and_then(tag).as_ref()) {
        Ok((Lead::Subset(i), _)) => i as usize,
        other => panic!("{name:?}: {other:?}"),
    };
    for name in [a, b, None] {
        let (i, j) = (subset(&next, name), subset(&last, name));
        assert_eq!(last.counterpart(&next, i), Some(j), "{name:?}");
    }
    assert_eq!(last.counterpart(&next, subset(&next, c)), None);
    assert_eq!(last.counterpart(&next, next.subsets.len()), None);
}
