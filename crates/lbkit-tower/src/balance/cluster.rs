//! The cluster modes, each an async function over the shared state. The rules of one call's
//! attempts (tried set, idempotency, budget, deadlines, retry or answer) are lbkit-core's
//! [`Attempts`]; this module only drives it.
//!
//! Where a mode differs, and why:
//! * **Forking** sends copies at once, not one after another: its copies go to distinct
//!   endpoints (a tried set of its own, since [`Attempts`] counts attempts in sequence), each
//!   copy past the first withdraws from the budget once it has an endpoint, and all share the
//!   call's per-attempt limit inside its overall deadline.
//! * **Broadcast** calls every endpoint once by definition: there is no retry, so it neither
//!   deposits into nor withdraws from the budget (the budget is a share of retryable calls),
//!   and no idempotency rule applies; each call is bounded by the per-attempt limit inside the
//!   overall deadline.
//! * **Failback** retries in the background after the caller has its answer; see
//!   `failback.rs`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesOrdered, FuturesUnordered};
use futures_util::StreamExt;
use lbkit_core::trace::TraceId;
use lbkit_core::{Attempts, FastRng, Stop, Strategy, Timestamp, TriedSet};
use tower::Service;

use super::attempt::{send, Sent};
use super::{failback, Fallback, Mode, Shared};
use crate::error::{BoxError, Error, ErrorKind};
use crate::policy::{RequestPolicy, ResponsePolicy};
use crate::pool::{PickInput, Selected};

type Output<R, Resp> = <R as ResponsePolicy<Resp>>::Output;

/// Run one request under the configured mode (all but broadcast), `first` being its first pick
/// (already begun in `attempts`) and `spare` a copy for a retry.
pub(crate) async fn dispatch<Req, Svc, Q, R, S, F>(
    shared: Arc<Shared<Svc, Q, R, S, F>>,
    first: Result<Selected<Svc>, Error>,
    req: Req,
    spare: Option<Req>,
    attempts: Attempts,
) -> Result<Output<R, Svc::Response>, BoxError>
where
    Req: Send + 'static,
    Svc: Service<Req> + Clone + Send + Sync + 'static,
    Svc::Error: Into<BoxError>,
    Svc::Future: Send,
    Svc::Response: Send,
    Q: RequestPolicy<Req>,
    R: ResponsePolicy<Svc::Response>,
    S: Strategy,
    F: Fallback<R::Output>,
{
    let s = &*shared;
    let timeout = attempts.timeout(attempts.started());
    match s.mode {
        Mode::Failover { .. } => {
            let now = attempts.started();
            let delay = s.hedge.as_ref().filter(|_| attempts.may_hedge(now));
            let delay = delay.and_then(|h| h.delay_at(now, || s.pool.snapshot()));
            if let Some(delay) = delay {
                let first = first?;
                return Box::pin(super::hedge::hedged(s, first, req, spare, attempts, delay)).await;
            }
            let sent = s.send(first?, req, timeout).await;
            failover(s, sent, spare, attempts).await
        }
        // Rare modes run boxed, so the common future stays small.
        Mode::Forking { forks } => Box::pin(forking(s, first?, req, forks, attempts)).await,
        Mode::Failfast | Mode::Broadcast => once(s, first, req, timeout).await,
        Mode::Failsafe => match once(s, first, req, timeout).await {
            Ok(out) => Ok(out),
            Err(e) => s.fallback.fallback(&e).ok_or(e),
        },
        Mode::Failback(config) => {
            let spare = s.requests.replay(&req);
            match once(s, first, req, timeout).await {
                Ok(out) => Ok(out),
                Err(e) => {
                    failback::schedule(shared.clone(), spare, config);
                    s.fallback.fallback(&e).ok_or(e)
                }
            }
        }
    }
}

/// The failover loop after a fast-path first attempt `sent` failed and may be retried
/// ([`ResponseFuture`](super::ResponseFuture)): [`failover`] owning the shared state, so it
/// can be boxed.
pub(crate) async fn failover_owned<Req, Svc, Q, R, S, F>(
    shared: Arc<Shared<Svc, Q, R, S, F>>,
    sent: Sent<Svc::Response>,
    spare: Option<Req>,
    attempts: Attempts,
) -> Result<Output<R, Svc::Response>, BoxError>
where
    Svc: Service<Req> + Clone,
    Svc::Error: Into<BoxError>,
    Q: RequestPolicy<Req>,
    R: ResponsePolicy<Svc::Response>,
    S: Strategy,
{
    failover(&shared, sent, spare, attempts).await
}

