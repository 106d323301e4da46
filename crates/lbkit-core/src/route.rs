//! Tag routing, as Dubbo's `TagRouter` (2.7) and `TagStateRouter` (3.0, 3.1) do it: providers
//! carry a tag (`dubbo.tag` in their metadata, or a tag rule's addresses), a request asks for
//! one, and the request goes to that tag's providers.
//!
//! | request | goes to |
//! |---|---|
//! | no tag (or an empty one) | the untagged providers (with a rule: those in none of its address lists whose own tag the rule does not name) |
//! | tag `T` | the providers tagged `T`: by the rule's addresses for `T` when it lists some, else by their own `dubbo.tag` |
//! | tag `T`, none has it | the untagged providers (with a rule: those in none of its address lists and without a tag of their own) |
//! | tag `T`, none has it, `dubbo.force.tag=true` | nothing: [`PickError::NoTagMatch`] |
//! | tag `T`, the rule lists addresses for `T` but none is here, the rule says `force: true` | nothing |
//!
//! The sets are the snapshot's *eligible* endpoints (lbkit's health, ejection and `disabled`
//! come first, as Dubbo's routers see only the invokers left by the ones before them), so a
//! tagged provider that is down sends a tag's requests back to the untagged ones unless the
//! request forces its tag.
//!
//! Where the tags come from is the endpoint source's business: the ZooKeeper consumer copies a
//! provider's `dubbo.tag` URL parameter and resolves Dubbo 3's YAML tag rule
//! (`/dubbo/config/dubbo/<application>.tag-router`) into the `dubbo.tag.rule*` and
//! [`TAG_GROUPS_KEY`] metadata below, written alike on every endpoint while the rule applies; a
//! static or file source can set `dubbo.tag` by hand.
//!
//! Each distinct set gets its own picker, prepared with the others once per snapshot change
//! ([`Prepared`](crate::Prepared)), so a tagged pick costs the strategy's pick plus a binary
//! search of the tag table, and failover retries stay within the request's set. A set's picker
//! is prepared from the last snapshot's picker of the same requests' set
//! ([`Strategy::prepare_next`](crate::Strategy::prepare_next)), so a change of k endpoints
//! costs a tagged fleet's hash rings O(k) patches, not one rebuild per tag (when stages run,
//! tagged requests pick in the stage trees of their sets, whose tier and zone leaves are
//! prepared from the last tree's of the same requests in the same way). Only the
//! [`MAX_TAG_SETS`] largest sets get a picker: requests for the others (a fleet that tags every
//! provider apart, say) pick at random among the set's members, passing over those the
//! availability filter or the call's earlier attempts rule out.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use crate::error::PickError;
use crate::snapshot::{EndpointIdx, Snapshot};

/// A provider's own tag (Dubbo's `TAG_KEY`), and the request attachment that asks for one.
pub const TAG_KEY: &str = "dubbo.tag";
/// The request attachment that forbids the fall back to untagged providers (Dubbo's
/// `FORCE_USE_TAG`).
pub const FORCE_TAG_KEY: &str = "dubbo.force.tag";
/// Present on every endpoint while a tag rule applies: the rule's key (the providers'
/// application).
pub const TAG_RULE_KEY: &str = "dubbo.tag.rule";
/// `true` when the rule forces its address lists (`force: true`).
pub const TAG_RULE_FORCE_KEY: &str = "dubbo.tag.rule.force";
/// Every tag the rule names, comma-separated.
pub const TAG_RULE_NAMES_KEY: &str = "dubbo.tag.rule.names";
/// The tags the rule gives addresses to, comma-separated.
pub const TAG_RULE_LISTED_KEY: &str = "dubbo.tag.rule.listed";
/// The tags whose rule addresses match this endpoint, comma-separated.
pub const TAG_GROUPS_KEY: &str = "dubbo.tag.groups";

/// The tag a request asks for.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RequestTag<'a> {
    /// The tag (`dubbo.tag`); empty means none.
    pub name: &'a [u8],
    /// No fall back to untagged providers (`dubbo.force.tag=true`).
    pub force: bool,
}

impl<'a> RequestTag<'a> {
    /// A tag that falls back to untagged providers when none has it.
    pub fn new(name: &'a [u8]) -> Self {
        RequestTag { name, force: false }
    }

