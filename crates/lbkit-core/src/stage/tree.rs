//! The prepared stages of one snapshot: per set (the whole snapshot, each tag's set) a tree of
//! subset index → tiers → zones → leaves, and the leaves' pickers. Built once per snapshot
//! change; a pick walks it with a few comparisons and draws. A leaf gets its picker from the
//! last snapshot's leaf at the same place (the same requests' tree, metadata subset, tier and
//! zone: [`Strategy::prepare_next`]), and a leaf no request can reach (a standby tier) none.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::aperture::{aperture_coverage, random_slice};
use super::tiers::{plan, TierCounts};
use super::{ApertureMode, Attr, Stages, SubsetFallback, MAX_STAGE_SETS};
use crate::error::PickError;
use crate::hash::key_hash;
use crate::snapshot::{EndpointIdx, Snapshot};
use crate::strategy::{PickContext, Strategy};
use crate::time::Timestamp;

/// Why the stages lead a request nowhere: a byte, so a leaf or a miss comes back in registers
/// (a [`PickError`] made the result 24 bytes, returned through memory on every pick).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Miss {
    NoSubset,
    SubsetUnavailable,
    DefaultSubsetEmpty,
}

impl From<Miss> for PickError {
    fn from(m: Miss) -> PickError {
        match m {
            Miss::NoSubset => PickError::NoSubset,
            Miss::SubsetUnavailable => PickError::SubsetUnavailable,
            Miss::DefaultSubsetEmpty => PickError::DefaultSubsetEmpty,
        }
    }
}

/// The stages of a snapshot: one tree per routed set, and the leaves they lead to.
pub(crate) struct Staged<P> {
    /// The whole snapshot's set (tree 0), inline: a pick reaches it with no pointer to follow.
    main: Tree,
    /// Each tag set's (trees 1..).
    tags: Box<[Tree]>,
    pub(crate) leaves: Box<[Leaf<P>]>,
    /// Whether the whole snapshot's set (tree 0) leads every request to one leaf, whose
    /// picker [`fold_main`](Self::fold_main) handed over.
    pub(crate) folded: bool,
    /// How many stage nodes lead to each leaf.
    refs: Box<[u32]>,
}

/// A set the stages lead to: a restriction of the snapshot with its picker, or (beyond
/// [`MAX_STAGE_SETS`]) the base snapshot and the set's members to pick from at random. A
/// restriction no node leads to (a standby tier), or whose picker
/// [`fold_main`](Staged::fold_main) handed over, has neither: no pick reaches it.
pub(crate) struct Leaf<P> {
    pub(crate) snapshot: Arc<Snapshot>,
    pub(crate) picker: Option<P>,
    pub(crate) members: Box<[EndpointIdx]>,
    /// Where requests find it (see [`Route`]); `None` beyond [`MAX_STAGE_SETS`].
    route: Option<Route>,
}

/// A leaf's place, stable across snapshots: its tree (0 for the whole snapshot's, t + 1 for tag
/// set t's), its entry in the tree ([`entry_name`]: "" for every member, else a metadata
/// subset's key set and values, or the default subset), its tier's priority and its zone (""
/// when its tier has no zones). The next snapshot's leaf at the same place (in the tree of the
/// same requests' tag set: [`Last`]'s `tags`) is prepared from this one's picker. A leaf two
/// entries share (the same members) keeps the place of the first; when their members part,
/// the other's leaf is prepared from scratch once.
type Route = (u32, Box<str>, u32, Box<str>);

/// The entry part of a [`Route`]: "" for a tree's every-member entry, `"d"` for the default
/// subset, and for a metadata subset `k`, then its key set's keys and `v`, then its values,
/// each written as its length, `:` and itself: unambiguous whatever the texts hold, and the
/// same after a reload that reorders the key sets.
fn entry_name(subset: Option<(&[String], &[&str])>) -> Box<str> {
    use std::fmt::Write as _;
    let Some((keys, values)) = subset else {
        return "d".into();
    };
    let mut name = String::from("k");
    let texts = keys.iter().map(String::as_str);
    for (i, t) in texts.chain(values.iter().copied()).enumerate() {
        if i == keys.len() {
            name.push('v');
        }
        let _ = write!(name, "{}:{t}", t.len());
    }
    name.into()
}

/// What the last snapshot prepared, for the next one's leaves to be prepared from: its main
/// set and picker ([`Prepared`](crate::Prepared)'s `main` and `picker`) and its stages.
pub(crate) struct Last<'l, P> {
    pub(crate) main: (&'l Arc<Snapshot>, &'l P),
    pub(crate) staged: Option<&'l Staged<P>>,
    /// For each tag set of the snapshot being prepared, the last snapshot's tag set of the same
    /// requests ([`TagTable::counterpart`](crate::route::TagTable::counterpart)), if any.
    pub(crate) tags: &'l [Option<usize>],
}

impl<P> Clone for Last<'_, P> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<P> Copy for Last<'_, P> {}

