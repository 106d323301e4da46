//! [`Balancer`]: one snapshot and its prepared picker, published together through one
//! `ArcSwap`, and [`CallGuard`], which feeds each call's outcome back into the statistics.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::availability::Availability;
use crate::endpoint::Endpoint;
use crate::error::PickError;
use crate::route::{self, Lead, RequestTag, Routed, RoutedSet, TagTable};
use crate::shadow::Shadow;
use crate::snapshot::{EndpointIdx, Snapshot};
use crate::stage::{Attr, Last, Leaf, StageReport, Staged, Stages};
use crate::stats::Outcome;
use crate::strategy::{BoxStrategy, PickContext, Picker, Strategy};
use crate::sync::{ArcCell, AtomicBool, Ordering};
use crate::time::{Clock, Timestamp};
use crate::trace::{Tap, TraceId, TraceSink, Tracer};

/// How often the balancer re-prepares while some endpoint is inside its warm-up or slow-start
/// window, so weights follow the curve in steps of at most this length.
pub const WARMUP_REFRESH: Duration = Duration::from_secs(1);

/// Candidates the balancer asks the picker for before it scans for an acceptable endpoint
/// (Ribbon's `AvailabilityFilteringRule` tries 10 times).
pub const MAX_PROBES: u32 = 10;

/// A snapshot and the picker prepared for it (and, when its endpoints carry tags, one picker
/// per tag set: see [`route`](crate::route)). Immutable; replaced as a whole.
pub struct Prepared<P> {
    snapshot: Arc<Snapshot>,
    /// What `picker` picks in: `snapshot`, or the one set the stages lead every request of
    /// the whole snapshot to (healthy tiers, an aperture), folded in at prepare time so such
    /// stages cost a pick nothing.
    main: Arc<Snapshot>,
    picker: P,
    tags: Option<Box<Tagged<P>>>,
    staged: Option<Staged<P>>,
    prepared_at: Timestamp,
    refresh_at: Option<Timestamp>,
}

/// The tag table of a snapshot and the pickers of its subsets.
struct Tagged<P> {
    table: TagTable,
    pickers: Box<[P]>,
}

// === impl Tagged ===

impl<P: Picker> Tagged<P> {
    /// The pickers of `table`'s subsets, each from the last snapshot's picker of the same
    /// requests' subset where there is one ([`TagTable::counterpart`]), else from scratch.
    fn prepare<S>(strategy: &S, table: TagTable, now: Timestamp, last: Option<&Self>) -> Self
    where
        S: Strategy<Picker = P>,
    {
        let from_last = |i| last.and_then(|l| Some((l, l.table.counterpart(&table, i)?)));
        let pickers = (table.subsets.iter().enumerate())
            .map(|(i, s)| match from_last(i) {
                Some((l, j)) => strategy.prepare_next(&l.table.subsets[j], &l.pickers[j], s, now),
                None => strategy.prepare(s, now),
            })
            .collect();
        Tagged { table, pickers }
    }
}

// === impl Prepared ===

impl<P: Picker> Prepared<P> {
    /// The snapshot prepared: every endpoint, indexed as every pick's result is.
    pub fn snapshot(&self) -> &Arc<Snapshot> {
        &self.snapshot
    }

    /// The prepared picker of the whole snapshot's requests: prepared on
    /// [`snapshot`](Self::snapshot), or, when the stages send every such request to one set
    /// (healthy priority tiers, an aperture: see [`stage`](crate::stage)), on that set, whose
    /// other endpoints it never picks.
    pub fn picker(&self) -> &P {
        &self.picker
    }

    /// When it was prepared.
    pub fn prepared_at(&self) -> Timestamp {
        self.prepared_at
    }

    /// When it should be prepared again (response-time refresh, warm-up, a picker's own
    /// [`Picker::refresh_at`]: a patched Maglev table), if ever.
    pub fn refresh_at(&self) -> Option<Timestamp> {
        self.refresh_at
    }

    /// Whether it should be prepared again by `now`.
    fn due(&self, now: Timestamp) -> bool {
        self.refresh_at.is_some_and(|at| at <= now)
    }

