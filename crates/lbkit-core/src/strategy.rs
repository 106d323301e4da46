//! The strategy interface: [`Strategy`] prepares a [`Picker`] per snapshot; the picker picks.
//!
//! A user-defined strategy implements these two traits and nothing else; it then runs in a
//! [`Balancer`](crate::Balancer), in `lbkit pick` and in the conformance suite like the built-in
//! ones. See `examples/sticky_custom.rs` in the `lbkit` crate.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::endpoint::Endpoint;
use crate::error::PickError;
use crate::rng::FastRng;
use crate::route::{RequestTag, Route};
use crate::snapshot::{EndpointIdx, Snapshot};
use crate::stage::Attr;
use crate::time::Timestamp;
use crate::trace_id::TraceId;

/// Builds per-snapshot state (tables, cycles, cumulative weights). Never on the hot path.
///
/// `prepare` runs once per snapshot change, and again every
/// [`refresh_interval`](Strategy::refresh_interval) for strategies whose weights move with time
/// or statistics. The [`Balancer`](crate::Balancer) also re-prepares while an endpoint warms up.
pub trait Strategy: Send + Sync + 'static {
    /// The prepared, immutable picker.
    type Picker: Picker;

    /// The strategy's name, as `lbkit pick --strategy` spells it.
    fn name(&self) -> &str;

    /// Build the picker for `snapshot` at time `now`.
    ///
    /// Only [`Snapshot::eligible`] endpoints may be returned by the picker; the balancer never
    /// calls `pick` when that list is empty.
    fn prepare(&self, snapshot: &Arc<Snapshot>, now: Timestamp) -> Self::Picker;

    /// Build the picker for `snapshot` knowing `last`, the picker this strategy prepared for
    /// `last_snapshot` (the set published before): a strategy whose structure allows it carries
    /// over what did not change ([`diff::carried`](crate::diff::carried) says which endpoints
    /// are the same objects) instead of building from scratch. The hash rings do: a change of
    /// k endpoints hashes only theirs, merges again only the parts of the ring their points
    /// land in and shares the rest. The picker must equal the one
    /// [`prepare`](Strategy::prepare) would build. `last` must be the picker this strategy
    /// prepared for `last_snapshot`.
    ///
    /// The [`Balancer`](crate::Balancer) calls this for the picker of its whole snapshot on
    /// every publish, refresh tick and change of stages after the first, off the request path
    /// (picks keep the last picker until the new one is swapped in), and for the picker of each
    /// tag subset whose requests had a subset in the last snapshot too (the same tag, or the
    /// untagged or fallback set), for the set every request of the whole snapshot reaches
    /// when stages narrow it to one (healthy priority tiers, an aperture), from the last one's
    /// main picker, and for each tier's or zone's set of the whole snapshot, of a metadata
    /// subset (or the default subset) or of a tag set, from the last one's at the same place
    /// (the same requests' tag set, the same subset's key set and values, tier and zone). A set new to the snapshot is
    /// prepared from scratch, and a tier no request reaches (a standby tier) not at all.
    /// The default prepares from scratch.
    fn prepare_next(
        &self,
        last_snapshot: &Arc<Snapshot>,
        last: &Self::Picker,
        snapshot: &Arc<Snapshot>,
        now: Timestamp,
    ) -> Self::Picker {
        let _ = (last_snapshot, last);
        self.prepare(snapshot, now)
    }

    /// `Some(period)`: re-prepare on a timer (response-time weights), as grpc-go WRR does.
    fn refresh_interval(&self) -> Option<Duration> {
        None
    }

    /// `Some(decay)`: the time constant this strategy wants for the endpoints' peak-EWMA latency
    /// (linkerd's and Finagle's `decay`). A [`Balancer`](crate::Balancer) running the strategy
    /// sets it on the statistics of every endpoint it publishes; a shadow
    /// does not (it reads the live strategy's statistics). `None` leaves the statistics' own
    /// ([`SnapshotBuilder::with_ewma_decay`](crate::SnapshotBuilder::with_ewma_decay), default
    /// [`DEFAULT_EWMA_DECAY`](crate::DEFAULT_EWMA_DECAY)).
    fn ewma_decay(&self) -> Option<Duration> {
        None
    }
}

