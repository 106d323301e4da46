//! One pick with readiness pass-over: pick, look up the endpoint's service, and take it if it is
//! ready at once; otherwise pass it over (bounded) and settle for the first candidate that was
//! merely busy.

use std::sync::Arc;

use futures_util::FutureExt;
use lbkit_core::trace::TraceId;
use lbkit_core::{
    CallGuard, Endpoint, EndpointIdx, FailureKind, FastRng, Outcome, PickContext, PickError,
    Prepared, Strategy, Timestamp, TriedSet,
};
use tower::{Service, ServiceExt};

use super::{Entry, Pool, ServiceMap};
use crate::completion::Completion;
use crate::error::{Error, ErrorKind};

/// A picked endpoint: its call handle (in flight from now) and a clone of its service, ready or
/// to be waited on.
pub(crate) struct Selected<Svc> {
    pub(crate) call: Completion,
    pub(crate) svc: Svc,
    pub(crate) ready: bool,
}

/// Candidates passed over: the first that was merely busy, the first whose readiness failed.
struct Leftover<Svc> {
    waiting: Option<(Endpoint, Svc)>,
    failed: Option<Error>,
}

impl<Svc> Default for Leftover<Svc> {
    fn default() -> Self {
        Leftover {
            waiting: None,
            failed: None,
        }
    }
}

/// Inputs of one pick.
pub(crate) struct PickInput<'a> {
    pub(crate) now: Timestamp,
    pub(crate) route: lbkit_core::Route<'a>,
    pub(crate) attempt: u32,
    pub(crate) tried: &'a TriedSet,
    /// The request's tracing decision (undecided at its first pick).
    pub(crate) trace: TraceId,
    /// Sent while an earlier attempt is open (a fork).
    pub(crate) hedge: bool,
}

impl<'a> PickInput<'a> {
    /// A request's first pick at `now` on `route`: nothing tried, no tracing decision yet.
    pub(crate) fn first(now: Timestamp, route: lbkit_core::Route<'a>) -> Self {
        static NOTHING_TRIED: TriedSet = TriedSet::new();
        PickInput {
            now,
            route,
            attempt: 0,
            tried: &NOTHING_TRIED,
            trace: TraceId::UNDECIDED,
            hedge: false,
        }
    }
}

// === impl Pool (selection) ===

impl<Svc, S: Strategy> Pool<Svc, S> {
    /// Pick an endpoint whose service is ready, passing over those that are not (at most
    /// `probes` candidates); when none is ready, the first candidate that was merely busy.
    ///
    /// Passed-over candidates get no call recorded: the guard is made only for the endpoint
    /// finally chosen. A service whose readiness fails is recorded as a connect failure.
    pub(crate) fn select<Req>(
        &self,
        input: &PickInput<'_>,
        rng: &mut FastRng,
    ) -> Result<Selected<Svc>, Error>
    where
        Svc: Service<Req> + Clone,
        Svc::Error: Into<crate::BoxError>,
    {
        let prepared = self.inner.balancer.load();
        let services = self.inner.services.load();
        let idx = self.pick(&prepared, input, input.tried, rng)?;
        let endpoint = prepared.snapshot().endpoint(idx);
        let mut left = Leftover::default();
        if let Some(entry) = lookup(&services, endpoint) {
            let mut svc = entry.svc.clone();
            match svc.ready().now_or_never().map(|r| r.map(drop)) {
                Some(Ok(_)) => return Ok(self.selected(endpoint, svc, true, input, rng)),
                other => self.note(&mut left, endpoint, svc, other, input),
            }
        }
        self.pass_over(&prepared, &services, endpoint, left, input, rng)
    }

    #[inline]
    fn pick(
        &self,
        prepared: &Prepared<S::Picker>,
        input: &PickInput<'_>,
        tried: &TriedSet,
        rng: &mut FastRng,
    ) -> Result<EndpointIdx, Error> {
        let mut cx = PickContext::new(input.now, rng)
            .with_tried(input.attempt, tried)
            .with_route(input.route);
        prepared
            .select_untried(&mut cx, self.inner.balancer.availability())
            .map_err(Error::pick)
    }