    /// A tag that does not fall back.
    pub fn forced(name: &'a [u8]) -> Self {
        RequestTag { name, force: true }
    }
}

/// A [`RequestTag`] that owns its name (read from a request the caller does not keep).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestTagBuf {
    /// The tag.
    pub name: Box<[u8]>,
    /// No fall back to untagged providers.
    pub force: bool,
}

impl RequestTagBuf {
    /// The tag, borrowed.
    #[inline]
    pub fn get(&self) -> RequestTag<'_> {
        RequestTag {
            name: &self.name,
            force: self.force,
        }
    }
}

impl From<RequestTag<'_>> for RequestTagBuf {
    fn from(t: RequestTag<'_>) -> Self {
        RequestTagBuf {
            name: t.name.into(),
            force: t.force,
        }
    }
}

/// What a request says about where it may go: its consistent-hash key, its tag and its
/// attributes.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Route<'a> {
    /// The request's hash key.
    pub key: Option<&'a [u8]>,
    /// The tag it asks for.
    pub tag: Option<RequestTag<'a>>,
    /// Its attributes, for metadata subsets ([`stage`](crate::stage)).
    pub attrs: &'a [crate::stage::Attr<'a>],
}

impl<'a> Route<'a> {
    /// A route with only a hash key.
    pub fn key(key: Option<&'a [u8]>) -> Self {
        Route {
            key,
            tag: None,
            attrs: &[],
        }
    }
}

/// Which of a snapshot's sets a request was routed to.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Routed {
    /// Every eligible endpoint (no tags in the snapshot, or the set holds them all).
    All,
    /// The providers of the request's tag.
    Tagged,
    /// The untagged providers, for a request without a tag.
    Untagged,
    /// The untagged providers, for a tag no provider has.
    Fallback,
}

/// Most tag sets a snapshot prepares a picker for (the largest ones); requests for the others
/// pick at random among their members, so a fleet with a tag per provider costs memory in
/// proportion to its providers, not to providers × tags.
pub const MAX_TAG_SETS: usize = 32;

/// The endpoints a request may be sent to, as [`Prepared::routed`](crate::Prepared::routed)
/// finds them.
#[derive(Clone, Copy, Debug)]
pub struct RoutedSet<'a> {
    snapshot: &'a Snapshot,
    members: Option<&'a [EndpointIdx]>,
}

impl<'a> RoutedSet<'a> {
    pub(crate) fn new(snapshot: &'a Snapshot, members: Option<&'a [EndpointIdx]>) -> Self {
        RoutedSet { snapshot, members }
    }

    /// Whether the endpoint at `idx` (of the prepared snapshot) is in the set.
    pub fn contains(&self, idx: EndpointIdx) -> bool {
        match self.members {
            None => self.snapshot.is_eligible(idx),
            Some(m) => m.contains(&idx),
        }
    }

    /// How many endpoints the set has.
    pub fn len(&self) -> usize {
        self.members
            .map_or(self.snapshot.eligible().len(), <[_]>::len)
    }

    /// Whether it has none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A set of the snapshot: all of it, one prepared subset, a member list, or nothing.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Lead {
    Main,
    Subset(u32),
    Members(u32),
    Nothing,
}

/// One tag's entry: its providers, and whether an empty set is final (the rule's `force`).
#[derive(Clone, Debug)]
struct TagEntry {
    name: Box<[u8]>,
    lead: Lead,
    final_when_empty: bool,
}

/// The tag table of one snapshot: the sets, as restricted snapshots to prepare pickers on, and
/// where each kind of request leads.
#[derive(Debug)]
pub(crate) struct TagTable {
    /// The distinct proper subsets with a picker, each a restriction of the snapshot.
    pub(crate) subsets: Vec<Arc<Snapshot>>,
    /// The other distinct proper subsets (beyond [`MAX_TAG_SETS`]): their members.
    pub(crate) members: Vec<Box<[EndpointIdx]>>,
    untagged: Lead,
    fallback: Lead,
    /// Sorted by name.
    tags: Box<[TagEntry]>,
    /// The rule's key, when a rule applies.
    rule: Option<Box<str>>,
}