/// Chooses one endpoint. Object-safe, `&self`, called concurrently from many threads:
/// no locks, no allocation, no clock reads (time comes in [`PickContext::now`]).
pub trait Picker: Any + Send + Sync {
    /// Pick one of the snapshot's eligible endpoints.
    ///
    /// Called repeatedly for one call when the balancer rejects a candidate (already tried, or
    /// unavailable); [`PickContext::probe`] counts those rejections, so deterministic pickers
    /// (hash rings) can walk on instead of returning the same endpoint.
    ///
    /// # Errors
    /// Only when the picker cannot choose at all ([`PickError::Declined`]).
    fn pick(&self, cx: &mut PickContext<'_>) -> Result<EndpointIdx, PickError>;

    /// Strategy-specific inputs behind this endpoint's chances at `now` (`lbkit pick
    /// --explain`). Off the hot path; may allocate.
    fn explain(&self, idx: EndpointIdx, now: Timestamp) -> Option<String> {
        let _ = (idx, now);
        None
    }

    /// When this picker wants to be prepared again although its snapshot has not changed:
    /// a picker that stood in for a costly one (a Maglev table patched rather than rebuilt
    /// while changes come fast) asks for the full preparation here. A
    /// [`Balancer`](crate::Balancer) re-prepares it, from itself
    /// ([`Strategy::prepare_next`]), at its first [`tick`](crate::Balancer::tick) from then
    /// on. Default `None`: never.
    fn refresh_at(&self) -> Option<Timestamp> {
        None
    }
}

impl<P: Picker + ?Sized> Picker for Box<P> {
    #[inline]
    fn pick(&self, cx: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> {
        (**self).pick(cx)
    }

    fn explain(&self, idx: EndpointIdx, now: Timestamp) -> Option<String> {
        (**self).explain(idx, now)
    }

    fn refresh_at(&self) -> Option<Timestamp> {
        (**self).refresh_at()
    }
}

/// Everything a pick may depend on besides the prepared state. Built by the caller per call.
#[derive(Debug)]
pub struct PickContext<'a> {
    /// The time of this call, read once by the caller.
    pub now: Timestamp,
    /// A precomputed 64-bit hash of the request (e.g. from a header the caller already hashed).
    /// Strategies that need a `u64` use it, else [`key_hash`](crate::key_hash) of `key`.
    pub hash: Option<u64>,
    /// The request key itself, for strategies that must hash it their own way (Dubbo's MD5
    /// ring, nginx's CRC32 ring).
    pub key: Option<&'a [u8]>,
    /// 0 for the first try of a call; failover increments it.
    pub attempt: u32,
    /// Candidates the balancer already rejected during this pick.
    pub probe: u32,
    /// Endpoints this call already tried (retry exclusion).
    pub tried: &'a TriedSet,
    /// The caller's random source.
    pub rng: &'a mut FastRng,
    /// The tag the request asks for (Dubbo's tag routing: see [`route`](crate::route)); the
    /// balancer picks among that tag's providers.
    pub tag: Option<RequestTag<'a>>,
    /// The request's attributes (headers, gRPC metadata) that metadata subsets match on
    /// ([`stage`](crate::stage)); empty by default.
    pub attrs: &'a [Attr<'a>],
    /// The request's tracing decision ([`trace`](crate::trace)): undecided at a first attempt;
    /// a balancer with a tracer decides and writes it here, and retries carry it.
    pub trace: TraceId,
    /// The attempt is sent while an earlier one of the same request is still open (a hedge or
    /// a fork); traces mark it.
    pub hedge: bool,
}

static NOTHING_TRIED: TriedSet = TriedSet::new();

// === impl PickContext ===

impl<'a> PickContext<'a> {
    /// A context for a first attempt at `now`, without hash key or exclusions.
    #[inline]
    pub fn new(now: Timestamp, rng: &'a mut FastRng) -> Self {
        PickContext {
            now,
            hash: None,
            key: None,
            attempt: 0,
            probe: 0,
            tried: &NOTHING_TRIED,
            rng,
            tag: None,
            attrs: &[],
            trace: TraceId::UNDECIDED,
            hedge: false,
        }
    }

    /// Set a precomputed 64-bit hash of the request.
    pub fn with_hash(mut self, hash: u64) -> Self {
        self.hash = Some(hash);
        self
    }

    /// Set the request key. Strategies hash it their own way (Dubbo's MD5, nginx's CRC32) or with
    /// [`key_hash`](crate::key_hash); no hash is computed here, so keyed picks pay only for the hash they use.
    pub fn with_key(mut self, key: &'a [u8]) -> Self {
        self.key = Some(key);
        self
    }