    /// Choose an endpoint: the picker's choice, unless it was already tried by this call or the
    /// availability filter rejects it.
    ///
    /// With one eligible endpoint it is returned without running the strategy (Dubbo's
    /// `select`). A rejected candidate is re-picked at most [`MAX_PROBES`] times, then the
    /// eligible list is scanned once from a random start; when everything is rejected, an
    /// untried endpoint is preferred over an available one, and finally the picker's first
    /// choice is returned (Ribbon falls back to all servers rather than failing).
    ///
    /// # Errors
    /// [`PickError::NoEndpoints`] or [`PickError::AllIneligible`] when nothing is eligible; a
    /// picker's own error.
    ///
    /// # Complexity
    /// The picker's cost when the first candidate is acceptable; O(n) only in the fallback.
    #[inline]
    pub fn select(
        &self,
        cx: &mut PickContext<'_>,
        filter: &Availability,
    ) -> Result<EndpointIdx, PickError> {
        // The tag by reference, not copied: the copy was a 16-byte load of the context its
        // caller had just written field by field, which the store buffer cannot forward.
        let (_, set, lead) = self.set(cx.tag.as_ref())?;
        match (&self.staged, lead) {
            (Some(staged), Some(tree)) if tree != 0 || !staged.folded => {
                match staged.leaf(tree, cx) {
                    Ok(leaf) => leaf_set(leaf).select(cx, filter),
                    Err(miss) => Err(miss.into()),
                }
            }
            _ => set.select(cx, filter),
        }
    }

    /// What the stages ([`stage`](crate::stage)) decide for a request with `tag` and
    /// `attrs`: its subset, tiers, zones and aperture. `None` when no stage runs (nothing
    /// configured, one priority), or for a tag set beyond
    /// [`MAX_TAG_SETS`](crate::route::MAX_TAG_SETS).
    ///
    /// # Errors
    /// The tag's errors, as [`routed`](Self::routed); a subset fallback's.
    pub fn stage_report(
        &self,
        tag: Option<RequestTag<'_>>,
        attrs: &[Attr<'_>],
    ) -> Result<Option<StageReport>, PickError> {
        let (_, _, lead) = self.set(tag.as_ref())?;
        match (&self.staged, lead) {
            (Some(staged), Some(tree)) => staged.tree(tree).map(|t| t.report(attrs)).transpose(),
            _ => Ok(None),
        }
    }

    /// Whether stages run in front of the strategy.
    pub fn is_staged(&self) -> bool {
        self.staged.is_some()
    }

    /// The set a request with `tag` is routed to (all of the snapshot without tags, or one
    /// tag's, or the untagged providers), as [`select`](Self::select) routes it; indices are
    /// [`snapshot`](Self::snapshot)'s.
    ///
    /// # Errors
    /// [`PickError::NoTagMatch`], [`PickError::AllTagged`]: see [`route`](crate::route).
    pub fn routed(
        &self,
        tag: Option<RequestTag<'_>>,
    ) -> Result<(Routed, RoutedSet<'_>), PickError> {
        self.set(tag.as_ref()).map(|(routed, set, _)| {
            let members = match set.how {
                How::Members(m) => Some(m),
                How::Picker(_) => None,
            };
            // Tag routing's set, stages aside: the whole snapshot, not the leaf folded in.
            let snapshot = match std::ptr::eq(set.snapshot, &self.main) {
                true => &self.snapshot,
                false => set.snapshot,
            };
            (routed, RoutedSet::new(snapshot, members))
        })
    }

    /// The set a request with `tag` picks in, its picker, and its stage tree (0 for the whole
    /// snapshot, 1 + i for tag subset i; none for a member list).
    #[inline]
    fn set(
        &self,
        tag: Option<&RequestTag<'_>>,
    ) -> Result<(Routed, Set<'_, P>, Option<usize>), PickError> {
        let main = Set {
            snapshot: &self.main,
            how: How::Picker(&self.picker),
        };
        let Some(tagged) = &self.tags else {
            return route::untabled(tag).map(|(_, routed)| (routed, main, Some(0)));
        };
        let (lead, routed) = tagged.table.lead(tag)?;
        let (set, tree) = match lead {
            Lead::Subset(i) => (
                Set {
                    snapshot: &tagged.table.subsets[i as usize],
                    how: How::Picker(&tagged.pickers[i as usize]),
                },
                Some(1 + i as usize),
            ),
            Lead::Members(i) => (
                Set {
                    snapshot: &self.snapshot,
                    how: How::Members(&tagged.table.members[i as usize]),
                },
                None,
            ),
            Lead::Main | Lead::Nothing => (main, Some(0)),
        };
        Ok((routed, set, tree))
    }

    /// How many subsets were prepared beside the whole snapshot for its tags.
    pub fn tag_sets(&self) -> usize {
        self.tags.as_ref().map_or(0, |t| t.pickers.len())
    }

    /// The key of the tag rule the snapshot's endpoints carry, if any.
    pub fn tag_rule(&self) -> Option<&str> {
        self.tags.as_ref().and_then(|t| t.table.rule())
    }

    /// [`select`](Self::select), but [`PickError::AllTried`] when the choice was already tried
    /// by this call (`cx.tried`): a retry goes to an untried endpoint or not at all.
    ///
    /// # Errors
    /// As [`select`](Self::select), plus [`PickError::AllTried`].
    #[inline]
    pub fn select_untried(
        &self,
        cx: &mut PickContext<'_>,
        filter: &Availability,
    ) -> Result<EndpointIdx, PickError> {
        let idx = self.select(cx, filter)?;
        if !cx.tried.is_empty() && cx.tried.contains(self.snapshot.endpoint(idx)) {
            return Err(PickError::AllTried);
        }
        Ok(idx)
    }
}

/// A leaf of the stages, as a set to pick in.
#[inline]
fn leaf_set<P: Picker>(leaf: &Leaf<P>) -> Set<'_, P> {
    Set {
        snapshot: &leaf.snapshot,
        how: match &leaf.picker {
            Some(p) => How::Picker(p),
            None => How::Members(&leaf.members),
        },
    }
}