/// One attempt.
async fn once<Req, Svc, Q, R, S: Strategy, F>(
    s: &Shared<Svc, Q, R, S, F>,
    first: Result<Selected<Svc>, Error>,
    req: Req,
    timeout: Option<Duration>,
) -> Result<Output<R, Svc::Response>, BoxError>
where
    Svc: Service<Req>,
    Svc::Error: Into<BoxError>,
    Q: RequestPolicy<Req>,
    R: ResponsePolicy<Svc::Response>,
{
    s.send(first?, req, timeout).await.finish(&s.responses)
}

impl<Svc, Q, R, S: Strategy, F> Shared<Svc, Q, R, S, F> {
    /// [`send`] with this balance's span fields, under `timeout`, which the endpoint is told
    /// ([`RequestPolicy::tell_deadline`]).
    pub(crate) fn send<'a, Req: 'a>(
        &'a self,
        sel: Selected<Svc>,
        mut req: Req,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Sent<Svc::Response>> + 'a
    where
        Svc: Service<Req> + 'a,
        Svc::Error: Into<BoxError>,
        Q: RequestPolicy<Req>,
        R: ResponsePolicy<Svc::Response>,
    {
        if let Some(left) = timeout {
            self.requests.tell_deadline(&mut req, left);
        }
        let pool = self.pool.name();
        let strategy = self.pool.balancer().strategy().name();
        let metrics = &self.pool.inner.metrics;
        send(sel, req, timeout, &self.responses, metrics, pool, strategy)
    }

    /// The span fields of this balance: pool and strategy names.
    pub(crate) fn names(&self) -> (&str, &str) {
        (self.pool.name(), self.pool.balancer().strategy().name())
    }

    /// Pick for another attempt of `req` (a retry, a fork, a background failback) at `now`.
    pub(crate) fn repick<Req>(
        &self,
        req: &Req,
        now: Timestamp,
        again: Again<'_>,
        rng: &mut FastRng,
    ) -> Result<Selected<Svc>, Error>
    where
        Svc: Service<Req> + Clone,
        Svc::Error: Into<BoxError>,
        Q: RequestPolicy<Req>,
    {
        self.requests.with_route(req, |route| {
            let input = PickInput {
                now,
                route,
                attempt: again.attempt,
                tried: again.tried,
                trace: again.trace,
                hedge: again.hedge,
            };
            self.pool.select(&input, rng)
        })
    }
}

/// Another attempt of a request: its index, the endpoints tried, its tracing decision, and
/// whether it is sent while an earlier attempt is open (a fork).
pub(crate) struct Again<'a> {
    pub(crate) attempt: u32,
    pub(crate) tried: &'a TriedSet,
    pub(crate) trace: TraceId,
    pub(crate) hedge: bool,
}

/// After an attempt: answer with it, or (boxed: the rare path) send the request again on an
/// endpoint not tried yet, as long as [`Attempts`] says so.
pub(crate) async fn failover<Req, Svc, Q, R, S: Strategy, F>(
    s: &Shared<Svc, Q, R, S, F>,
    sent: Sent<Svc::Response>,
    spare: Option<Req>,
    mut attempts: Attempts,
) -> Result<Output<R, Svc::Response>, BoxError>
where
    Svc: Service<Req> + Clone,
    Svc::Error: Into<BoxError>,
    Q: RequestPolicy<Req>,
    R: ResponsePolicy<Svc::Response>,
{
    match decide(s, &mut attempts, &sent) {
        Some(stop) => answer(s, sent, stop),
        None => Box::pin(retry(s, sent, spare, attempts)).await,
    }
}

/// What `attempts` says after `sent` (and the pushback its answer carried): `None` to retry,
/// else why not.
fn decide<Svc, Q, R, S: Strategy, F, Resp>(
    s: &Shared<Svc, Q, R, S, F>,
    attempts: &mut Attempts,
    sent: &Sent<Resp>,
) -> Option<Stop> {
    if let Some(p) = sent.pushback() {
        attempts.pushed_back(p);
    }
    attempts.may_retry(sent.classified(), s.clock()).err()
}

/// Hand `sent` to the caller; a budget refusal is counted and wraps the error.
fn answer<Svc, Q, R, S: Strategy, F, Resp>(
    s: &Shared<Svc, Q, R, S, F>,
    sent: Sent<Resp>,
    stop: Stop,
) -> Result<R::Output, BoxError>
where
    R: ResponsePolicy<Resp>,
{
    if stop == Stop::BudgetExhausted {
        crate::telemetry::inc(&s.pool.inner.metrics.budget_exhausted);
        return sent.map_err(exhausted).finish(&s.responses);
    }
    sent.finish(&s.responses)
}

