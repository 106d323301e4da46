//! The cluster modes, each an async function over the shared state.

use std::future::Future;
use std::sync::Arc;

use futures_util::stream::{FuturesOrdered, FuturesUnordered};
use futures_util::{StreamExt, TryFutureExt};
use lbkit_core::{FastRng, Strategy, Timestamp, TriedSet};
use tower::Service;

use super::attempt::{send, settle, Sent};
use super::{failback, Fallback, Mode, Shared};
use crate::completion::Completion;
use crate::error::{BoxError, Error, ErrorKind};
use crate::policy::{RequestPolicy, ResponsePolicy};
use crate::pool::{PickInput, Selected};

type Output<R, Resp> = <R as ResponsePolicy<Resp>>::Output;

/// Run one request under the configured mode (all but broadcast), `first` being its first pick.
pub(crate) async fn dispatch<Req, Svc, Q, R, S, F>(
    shared: Arc<Shared<Svc, Q, R, S, F>>,
    first: Result<Selected<Svc>, Error>,
    req: Req,
    now: Timestamp,
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
    match s.mode {
        Mode::Failover { retries } => failover(s, first?, req, retries, now).await,
        // Rare modes run boxed, so the common future stays small.
        Mode::Forking { forks } => Box::pin(forking(s, first?, req, forks, now)).await,
        Mode::Failfast | Mode::Broadcast => once(s, first, req).await,
        Mode::Failsafe => match once(s, first, req).await {
            Ok(out) => Ok(out),
            Err(e) => s.fallback.fallback(&e).ok_or(e),
        },
        Mode::Failback(config) => {
            let spare = s.requests.replay(&req);
            match once(s, first, req).await {
                Ok(out) => Ok(out),
                Err(e) => {
                    failback::schedule(shared.clone(), spare, config);
                    s.fallback.fallback(&e).ok_or(e)
                }
            }
        }
    }
}

/// The fast path of failfast and failover: the first attempt was dispatched in `call` (its
/// endpoint was ready); await it, and fail over (boxed) if it failed and may be retried.
pub(crate) async fn respond<Req, Svc, Q, R, S, F>(
    shared: Arc<Shared<Svc, Q, R, S, F>>,
    call: Completion,
    response: Svc::Future,
    span: tracing::Span,
    spare: Option<Req>,
    retry: Retry,
) -> Result<Output<R, Svc::Response>, BoxError>
where
    Svc: Service<Req> + Clone,
    Svc::Error: Into<BoxError>,
    Q: RequestPolicy<Req>,
    R: ResponsePolicy<Svc::Response>,
    S: Strategy,
{
    let s = &*shared;
    let response = response.map_err(Into::into);
    let sent = settle(response, call, s.timeout, span, &s.responses).await;
    if spare.is_none() || !retryable(&sent, retry.idempotent) {
        return sent.finish(&s.responses);
    }
    Box::pin(retry.run(s, sent, spare)).await
}

/// One attempt.
async fn once<Req, Svc, Q, R, S: Strategy, F>(
    s: &Shared<Svc, Q, R, S, F>,
    first: Result<Selected<Svc>, Error>,
    req: Req,
) -> Result<Output<R, Svc::Response>, BoxError>
where
    Svc: Service<Req>,
    Svc::Error: Into<BoxError>,
    R: ResponsePolicy<Svc::Response>,
{
    s.send(first?, req).await.finish(&s.responses)
}

impl<Svc, Q, R, S: Strategy, F> Shared<Svc, Q, R, S, F> {
    /// [`send`] with this balance's timeout and span fields.
    pub(crate) fn send<'a, Req: 'a>(
        &'a self,
        sel: Selected<Svc>,
        req: Req,
    ) -> impl Future<Output = Sent<Svc::Response>> + 'a
    where
        Svc: Service<Req> + 'a,
        Svc::Error: Into<BoxError>,
        R: ResponsePolicy<Svc::Response>,
    {
        let pool = self.pool.name();
        let strategy = self.pool.balancer().strategy().name();
        send(sel, req, self.timeout, &self.responses, pool, strategy)
    }

    /// The span fields of this balance: pool and strategy names.
    pub(crate) fn names(&self) -> (&str, &str) {
        (self.pool.name(), self.pool.balancer().strategy().name())
    }

    /// Pick for another attempt of `req` (a retry, a fork, a background failback).
    pub(crate) fn repick<Req>(
        &self,
        req: &Req,
        attempt: u32,
        tried: &TriedSet,
        rng: &mut FastRng,
    ) -> Result<Selected<Svc>, Error>
    where
        Svc: Service<Req> + Clone,
        Svc::Error: Into<BoxError>,
        Q: RequestPolicy<Req>,
    {
        let now = self.pool.balancer().clock().now();
        self.requests.with_hash_key(req, |key| {
            let input = PickInput {
                now,
                key,
                attempt,
                tried,
            };
            self.pool.select(&input, rng)
        })
    }
}

/// Retry failures on endpoints not tried yet, while the request is idempotent or the failure
/// certainly happened before the server saw it, a copy exists, and the budget allows.
///
/// The first attempt runs inline; the retry loop (rare) runs boxed.
async fn failover<Req, Svc, Q, R, S: Strategy, F>(
    s: &Shared<Svc, Q, R, S, F>,
    sel: Selected<Svc>,
    req: Req,
    retries: u32,
    now: Timestamp,
) -> Result<Output<R, Svc::Response>, BoxError>
where
    Svc: Service<Req> + Clone,
    Svc::Error: Into<BoxError>,
    Q: RequestPolicy<Req>,
    R: ResponsePolicy<Svc::Response>,
{
    let idempotent = s.requests.is_idempotent(&req);
    let spare = (retries > 0).then(|| s.requests.replay(&req)).flatten();
    let sent = s.send(sel, req).await;
    if spare.is_none() || !retryable(&sent, idempotent) {
        return sent.finish(&s.responses);
    }
    let retry = Retry {
        idempotent,
        retries,
        now,
    };
    Box::pin(retry.run(s, sent, spare)).await
}