/// The rule, as the endpoint source wrote it on the endpoints.
struct Rule<'s> {
    key: &'s str,
    force: bool,
    names: HashSet<&'s str>,
    listed: Vec<&'s str>,
}

impl<'s> Rule<'s> {
    /// The rule the source wrote on the snapshot's endpoints, if any.
    fn of(snapshot: &'s Snapshot) -> Option<Rule<'s>> {
        snapshot.endpoints().iter().find_map(|e| {
            let m = e.metadata();
            m.get(TAG_RULE_KEY).map(|key| Rule {
                key,
                force: m.get(TAG_RULE_FORCE_KEY).is_some_and(|f| f == "true"),
                names: list(m.get(TAG_RULE_NAMES_KEY)).into_iter().collect(),
                listed: list(m.get(TAG_RULE_LISTED_KEY)),
            })
        })
    }
}

/// Each eligible endpoint's own tag and rule groups (by position in `eligible`), read once;
/// then each tag's members, found in one pass, so the table costs O(endpoints +
/// memberships), not O(endpoints × tags).
struct Tagging<'s> {
    own: Vec<Option<&'s str>>,
    groups: Vec<Vec<&'s str>>,
    by_own: BTreeMap<&'s str, Vec<u32>>,
    by_group: HashMap<&'s str, Vec<u32>>,
}

/// A table's tag entries, and where untagged requests and unmatched ones go.
type Leads = (Vec<TagEntry>, Lead, Lead);

impl<'s> Tagging<'s> {
    /// Read the eligible endpoints' tags (and, under a rule, their groups).
    fn of(snapshot: &'s Snapshot, ruled: bool) -> Tagging<'s> {
        let eligible = snapshot.eligible();
        let meta = |i: EndpointIdx| snapshot.endpoint(i).metadata();
        let own: Vec<Option<&str>> = eligible
            .iter()
            .map(|&i| {
                meta(i)
                    .get(TAG_KEY)
                    .map(String::as_str)
                    .filter(|t| !t.is_empty())
            })
            .collect();
        let groups: Vec<Vec<&str>> = eligible
            .iter()
            .map(|&i| {
                let mut g = if ruled {
                    list(meta(i).get(TAG_GROUPS_KEY))
                } else {
                    Vec::new()
                };
                g.sort_unstable();
                g.dedup();
                g
            })
            .collect();
        let mut by_own: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
        let mut by_group: HashMap<&str, Vec<u32>> = HashMap::new();
        for (k, &i) in eligible.iter().enumerate() {
            let at = u32::try_from(i.get()).unwrap_or(u32::MAX);
            if let Some(t) = own[k] {
                by_own.entry(t).or_default().push(at);
            }
            for &g in &groups[k] {
                by_group.entry(g).or_default().push(at);
            }
        }
        Tagging {
            own,
            groups,
            by_own,
            by_group,
        }
    }

    /// Without a rule: a set per tag; untagged and unmatched requests go to the untagged.
    fn leads(&self, sets: &mut Sets<'_>) -> Leads {
        let tags = self
            .by_own
            .iter()
            .map(|(&t, members)| TagEntry::new(t, sets.lead_of(members.clone()), false))
            .collect();
        let untagged = sets.lead(|k| self.own[k].is_none());
        (tags, untagged, untagged)
    }

    /// Under `rule`: its listed tags by group (final when empty if it forces), then the
    /// endpoints' own tags; unmatched requests go to the endpoints in no group and without a
    /// tag, untagged ones also to those whose tag the rule does not name.
    fn leads_under(&mut self, rule: &Rule<'_>, sets: &mut Sets<'_>) -> Leads {
        let mut tags = Vec::new();
        for &t in &rule.listed {
            let members = self.by_group.remove(t).unwrap_or_default();
            tags.push(TagEntry::new(t, sets.lead_of(members), rule.force));
        }
        let listed: HashSet<&str> = rule.listed.iter().copied().collect();
        for (&t, members) in self.by_own.iter().filter(|(t, _)| !listed.contains(*t)) {
            tags.push(TagEntry::new(t, sets.lead_of(members.clone()), false));
        }
        let (own, groups) = (&self.own, &self.groups);
        let fallback = sets.lead(|k| groups[k].is_empty() && own[k].is_none());
        let untagged =
            sets.lead(|k| groups[k].is_empty() && own[k].is_none_or(|t| !rule.names.contains(t)));
        (tags, untagged, fallback)
    }
}

fn list(v: Option<&String>) -> Vec<&str> {
    v.map_or_else(Vec::new, |s| {
        s.split(',').filter(|t| !t.is_empty()).collect()
    })
}

/// The tags listed (comma-separated) under `key` of `metadata`: how [`TAG_RULE_NAMES_KEY`],
/// [`TAG_RULE_LISTED_KEY`] and [`TAG_GROUPS_KEY`] are read.
pub fn listed_tags<'m>(metadata: &'m crate::Metadata, key: &str) -> Vec<&'m str> {
    list(metadata.get(key))
}