    /// Set the tag the request asks for.
    pub fn with_tag(mut self, tag: RequestTag<'a>) -> Self {
        self.tag = Some(tag);
        self
    }

    /// Set the request's attributes, for metadata subsets.
    pub fn with_attrs(mut self, attrs: &'a [Attr<'a>]) -> Self {
        self.attrs = attrs;
        self
    }

    /// Set the request's hash key, tag and attributes.
    pub fn with_route(mut self, route: Route<'a>) -> Self {
        self.key = route.key;
        self.tag = route.tag;
        self.attrs = route.attrs;
        self
    }

    /// Carry the request's tracing decision (from its first attempt's guard).
    pub fn with_trace(mut self, trace: TraceId) -> Self {
        self.trace = trace;
        self
    }

    /// Mark the attempt as sent while an earlier one is still open (a hedge or a fork).
    pub fn as_hedge(mut self) -> Self {
        self.hedge = true;
        self
    }

    /// Set the retry attempt number and the endpoints already tried.
    pub fn with_tried(mut self, attempt: u32, tried: &'a TriedSet) -> Self {
        self.attempt = attempt;
        self.tried = tried;
        self
    }
}

/// Endpoints a call already tried, for retry exclusion. Fixed capacity, no allocation.
///
/// Holds key hashes, so it stays valid when a snapshot is swapped between attempts. Beyond
/// [`TriedSet::CAPACITY`] entries further inserts are ignored (only the first ones are excluded).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TriedSet {
    hashes: [u64; TriedSet::CAPACITY],
    len: u8,
}

// === impl TriedSet ===

impl TriedSet {
    /// Most endpoints remembered (more than any sane retry count).
    pub const CAPACITY: usize = 16;

    /// An empty set.
    pub const fn new() -> Self {
        TriedSet {
            hashes: [0; TriedSet::CAPACITY],
            len: 0,
        }
    }

    /// Remember `endpoint`. Returns `false` when the set is full.
    pub fn insert(&mut self, endpoint: &Endpoint) -> bool {
        if self.contains(endpoint) {
            return true;
        }
        let len = usize::from(self.len);
        if len == Self::CAPACITY {
            return false;
        }
        self.hashes[len] = endpoint.key_hash();
        self.len += 1;
        true
    }

    /// Whether `endpoint` was tried.
    #[inline]
    pub fn contains(&self, endpoint: &Endpoint) -> bool {
        if self.len == 0 {
            return false; // without touching the endpoint: a first attempt reads no key
        }
        let h = endpoint.key_hash();
        self.hashes[..usize::from(self.len)].contains(&h)
    }

    /// Number of endpoints remembered.
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Whether nothing was tried yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A type-erased strategy, for strategies chosen by configuration or written by users.
/// Allocates once per prepare (the boxed picker), never per pick.
///
/// ```
/// use lbkit_core::{BoxStrategy, Strategy};
/// # use lbkit_core::{Picker, PickContext, PickError, EndpointIdx, Snapshot, Timestamp};
/// # use std::sync::Arc;
/// # struct First;
/// # struct FirstPicker(EndpointIdx);
/// # impl Picker for FirstPicker {
/// #     fn pick(&self, _: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> { Ok(self.0) }
/// # }
/// # impl Strategy for First {
/// #     type Picker = FirstPicker;
/// #     fn name(&self) -> &str { "first" }
/// #     fn prepare(&self, s: &Arc<Snapshot>, _: Timestamp) -> FirstPicker {
/// #         FirstPicker(s.eligible().first().copied().unwrap_or(EndpointIdx::new(0)))
/// #     }
/// # }
/// let s = BoxStrategy::new(First);
/// assert_eq!(s.name(), "first");
/// ```
#[derive(Clone)]
pub struct BoxStrategy(Arc<dyn DynStrategy>);

trait DynStrategy: Send + Sync + 'static {
    fn name(&self) -> &str;
    fn prepare_boxed(&self, snapshot: &Arc<Snapshot>, now: Timestamp) -> Box<dyn Picker>;
    fn prepare_next_boxed(
        &self,
        last_snapshot: &Arc<Snapshot>,
        last: &dyn Picker,
        snapshot: &Arc<Snapshot>,
        now: Timestamp,
    ) -> Box<dyn Picker>;
    fn refresh_interval(&self) -> Option<Duration>;
    fn ewma_decay(&self) -> Option<Duration>;
}