impl<'l, P> Last<'l, P> {
    /// The set and picker a leaf is prepared from: the last main set's for the main leaf (see
    /// [`Staged::fold_main`]), else the last leaf's at the same `route`, a tag set's leaf in the
    /// last tree of the same requests' tag set (the last main set's when that leaf was folded).
    /// `None`: from scratch.
    fn pair(self, main: bool, route: Option<&Route>) -> Option<(&'l Arc<Snapshot>, &'l P)> {
        if main {
            return Some(self.main);
        }
        let staged = self.staged?;
        let (tree, entry, priority, zone) = route?;
        let tree = match tree.checked_sub(1) {
            None => 0,
            Some(t) => 1 + u32::try_from(self.tags.get(t as usize).copied().flatten()?).ok()?,
        };
        let at = staged.leaves.iter().position(|l| {
            l.route
                .as_ref()
                .is_some_and(|r| r.0 == tree && r.1 == *entry && r.2 == *priority && r.3 == *zone)
        })?;
        match &staged.leaves[at].picker {
            Some(picker) => Some((&staged.leaves[at].snapshot, picker)),
            None if staged.folded && staged.main_leaf() == Some(at) => Some(self.main),
            None => None,
        }
    }
}

/// One routed set's stages.
pub(crate) struct Tree {
    pub(super) subsets: Option<SubsetIndex>,
    /// Every member of the set.
    pub(super) any: Entry,
}

impl Tree {
    /// Its entries: every member's, each subset's and the default subset's.
    fn entries(&self) -> impl Iterator<Item = &Entry> {
        let subsets = self.subsets.iter().flat_map(|s| {
            let keyed = s.key_sets.iter().flat_map(|k| k.entries.iter());
            keyed.map(|sub| &sub.entry).chain(s.default.as_ref())
        });
        std::iter::once(&self.any).chain(subsets)
    }
}

pub(super) struct SubsetIndex {
    pub(super) key_sets: Box<[KeySet]>,
    pub(super) fallback: SubsetFallback,
    pub(super) default: Option<Entry>,
}

/// One key set: its keys, and its subsets sorted by their values.
pub(super) struct KeySet {
    pub(super) keys: Box<[Label]>,
    pub(super) entries: Box<[Sub]>,
}

/// A subset of a key set: its values (one per key), and its stages.
pub(super) struct Sub {
    /// The first key's value, inline: a one-key lookup compares it with no pointer to follow.
    first: Label,
    /// The other keys' values.
    rest: Box<[Label]>,
    entry: Entry,
}

/// A key or value: up to [`Label::INLINE`] bytes stored inline (attribute keys and values are
/// short), longer ones on the heap.
pub(super) struct Label {
    len: usize,
    head: [u8; Label::INLINE],
    long: Box<[u8]>,
}

impl Label {
    const INLINE: usize = 16;

    fn new(b: &[u8]) -> Label {
        let mut head = [0; Label::INLINE];
        let long = if b.len() <= Label::INLINE {
            head[..b.len()].copy_from_slice(b);
            Box::default()
        } else {
            b.into()
        };
        Label {
            len: b.len(),
            head,
            long,
        }
    }

    /// Its bytes.
    #[inline]
    pub(super) fn bytes(&self) -> &[u8] {
        match self.head.get(..self.len) {
            Some(short) => short,
            None => &self.long,
        }
    }

    /// Whether it is `b`.
    #[inline]
    fn is(&self, b: &[u8]) -> bool {
        self.len == b.len() && bytes_eq(self.bytes(), b)
    }
}

impl Sub {
    /// Its values, in key order.
    fn values(&self) -> impl Iterator<Item = &[u8]> {
        std::iter::once(self.first.bytes()).chain(self.rest.iter().map(Label::bytes))
    }
}

/// A subset: its stages, and how many of its endpoints serve (up, weighted, not ejected).
pub(super) struct Entry {
    /// The leaves an unkeyed request reaches, with their combined shares.
    pub(super) flat: Flat,
    /// A tier choice, or (one tier) that tier's zones or leaf: the walk a keyed request takes,
    /// one salted draw per level, so a key keeps its tier when zones change and its zone when
    /// tiers do.
    pub(super) node: Node,
    /// Each tier's figures, for reports (a pick never reads them).
    pub(super) tiers: Box<[TierInfo]>,
    pub(super) endpoints: u32,
    pub(super) serving: u32,
}

/// An entry's stages flattened for unkeyed requests: every leaf its choices reach, with the
/// product of their shares, as `(upper bound over the u64 range, leaf)`; the last bound is
/// `u64::MAX`. One draw and one branch-free count pick the leaf however many levels led to it.
pub(super) struct Flat {
    /// The leaf when there is one (then `picks` is empty and a pick reads nothing else).
    only: u32,
    picks: Box<[(u64, u32)]>,
}

impl Flat {
    /// The flattening of `node`.
    fn of(node: &Node) -> Flat {
        let mut shares: Vec<(u32, f64)> = Vec::new();
        node.shares(1.0, &mut shares);
        shares.sort_by_key(|&(leaf, _)| leaf);
        shares.dedup_by(|b, a| {
            let same = a.0 == b.0;
            if same {
                a.1 += b.1;
            }
            same
        });
        shares.retain(|&(_, p)| p > 0.0);
        let Some(&(last, _)) = shares.last() else {
            // Every share zero (cannot happen: a choice's shares sum to one): its first leaf.
            return Flat {
                only: node.first_leaf(),
                picks: Box::new([]),
            };
        };
        if let [(only, _)] = shares[..] {
            return Flat {
                only,
                picks: Box::new([]),
            };
        }
        let weights: Vec<f64> = shares.iter().map(|&(_, p)| p).collect();
        let picks = bounds(&weights)
            .iter()
            .copied()
            .zip(shares.iter().map(|&(leaf, _)| leaf))
            .chain([(u64::MAX, last)])
            .collect();
        Flat { only: last, picks }
    }

