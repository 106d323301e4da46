//! Shadow mode: run a *candidate* strategy beside the live one on every request. The
//! candidate picks too, over the same snapshot and the same live statistics, and nothing is
//! sent: the counters say how often it disagrees with the live choice and what share of the
//! traffic it would have sent to each endpoint, so a switch can be judged before it happens.
//!
//! A [`Shadow`] is attached to a [`Balancer`] with [`Balancer::start_shadow`] (or
//! [`Balancer::set_shadow`], to carry one over to a new balancer); from then on the
//! balancer keeps the candidate's picker prepared for every snapshot it publishes and refresh
//! it ticks, and every first attempt it starts ([`Balancer::pick`], [`Balancer::start_call`])
//! is observed. Retries and hedges are not: what the candidate would retry depends on outcomes
//! that did not happen. Without a shadow the balancer pays one relaxed load per pick.
//!
//! ```
//! use std::sync::Arc;
//! use lbkit_core::*;
//! use lbkit_core::shadow::Shadow;
//! # struct Nth(usize); struct NthPicker(EndpointIdx);
//! # impl Picker for NthPicker { fn pick(&self, _: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> { Ok(self.0) } }
//! # impl Strategy for Nth { type Picker = NthPicker; fn name(&self) -> &str { "nth" }
//! #     fn prepare(&self, s: &Arc<Snapshot>, _: Timestamp) -> NthPicker { NthPicker(s.eligible()[self.0]) } }
//! let now = Timestamp::from_millis(1);
//! let specs = vec![EndpointSpec::new("a:1"), EndpointSpec::new("b:1")];
//! let balancer = Balancer::new(BoxStrategy::new(Nth(0)), Arc::new(Snapshot::from_specs(specs, now)), now);
//! let shadow = balancer.start_shadow("second", BoxStrategy::new(Nth(1)), now);
//! let mut rng = FastRng::seed_from_u64(1);
//! for _ in 0..3 {
//!     balancer.pick(&mut PickContext::new(now, &mut rng)).unwrap().finish_at(Outcome::Success, now);
//! }
//! let report = shadow.report(&balancer.snapshot());
//! assert_eq!((report.picks, report.disagreements), (3, 3));
//! assert_eq!(report.endpoints[1].candidate_share, 1.0);
//! ```

use std::fmt;
use std::sync::Arc;

use crate::availability::Availability;
use crate::balancer::Balancer;
use crate::endpoint::Endpoint;
use crate::snapshot::Snapshot;
use crate::strategy::{BoxStrategy, PickContext};
use crate::sync::{AtomicU64, Ordering};
use crate::time::Timestamp;

#[allow(unused_imports)] // named in the docs
use crate::strategy::Strategy;

/// A candidate strategy picking beside the live one, and what it would have done.
pub struct Shadow {
    label: String,
    candidate: Balancer<BoxStrategy>,
    picks: AtomicU64,
    disagreements: AtomicU64,
    unpicked: AtomicU64,
}

/// What a shadow saw so far.
#[derive(Clone, Debug, PartialEq)]
pub struct ShadowReport {
    /// The candidate's label (its name and parameters, as given).
    pub candidate: String,
    /// First attempts observed.
    pub picks: u64,
    /// Of those, how many the candidate would have sent elsewhere.
    pub disagreements: u64,
    /// Of those, how many the candidate could not pick at all (its error).
    pub unpicked: u64,
    /// Each endpoint of the snapshot: where the live strategy sent first attempts, and where
    /// the candidate would have.
    pub endpoints: Vec<ShadowShare>,
}

/// One endpoint's share under each strategy.
#[derive(Clone, Debug, PartialEq)]
pub struct ShadowShare {
    /// The endpoint's address.
    pub address: String,
    /// First attempts the live strategy sent here.
    pub live: u64,
    /// First attempts the candidate would have sent here.
    pub candidate: u64,
    /// `live` over every endpoint's.
    pub live_share: f64,
    /// `candidate` over every endpoint's.
    pub candidate_share: f64,
}

// === impl Shadow ===

