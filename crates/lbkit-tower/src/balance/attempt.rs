//! One attempt: wait for readiness if needed, call, apply the timeout, classify.

use std::future::Future;
use std::time::Duration;

use lbkit_core::signal::Pushback;
use lbkit_core::{Classified, Outcome};
use tower::{Service, ServiceExt};
use tracing::Instrument;

use crate::completion::Completion;
use crate::error::{BoxError, Error, ErrorKind};
use crate::policy::ResponsePolicy;
use crate::pool::Selected;
use crate::telemetry::PoolMetrics;

/// What one attempt produced, its call still open.
pub(crate) enum Sent<Resp> {
    /// The endpoint answered.
    Response {
        resp: Resp,
        outcome: Outcome,
        call: Completion,
        /// What the answer asked of the client ([`noted_pushback`]).
        pushback: Option<Pushback>,
    },
    /// The call failed (or timed out).
    Failed {
        err: Error,
        outcome: Outcome,
        call: Completion,
    },
}

// === impl Sent ===

impl<Resp> Sent<Resp> {
    /// The endpoint called.
    pub(crate) fn endpoint(&self) -> &lbkit_core::Endpoint {
        match self {
            Sent::Response { call, .. } | Sent::Failed { call, .. } => call.endpoint(),
        }
    }

    /// Whether the attempt counts as a failure of the endpoint.
    pub(crate) fn is_failure(&self) -> bool {
        matches!(
            self,
            Sent::Response {
                outcome: Outcome::Failure(_),
                ..
            } | Sent::Failed {
                outcome: Outcome::Failure(_),
                ..
            }
        )
    }

    /// What the attempt means for the endpoint and for a retry (lbkit-core's table): an
    /// answer's outcome is the response policy's, an error's is its classification and
    /// whether the request may have reached the server.
    pub(crate) fn classified(&self) -> Classified {
        match self {
            Sent::Response { outcome, .. } => Classified::answer(*outcome),
            Sent::Failed { err, outcome, .. } => Classified::error(*outcome, err.reached_server()),
        }
    }

    /// The pushback the answer carried, if any.
    pub(crate) fn pushback(&self) -> Option<Pushback> {
        match self {
            Sent::Response { pushback, .. } => *pushback,
            Sent::Failed { .. } => None,
        }
    }

    /// Hand the result to the caller: the response through the policy, the error boxed.
    pub(crate) fn finish<R>(self, policy: &R) -> Result<R::Output, BoxError>
    where
        R: ResponsePolicy<Resp>,
    {
        match self {
            Sent::Response {
                resp,
                outcome,
                call,
                ..
            } => Ok(policy.complete(resp, outcome, call)),
            Sent::Failed { err, outcome, call } => {
                call.finish(outcome);
                Err(Box::new(err))
            }
        }
    }

    /// Record the outcome and drop the result (a failed attempt that will be retried, a lost
    /// fork, a broadcast response not returned).
    pub(crate) fn discard(self) {
        match self {
            Sent::Response { outcome, call, .. } | Sent::Failed { outcome, call, .. } => {
                call.finish(outcome);
            }
        }
    }

    /// The caller waited `d` after this answer (its pushback): however the attempt ends —
    /// discarded for a retry, or handed back when none follows — its latency leaves `d` out.
    pub(crate) fn hold(&mut self, d: std::time::Duration) {
        match self {
            Sent::Response { call, .. } | Sent::Failed { call, .. } => call.hold(d),
        }
    }

    /// Record the outcome and turn the result into an [`Error`] naming the endpoint (a failed
    /// broadcast).
    pub(crate) fn into_error(self) -> Error {
        match self {
            Sent::Response { outcome, call, .. } => {
                let kind = match outcome {
                    Outcome::Failure(k) => ErrorKind::FailureResponse(k),
                    _ => ErrorKind::Service,
                };
                let err = Error::new(kind).at(call.endpoint().key(), 0);
                call.finish(outcome);
                err
            }
            Sent::Failed { err, outcome, call } => {
                call.finish(outcome);
                err
            }
        }
    }

    /// Replace the error with `f(error)` (budget exhaustion wraps the last failure).
    pub(crate) fn map_err(self, f: impl FnOnce(Error) -> Error) -> Self {
        match self {
            Sent::Failed { err, outcome, call } => Sent::Failed {
                err: f(err),
                outcome,
                call,
            },
            other => other,
        }
    }
}