fn retryable<Resp>(sent: &Sent<Resp>, idempotent: bool) -> bool {
    sent.is_failure() && (idempotent || !sent.may_have_reached())
}

/// The failover retry loop and what it needs to know.
pub(crate) struct Retry {
    pub(crate) idempotent: bool,
    pub(crate) retries: u32,
    pub(crate) now: Timestamp,
}

impl Retry {
    async fn run<Req, Svc, Q, R, S: Strategy, F>(
        self,
        s: &Shared<Svc, Q, R, S, F>,
        mut sent: Sent<Svc::Response>,
        mut spare: Option<Req>,
    ) -> Result<Output<R, Svc::Response>, BoxError>
    where
        Svc: Service<Req> + Clone,
        Svc::Error: Into<BoxError>,
        Q: RequestPolicy<Req>,
        R: ResponsePolicy<Svc::Response>,
    {
        let mut tried = TriedSet::new();
        let mut rng = FastRng::seed_from_u64(self.now.as_nanos() ^ s.next_seed());
        loop {
            tried.insert(sent.endpoint());
            let Some(req) = spare.take() else {
                return sent.finish(&s.responses);
            };
            if !s.budget.withdraw() {
                s.pool.inner.metrics.budget_exhausted.increment(1);
                return sent.map_err(exhausted).finish(&s.responses);
            }
            let next = match s.repick(&req, sent.attempt() + 1, &tried, &mut rng) {
                Ok(next) => next,
                Err(_) => return sent.finish(&s.responses),
            };
            sent.discard();
            if next.attempt < self.retries {
                spare = s.requests.replay(&req);
            }
            sent = s.send(next, req).await;
            if !retryable(&sent, self.idempotent) {
                return sent.finish(&s.responses);
            }
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
    now: Timestamp,
) -> Result<Output<R, Svc::Response>, BoxError>
where
    Svc: Service<Req> + Clone,
    Svc::Error: Into<BoxError>,
    Q: RequestPolicy<Req>,
    R: ResponsePolicy<Svc::Response>,
{
    let eligible = s.pool.balancer().current().snapshot().eligible().len();
    let forks = (forks as usize).min(eligible.max(1));
    let mut tried = TriedSet::new();
    tried.insert(first.call.endpoint());
    let mut copies = Vec::with_capacity(forks);
    let mut rng = FastRng::seed_from_u64(now.as_nanos() ^ s.next_seed());
    while copies.len() + 1 < forks {
        let Some(copy) = s.requests.replay(&req) else {
            break;
        };
        if !s.budget.withdraw() {
            s.pool.inner.metrics.budget_exhausted.increment(1);
            break;
        }
        let Ok(sel) = s.repick(&copy, 0, &tried, &mut rng) else {
            break;
        };
        if tried.contains(sel.call.endpoint()) {
            break; // every available endpoint has its fork (the pick records a cancellation)
        }
        tried.insert(sel.call.endpoint());
        copies.push((sel, copy));
    }
    let mut calls: FuturesUnordered<_> = std::iter::once(s.send(first, req))
        .chain(copies.into_iter().map(|(sel, copy)| s.send(sel, copy)))
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

/// Send to every eligible endpoint; an error if any fails, else the last endpoint's response
/// (in snapshot order, as Dubbo returns the last result).
pub(crate) async fn broadcast<Req, Svc, Q, R, S: Strategy, F>(
    shared: Arc<Shared<Svc, Q, R, S, F>>,
    req: Req,
    now: Timestamp,
) -> Result<Output<R, Svc::Response>, BoxError>
where
    Svc: Service<Req> + Clone,
    Svc::Error: Into<BoxError>,
    Q: RequestPolicy<Req>,
    R: ResponsePolicy<Svc::Response>,
{
    let s = &*shared;
    let targets = s.pool.targets::<Req>(now);
    if targets.is_empty() {
        return Err(Box::new(Error::pick(s.pool.snapshot().empty_error())));
    }
    let total = targets.len();
    let mut reqs = Vec::with_capacity(total);
    for _ in 1..total {
        match s.requests.replay(&req) {
            Some(copy) => reqs.push(copy),
            None => return Err(Box::new(Error::new(ErrorKind::NotReplayable))),
        }
    }
    reqs.push(req);
    let calls: FuturesOrdered<_> = targets
        .into_iter()
        .zip(reqs)
        .map(|(target, req)| async move {
            match target {
                Ok(sel) => Ok(s.send(sel, req).await),
                Err(e) => Err(e),
            }
        })
        .collect();
    let results: Vec<_> = calls.collect().await;
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
    match (first_failure, last) {
        (None, Some(sent)) => sent.finish(&s.responses),
        (first, last) => {
            if let Some(sent) = last {
                sent.discard();
            }
            let mut err = Error::new(ErrorKind::Broadcast {
                failed: failed as u32,
                total: total as u32,
            });
            if let Some(first) = first {
                if let Some(k) = first.endpoint().cloned() {
                    err = err.at(&k, 0);
                }
                err = err.with_source(Box::new(first));
            }
            Err(Box::new(err))
        }
    }
}