/// One set of a snapshot (all of it or a tag's) and how it is picked from: what a pick
/// chooses in.
struct Set<'p, P> {
    snapshot: &'p Arc<Snapshot>,
    how: How<'p, P>,
}

/// The set's picker, or (a tag set beyond [`route::MAX_TAG_SETS`]) its members to pick from at
/// random.
enum How<'p, P> {
    Picker(&'p P),
    Members(&'p [EndpointIdx]),
}

impl<P: Picker> Set<'_, P> {
    #[inline]
    fn select(
        &self,
        cx: &mut PickContext<'_>,
        filter: &Availability,
    ) -> Result<EndpointIdx, PickError> {
        if let How::Members(members) = self.how {
            if members.is_empty() {
                return Err(self.snapshot.empty_error());
            }
            return Ok(self.member(members, cx, filter));
        }
        let eligible = self.snapshot.eligible();
        match eligible {
            [] => return Err(self.snapshot.empty_error()),
            [only] => return Ok(*only),
            _ => {}
        }
        cx.probe = 0;
        let first = self.checked_pick(cx)?;
        if self.acceptable(first, cx, filter) {
            return Ok(first);
        }
        self.reselect(first, cx, filter)
    }

    #[cold]
    fn reselect(
        &self,
        first: EndpointIdx,
        cx: &mut PickContext<'_>,
        filter: &Availability,
    ) -> Result<EndpointIdx, PickError> {
        for probe in 1..MAX_PROBES {
            cx.probe = probe;
            let idx = self.checked_pick(cx)?;
            if self.acceptable(idx, cx, filter) {
                return Ok(idx);
            }
        }
        let eligible = self.snapshot.eligible();
        let start = cx.rng.index(eligible.len());
        let ring = || eligible[start..].iter().chain(&eligible[..start]).copied();
        if let Some(idx) = ring().find(|&i| self.acceptable(i, cx, filter)) {
            return Ok(idx);
        }
        let untried = |&i: &EndpointIdx| !cx.tried.contains(self.snapshot.endpoint(i));
        Ok(ring().find(untried).unwrap_or(first))
    }

    /// A member at random: the first acceptable one from a random start, else the first
    /// untried one, else the one at the start (as [`reselect`](Self::reselect) falls back).
    #[cold]
    fn member(
        &self,
        members: &[EndpointIdx],
        cx: &mut PickContext<'_>,
        filter: &Availability,
    ) -> EndpointIdx {
        let start = cx.rng.index(members.len());
        let ring = || members[start..].iter().chain(&members[..start]).copied();
        if let Some(idx) = ring().find(|&i| self.acceptable(i, cx, filter)) {
            return idx;
        }
        let untried = |&i: &EndpointIdx| !cx.tried.contains(self.snapshot.endpoint(i));
        ring().find(untried).unwrap_or(members[start])
    }

    #[inline]
    fn checked_pick(&self, cx: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> {
        let How::Picker(picker) = self.how else {
            return Err(PickError::Declined("a member list has no picker"));
        };
        let idx = picker.pick(cx)?;
        if idx.get() < self.snapshot.len() {
            Ok(idx)
        } else {
            Err(PickError::Declined(
                "picker returned an index outside the snapshot",
            ))
        }
    }

    #[inline]
    fn acceptable(&self, idx: EndpointIdx, cx: &PickContext<'_>, filter: &Availability) -> bool {
        self.snapshot.is_eligible(idx)
            && !cx.tried.contains(self.snapshot.endpoint(idx))
            && filter.check_live(self.snapshot.live(idx), cx.now).is_none()
    }
}

impl<P> fmt::Debug for Prepared<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Prepared")
            .field("snapshot_version", &self.snapshot.version())
            .field("prepared_at", &self.prepared_at)
            .field("refresh_at", &self.refresh_at)
            .finish_non_exhaustive()
    }
}