impl<S: Strategy> DynStrategy for S {
    fn name(&self) -> &str {
        Strategy::name(self)
    }
    fn prepare_boxed(&self, snapshot: &Arc<Snapshot>, now: Timestamp) -> Box<dyn Picker> {
        Box::new(self.prepare(snapshot, now))
    }
    fn prepare_next_boxed(
        &self,
        last_snapshot: &Arc<Snapshot>,
        last: &dyn Picker,
        snapshot: &Arc<Snapshot>,
        now: Timestamp,
    ) -> Box<dyn Picker> {
        let last: &dyn Any = last;
        match last.downcast_ref::<S::Picker>() {
            Some(last) => Box::new(self.prepare_next(last_snapshot, last, snapshot, now)),
            None => Box::new(self.prepare(snapshot, now)),
        }
    }
    fn refresh_interval(&self) -> Option<Duration> {
        Strategy::refresh_interval(self)
    }
    fn ewma_decay(&self) -> Option<Duration> {
        Strategy::ewma_decay(self)
    }
}

// === impl BoxStrategy ===

impl BoxStrategy {
    /// Erase the type of `strategy`.
    pub fn new<S: Strategy>(strategy: S) -> Self {
        BoxStrategy(Arc::new(strategy))
    }
}

impl Strategy for BoxStrategy {
    type Picker = Box<dyn Picker>;

    fn name(&self) -> &str {
        self.0.name()
    }

    fn prepare(&self, snapshot: &Arc<Snapshot>, now: Timestamp) -> Box<dyn Picker> {
        self.0.prepare_boxed(snapshot, now)
    }

    fn prepare_next(
        &self,
        last_snapshot: &Arc<Snapshot>,
        last: &Box<dyn Picker>,
        snapshot: &Arc<Snapshot>,
        now: Timestamp,
    ) -> Box<dyn Picker> {
        self.0
            .prepare_next_boxed(last_snapshot, &**last, snapshot, now)
    }

    fn refresh_interval(&self) -> Option<Duration> {
        self.0.refresh_interval()
    }

    fn ewma_decay(&self) -> Option<Duration> {
        self.0.ewma_decay()
    }
}

impl fmt::Debug for BoxStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("BoxStrategy").field(&self.0.name()).finish()
    }
}