/// The failover loop: each retry on an endpoint not tried yet, while [`Attempts`] allows.
async fn retry<Req, Svc, Q, R, S: Strategy, F>(
    s: &Shared<Svc, Q, R, S, F>,
    mut sent: Sent<Svc::Response>,
    mut spare: Option<Req>,
    mut attempts: Attempts,
) -> Result<Output<R, Svc::Response>, BoxError>
where
    Svc: Service<Req> + Clone,
    Svc::Error: Into<BoxError>,
    Q: RequestPolicy<Req>,
    R: ResponsePolicy<Svc::Response>,
{
    let mut rng = FastRng::seed_from_u64(attempts.started().as_nanos() ^ s.next_seed());
    loop {
        let Some(req) = spare.take() else {
            return sent.finish(&s.responses);
        };
        // The answer asked for a pause before another try (`decide` found it fits): waited
        // only when an endpoint not tried yet is eligible, so that a retry may follow.
        let wait = attempts.retry_wait();
        let untried = s.pool.snapshot().eligible().len() > attempts.tried().len();
        if !wait.is_zero() && untried {
            tokio::time::sleep(wait).await;
            attempts.waited();
            // The failed attempt's latency ends with its answer, not after the wait.
            sent.hold(wait);
        }
        let now = s.clock().now();
        let next = match s.repick(
            &req,
            now,
            Again {
                attempt: attempts.next_attempt(),
                tried: attempts.tried(),
                trace: attempts.trace(),
                hedge: false,
            },
            &mut rng,
        ) {
            Ok(next) => next,
            Err(_) => return sent.finish(&s.responses),
        };
        if let Err(stop) = Attempts::grant(&*s.budget, now) {
            next.call.abandon();
            return answer(s, sent, stop);
        }
        sent.discard();
        attempts.begin(next.call.endpoint());
        if attempts.begun() <= attempts.policy().retries {
            spare = s.requests.replay(&req);
        }
        attempts.set_replayable(spare.is_some());
        sent = s.send(next, req, attempts.timeout(now)).await;
        if let Some(stop) = decide(s, &mut attempts, &sent) {
            return answer(s, sent, stop);
        }
    }
}

/// The last failure, wrapped as a budget exhaustion at the same endpoint.
fn exhausted(e: Error) -> Error {
    let wrapped = Error::new(ErrorKind::BudgetExhausted);
    let wrapped = match e.endpoint().cloned() {
        Some(k) => wrapped.at(&k, e.attempt()),
        None => wrapped,
    };
    wrapped.with_source(Box::new(e))
}

/// Send to up to `forks` endpoints at once; the first success (or non-failure answer) wins and
/// the other calls are dropped, which cancels them.
async fn forking<Req, Svc, Q, R, S: Strategy, F>(
    s: &Shared<Svc, Q, R, S, F>,
    first: Selected<Svc>,
    req: Req,
    forks: u32,
    mut attempts: Attempts,
) -> Result<Output<R, Svc::Response>, BoxError>
where
    Svc: Service<Req> + Clone,
    Svc::Error: Into<BoxError>,
    Q: RequestPolicy<Req>,
    R: ResponsePolicy<Svc::Response>,
{
    let eligible = s.pool.balancer().current().snapshot().eligible().len();
    let forks = (forks as usize).min(eligible.max(1));
    let now = attempts.started();
    let timeout = attempts.timeout(now);
    let copies = fork_copies(s, &first, &req, forks, &mut attempts);
    let mut calls: FuturesUnordered<_> = std::iter::once(s.send(first, req, timeout))
        .chain(
            copies
                .into_iter()
                .map(|(sel, copy)| s.send(sel, copy, timeout)),
        )
        .collect();
    let mut last: Option<Sent<Svc::Response>> = None;
    while let Some(sent) = calls.next().await {
        if !sent.is_failure() {
            return sent.finish(&s.responses); // dropping `calls` cancels the rest
        }
        if let Some(prev) = last.replace(sent) {
            prev.discard();
        }
    }
    match last {
        Some(sent) => sent.finish(&s.responses),
        None => Err(Box::new(Error::new(ErrorKind::NoService))),
    }
}