impl Shadow {
    /// A shadow running `strategy` over `snapshot` with the live balancer's `availability`
    /// filter, labelled `label` in reports; every endpoint's shadow counters start at 0.
    /// [`Balancer::start_shadow`] makes one from the balancer's own state and attaches it.
    pub fn new(
        label: impl Into<String>,
        strategy: BoxStrategy,
        snapshot: &Arc<Snapshot>,
        availability: Availability,
        now: Timestamp,
    ) -> Self {
        for e in snapshot.endpoints() {
            e.stats().reset_shadow();
        }
        Shadow {
            label: label.into(),
            candidate: Balancer::observing(strategy, snapshot.clone(), now)
                .with_availability(availability),
            picks: AtomicU64::new(0),
            disagreements: AtomicU64::new(0),
            unpicked: AtomicU64::new(0),
        }
    }

    /// The candidate's label.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Prepare the candidate for `snapshot` (the live balancer published it).
    pub(crate) fn publish(&self, snapshot: Arc<Snapshot>, now: Timestamp) {
        self.candidate.publish(snapshot, now);
    }

    /// Run the live balancer's `stages` in front of the candidate too, so it picks among the
    /// same endpoints for each request.
    pub(crate) fn set_stages(&self, stages: crate::stage::Stages, now: Timestamp) {
        self.candidate.set_stages(stages, now);
    }

    /// Refresh the candidate when due (the live balancer ticked).
    pub(crate) fn tick(&self, now: Timestamp) {
        self.candidate.tick(now);
    }