/// Count an attempt in the pool's metrics and make its span.
#[inline]
pub(crate) fn start(
    call: &Completion,
    metrics: &PoolMetrics,
    pool: &str,
    strategy: &str,
) -> tracing::Span {
    let attempt = call.attempt();
    crate::telemetry::inc(&metrics.attempts);
    if attempt > 0 {
        crate::telemetry::inc(&metrics.retries);
    }
    tracing::debug_span!(
        "lbkit.call",
        pool,
        strategy,
        endpoint = %call.endpoint().key(),
        attempt
    )
}

/// Send `req` to the selected endpoint (waiting for readiness first if needed).
pub(crate) fn send<'a, Req, Svc, R>(
    sel: Selected<Svc>,
    req: Req,
    timeout: Option<Duration>,
    policy: &'a R,
    metrics: &PoolMetrics,
    pool: &str,
    strategy: &str,
) -> impl Future<Output = Sent<Svc::Response>> + 'a
where
    Req: 'a,
    Svc: Service<Req> + 'a,
    Svc::Error: Into<BoxError>,
    R: ResponsePolicy<Svc::Response>,
{
    let Selected {
        call, svc, ready, ..
    } = sel;
    let span = start(&call, metrics, pool, strategy);
    settle(exchange(svc, ready, req), call, timeout, span, policy)
}

/// Await a call's response under the timeout, inside its span, and classify it.
pub(crate) async fn settle<Fut, Resp, R>(
    exchange: Fut,
    call: Completion,
    timeout: Option<Duration>,
    span: tracing::Span,
    policy: &R,
) -> Sent<Resp>
where
    Fut: Future<Output = Result<Resp, BoxError>>,
    R: ResponsePolicy<Resp>,
{
    let result = match timeout {
        None => Ok(exchange.instrument(span).await),
        Some(t) => tokio::time::timeout(t, exchange).instrument(span).await,
    };
    sent(result, call, timeout, policy)
}

/// Classify what one attempt's exchange produced: a response, the endpoint's error, or the
/// attempt's `timeout` having elapsed first.
pub(crate) fn sent<Resp, R>(
    result: Result<Result<Resp, BoxError>, tokio::time::error::Elapsed>,
    call: Completion,
    timeout: Option<Duration>,
    policy: &R,
) -> Sent<Resp>
where
    R: ResponsePolicy<Resp>,
{
    match result {
        Ok(Ok(resp)) => {
            let outcome = policy.classify(&resp);
            let pushback = noted_pushback(policy, &resp, outcome, &call);
            Sent::Response {
                resp,
                outcome,
                call,
                pushback,
            }
        }
        Ok(Err(source)) => {
            let outcome = policy.classify_error(&*source);
            let kind = match outcome {
                Outcome::Failure(k) => ErrorKind::Failed(k),
                _ => ErrorKind::Service,
            };
            let err = Error::new(kind)
                .at(call.endpoint().key(), call.attempt())
                .with_source(source);
            Sent::Failed { err, outcome, call }
        }
        Err(elapsed) => {
            // Only a timed exchange elapses; its limit is `timeout`.
            let t = timeout.unwrap_or_default();
            let err = Error::new(ErrorKind::Timeout(t))
                .at(call.endpoint().key(), call.attempt())
                .with_source(Box::new(elapsed));
            let outcome = Outcome::Failure(lbkit_core::FailureKind::Timeout);
            Sent::Failed { err, outcome, call }
        }
    }
}

/// The policy's [`signals`](ResponsePolicy::signals) of an answer classified as `outcome`,
/// for every answer (retried ones too): its load report and pushback recorded against the
/// endpoint of `call`, the pushback returned for the call's attempts.
#[inline]
pub(crate) fn noted_pushback<Resp, R: ResponsePolicy<Resp>>(
    policy: &R,
    resp: &Resp,
    outcome: Outcome,
    call: &Completion,
) -> Option<Pushback> {
    policy.signals(resp, outcome, call)
}

async fn exchange<Req, Svc>(mut svc: Svc, ready: bool, req: Req) -> Result<Svc::Response, BoxError>
where
    Svc: Service<Req>,
    Svc::Error: Into<BoxError>,
{
    if !ready {
        if let Err(e) = svc.ready().await {
            // A service that cannot become ready never sent the request.
            let kind = ErrorKind::Failed(lbkit_core::FailureKind::Connect);
            return Err(Box::new(Error::new(kind).with_source(e.into())));
        }
    }
    svc.call(req).await.map_err(Into::into)
}