/// Copies of `req` for the forks beside `first`'s call, each with an endpoint picked among
/// those not called yet and paid from the retry budget: `forks - 1`, or fewer when the
/// request cannot be copied, no endpoint is left or the budget is spent.
fn fork_copies<Req, Svc, Q, R, S: Strategy, F>(
    s: &Shared<Svc, Q, R, S, F>,
    first: &Selected<Svc>,
    req: &Req,
    forks: usize,
    attempts: &mut Attempts,
) -> Vec<(Selected<Svc>, Req)>
where
    Svc: Service<Req> + Clone,
    Svc::Error: Into<BoxError>,
    Q: RequestPolicy<Req>,
    R: ResponsePolicy<Svc::Response>,
{
    let mut tried = TriedSet::new();
    tried.insert(first.call.endpoint());
    let trace = first.call.trace_id();
    let mut copies = Vec::with_capacity(forks);
    let now = attempts.started();
    let mut rng = FastRng::seed_from_u64(now.as_nanos() ^ s.next_seed());
    while copies.len() + 1 < forks {
        let Some(copy) = s.requests.replay(req) else {
            break;
        };
        let again = Again {
            attempt: 0,
            tried: &tried,
            trace,
            hedge: true,
        };
        let Ok(sel) = s.repick(&copy, now, again, &mut rng) else {
            break;
        };
        // `repick` picks among the untried only (`AllTried` otherwise).
        debug_assert!(!tried.contains(sel.call.endpoint()));
        if !attempts.withdraw_fork(&*s.budget, now) {
            sel.call.abandon();
            crate::telemetry::inc(&s.pool.inner.metrics.budget_exhausted);
            break;
        }
        tried.insert(sel.call.endpoint());
        copies.push((sel, copy));
    }
    copies
}

/// Send to every eligible endpoint; an error if any fails, else the last endpoint's response
/// (in snapshot order, as Dubbo returns the last result).
pub(crate) async fn broadcast<Req, Svc, Q, R, S: Strategy, F>(
    shared: Arc<Shared<Svc, Q, R, S, F>>,
    req: Req,
    now: Timestamp,
    deadline: Option<Duration>,
) -> Result<Output<R, Svc::Response>, BoxError>
where
    Svc: Service<Req> + Clone,
    Svc::Error: Into<BoxError>,
    Q: RequestPolicy<Req>,
    R: ResponsePolicy<Svc::Response>,
{
    let s = &*shared;
    let mut rng = FastRng::seed_from_u64(now.as_nanos() ^ s.next_seed());
    let targets = s.pool.targets::<Req>(now, &mut rng);
    if targets.is_empty() {
        return Err(Box::new(Error::pick(s.pool.snapshot().empty_error())));
    }
    let total = targets.len();
    let reqs = copies(&s.requests, req, total)?;
    // One attempt each, bounded by the per-attempt limit inside the overall deadline (cut to
    // the caller's).
    let mut attempts = Attempts::resume(s.attempt_policy(), false, false, now);
    if let Some(d) = deadline {
        attempts.limit(d);
    }
    let timeout = attempts.timeout(now);
    let calls: FuturesOrdered<_> = targets
        .into_iter()
        .zip(reqs)
        .map(|(target, req)| async move {
            match target {
                Ok(sel) => Ok(s.send(sel, req, timeout).await),
                Err(e) => Err(e),
            }
        })
        .collect();
    let results: Vec<_> = calls.collect().await;
    broadcast_outcome(results, &s.responses)
}

/// `req` and copies of it (its replays), `total` in all, the original last.
fn copies<Req, Q: RequestPolicy<Req>>(
    requests: &Q,
    req: Req,
    total: usize,
) -> Result<Vec<Req>, BoxError> {
    let mut reqs = Vec::with_capacity(total);
    for _ in 1..total {
        match requests.replay(&req) {
            Some(copy) => reqs.push(copy),
            None => return Err(Box::new(Error::new(ErrorKind::NotReplayable))),
        }
    }
    reqs.push(req);
    Ok(reqs)
}

/// A broadcast's answer from every target's result (in snapshot order): the last response
/// when none failed, else a [`ErrorKind::Broadcast`] error counting the failures, at the
/// first failure's endpoint and caused by it.
fn broadcast_outcome<Resp, R: ResponsePolicy<Resp>>(
    results: Vec<Result<Sent<Resp>, Error>>,
    responses: &R,
) -> Result<R::Output, BoxError> {
    let total = results.len();
    let failed = results
        .iter()
        .filter(|r| r.as_ref().map_or(true, Sent::is_failure))
        .count();
    let mut last = None;
    let mut first_failure = None;
    for r in results {
        match r {
            Ok(sent) if !sent.is_failure() => {
                if let Some(prev) = last.replace(sent) {
                    prev.discard();
                }
            }
            Ok(sent) => {
                let e = sent.into_error();
                first_failure.get_or_insert(e);
            }
            Err(e) => {
                first_failure.get_or_insert(e);
            }
        }
    }
    let Some(first) = first_failure else {
        return match last {
            Some(sent) => sent.finish(responses),
            None => Err(Box::new(Error::new(ErrorKind::Broadcast {
                failed: 0,
                total: total as u32,
            }))),
        };
    };
    if let Some(sent) = last {
        sent.discard();
    }
    let mut err = Error::new(ErrorKind::Broadcast {
        failed: failed as u32,
        total: total as u32,
    });
    if let Some(k) = first.endpoint().cloned() {
        err = err.at(&k, 0);
    }
    Err(Box::new(err.with_source(Box::new(first))))
}