/// Picks endpoints with a strategy over the current snapshot. Share it (`Arc<Balancer>`) across
/// threads: picks only read.
///
/// ```
/// use std::sync::Arc;
/// use lbkit_core::{Balancer, EndpointSpec, FastRng, Outcome, PickContext, Snapshot, Timestamp};
/// # use lbkit_core::{Picker, PickError, EndpointIdx, Strategy};
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
/// let now = Timestamp::ZERO;
/// let snap = Arc::new(Snapshot::from_specs(vec![EndpointSpec::new("a:1"), EndpointSpec::new("b:1")], now));
/// let balancer = Balancer::new(First, snap, now);
/// let mut rng = FastRng::seed_from_u64(1);
/// let guard = balancer.pick(&mut PickContext::new(now, &mut rng)).unwrap();
/// assert_eq!(guard.endpoint().address(), "a:1");
/// assert_eq!(guard.endpoint().stats().in_flight(), 1);
/// guard.finish(Outcome::Success);
/// ```
pub struct Balancer<S: Strategy = BoxStrategy> {
    strategy: S,
    availability: Availability,
    clock: Clock,
    /// The published state; replaced whole by `publish` and `tick`.
    current: ArcCell<Prepared<S::Picker>>,
    /// Set while one thread re-prepares in `tick`, so at most one does.
    refreshing: AtomicBool,
    /// Samples requests into a trace, when set.
    tracer: Option<Arc<Tracer>>,
    /// A candidate strategy observing first attempts ([`crate::shadow`]); `shadowing` says
    /// whether one is set, so a balancer without one pays a relaxed load per pick.
    shadow: ArcCell<Option<Arc<Shadow>>>,
    shadowing: AtomicBool,
    /// Whether this balancer's strategy sets the endpoints' EWMA decay
    /// ([`Strategy::ewma_decay`]): not for a shadow's candidate.
    owns_statistics: bool,
    /// The stages in front of the strategy ([`crate::stage`]).
    stages: ArcCell<Stages>,
}

// === impl Balancer ===

impl<S: Strategy> Balancer<S> {
    /// A balancer over `snapshot`, prepared at `now`, with the default [`Availability`] filter
    /// and the system clock.
    pub fn new(strategy: S, snapshot: Arc<Snapshot>, now: Timestamp) -> Self {
        apply_decay(&strategy, &snapshot);
        Self::observing(strategy, snapshot, now).owning_statistics()
    }