// === impl TagTable ===

impl TagTable {
    /// The table of `snapshot`, or `None` when nothing in it is tagged and no rule applies (then
    /// every request but a forced tag goes to all of it).
    pub(crate) fn of(snapshot: &Snapshot) -> Option<TagTable> {
        if snapshot.tagged() == 0 {
            // No metadata to read: an untagged fleet's change costs no pass over it here.
            return None;
        }
        let rule = Rule::of(snapshot);
        let mut tagging = Tagging::of(snapshot, rule.is_some());
        if rule.is_none() && tagging.by_own.is_empty() {
            return None;
        }
        let mut sets = Sets::new(snapshot);
        let (mut tags, untagged, fallback) = match &rule {
            None => tagging.leads(&mut sets),
            Some(rule) => tagging.leads_under(rule, &mut sets),
        };
        tags.sort_by(|a, b| a.name.cmp(&b.name));
        tags.dedup_by(|a, b| a.name == b.name);
        let (subsets, members, remap) = sets.finish();
        for t in &mut tags {
            t.lead = remap(t.lead);
        }
        Some(TagTable {
            subsets,
            members,
            untagged: remap(untagged),
            fallback: remap(fallback),
            tags: tags.into_boxed_slice(),
            rule: rule.map(|r| r.key.into()),
        })
    }

    /// Where a request with `tag` goes.
    ///
    /// # Errors
    /// [`PickError::NoTagMatch`] when no provider has a forced tag (or the rule forces it);
    /// [`PickError::AllTagged`] when every eligible endpoint is reserved for a tag.
    #[inline]
    pub(crate) fn lead(&self, tag: Option<&RequestTag<'_>>) -> Result<(Lead, Routed), PickError> {
        let Some(tag) = tag.filter(|t| !t.name.is_empty()) else {
            return match self.untagged {
                Lead::Nothing => Err(PickError::AllTagged),
                lead => Ok((lead, Routed::Untagged)),
            };
        };
        let found = self
            .tags
            .binary_search_by(|e| (*e.name).cmp(tag.name))
            .ok()
            .map(|i| &self.tags[i]);
        match found {
            Some(e) if e.lead != Lead::Nothing => Ok((e.lead, Routed::Tagged)),
            Some(e) if e.final_when_empty => Err(PickError::NoTagMatch),
            _ if tag.force => Err(PickError::NoTagMatch),
            _ => match self.fallback {
                Lead::Nothing => Err(PickError::NoTagMatch),
                lead => Ok((lead, Routed::Fallback)),
            },
        }
    }

    /// The rule's key, when a rule applies.
    pub(crate) fn rule(&self) -> Option<&str> {
        self.rule.as_deref()
    }

    /// A subset of this table (the last snapshot's) that requests now led to `next`'s subset
    /// `i` were led to: the first of a tag's, then the untagged, then the fallback requests'
    /// that went to a subset. `None` when all of them went to all of the last snapshot, to a
    /// member list or nowhere. The pair is what a picker of `next`'s subset is prepared from
    /// ([`Strategy::prepare_next`](crate::Strategy::prepare_next)), so a change of k endpoints
    /// costs a tag subset's ring O(k) as it costs the whole snapshot's.
    pub(crate) fn counterpart(&self, next: &TagTable, i: usize) -> Option<usize> {
        let i = Lead::Subset(u32::try_from(i).ok()?);
        let by_tag = (next.tags.iter().filter(|t| t.lead == i)).map(|t| {
            let at = self.tags.binary_search_by(|e| e.name.cmp(&t.name));
            at.map_or(Lead::Nothing, |at| self.tags[at].lead)
        });
        let sets = [
            (next.untagged, self.untagged),
            (next.fallback, self.fallback),
        ];
        let by_set = sets.into_iter().filter(|&(n, _)| n == i).map(|(_, l)| l);
        by_tag.chain(by_set).find_map(|lead| match lead {
            Lead::Subset(j) => Some(j as usize),
            _ => None,
        })
    }
}