    /// The leaf an unkeyed request reaches: with one, no draw.
    #[inline]
    pub(super) fn leaf(&self, cx: &mut PickContext<'_>) -> u32 {
        let picks = &*self.picks;
        if picks.is_empty() {
            return self.only;
        }
        let draw = cx.rng.next_u64();
        let at = picks[..picks.len() - 1]
            .iter()
            .filter(|&&(b, _)| b <= draw)
            .count();
        picks[at].1
    }
}

/// A stage: a leaf, a choice of tier, or a choice of zone.
///
/// A choice holds its children's upper bounds over the whole `u64` range (one fewer than the
/// children: the last child takes the rest), so a draw picks its child with a count of the
/// bounds it reaches: no division, no scaling multiply, no branch.
pub(super) enum Node {
    Leaf(u32, Box<LeafInfo>),
    /// Bounds per tier, by load, for two tiers or more.
    Tiers(Box<[u64]>, Box<[Node]>),
    /// Bounds per zone, by effective weight.
    Zones(Box<[u64]>, Box<[Node]>, Box<[ZoneInfo]>),
}

impl Node {
    /// Mark the leaves this node leads to in `reached`.
    fn mark(&self, reached: &mut [bool]) {
        match self {
            Node::Leaf(i, _) => {
                if let Some(r) = reached.get_mut(*i as usize) {
                    *r = true;
                }
            }
            Node::Tiers(_, children) | Node::Zones(_, children, _) => {
                children.iter().for_each(|n| n.mark(reached));
            }
        }
    }
}

pub(super) struct LeafInfo {
    /// Endpoints the leaf picks from, and of how many candidates (before the aperture).
    pub(super) picks_from: u32,
    pub(super) candidates: u32,
    pub(super) aperture: bool,
    /// How many of them the aperture covers only partly.
    pub(super) edges: u32,
}

pub(super) struct TierInfo {
    pub(super) priority: u32,
    pub(super) counts: TierCounts,
    pub(super) health: u32,
    pub(super) load: u32,
    pub(super) panic: bool,
}

pub(super) struct ZoneInfo {
    pub(super) zone: Box<str>,
    pub(super) counts: TierCounts,
    pub(super) weight: u32,
    pub(super) effective: f64,
}

/// 2⁶⁴, the range of a draw.
const DRAWS: f64 = 18_446_744_073_709_551_616.0;

impl Node {
    /// Push each leaf this node reaches, with `share` times its share here.
    fn shares(&self, share: f64, out: &mut Vec<(u32, f64)>) {
        let (bounds, children) = match self {
            Node::Leaf(i, _) => return out.push((*i, share)),
            Node::Tiers(b, c) | Node::Zones(b, c, _) => (b, c),
        };
        let mut from = 0.0;
        for (k, child) in children.iter().enumerate() {
            let to = bounds.get(k).map_or(DRAWS, |&b| b as f64);
            child.shares(share * (to - from) / DRAWS, out);
            from = to;
        }
    }

    /// The first leaf this node reaches.
    fn first_leaf(&self) -> u32 {
        match self {
            Node::Leaf(i, _) => *i,
            Node::Tiers(_, c) | Node::Zones(_, c, _) => c.first().map_or(0, Node::first_leaf),
        }
    }
}

// === impl Staged ===

impl<P> Staged<P> {
    /// Prepare the stages of `snapshot` (and of its tag sets `tag_sets`, as tag routing found
    /// them: their eligible endpoints, to which [`with_down`] adds the tag's others) with
    /// `strategy` at the leaves. `None` when nothing is staged: no stage configured and a
    /// single priority.
    ///
    /// `last` is what the last snapshot prepared: the leaf that every request of the whole
    /// snapshot reaches, the one [`fold_main`](Self::fold_main) hands over, is prepared from
    /// its main set and picker
    /// ([`Strategy::prepare_next`]), so healthy tiers or an aperture over a large set cost a
    /// change what the set's strategy makes of it, not a build from scratch. The other leaves,
    /// of the whole snapshot's tree and of tag sets' trees, are prepared from `last`'s leaf at
    /// the same place ([`Route`]: the same requests' tree, entry — every member, a metadata
    /// subset's values or the default subset — tier and zone); a leaf at a new place from
    /// scratch.
    pub(crate) fn prepare<S: Strategy<Picker = P>>(
        strategy: &S,
        stages: &Stages,
        snapshot: &Arc<Snapshot>,
        tag_sets: &[Arc<Snapshot>],
        now: Timestamp,
        last: Option<Last<'_, P>>,
    ) -> Option<Staged<P>> {
        let tiered = snapshot.is_tiered();
        if stages.is_default() && !tiered {
            return None;
        }
        let mut b = Builder::<S>::new(stages, snapshot);
        let all: Vec<EndpointIdx> = (0..snapshot.len()).map(EndpointIdx::new).collect();
        let main = b.tree(&all, true, 0);
        // A tag's tiers count its down members but never panic: tag routing sends requests to
        // serving providers only, and a tier with nothing serving takes no load.
        let tags = tag_sets
            .iter()
            .zip(1..)
            .map(|(set, t)| b.tree(&with_down(snapshot, set), false, t))
            .collect();
        let mut staged = Staged {
            main,
            tags,
            leaves: b.leaves.into_boxed_slice(),
            folded: false,
            refs: b.refs.into_boxed_slice(),
        };
        staged.prepare_leaves(strategy, now, last);
        Some(staged)
    }