    /// A balancer that reads the endpoints' statistics without setting them up for its
    /// strategy: a shadow's candidate.
    pub(crate) fn observing(strategy: S, snapshot: Arc<Snapshot>, now: Timestamp) -> Self {
        let stages = Stages::default();
        let prepared = prepare(&strategy, &stages, snapshot, now, None);
        Balancer {
            strategy,
            availability: Availability::default(),
            clock: Clock::System,
            current: ArcCell::from_pointee(prepared),
            refreshing: AtomicBool::new(false),
            tracer: None,
            shadow: ArcCell::from_pointee(None),
            shadowing: AtomicBool::new(false),
            owns_statistics: false,
            stages: ArcCell::from_pointee(stages),
        }
    }

    /// Run `stages` in front of the strategy ([`crate::stage`]), re-preparing the current
    /// snapshot at `now`.
    pub fn with_stages(self, stages: Stages, now: Timestamp) -> Self {
        self.set_stages(stages, now);
        self
    }

    /// Replace the stages (an aperture's new coordinates, a reload) and publish the current
    /// snapshot prepared with them at `now`. Safe beside a concurrent [`publish`](Self::publish):
    /// whichever lands last, the published state ends with the newest snapshot and the newest
    /// stages.
    pub fn set_stages(&self, stages: Stages, now: Timestamp) {
        if self.shadowing.load(Ordering::Acquire) {
            if let Some(s) = self.shadow.load().as_ref() {
                s.set_stages(stages.clone(), now);
            }
        }
        self.stages.store(Arc::new(stages));
        loop {
            let before = self.current.load_full();
            let stages = self.stages.load_full();
            let next = Arc::new(prepare(
                &self.strategy,
                &stages,
                before.snapshot.clone(),
                now,
                Some(&before),
            ));
            let prev = self.current.compare_and_swap(&before, next);
            if Arc::ptr_eq(&prev, &before) {
                return;
            }
        }
    }

    /// The stages in front of the strategy.
    pub fn stages(&self) -> Arc<Stages> {
        self.stages.load_full()
    }

    fn owning_statistics(mut self) -> Self {
        self.owns_statistics = true;
        self
    }

    /// Run `strategy` as a shadow beside this balancer's (see [`crate::shadow`]), labelled
    /// `label`, from this balancer's current snapshot and filter; replaces a running one.
    pub fn start_shadow(
        &self,
        label: impl Into<String>,
        strategy: BoxStrategy,
        now: Timestamp,
    ) -> Arc<Shadow> {
        let shadow = Arc::new(Shadow::new(
            label,
            strategy,
            &self.snapshot(),
            self.availability,
            now,
        ));
        self.set_shadow(Some(shadow.clone()), now);
        shadow
    }

    /// Attach `shadow` (a running one, carried over from another balancer of the same
    /// service, keeps its counters), or stop shadowing with `None`.
    pub fn set_shadow(&self, shadow: Option<Arc<Shadow>>, now: Timestamp) {
        if let Some(s) = &shadow {
            s.publish(self.snapshot(), now);
            s.set_stages((*self.stages.load_full()).clone(), now);
        }
        self.shadowing.store(shadow.is_some(), Ordering::Release);
        self.shadow.store(Arc::new(shadow));
    }

    /// The running shadow, if any.
    pub fn shadow(&self) -> Option<Arc<Shadow>> {
        self.shadow.load().as_ref().clone()
    }

    /// Record `sample_rate` of the requests to `service` into `sink` (see [`trace`](crate::trace)):
    /// every attempt of a sampled request, with the strategy's name.
    pub fn with_tracer(
        mut self,
        sink: Arc<dyn TraceSink>,
        service: &str,
        sample_rate: f64,
    ) -> Self {
        let tracer = Tracer::new(sink, service, self.strategy.name(), sample_rate);
        self.tracer = Some(Arc::new(tracer));
        self
    }

    /// The tracer, if requests are sampled.
    pub fn tracer(&self) -> Option<&Arc<Tracer>> {
        self.tracer.as_ref()
    }

    /// Use `availability` as the pick-time filter.
    pub fn with_availability(mut self, availability: Availability) -> Self {
        self.availability = availability;
        self
    }

    /// Use `clock` for guards that finish without an explicit time.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The strategy.
    pub fn strategy(&self) -> &S {
        &self.strategy
    }

    /// The pick-time filter.
    pub fn availability(&self) -> &Availability {
        &self.availability
    }

    /// The clock guards use.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The current snapshot and picker.
    pub fn current(&self) -> Arc<Prepared<S::Picker>> {
        self.current.load_full()
    }