impl fmt::Debug for dyn Picker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("dyn Picker")
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::{Balancer, EndpointSpec, FastRng};

    /// Picks its snapshot's first eligible endpoint; counts how it was prepared.
    #[derive(Default)]
    struct Counting {
        fresh: AtomicUsize,
        carried: AtomicUsize,
        /// Pickers carried over from a set of other zones or tags than the new one's.
        unlike: AtomicUsize,
    }

    impl Counting {
        /// Pickers prepared from scratch, carried over, and carried over from unlike sets.
        fn counts(&self) -> (usize, usize, usize) {
            let load = |n: &AtomicUsize| n.load(Ordering::Relaxed);
            (load(&self.fresh), load(&self.carried), load(&self.unlike))
        }
    }

    /// The addresses `n` picks from `lb`'s current stages reach, with request tag `tag`.
    fn picked(
        lb: &Balancer<Arc<Counting>>,
        tag: Option<&[u8]>,
        n: usize,
    ) -> std::collections::BTreeSet<String> {
        let mut rng = FastRng::seed_from_u64(1);
        (0..n)
            .map(|_| {
                let mut cx = PickContext::new(Timestamp::ZERO, &mut rng);
                if let Some(t) = tag {
                    cx = cx.with_tag(RequestTag::new(t));
                }
                let current = lb.current();
                let at = current.select(&mut cx, lb.availability()).unwrap();
                current.snapshot().endpoint(at).address().to_owned()
            })
            .collect()
    }

    /// Stages of locality-weighted balancing alone.
    fn localities() -> crate::stage::Stages {
        crate::stage::Stages {
            localities: Some(crate::stage::Localities::default()),
            ..crate::stage::Stages::default()
        }
    }

    /// The zones, Dubbo tags and `version`s of `s`'s eligible endpoints.
    fn kinds(s: &Snapshot) -> std::collections::BTreeSet<(String, String, String)> {
        let meta = |i: EndpointIdx, k: &str| {
            let m = s.endpoint(i).metadata();
            m.get(k).cloned().unwrap_or_default()
        };
        (s.eligible().iter())
            .map(|&i| {
                let zone = s.endpoint(i).zone().unwrap_or("").to_owned();
                (zone, meta(i, crate::route::TAG_KEY), meta(i, "version"))
            })
            .collect()
    }

    struct First(EndpointIdx, usize);
    impl Picker for First {
        fn pick(&self, _: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> {
            Ok(self.0)
        }
    }
    impl Strategy for Arc<Counting> {
        type Picker = First;
        fn name(&self) -> &str {
            "counting"
        }
        fn prepare(&self, s: &Arc<Snapshot>, _: Timestamp) -> First {
            self.fresh.fetch_add(1, Ordering::Relaxed);
            First(s.eligible()[0], 0)
        }
        fn prepare_next(
            &self,
            was: &Arc<Snapshot>,
            last: &First,
            s: &Arc<Snapshot>,
            _: Timestamp,
        ) -> First {
            self.carried.fetch_add(1, Ordering::Relaxed);
            if kinds(was) != kinds(s) {
                self.unlike.fetch_add(1, Ordering::Relaxed);
            }
            First(s.eligible()[0], last.1 + 1)
        }
    }

    /// A balancer hands each publish the picker before it, through a [`BoxStrategy`] too (the
    /// boxed picker is the strategy's own, found again by its type).
    #[test]
    fn publishes_prepare_from_the_last_picker_through_a_box() {
        let counting = Arc::new(Counting::default());
        let snap = |a: &str| {
            Arc::new(Snapshot::from_specs(
                vec![EndpointSpec::new(a)],
                Timestamp::ZERO,
            ))
        };
        let lb = Balancer::new(
            BoxStrategy::new(counting.clone()),
            snap("a:1"),
            Timestamp::ZERO,
        );
        lb.publish(snap("b:1"), Timestamp::ZERO);
        lb.publish(snap("c:1"), Timestamp::ZERO);
        assert_eq!(counting.fresh.load(Ordering::Relaxed), 1);
        assert_eq!(counting.carried.load(Ordering::Relaxed), 2);
        let current = lb.current();
        let picker: &dyn Any = &**current.picker();
        assert_eq!(picker.downcast_ref::<First>().map(|f| f.1), Some(2));
        let mut rng = FastRng::seed_from_u64(1);
        let mut cx = PickContext::new(Timestamp::ZERO, &mut rng);
        assert_eq!(current.picker().pick(&mut cx), Ok(EndpointIdx::new(0)));
    }

    /// Under healthy priority tiers every request reaches tier 0's leaf, whose picker is
    /// prepared from the last main picker; the standby tier, which no request reaches, gets
    /// none until tier 0 degrades.
    #[test]
    fn the_folded_tier_prepares_from_the_last_main_picker() {
        let counting = Arc::new(Counting::default());
        let snap = |eps: &[(&str, u32)]| {
            let specs = eps
                .iter()
                .map(|&(a, p)| EndpointSpec::new(a).with_priority(p));
            Arc::new(Snapshot::from_specs(specs.collect(), Timestamp::ZERO))
        };
        let lb = Balancer::new(
            counting.clone(),
            snap(&[("a:1", 0), ("b:1", 0), ("z:1", 1)]),
            Timestamp::ZERO,
        );
        assert!(lb.current().is_staged());
        assert_eq!(counting.fresh.load(Ordering::Relaxed), 1, "tier 0 alone");
        lb.publish(snap(&[("b:1", 0), ("c:1", 0), ("z:1", 1)]), Timestamp::ZERO);
        assert_eq!(counting.carried.load(Ordering::Relaxed), 1, "tier 0");
        assert_eq!(counting.fresh.load(Ordering::Relaxed), 1, "no more");
        let current = lb.current();
        assert_eq!(current.picker().1, 1, "from the first tier 0 picker");
        let mut rng = FastRng::seed_from_u64(1);
        let mut cx = PickContext::new(Timestamp::ZERO, &mut rng);
        let at = current.select(&mut cx, lb.availability()).unwrap();
        assert_eq!(current.snapshot().endpoint(at).address(), "b:1");
        // Tier 0 down: the requests move to tier 1, whose leaf is prepared now.
        let down = |a: &str| EndpointSpec::new(a).with_healthy(false);
        let specs = vec![
            down("b:1"),
            down("c:1"),
            EndpointSpec::new("z:1").with_priority(1),
        ];
        lb.publish(
            Arc::new(Snapshot::from_specs(specs, Timestamp::ZERO)),
            Timestamp::ZERO,
        );
        let current = lb.current();
        let at = current.select(&mut cx, lb.availability()).unwrap();
        assert_eq!(current.snapshot().endpoint(at).address(), "z:1");
    }

    /// With locality-weighted balancing, each zone's leaf is prepared from the last snapshot's
    /// leaf of the same tier and zone; a zone new to the set gets one from scratch.
    #[test]
    fn zone_leaves_prepare_from_the_last_leaf_of_their_zone() {
        let counting = Arc::new(Counting::default());
        let snap = |eps: &[(&str, &str)]| {
            let specs = eps.iter().map(|&(a, z)| EndpointSpec::new(a).with_zone(z));
            Arc::new(Snapshot::from_specs(specs.collect(), Timestamp::ZERO))
        };
        let stages = localities();
        let first = snap(&[("a:1", "x"), ("b:1", "x"), ("c:1", "y"), ("d:1", "y")]);
        let lb = Balancer::new(counting.clone(), first, Timestamp::ZERO)
            .with_stages(stages, Timestamp::ZERO);
        let count = || counting.counts();
        let before = count();
        let next = [
            ("a:1", "x"),
            ("e:1", "x"),
            ("c:1", "y"),
            ("d:1", "y"),
            ("f:1", "w"),
        ];
        lb.publish(snap(&next), Timestamp::ZERO);
        assert_eq!(count().1 - before.1, 3, "the whole set, zones x and y");
        assert_eq!(count().0 - before.0, 1, "zone w");
        let seen = picked(&lb, None, 60);
        let want = ["a:1", "c:1", "f:1"].map(String::from);
        assert_eq!(
            seen,
            want.into_iter().collect(),
            "each zone's first endpoint"
        );
    }

    /// With tags and locality-weighted balancing, the zone leaves of a tag set's tree are
    /// prepared from the last leaves of the same requests' tag set and zone too; a zone new to
    /// the set gets one from scratch.
    #[test]
    fn tag_zone_leaves_prepare_from_the_last_leaf_of_their_tag_and_zone() {
        use crate::route::TAG_KEY;
        let counting = Arc::new(Counting::default());
        let snap = |eps: &[(&str, &str, Option<&str>)]| {
            let specs = eps.iter().map(|&(a, z, t)| {
                let s = EndpointSpec::new(a).with_zone(z);
                match t {
                    Some(t) => s.with_meta(TAG_KEY, t),
                    None => s,
                }
            });
            Arc::new(Snapshot::from_specs(specs.collect(), Timestamp::ZERO))
        };
        let stages = localities();
        let (t, none) = (Some("t"), None);
        // The untagged set is the larger here (tag set 0) and t's in the next (so 0 there).
        let first = [
            ("a:1", "x", t),
            ("b:1", "y", t),
            ("c:1", "x", none),
            ("d:1", "y", none),
            ("g:1", "x", none),
        ];
        let lb = Balancer::new(counting.clone(), snap(&first), Timestamp::ZERO)
            .with_stages(stages, Timestamp::ZERO);
        let count = || counting.counts();
        let before = count();
        let next = [
            ("a:1", "x", t),
            ("e:1", "x", t),
            ("b:1", "y", t),
            ("c:1", "x", none),
            ("d:1", "y", none),
            ("f:1", "w", t),
            ("g:1", "x", none),
        ];
        lb.publish(snap(&next), Timestamp::ZERO);
        // Carried: the tag sets t and untagged, the whole set, zones x and y of the whole
        // set's tree, of t's and of the untagged set's. Fresh: zone w (t's and the whole
        // set's: the same members, one leaf).
        assert_eq!(count().1 - before.1, 9, "carried");
        assert_eq!(count().0 - before.0, 1, "fresh");
        // Each leaf from the last leaf of its own tag and zone: only the whole set's picker
        // and tag set t's, which gained zone w, come from sets of other kinds.
        assert_eq!(
            counting.unlike.load(Ordering::Relaxed),
            2,
            "paired by tag and zone"
        );
        let seen = picked(&lb, Some(b"t"), 80);
        let want = ["a:1", "b:1", "f:1"].map(String::from);
        assert_eq!(
            seen,
            want.into_iter().collect(),
            "each zone's first endpoint of t"
        );
    }

    /// With metadata subsets, each subset's leaf is prepared from the last snapshot's leaf of
    /// the same key set and values; a subset new to the set gets one from scratch.
    #[test]
    fn subset_leaves_prepare_from_the_last_leaf_of_their_subset() {
        use crate::stage::{Stages, SubsetFallback, Subsets};
        let counting = Arc::new(Counting::default());
        let snap = |eps: &[(&str, &str)]| {
            let specs = eps
                .iter()
                .map(|&(a, v)| EndpointSpec::new(a).with_meta("version", v));
            Arc::new(Snapshot::from_specs(specs.collect(), Timestamp::ZERO))
        };
        let stages = Stages {
            subsets: Some(Subsets::new(
                vec![vec!["version".into()]],
                SubsetFallback::Any,
            )),
            ..Stages::default()
        };
        let first = [("a:1", "v1"), ("b:1", "v1"), ("c:1", "v2"), ("d:1", "v2")];
        let lb = Balancer::new(counting.clone(), snap(&first), Timestamp::ZERO)
            .with_stages(stages, Timestamp::ZERO);
        let count = || counting.counts();
        let before = count();
        let next = [
            ("a:1", "v1"),
            ("b:1", "v1"),
            ("c:1", "v2"),
            ("d:1", "v2"),
            ("e:1", "v1"),
            ("f:1", "v3"),
        ];
        lb.publish(snap(&next), Timestamp::ZERO);
        // Carried: the whole set's picker, its every-member leaf, subsets v1 and v2, each from
        // its own last set (only the first two gained v3). Fresh: subset v3.
        assert_eq!(count().1 - before.1, 4, "carried");
        assert_eq!(count().0 - before.0, 1, "fresh");
        assert_eq!(count().2 - before.2, 2, "paired by key set and values");
        let mut rng = FastRng::seed_from_u64(1);
        for (v, want) in [(&b"v1"[..], "a:1"), (b"v2", "c:1"), (b"v3", "f:1")] {
            let attrs: &[crate::stage::Attr<'_>] = &[(b"version", v)];
            let mut cx = PickContext::new(Timestamp::ZERO, &mut rng).with_attrs(attrs);
            let current = lb.current();
            let at = current.select(&mut cx, lb.availability()).unwrap();
            assert_eq!(current.snapshot().endpoint(at).address(), want);
        }
    }

    /// The pickers of tag subsets are prepared from the last snapshot's picker of the same
    /// requests' subset too; a tag new to the set gets one from scratch.
    #[test]
    fn tag_subsets_prepare_from_the_last_subsets_picker() {
        use crate::route::TAG_KEY;
        let counting = Arc::new(Counting::default());
        let snap = |tags: &[(&str, Option<&str>)]| {
            let specs = tags.iter().map(|&(a, t)| match t {
                Some(t) => EndpointSpec::new(a).with_meta(TAG_KEY, t),
                None => EndpointSpec::new(a),
            });
            Arc::new(Snapshot::from_specs(specs.collect(), Timestamp::ZERO))
        };
        let first = snap(&[("a:1", Some("x")), ("b:1", Some("y")), ("c:1", None)]);
        let lb = Balancer::new(counting.clone(), first, Timestamp::ZERO);
        // The whole set, then subsets x, y and the untagged one.
        assert_eq!(lb.current().tag_sets(), 3);
        assert_eq!(counting.fresh.load(Ordering::Relaxed), 4);
        let next = [("a:1", Some("x")), ("d:1", Some("x")), ("b:1", Some("y"))];
        let next = snap(&[next[0], next[1], next[2], ("c:1", None), ("e:1", Some("z"))]);
        lb.publish(next, Timestamp::ZERO);
        assert_eq!(lb.current().tag_sets(), 4);
        assert_eq!(
            counting.carried.load(Ordering::Relaxed),
            4,
            "whole, x, y, untagged"
        );
        assert_eq!(counting.fresh.load(Ordering::Relaxed), 5, "z");
        let mut rng = FastRng::seed_from_u64(1);
        for (t, want) in [(&b"x"[..], "a:1"), (b"y", "b:1"), (b"z", "e:1")] {
            let mut cx = PickContext::new(Timestamp::ZERO, &mut rng).with_tag(RequestTag::new(t));
            let at = lb.current().select(&mut cx, lb.availability()).unwrap();
            assert_eq!(lb.current().snapshot().endpoint(at).address(), want);
        }
    }
}