    /// Remember a candidate that was not ready (to wait on) or whose readiness failed.
    fn note<Req>(
        &self,
        left: &mut Leftover<Svc>,
        endpoint: &Endpoint,
        svc: Svc,
        ready: Option<Result<(), Svc::Error>>,
        input: &PickInput<'_>,
    ) where
        Svc: Service<Req>,
        Svc::Error: Into<crate::BoxError>,
    {
        match ready {
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                self.record_not_ready(endpoint, input.now);
                let err = Error::new(ErrorKind::Failed(FailureKind::Connect))
                    .at(endpoint.key(), input.attempt)
                    .with_source(e.into());
                left.failed.get_or_insert(err);
            }
            None => {
                if left.waiting.is_none() {
                    left.waiting = Some((endpoint.clone(), svc));
                }
            }
        }
    }

    /// The first candidate was not ready: look at up to `probes - 1` more, each not looked at
    /// yet, then settle for the first that was merely busy.
    #[cold]
    fn pass_over<Req>(
        &self,
        prepared: &Prepared<S::Picker>,
        services: &ServiceMap<Svc>,
        first: &Endpoint,
        mut left: Leftover<Svc>,
        input: &PickInput<'_>,
        rng: &mut FastRng,
    ) -> Result<Selected<Svc>, Error>
    where
        Svc: Service<Req> + Clone,
        Svc::Error: Into<crate::BoxError>,
    {
        let mut probe = *input.tried;
        let mut passed = TriedSet::new();
        let mut candidate = first.clone();
        for _ in 0..self.inner.probes {
            crate::telemetry::inc(&self.inner.metrics.pass_over);
            passed.insert(&candidate);
            probe.insert(&candidate);
            let idx = match self.pick(prepared, input, &probe, rng) {
                Ok(idx) => idx,
                // Every candidate left has been looked at (or tried by this call).
                Err(e) if e.kind() == ErrorKind::NoEndpoint(PickError::AllTried) => break,
                Err(e) => return Err(e),
            };
            let endpoint = prepared.snapshot().endpoint(idx);
            if let Some(entry) = lookup(services, endpoint) {
                let mut svc = entry.svc.clone();
                match svc.ready().now_or_never().map(|r| r.map(drop)) {
                    Some(Ok(_)) => return Ok(self.selected(endpoint, svc, true, input, rng)),
                    other => self.note(&mut left, endpoint, svc, other, input),
                }
            }
            candidate = endpoint.clone();
        }
        match left {
            Leftover {
                waiting: Some((endpoint, svc)),
                ..
            } => Ok(self.selected(&endpoint, svc, false, input, rng)),
            Leftover {
                failed: Some(err), ..
            } => Err(err),
            _ => Err(Error::new(ErrorKind::NoService).at(first.key(), input.attempt)),
        }
    }

    /// Every eligible endpoint of the current snapshot with its service (not yet polled for
    /// readiness), for broadcast.
    pub(crate) fn targets<Req>(
        &self,
        now: Timestamp,
        rng: &mut FastRng,
    ) -> Vec<Result<Selected<Svc>, Error>>
    where
        Svc: Service<Req> + Clone,
    {
        let prepared = self.inner.balancer.current();
        let services = self.inner.services.load();
        let snapshot = prepared.snapshot();
        let no_tries = TriedSet::new();
        let mut input = PickInput {
            now,
            route: lbkit_core::Route::default(),
            attempt: 0,
            tried: &no_tries,
            trace: TraceId::UNDECIDED,
            hedge: false,
        };
        snapshot
            .eligible()
            .iter()
            .map(|&i| {
                let endpoint = snapshot.endpoint(i);
                match lookup(&services, endpoint) {
                    Some(entry) => {
                        let sel = self.selected(endpoint, entry.svc.clone(), false, &input, rng);
                        // One request: every copy shares the first's tracing decision, and
                        // the copies after the first are sent beside it.
                        input.trace = sel.call.trace_id();
                        input.hedge = true;
                        Ok(sel)
                    }
                    None => Err(Error::new(ErrorKind::NoService).at(endpoint.key(), 0)),
                }
            })
            .collect()
    }

    // Always inlined: out of line, it returned the `Selected` (with its call guard) through
    // memory, written field by field, and `select`'s copy of it read it with wider loads, which
    // the store buffer cannot forward (a third of `select`'s time in perf's samples; the
    // balancer's pick had the same stall, BENCHMARKS.md).
    #[inline(always)]
    fn selected(
        &self,
        endpoint: &Endpoint,
        svc: Svc,
        ready: bool,
        input: &PickInput<'_>,
        rng: &mut FastRng,
    ) -> Selected<Svc> {
        let clock = self.inner.balancer.clock().clone();
        let mut cx = PickContext::new(input.now, rng)
            .with_tried(input.attempt, input.tried)
            .with_route(input.route)
            .with_trace(input.trace);
        cx.hedge = input.hedge;
        let guard = self.inner.balancer.start_call(endpoint.clone(), &mut cx);
        Selected {
            call: Completion::new(guard, clock, input.attempt),
            svc,
            ready,
        }
    }

    fn record_not_ready(&self, endpoint: &Endpoint, now: Timestamp) {
        let clock = self.inner.balancer.clock().clone();
        let guard = CallGuard::new(endpoint.clone(), now, clock.clone());
        Completion::new(guard, clock, 0).finish(Outcome::Failure(FailureKind::Connect));
    }
}

/// The entry of `endpoint`, if its service exists (and the key matches: a 64-bit hash collision
/// between two keys leaves the second without a service rather than calling the wrong one).
/// While an endpoint moves to a new address, a pick from the old snapshot may get the new
/// address's service: the same endpoint either way.
#[inline]
fn lookup<'m, Svc>(
    services: &'m ServiceMap<Svc>,
    endpoint: &Endpoint,
) -> Option<&'m Arc<Entry<Svc>>> {
    services
        .get(&endpoint.key_hash())
        .filter(|e| e.key == *endpoint.key())
}