    /// The current snapshot and picker, borrowed: cheaper than [`current`](Self::current) (no
    /// reference-count traffic on a shared counter), for use within one call. Do not hold it
    /// across an `.await` or for long: a held guard delays the old state's release.
    #[inline]
    pub fn load(&self) -> impl std::ops::Deref<Target = Arc<Prepared<S::Picker>>> + '_ {
        self.current.load()
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current.load().snapshot.clone()
    }

    /// Prepare `snapshot` and publish it with its picker in one swap. Call from one task (the
    /// owner of the endpoint source); picks running meanwhile see the old or the new state,
    /// never a mix.
    pub fn publish(&self, snapshot: Arc<Snapshot>, now: Timestamp) {
        if self.shadowing.load(Ordering::Acquire) {
            if let Some(s) = self.shadow.load().as_ref() {
                s.publish(snapshot.clone(), now);
            }
        }
        if self.owns_statistics {
            apply_decay(&self.strategy, &snapshot);
        }
        // Stages replaced meanwhile (`set_stages` from another task): prepared again with
        // them, so the newest snapshot never goes out with stages already replaced.
        loop {
            let stages = self.stages.load_full();
            let last = self.current.load_full();
            self.current.store(Arc::new(prepare(
                &self.strategy,
                &stages,
                snapshot.clone(),
                now,
                Some(&last),
            )));
            if Arc::ptr_eq(&stages, &self.stages.load_full()) {
                return;
            }
        }
    }

    /// Whether the current picker asked to be re-prepared by `now`.
    pub fn refresh_due(&self, now: Timestamp) -> bool {
        self.current.load().due(now)
    }

    /// Re-prepare the current snapshot if it is due (response-time weights, warm-up, a picker
    /// that asked: [`Prepared::refresh_at`]). One due
    /// refresh is prepared once, however many threads tick; a `publish` that lands meanwhile
    /// wins. Returns whether a new picker was published.
    pub fn tick(&self, now: Timestamp) -> bool {
        if self.shadowing.load(Ordering::Acquire) {
            if let Some(s) = self.shadow.load().as_ref() {
                s.tick(now);
            }
        }
        if !self.refresh_due(now) {
            return false;
        }
        // Acquire/Release: the flag only excludes other refreshers; ArcSwap orders the data.
        if self.refreshing.swap(true, Ordering::Acquire) {
            return false;
        }
        // Checked again under the flag: another refresher may have published since the check
        // above (without this, two ticks could both prepare the same refresh; the loom model
        // `concurrent_ticks_prepare_once` finds it).
        let before = self.current.load_full();
        if !before.due(now) {
            self.refreshing.store(false, Ordering::Release);
            return false;
        }
        let next = Arc::new(prepare(
            &self.strategy,
            &self.stages.load(),
            before.snapshot.clone(),
            now,
            Some(&before),
        ));
        let prev = self.current.compare_and_swap(&before, next);
        let swapped = Arc::ptr_eq(&prev, &before);
        self.refreshing.store(false, Ordering::Release);
        swapped
    }

    /// Pick an endpoint for one call and start tracking it.
    ///
    /// # Errors
    /// See [`Prepared::select`].
    //
    // Always inlined, with `start_call` and `CallGuard::new`: built in an out-of-line function,
    // the guard came back through memory, written field by field, and the caller's copy of it
    // read it with wider loads than the stores, which the store buffer cannot forward (with
    // the tag's copy in `Prepared::select`, round robin's pick and finish went from 57.7 ns to
    // 38.8: BENCHMARKS.md, "Pick and finish: two store-forwarding stalls").
    #[inline(always)]
    pub fn pick(&self, cx: &mut PickContext<'_>) -> Result<CallGuard, PickError> {
        let prepared = self.current.load();
        let idx = prepared.select(cx, &self.availability)?;
        let endpoint = prepared.snapshot.endpoint(idx).clone();
        Ok(self.start_call(endpoint, cx))
    }

    /// [`pick`](Self::pick), but only an endpoint not in `cx.tried` (see
    /// [`Prepared::select_untried`]): what a retry uses.
    ///
    /// # Errors
    /// See [`Prepared::select_untried`].
    #[inline(always)]
    pub fn pick_untried(&self, cx: &mut PickContext<'_>) -> Result<CallGuard, PickError> {
        let endpoint = self.select_untried(cx)?;
        Ok(self.start_call(endpoint, cx))
    }

    /// The endpoint [`pick_untried`](Self::pick_untried) would call, without starting the call:
    /// for a driver that must check something else (the retry budget) between the choice and
    /// the call. Start it with [`start_call`](Self::start_call).
    ///
    /// # Errors
    /// See [`Prepared::select_untried`].
    #[inline]
    pub fn select_untried(&self, cx: &mut PickContext<'_>) -> Result<Endpoint, PickError> {
        let prepared = self.current.load();
        let idx = prepared.select_untried(cx, &self.availability)?;
        Ok(prepared.snapshot.endpoint(idx).clone())
    }

    /// Let the shadow pick for the request of `cx`, whose first attempt goes to `live` (out
    /// of line: only balancers with a shadow pay for its code in the pick path).
    #[inline(never)]
    fn observe(&self, live: &Endpoint, cx: &mut PickContext<'_>) {
        if let Some(s) = self.shadow.load().as_ref() {
            s.observe(live, cx);
        }
    }

    /// Start tracking the call to `endpoint`, tapped for the trace when its request is sampled
    /// (deciding it when `cx.trace` is undecided): what [`pick`](Self::pick) does after it
    /// selects. For drivers that select with [`Prepared::select`] themselves (the tower pool's
    /// readiness pass-over).
    #[inline(always)]
    pub fn start_call(&self, endpoint: Endpoint, cx: &mut PickContext<'_>) -> CallGuard {
        if self.shadowing.load(Ordering::Relaxed) && cx.attempt == 0 && !cx.hedge {
            self.observe(&endpoint, cx);
        }
        let Some(tracer) = &self.tracer else {
            return CallGuard::new(endpoint, cx.now, self.clock.clone());
        };
        let trace = tracer.decide(cx);
        let in_flight = endpoint.stats().in_flight();
        let mut guard = CallGuard::new(endpoint, cx.now, self.clock.clone());
        guard.trace = trace;
        if let Some(request) = trace.request() {
            guard.tap = Some(Tap {
                tracer: tracer.clone(),
                request,
                in_flight,
                attempt: cx.attempt,
                hedge: cx.hedge,
            });
        }
        guard
    }
}