    /// The live strategy started a first attempt to `live` for the request in `cx`: let the
    /// candidate pick for the same request and count where it would have gone.
    #[inline]
    pub(crate) fn observe(&self, live: &Endpoint, cx: &mut PickContext<'_>) {
        let mut own = PickContext::new(cx.now, &mut *cx.rng);
        own.hash = cx.hash;
        own.key = cx.key;
        own.tag = cx.tag;
        own.attrs = cx.attrs;
        self.picks.fetch_add(1, Ordering::Relaxed);
        live.stats().count_shadow(true);
        let prepared = self.candidate.load();
        match prepared.select(&mut own, self.candidate.availability()) {
            Ok(idx) => {
                let chosen = prepared.snapshot().endpoint(idx);
                chosen.stats().count_shadow(false);
                if chosen.key_hash() != live.key_hash() || chosen.key() != live.key() {
                    self.disagreements.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(_) => {
                self.unpicked.fetch_add(1, Ordering::Relaxed);
                self.disagreements.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The counters so far, with each endpoint of `snapshot` (the live balancer's current one).
    pub fn report(&self, snapshot: &Snapshot) -> ShadowReport {
        let counts: Vec<(String, u64, u64)> = snapshot
            .endpoints()
            .iter()
            .map(|e| {
                let (l, c) = e.stats().shadow_counts();
                (e.address().to_owned(), l, c)
            })
            .collect();
        let total_live: u64 = counts.iter().map(|c| c.1).sum();
        let total_candidate: u64 = counts.iter().map(|c| c.2).sum();
        let share = |n: u64, of: u64| if of == 0 { 0.0 } else { n as f64 / of as f64 };
        ShadowReport {
            candidate: self.label.clone(),
            picks: self.picks.load(Ordering::Relaxed),
            disagreements: self.disagreements.load(Ordering::Relaxed),
            unpicked: self.unpicked.load(Ordering::Relaxed),
            endpoints: counts
                .into_iter()
                .map(|(address, live, candidate)| ShadowShare {
                    address,
                    live,
                    candidate,
                    live_share: share(live, total_live),
                    candidate_share: share(candidate, total_candidate),
                })
                .collect(),
        }
    }
}

impl fmt::Debug for Shadow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shadow")
            .field("label", &self.label)
            .field("picks", &self.picks)
            .field("disagreements", &self.disagreements)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::EndpointSpec;
    use crate::error::PickError;
    use crate::rng::FastRng;
    use crate::snapshot::EndpointIdx;
    use crate::stats::Outcome;
    use crate::strategy::{Picker, Strategy, TriedSet};

    /// The eligible endpoint at `index` from the end when `last`, else from the start.
    struct At {
        last: bool,
    }
    struct AtPicker(Option<EndpointIdx>);
    impl Picker for AtPicker {
        fn pick(&self, _: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> {
            self.0.ok_or(PickError::NoEndpoints)
        }
    }
    impl Strategy for At {
        type Picker = AtPicker;
        fn name(&self) -> &str {
            "at"
        }
        fn prepare(&self, s: &Arc<Snapshot>, _: Timestamp) -> AtPicker {
            let e = s.eligible();
            AtPicker(if self.last { e.last() } else { e.first() }.copied())
        }
    }

    fn snap(n: usize, now: Timestamp) -> Arc<Snapshot> {
        let specs = (0..n)
            .map(|i| EndpointSpec::new(format!("e{i}:1")))
            .collect();
        Arc::new(Snapshot::from_specs(specs, now))
    }

    #[test]
    fn the_candidate_follows_publishes_and_only_first_attempts_count() {
        let now = Timestamp::from_millis(1);
        let live = Balancer::new(BoxStrategy::new(At { last: false }), snap(2, now), now);
        let shadow = live.start_shadow("last", BoxStrategy::new(At { last: true }), now);
        let mut rng = FastRng::seed_from_u64(1);
        let pick = |rng: &mut FastRng| {
            live.pick(&mut PickContext::new(now, rng))
                .unwrap()
                .finish_at(Outcome::Success, now);
        };
        pick(&mut rng);
        // A retry is not observed.
        let tried = TriedSet::new();
        live.pick(&mut PickContext::new(now, &mut rng).with_tried(1, &tried))
            .unwrap()
            .finish_at(Outcome::Success, now);
        // A third endpoint joins: the candidate's choice moves with the publish.
        live.publish(snap(3, now), now);
        pick(&mut rng);
        pick(&mut rng);
        let r = shadow.report(&live.snapshot());
        assert_eq!((r.picks, r.disagreements, r.unpicked), (3, 3, 0));
        let counts: Vec<(u64, u64)> = r.endpoints.iter().map(|e| (e.live, e.candidate)).collect();
        // `from_specs` makes new endpoints, so the first pick's counts left with the old ones
        // (a `SnapshotBuilder` keeps unchanged endpoints, and their counts).
        assert_eq!(counts, [(2, 0), (0, 0), (0, 2)], "{r:?}");
        assert_eq!(r.endpoints[0].live_share, 1.0);
        assert_eq!(r.endpoints[2].candidate_share, 1.0);

        // The same strategy agrees; stopping stops the counting.
        let same = live.start_shadow("first", BoxStrategy::new(At { last: false }), now);
        pick(&mut rng);
        assert_eq!(
            (
                same.report(&live.snapshot()).picks,
                same.report(&live.snapshot()).disagreements
            ),
            (1, 0)
        );
        live.set_shadow(None, now);
        pick(&mut rng);
        assert_eq!(same.report(&live.snapshot()).picks, 1);
        assert!(live.shadow().is_none());
    }

    #[test]
    fn a_candidate_that_cannot_pick_counts_as_unpicked() {
        let now = Timestamp::from_millis(1);
        let live = Balancer::new(BoxStrategy::new(At { last: false }), snap(2, now), now);
        struct Fails;
        impl Strategy for Fails {
            type Picker = AtPicker;
            fn name(&self) -> &str {
                "fails"
            }
            fn prepare(&self, _: &Arc<Snapshot>, _: Timestamp) -> AtPicker {
                AtPicker(None)
            }
        }
        let shadow = live.start_shadow("fails", BoxStrategy::new(Fails), now);
        let mut rng = FastRng::seed_from_u64(1);
        live.pick(&mut PickContext::new(now, &mut rng))
            .unwrap()
            .finish_at(Outcome::Success, now);
        let r = shadow.report(&live.snapshot());
        assert_eq!((r.picks, r.disagreements, r.unpicked), (1, 1, 1));
    }
}