/// Where a request with `tag` goes in a snapshot without a tag table: everywhere, unless it
/// forces a tag (then nowhere: nothing is tagged).
#[inline]
pub(crate) fn untabled(tag: Option<&RequestTag<'_>>) -> Result<(Lead, Routed), PickError> {
    match tag {
        Some(t) if t.force && !t.name.is_empty() => Err(PickError::NoTagMatch),
        _ => Ok((Lead::Main, Routed::All)),
    }
}

impl TagEntry {
    fn new(name: &str, lead: Lead, final_when_empty: bool) -> Self {
        TagEntry {
            name: name.as_bytes().into(),
            lead,
            final_when_empty,
        }
    }
}

/// The distinct subsets found so far, each once (as member lists until [`Sets::finish`]).
struct Sets<'s> {
    snapshot: &'s Snapshot,
    seen: HashMap<Vec<u32>, u32>,
    found: Vec<Vec<u32>>,
}

impl<'s> Sets<'s> {
    fn new(snapshot: &'s Snapshot) -> Self {
        Sets {
            snapshot,
            seen: HashMap::new(),
            found: Vec::new(),
        }
    }

    /// The set of the eligible endpoints whose position in `eligible` `keep` accepts.
    fn lead(&mut self, keep: impl Fn(usize) -> bool) -> Lead {
        let eligible = self.snapshot.eligible();
        let members: Vec<u32> = (0..eligible.len())
            .filter(|&k| keep(k))
            .map(|k| u32::try_from(eligible[k].get()).unwrap_or(u32::MAX))
            .collect();
        self.lead_of(members)
    }

    /// The set of `members` (indices, in `eligible`'s order) (`Subset(i)`: the `i`th found).
    fn lead_of(&mut self, members: Vec<u32>) -> Lead {
        if members.is_empty() {
            return Lead::Nothing;
        }
        if members.len() == self.snapshot.eligible().len() {
            return Lead::Main;
        }
        if let Some(&at) = self.seen.get(&members) {
            return Lead::Subset(at);
        }
        let at = u32::try_from(self.found.len()).unwrap_or(u32::MAX);
        self.found.push(members.clone());
        self.seen.insert(members, at);
        Lead::Subset(at)
    }

    /// The largest [`MAX_TAG_SETS`] sets as restrictions of the snapshot (to prepare pickers
    /// on), the others as member lists, and how a lead found meanwhile maps onto them.
    #[allow(clippy::type_complexity)]
    fn finish(
        self,
    ) -> (
        Vec<Arc<Snapshot>>,
        Vec<Box<[EndpointIdx]>>,
        impl Fn(Lead) -> Lead,
    ) {
        let mut order: Vec<usize> = (0..self.found.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(self.found[i].len()));
        let mut place = vec![Lead::Nothing; self.found.len()];
        let (mut subsets, mut members) = (Vec::new(), Vec::new());
        let mut keep = vec![false; self.snapshot.len()];
        for i in order {
            let set = &self.found[i];
            let at = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
            if subsets.len() < MAX_TAG_SETS {
                for &m in set {
                    keep[m as usize] = true;
                }
                subsets.push(Arc::new(self.snapshot.restrict(|e| keep[e.get()])));
                for &m in set {
                    keep[m as usize] = false;
                }
                place[i] = Lead::Subset(at(subsets.len() - 1));
            } else {
                members.push(set.iter().map(|&m| EndpointIdx::new(m as usize)).collect());
                place[i] = Lead::Members(at(members.len() - 1));
            }
        }
        let remap = move |lead: Lead| match lead {
            Lead::Subset(i) => place[i as usize],
            other => other,
        };
        (subsets, members, remap)
    }
}

#[cfg(test)]
mod tests;