    /// Give the leaves that are restrictions of the snapshot (the first [`MAX_STAGE_SETS`]
    /// made) and that a request can reach their pickers, from what
    /// [`Last::pair`] finds in `last` (the main leaf from the last main set, a leaf of the whole
    /// snapshot's tree or of a tag set's from the last leaf at its [`Route`]), else from
    /// scratch. A leaf no node
    /// leads to (a tier that takes no load while the ones before it are healthy: a standby
    /// tier) gets none, so a change costs it nothing.
    fn prepare_leaves<S: Strategy<Picker = P>>(
        &mut self,
        strategy: &S,
        now: Timestamp,
        last: Option<Last<'_, P>>,
    ) {
        let main_leaf = self.main_leaf();
        let mut reached = vec![false; self.leaves.len()];
        for tree in std::iter::once(&self.main).chain(&*self.tags) {
            tree.entries().for_each(|e| e.node.mark(&mut reached));
        }
        let restricted = self.leaves.len().min(MAX_STAGE_SETS);
        for i in (0..restricted).filter(|&i| reached[i]) {
            let leaf = &mut self.leaves[i];
            let main = main_leaf == Some(i);
            leaf.picker = Some(match last.and_then(|l| l.pair(main, leaf.route.as_ref())) {
                Some((snapshot, picker)) => {
                    strategy.prepare_next(snapshot, picker, &leaf.snapshot, now)
                }
                None => strategy.prepare(&leaf.snapshot, now),
            });
        }
    }

    /// The leaf every request of the whole snapshot reaches, when no other set shares it (see
    /// [`fold_main`](Self::fold_main)).
    fn main_leaf(&self) -> Option<usize> {
        let tree = &self.main;
        let Node::Leaf(i, _) = &tree.any.node else {
            return None;
        };
        let i = *i as usize;
        (tree.subsets.is_none() && self.refs.get(i) == Some(&1)).then_some(i)
    }

    /// When every request of the whole snapshot reaches one leaf (no subsets, one tier with
    /// all the load, no zone split: healthy tiers, an aperture) and no other set shares it,
    /// hand over that leaf's snapshot and picker, so the caller picks there directly and the
    /// stages cost nothing per pick. Tree 0 stays for reports.
    pub(crate) fn fold_main(&mut self) -> Option<(Arc<Snapshot>, P)> {
        let i = self.main_leaf()?;
        let leaf = self.leaves.get_mut(i)?;
        let picker = leaf.picker.take()?;
        self.folded = true;
        Some((leaf.snapshot.clone(), picker))
    }

    /// The leaf a request routed to set `tree` reaches.
    ///
    /// # Errors
    /// [`Miss::NoSubset`], [`Miss::SubsetUnavailable`] under fallback `none`;
    /// [`Miss::DefaultSubsetEmpty`].
    #[inline]
    pub(crate) fn leaf(&self, tree: usize, cx: &mut PickContext<'_>) -> Result<&Leaf<P>, Miss> {
        let tree = match tree {
            0 => &self.main,
            t => &self.tags[t - 1],
        };
        let entry = tree.route(cx.attrs)?;
        if cx.hash.is_none() && cx.key.is_none() {
            return Ok(&self.leaves[entry.flat.leaf(cx) as usize]);
        }
        let mut node = &entry.node;
        loop {
            node = match node {
                Node::Leaf(i, _) => return Ok(&self.leaves[*i as usize]),
                Node::Tiers(bounds, children) => child(bounds, children, draw(cx, TIER_SALT)),
                Node::Zones(bounds, children, _) => child(bounds, children, draw(cx, ZONE_SALT)),
            };
        }
    }

    /// The stages of set `tree`, for reports.
    pub(crate) fn tree(&self, tree: usize) -> Option<&Tree> {
        match tree {
            0 => Some(&self.main),
            t => self.tags.get(t - 1),
        }
    }
}

/// A tag's set (its eligible members, as tag routing found them) with the endpoints that would
/// be in it if they served: every endpoint that does not serve and carries the tag and rule
/// groups of one of the set's members. So a tag's tiers count their down endpoints and spill
/// gradually, as the whole snapshot's do (counting only the eligible, a tier spilled only once
/// it had none left).
fn with_down(snapshot: &Snapshot, set: &Snapshot) -> Vec<EndpointIdx> {
    use crate::route::{TAG_GROUPS_KEY, TAG_KEY};
    let tagging = |i: EndpointIdx| {
        let m = snapshot.endpoint(i).metadata();
        let get = |k: &str| m.get(k).map_or("", String::as_str);
        (get(TAG_KEY), get(TAG_GROUPS_KEY))
    };
    let kinds: std::collections::HashSet<(&str, &str)> =
        set.eligible().iter().map(|&i| tagging(i)).collect();
    (0..snapshot.len())
        .map(EndpointIdx::new)
        .filter(|&i| {
            set.is_eligible(i) || (!snapshot.is_eligible(i) && kinds.contains(&tagging(i)))
        })
        .collect()
}