/// Give every endpoint of `snapshot` the EWMA decay `strategy` asks for, if it asks.
fn apply_decay<S: Strategy>(strategy: &S, snapshot: &Snapshot) {
    if let Some(decay) = strategy.ewma_decay() {
        for e in snapshot.endpoints() {
            e.stats().set_ewma_decay(decay);
        }
    }
}

/// Prepare `snapshot` under `stages`; the main picker from `last`'s where the strategy can carry
/// it over ([`Strategy::prepare_next`]).
fn prepare<S: Strategy>(
    strategy: &S,
    stages: &Stages,
    snapshot: Arc<Snapshot>,
    now: Timestamp,
    last: Option<&Prepared<S::Picker>>,
) -> Prepared<S::Picker> {
    let tags = TagTable::of(&snapshot).map(|table| {
        let last = last.and_then(|l| l.tags.as_deref());
        Box::new(Tagged::prepare(strategy, table, now, last))
    });
    let tag_sets = tags.as_ref().map_or(&[][..], |t| &t.table.subsets[..]);
    let last_tags = last.and_then(|l| l.tags.as_deref());
    let tag_pairs: Vec<Option<usize>> = match (&tags, last_tags) {
        (Some(now), Some(was)) => (0..tag_sets.len())
            .map(|i| was.table.counterpart(&now.table, i))
            .collect(),
        _ => Vec::new(),
    };
    let last_stages = last.map(|l| Last {
        main: (&l.main, &l.picker),
        staged: l.staged.as_ref(),
        tags: &tag_pairs,
    });
    let mut staged = Staged::prepare(strategy, stages, &snapshot, tag_sets, now, last_stages);
    let (main, picker) = match staged.as_mut().and_then(Staged::fold_main) {
        Some(folded) => folded,
        None => {
            let picker = match last {
                Some(last) => strategy.prepare_next(&last.main, &last.picker, &snapshot, now),
                None => strategy.prepare(&snapshot, now),
            };
            (snapshot.clone(), picker)
        }
    };
    let periodic = strategy.refresh_interval().map(|d| now.saturating_add(d));
    let warming = snapshot
        .any_ramping(now)
        .then(|| now.saturating_add(WARMUP_REFRESH));
    let asked = pickers_refresh_at(&picker, tags.as_deref(), staged.as_ref());
    let refresh_at = [periodic, warming, asked].into_iter().flatten().min();
    Prepared {
        snapshot,
        main,
        picker,
        tags,
        staged,
        prepared_at: now,
        refresh_at,
    }
}