/// The child a `draw` reaches: how many bounds it is at or past. Branch-free, because the
/// draw lands in one child or another at random and a search's branches would be
/// mispredicted about half the time.
#[inline]
fn child<'n>(bounds: &[u64], children: &'n [Node], draw: u64) -> &'n Node {
    let at = bounds.iter().filter(|&&b| b <= draw).count();
    &children[at.min(children.len() - 1)]
}

/// Upper bounds over the `u64` range for shares proportional to `weights` (not all zero): one
/// per weight but the last.
fn bounds(weights: &[f64]) -> Box<[u64]> {
    let total: f64 = weights.iter().sum();
    if total <= 0.0 || !total.is_finite() {
        return vec![u64::MAX; weights.len().saturating_sub(1)].into_boxed_slice();
    }
    let mut sum = 0.0;
    weights[..weights.len().saturating_sub(1)]
        .iter()
        .map(|w| {
            sum += w;
            // `as` saturates: a bound at 2⁶⁴ is u64::MAX, reached by one draw in 2⁶⁴.
            (sum / total * DRAWS) as u64
        })
        .collect()
}

/// Salts that make a key's tier draw and zone draw independent of each other.
const TIER_SALT: u64 = 0x9E37_79B9_7F4A_7C15;
const ZONE_SALT: u64 = 0xC2B2_AE3D_27D4_EB4F;

/// A draw for a tier or zone: from the request's hash key when it has one (a key keeps its
/// tier and zone; mixed with the level's `salt`, so the zone a key lands in does not depend on
/// where its tier draw fell), else at random.
#[inline]
fn draw(cx: &mut PickContext<'_>, salt: u64) -> u64 {
    let h = match (cx.hash, cx.key) {
        (Some(h), _) => h,
        (None, Some(k)) => key_hash(k),
        (None, None) => return cx.rng.next_u64(),
    };
    // splitmix64's finaliser.
    let mut z = h ^ salt;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

// === impl Tree ===

impl Tree {
    /// The subset a request with `attrs` goes to: the first key set (in order) whose keys it
    /// all carries and whose subset for its values has a serving endpoint, else the fallback.
    #[inline]
    pub(super) fn route(&self, attrs: &[Attr<'_>]) -> Result<&Entry, Miss> {
        let Some(ix) = &self.subsets else {
            return Ok(&self.any);
        };
        let mut matched = false;
        for ks in ix.key_sets.iter() {
            if let Some(e) = ks.find(attrs) {
                if e.serving > 0 {
                    return Ok(e);
                }
                matched = true;
            }
        }
        match ix.fallback {
            SubsetFallback::Any => Ok(&self.any),
            SubsetFallback::Default => ix
                .default
                .as_ref()
                .filter(|d| d.serving > 0)
                .ok_or(Miss::DefaultSubsetEmpty),
            SubsetFallback::None if matched => Err(Miss::SubsetUnavailable),
            SubsetFallback::None => Err(Miss::NoSubset),
        }
    }

    /// Which key set and values serve `attrs`, for reports: `(key set, entry)`, or `None` when
    /// the fallback does.
    pub(super) fn matched(&self, attrs: &[Attr<'_>]) -> Option<(usize, &Entry)> {
        let ix = self.subsets.as_ref()?;
        ix.key_sets
            .iter()
            .enumerate()
            .find_map(|(i, ks)| ks.find(attrs).filter(|e| e.serving > 0).map(|e| (i, e)))
    }
}

impl KeySet {
    /// The subset for the values `attrs` gives this key set's keys (the first attribute of a
    /// key counts), if the request carries them all and some endpoint has them.
    #[inline]
    pub(super) fn find(&self, attrs: &[Attr<'_>]) -> Option<&Entry> {
        if let [key] = &*self.keys {
            let value = attrs.iter().find(|(k, _)| key.is(k))?.1;
            return self.find_one(value);
        }
        let mut values: [&[u8]; super::MAX_SUBSET_KEYS] = [&[]; super::MAX_SUBSET_KEYS];
        for (slot, key) in values.iter_mut().zip(self.keys.iter()) {
            *slot = attrs.iter().find(|(k, _)| key.is(k))?.1;
        }
        let values = &values[..self.keys.len()];
        let at = self
            .entries
            .binary_search_by(|sub| sub.values().cmp(values.iter().copied()))
            .ok()?;
        Some(&self.entries[at].entry)
    }

    /// A one-key set's subset for `value`: a scan of a few entries, a binary search of many.
    #[inline]
    fn find_one(&self, value: &[u8]) -> Option<&Entry> {
        if self.entries.len() <= 8 {
            return self
                .entries
                .iter()
                .find(|sub| sub.first.is(value))
                .map(|sub| &sub.entry);
        }
        let at = self
            .entries
            .binary_search_by(|sub| sub.first.bytes().cmp(value))
            .ok()?;
        Some(&self.entries[at].entry)
    }
}

/// Whether `a` and `b` are equal: inline for up to 16 bytes (attribute keys and values are
/// short), with two overlapping word loads each instead of a call to `memcmp`.
#[inline]
pub(super) fn bytes_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    let w4 = |s: &[u8], at: usize| u32::from_le_bytes([s[at], s[at + 1], s[at + 2], s[at + 3]]);
    let w8 = |s: &[u8], at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&s[at..at + 8]);
        u64::from_le_bytes(w)
    };
    match n {
        0 => true,
        1..=3 => a[0] == b[0] && a[n / 2] == b[n / 2] && a[n - 1] == b[n - 1],
        4..=7 => w4(a, 0) == w4(b, 0) && w4(a, n - 4) == w4(b, n - 4),
        8..=16 => w8(a, 0) == w8(b, 0) && w8(a, n - 8) == w8(b, n - 8),
        _ => a == b,
    }
}

/// Builds trees, sharing leaves between sets that reach the same endpoints (their pickers are
/// prepared after, by [`Staged::prepare_leaves`]).
struct Builder<'b, S: Strategy> {
    stages: &'b Stages,
    snapshot: &'b Arc<Snapshot>,
    /// Per endpoint: up, weighted and not ejected.
    serving: Vec<bool>,
    leaves: Vec<Leaf<S::Picker>>,
    refs: Vec<u32>,
    /// Whether the tree being built lets its tiers panic.
    may_panic: bool,
    seen: HashMap<LeafKey, u32>,
    /// The place of the leaves being made in the tree being built ([`Route`]).
    route: Option<Route>,
}

/// What makes two leaves the same: their members (sorted), the aperture's coverage of each
/// (empty when every member counts fully) and whether they are in panic.
type LeafKey = (Vec<EndpointIdx>, Vec<u32>, bool);

impl<'b, S: Strategy> Builder<'b, S> {
    fn new(stages: &'b Stages, snapshot: &'b Arc<Snapshot>) -> Self {
        let serving = (0..snapshot.len())
            .map(EndpointIdx::new)
            .map(|i| snapshot.endpoint(i).is_eligible() && snapshot.ejected_until(i).is_none())
            .collect();
        Builder {
            stages,
            snapshot,
            serving,
            leaves: Vec::new(),
            refs: Vec::new(),
            may_panic: true,
            seen: HashMap::new(),
            route: None,
        }
    }

    /// The tree of a set of `members`, whose tiers enter panic as the snapshot's policy says
    /// when `may_panic` (else never); `tree` names its leaves' places ([`Route`]).
    fn tree(&mut self, members: &[EndpointIdx], may_panic: bool, tree: u32) -> Tree {
        self.may_panic = may_panic;
        self.route = Some((tree, "".into(), 0, "".into()));
        let any = self.entry(members);
        let subsets = self.stages.subsets.as_ref().map(|cfg| {
            // Stages set through the library unvalidated: a key set that is empty or longer
            // than `MAX_SUBSET_KEYS` can match nothing, and is left out.
            let key_sets = (cfg.key_sets.iter())
                .filter(|keys| (1..=super::MAX_SUBSET_KEYS).contains(&keys.len()))
                .map(|keys| self.key_set(keys, members))
                .collect();
            let default = (!cfg.default.is_empty()).then(|| {
                let m = self.snapshot.endpoints();
                let of: Vec<EndpointIdx> = members
                    .iter()
                    .copied()
                    .filter(|&i| {
                        let meta = m[i.get()].metadata();
                        cfg.default.iter().all(|(k, v)| meta.get(k) == Some(v))
                    })
                    .collect();
                self.name_entry(entry_name(None));
                self.entry(&of)
            });
            SubsetIndex {
                key_sets,
                fallback: cfg.fallback,
                default,
            }
        });
        self.route = None;
        Tree { subsets, any }
    }

    /// Name the entry whose leaves are made next ([`Route`]), at priority 0 and no zone until
    /// its tiers and zones say otherwise.
    fn name_entry(&mut self, name: Box<str>) {
        if let Some(route) = &mut self.route {
            (route.1, route.2, route.3) = (name, 0, "".into());
        }
    }

    /// The key set `keys` over `members`: an entry for each combination of values they carry.
    fn key_set(&mut self, keys: &[String], members: &[EndpointIdx]) -> KeySet {
        let mut groups: BTreeMap<Vec<&str>, Vec<EndpointIdx>> = BTreeMap::new();
        for &i in members {
            let meta = self.snapshot.endpoint(i).metadata();
            let values: Option<Vec<&str>> = keys
                .iter()
                .map(|k| meta.get(k).map(String::as_str))
                .collect();
            if let Some(v) = values {
                groups.entry(v).or_default().push(i);
            }
        }
        let entries = groups
            .into_iter()
            .map(|(values, of)| {
                self.name_entry(entry_name(Some((keys, &values))));
                Sub {
                    first: Label::new(values.first().map_or(&[], |v| v.as_bytes())),
                    rest: values
                        .iter()
                        .skip(1)
                        .map(|v| Label::new(v.as_bytes()))
                        .collect(),
                    entry: self.entry(&of),
                }
            })
            .collect();
        KeySet {
            keys: keys.iter().map(|k| Label::new(k.as_bytes())).collect(),
            entries,
        }
    }

    fn entry(&mut self, members: &[EndpointIdx]) -> Entry {
        let (node, tiers) = self.tiers(members);
        Entry {
            flat: Flat::of(&node),
            node,
            tiers,
            endpoints: u32::try_from(members.len()).unwrap_or(u32::MAX),
            serving: u32::try_from(members.iter().filter(|i| self.serving[i.get()]).count())
                .unwrap_or(u32::MAX),
        }
    }