/// The earliest time any picker of a prepared snapshot asked to be prepared again
/// ([`Picker::refresh_at`]): the main one, the tag sets' and the stages' leaves.
fn pickers_refresh_at<P: Picker>(
    main: &P,
    tags: Option<&Tagged<P>>,
    staged: Option<&Staged<P>>,
) -> Option<Timestamp> {
    let tags = tags.map_or(&[][..], |t| &t.pickers[..]);
    let leaves = staged.map_or(&[][..], |s| &s.leaves[..]);
    let leaves = leaves.iter().filter_map(|l| l.picker.as_ref());
    (std::iter::once(main).chain(tags).chain(leaves))
        .filter_map(Picker::refresh_at)
        .min()
}

impl<S: Strategy + fmt::Debug> fmt::Debug for Balancer<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Balancer")
            .field("strategy", &self.strategy)
            .field("availability", &self.availability)
            .field("current", &*self.current.load())
            .finish_non_exhaustive()
    }
}

/// Tracks one call to a picked endpoint: `in_flight` goes up when the guard is made and down
/// when it finishes; finishing records latency and outcome. Dropping it unfinished records a
/// cancellation (the elapsed time still counts, as in linkerd).
#[must_use = "dropping a CallGuard at once records a cancelled call"]
pub struct CallGuard {
    endpoint: Endpoint,
    started: Timestamp,
    clock: Clock,
    done: bool,
    trace: TraceId,
    tap: Option<Tap>,
}

// === impl CallGuard ===

impl CallGuard {
    /// Start tracking a call to `endpoint` that starts at `started`.
    #[inline(always)]
    pub fn new(endpoint: Endpoint, started: Timestamp, clock: Clock) -> Self {
        endpoint.stats().start();
        CallGuard {
            endpoint,
            started,
            clock,
            done: false,
            trace: TraceId::UNDECIDED,
            tap: None,
        }
    }

    /// The request's tracing decision (carry it to the request's retries with
    /// [`PickContext::with_trace`]; [`Attempts`](crate::Attempts) does).
    #[inline]
    pub fn trace_id(&self) -> TraceId {
        self.trace
    }

    /// The endpoint picked.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// When the call started.
    pub fn started(&self) -> Timestamp {
        self.started
    }

    /// The call was never sent (a retry whose budget was refused after its endpoint was
    /// chosen): the endpoint's in-flight count goes back and nothing is recorded, neither an
    /// outcome nor a trace record.
    pub fn abandon(mut self) {
        self.done = true;
        self.endpoint.stats().abandon();
    }

    /// Finish the call now (one clock read) with `outcome`.
    pub fn finish(self, outcome: Outcome) {
        let now = self.clock.now();
        self.finish_at(outcome, now);
    }

    /// Finish the call at `now` with `outcome`.
    #[inline]
    pub fn finish_at(mut self, outcome: Outcome, now: Timestamp) {
        self.done = true;
        self.endpoint.stats().finish(self.started, now, outcome);
        if let Some(tap) = self.tap.take() {
            tap.record(&self.endpoint, self.started, now, outcome);
        }
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        if !self.done {
            let now = self.clock.now();
            self.endpoint
                .stats()
                .finish(self.started, now, Outcome::Cancelled);
            if let Some(tap) = self.tap.take() {
                tap.record(&self.endpoint, self.started, now, Outcome::Cancelled);
            }
        }
    }
}

impl fmt::Debug for CallGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallGuard")
            .field("endpoint", &self.endpoint.address())
            .field("started", &self.started)
            .finish()
    }
}