    /// A set's endpoints that carry weight (drained ones are left out, as the snapshot-wide
    /// panic threshold leaves them out), and those of them that serve.
    fn counts(&self, members: &[EndpointIdx]) -> TierCounts {
        let weighted = members
            .iter()
            .filter(|&&i| self.snapshot.endpoint(i).weight() > 0)
            .count();
        TierCounts {
            endpoints: u32::try_from(weighted).unwrap_or(u32::MAX),
            healthy: u32::try_from(members.iter().filter(|i| self.serving[i.get()]).count())
                .unwrap_or(u32::MAX),
        }
    }

    /// Tiers (a choice when there are two or more; one tier is its zones or leaf, its
    /// figures kept for reports), then zones.
    fn tiers(&mut self, members: &[EndpointIdx]) -> (Node, Box<[TierInfo]>) {
        let mut by_priority: BTreeMap<u32, Vec<EndpointIdx>> = BTreeMap::new();
        for &i in members {
            let p = self.snapshot.endpoint(i).priority();
            by_priority.entry(p).or_default().push(i);
        }
        let tiers: Vec<(u32, Vec<EndpointIdx>)> = by_priority.into_iter().collect();
        let counts: Vec<TierCounts> = tiers.iter().map(|(_, m)| self.counts(m)).collect();
        let threshold = match self.may_panic {
            true => self.snapshot.policy().panic_threshold,
            false => 0.0,
        };
        let plan = plan(&counts, self.stages.overprovisioning, threshold);
        let mut children = Vec::with_capacity(tiers.len());
        let mut info = Vec::with_capacity(tiers.len());
        for (k, (priority, m)) in tiers.iter().enumerate() {
            if let Some(route) = &mut self.route {
                (route.2, route.3) = (*priority, "".into());
            }
            children.push(self.zones(m, plan.panic[k]));
            info.push(TierInfo {
                priority: *priority,
                counts: counts[k],
                health: plan.health[k],
                load: plan.load[k],
                panic: plan.panic[k],
            });
        }
        // One tier, or one taking all the load (the usual healthy state): no choice to make.
        let whole = plan.load.iter().position(|&l| l == 100);
        let node = match (children.len(), whole) {
            (0, _) => self.leaf(&[], false),
            (1, _) => children.pop().unwrap_or_else(|| self.leaf(&[], false)),
            (_, Some(at)) => children.swap_remove(at),
            _ => {
                let loads: Vec<f64> = plan.load.iter().map(|&l| f64::from(l)).collect();
                Node::Tiers(bounds(&loads), children.into_boxed_slice())
            }
        };
        (node, info.into_boxed_slice())
    }

    /// Zones of one tier by effective weight, when localities are configured and it has more
    /// than one; else the tier's leaf.
    fn zones(&mut self, members: &[EndpointIdx], panic: bool) -> Node {
        // A tier in panic balances over all of its endpoints, zones aside (as Envoy ignores
        // locality weights in panic: a zone with none serving would otherwise weigh 0).
        let Some(cfg) = self.stages.localities.clone().filter(|_| !panic) else {
            return self.leaf(members, panic);
        };
        let mut by_zone: BTreeMap<&str, Vec<EndpointIdx>> = BTreeMap::new();
        let snapshot = self.snapshot.clone();
        for &i in members {
            by_zone
                .entry(snapshot.endpoint(i).zone().unwrap_or(""))
                .or_default()
                .push(i);
        }
        if by_zone.len() <= 1 {
            return self.leaf(members, panic);
        }
        let over = self.stages.overprovisioning;
        let info: Vec<ZoneInfo> = by_zone
            .iter()
            .map(|(zone, m)| {
                let counts = self.counts(m);
                let weight = cfg.weight(zone);
                let ratio = f64::from(counts.healthy) / f64::from(counts.endpoints.max(1));
                ZoneInfo {
                    zone: (*zone).into(),
                    counts,
                    weight,
                    effective: f64::from(weight) * (over * ratio).min(1.0),
                }
            })
            .collect();
        if info.iter().all(|z| z.effective <= 0.0) {
            return self.leaf(members, panic);
        }
        let effective: Vec<f64> = info.iter().map(|z| z.effective).collect();
        let children: Vec<Node> = (by_zone.iter())
            .map(|(zone, m)| {
                if let Some(route) = &mut self.route {
                    route.3 = (*zone).into();
                }
                self.leaf(m, panic)
            })
            .collect();
        Node::Zones(
            bounds(&effective),
            children.into_boxed_slice(),
            info.into_boxed_slice(),
        )
    }

    /// The leaf of `members`: those admitted (serving, or in panic every weighted one), within
    /// the aperture when one is configured. The aperture's ring holds the admitted endpoints
    /// only, so the clients spread evenly over whatever serves (a ring of all members, with
    /// each slice keeping its survivors, piled the load of a dead stretch onto its neighbours:
    /// p99 73–81 ms against 51–54 in the `fleet` scenario, BENCHMARKS.md).
    fn leaf(&mut self, members: &[EndpointIdx], panic: bool) -> Node {
        let admitted: Vec<EndpointIdx> = members
            .iter()
            .copied()
            .filter(|&i| self.serving[i.get()] || (panic && self.snapshot.endpoint(i).weight() > 0))
            .collect();
        let (cut, aperture) = match self.aperture(&admitted) {
            Some(cut) => (cut, true),
            None => (Cut::whole(admitted.clone()), false),
        };
        let info = Box::new(LeafInfo {
            picks_from: u32::try_from(cut.members.len()).unwrap_or(u32::MAX),
            candidates: u32::try_from(admitted.len()).unwrap_or(u32::MAX),
            aperture,
            edges: cut.edges,
        });
        Node::Leaf(self.intern((cut.members, cut.cover, panic)), info)
    }

    /// The members in this client's aperture (sorted), if an aperture applies, with how much
    /// of each the deterministic aperture covers.
    fn aperture(&self, members: &[EndpointIdx]) -> Option<Cut> {
        let a = self.stages.aperture?;
        let mut ring: Vec<EndpointIdx> = members.to_vec();
        ring.sort_by(|x, y| {
            self.snapshot
                .endpoint(*x)
                .key()
                .cmp(self.snapshot.endpoint(*y).key())
        });
        // A server wholly inside the slice covers `whole` units.
        let (covered, whole) = match (a.mode, a.coordinates) {
            (ApertureMode::Deterministic, Some(c)) => (
                aperture_coverage(ring.len(), a.size, c),
                u64::from(c.count.max(1)),
            ),
            (ApertureMode::Deterministic, None) => return None,
            (ApertureMode::Random, c) => {
                let seed = a.seed
                    ^ c.map_or(0, |c| {
                        u64::from(c.index).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                    });
                let slice = random_slice(ring.len(), a.size, seed);
                (slice.into_iter().map(|p| (p, 1)).collect(), 1)
            }
        };
        let mut slice: Vec<(EndpointIdx, u64)> =
            covered.into_iter().map(|(p, c)| (ring[p], c)).collect();
        slice.sort_unstable_by_key(|(i, _)| i.get());
        let edges = slice.iter().filter(|&&(_, c)| c < whole).count();
        Some(Cut {
            members: slice.iter().map(|&(i, _)| i).collect(),
            cover: coverage_units(&slice),
            edges: u32::try_from(edges).unwrap_or(u32::MAX),
        })
    }

    /// The leaf for exactly `members` (eligible as given, with the aperture's coverage of
    /// each), shared when already made.
    fn intern(&mut self, key: LeafKey) -> u32 {
        if let Some(&at) = self.seen.get(&key) {
            self.refs[at as usize] += 1;
            return at;
        }
        let (members, cover, panic) = &key;
        let leaf = if self.leaves.len() < MAX_STAGE_SETS {
            let coverage = (!cover.is_empty()).then(|| {
                let mut c = vec![0u32; self.snapshot.len()];
                for (m, &w) in members.iter().zip(cover) {
                    c[m.get()] = w;
                }
                Arc::from(c)
            });
            let snapshot = Arc::new(self.snapshot.scoped(members, *panic, coverage));
            Leaf {
                picker: None,
                snapshot,
                members: Box::new([]),
                route: self.route.clone(),
            }
        } else {
            Leaf {
                snapshot: self.snapshot.clone(),
                picker: None,
                members: members.clone().into_boxed_slice(),
                route: None,
            }
        };
        let at = u32::try_from(self.leaves.len()).unwrap_or(u32::MAX);
        self.leaves.push(leaf);
        self.refs.push(1);
        self.seen.insert(key, at);
        at
    }
}

/// The members a leaf picks from: all it was given, or an aperture's slice with how much of
/// each it covers.
struct Cut {
    /// Sorted by index.
    members: Vec<EndpointIdx>,
    /// Each member's coverage ([`coverage_units`]; empty when every member counts fully).
    cover: Vec<u32>,
    /// How many members the slice covers only partly.
    edges: u32,
}

impl Cut {
    fn whole(members: Vec<EndpointIdx>) -> Cut {
        Cut {
            members,
            cover: Vec::new(),
            edges: 0,
        }
    }
}

/// Each member's coverage divided by the members' common divisor, or nothing when they are
/// all the same (every member counts fully).
fn coverage_units(slice: &[(EndpointIdx, u64)]) -> Vec<u32> {
    if slice.windows(2).all(|w| w[0].1 == w[1].1) {
        return Vec::new();
    }
    let g = slice
        .iter()
        .fold(0, |g, &(_, c)| crate::weight_gcd(g, c))
        .max(1);
    slice
        .iter()
        .map(|&(_, c)| u32::try_from(c / g).unwrap_or(u32::MAX))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::entry_name;

    /// A subset's entry name tells key sets and value tuples apart whatever their texts hold.
    #[test]
    fn entry_names_are_unambiguous() {
        let keys = |k: &[&str]| k.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let (ab, a) = (keys(&["a", "b"]), keys(&["a"]));
        let names = [
            entry_name(Some((&ab, &["x\0y", "z"]))),
            entry_name(Some((&ab, &["x", "y\0z"]))),
            entry_name(Some((&ab, &["x", "1:z"]))),
            entry_name(Some((&ab, &["x1:", "z"]))),
            entry_name(Some((&a, &["bv1:x"]))),
            entry_name(Some((&keys(&["av1:b"]), &["x"]))),
            entry_name(None),
        ];
        let distinct: std::collections::BTreeSet<_> = names.iter().collect();
        assert_eq!(distinct.len(), names.len(), "{names:?}");
        assert_eq!(&*entry_name(Some((&ab, &["x", "z"]))), "k1:a1:bv1:x1:z");
    }
}
