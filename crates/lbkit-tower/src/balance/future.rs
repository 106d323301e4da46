//! [`ResponseFuture`], what [`Balance`](super::Balance) returns per request: a hand-written
//! future for the common case (the first endpoint picked was ready, one attempt so far), and a
//! boxed `async` state machine for everything else.
//!
//! Why not one boxed `async fn` for every call: the fast path's state (the endpoint's response
//! future, the call's [`Completion`], its span, the copy kept for a retry) was moved between
//! nested `async` frames and into the box about sixteen times a request, ~870 instructions of
//! `memcpy`, plus the box's allocation (BENCHMARKS.md, issue 18). Here it is built once, in
//! place, and the box is left to the rare paths: a first endpoint that was not ready, a failed
//! attempt that fails over, forking, broadcast, failsafe and failback.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use lbkit_core::{Attempts, Classified, RetryWhen, Strategy, Timestamp};
use pin_project_lite::pin_project;
use tower::Service;

use super::attempt::{noted_pushback, sent, Sent};
use super::cluster::failover_owned;
use super::Shared;
use crate::completion::Completion;
use crate::error::BoxError;
use crate::policy::{RequestPolicy, ResponsePolicy};

type Output<R, Resp> = Result<<R as ResponsePolicy<Resp>>::Output, BoxError>;

/// A boxed future of a call's result: the rare paths.
pub(crate) type BoxResponse<O> = Pin<Box<dyn Future<Output = Result<O, BoxError>> + Send>>;

pin_project! {
    /// The response to one request through a [`Balance`](super::Balance): the result of the
    /// cluster mode's attempts, the response's body wrapped by the
    /// [`ResponsePolicy`](crate::ResponsePolicy) where it tracks the end of the call.
    ///
    /// When the first endpoint picked is ready (the common case), the request is sent during
    /// `call` and this future holds that one exchange without a heap allocation (one, for the
    /// timer, when a per-attempt timeout is set); a failed attempt that may fail over, and the
    /// other cluster modes, continue in a boxed future.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<Req, Svc, Q, R, S, F>
    where
        Svc: Service<Req>,
        R: ResponsePolicy<Svc::Response>,
        S: Strategy,
    {
        #[pin]
        state: State<Req, Svc, Q, R, S, F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<Req, Svc, Q, R, S, F>
    where
        Svc: Service<Req>,
        R: ResponsePolicy<Svc::Response>,
        S: Strategy,
    {
        /// The first attempt, sent. Its fields are read in place when the response comes:
        /// moving them out as a whole cost a copy of the future a request.
        Once {
            #[pin]
            exchange: Exchange<Svc::Future>,
            // `None` once the attempt is done.
            call: Option<Completion>,
            span: tracing::Span,
            shared: Arc<Shared<Svc, Q, R, S, F>>,
            // The copy of the request for a retry.
            spare: Option<Req>,
            // `Some` when the mode may retry (failover).
            retry: Option<Retry>,
        },
        /// Everything else.
        Boxed { fut: BoxResponse<R::Output> },
    }
}

/// What failover needs of a request beyond the balance's configuration to build the attempts'
/// state, should its first attempt fail.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Retry {
    /// Whether the request may be sent again after it reached a server.
    pub(crate) idempotent: bool,
    /// When the request started (the overall deadline counts from it).
    pub(crate) started: Timestamp,
    /// The caller's deadline, from `started` (`RequestPolicy::deadline`).
    pub(crate) deadline: Option<Duration>,
}

pin_project! {
    /// The endpoint's response future, under the attempt's timeout if there is one. The timed
    /// variant is boxed (tokio's `Sleep` is large): only calls with a timeout pay for it. Its
    /// timer starts at the first poll, inside the runtime that polls it, as an `async fn`'s
    /// would: `call` itself may run outside a runtime.
    #[project = ExchangeProj]
    enum Exchange<Fut> {
        Plain { #[pin] fut: Fut },
        Unarmed { fut: Option<Fut>, limit: Duration },
        Timed { fut: Pin<Box<tokio::time::Timeout<Fut>>> },
    }
}

impl<Fut: Future> Future for Exchange<Fut> {
    type Output = Result<Fut::Output, tokio::time::error::Elapsed>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            match self.as_mut().project() {
                ExchangeProj::Plain { fut } => return fut.poll(cx).map(Ok),
                ExchangeProj::Timed { fut } => return fut.as_mut().poll(cx),
                ExchangeProj::Unarmed { fut, limit } => {
                    // Never pinned while unarmed: moving it into the timer is sound.
                    let fut = fut.take().expect("an unarmed exchange holds its future");
                    let fut = Box::pin(tokio::time::timeout(*limit, fut));
                    self.set(Exchange::Timed { fut });
                }
            }
        }
    }
}

// === impl ResponseFuture ===

impl<Req, Svc, Q, R, S, F> ResponseFuture<Req, Svc, Q, R, S, F>
where
    Svc: Service<Req>,
    R: ResponsePolicy<Svc::Response>,
    S: Strategy,
{
    /// The first attempt, already sent (`response`) under `timeout`; `retry` when the mode
    /// may retry it, with `spare` the copy of the request for that.
    pub(crate) fn once(
        shared: Arc<Shared<Svc, Q, R, S, F>>,
        call: Completion,
        response: Svc::Future,
        span: tracing::Span,
        timeout: Option<Duration>,
        spare: Option<Req>,
        retry: Option<Retry>,
    ) -> Self {
        let exchange = match timeout {
            None => Exchange::Plain { fut: response },
            Some(limit) => Exchange::Unarmed {
                fut: Some(response),
                limit,
            },
        };
        ResponseFuture {
            state: State::Once {
                exchange,
                call: Some(call),
                span,
                shared,
                spare,
                retry,
            },
        }
    }

    /// A call on one of the rare paths.
    pub(crate) fn boxed(fut: BoxResponse<R::Output>) -> Self {
        ResponseFuture {
            state: State::Boxed { fut },
        }
    }
}

impl<Req, Svc, Q, R, S, F> Future for ResponseFuture<Req, Svc, Q, R, S, F>
where
    Req: Send + 'static,
    Svc: Service<Req> + Clone + Send + Sync + 'static,
    Svc::Error: Into<BoxError>,
    Svc::Future: Send,
    Svc::Response: Send,
    Q: RequestPolicy<Req>,
    R: ResponsePolicy<Svc::Response>,
    S: Strategy,
    F: Send + Sync + 'static,
{
    type Output = Output<R, Svc::Response>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        let (exchange, call, span, shared, spare, retry) = match state.as_mut().project() {
            StateProj::Boxed { fut } => return fut.as_mut().poll(cx),
            StateProj::Once {
                exchange,
                call,
                span,
                shared,
                spare,
                retry,
            } => (exchange, call, span, shared, spare, retry),
        };
        // As an `async fn`'s future does, refuse a poll after the result was handed out
        // (before polling the endpoint's future, finished too).
        assert!(call.is_some(), "`ResponseFuture` polled after completion");
        let result = {
            let _entered = span.enter();
            ready!(exchange.poll(cx))
        };
        let Some(call) = call.take() else {
            unreachable!("checked above")
        };
        let trace = call.trace_id();
        let policy = &shared.responses;
        let sent = match result {
            // The common case, handed out without building a `Sent` (each move of the
            // response is a copy): an answer that is not retried.
            Ok(Ok(resp)) => {
                let outcome = policy.classify(&resp);
                let pushback = noted_pushback(policy, &resp, outcome, &call);
                let retried =
                    retry.is_some() && Classified::answer(outcome).retry != RetryWhen::Never;
                if !retried {
                    return Poll::Ready(Ok(policy.complete(resp, outcome, call)));
                }
                Sent::Response {
                    resp,
                    outcome,
                    call,
                    pushback,
                }
            }
            other => {
                let result = other.map(|r| r.map_err(Into::into));
                sent(result, call, shared.policy.first_timeout(), policy)
            }
        };
        let Some(retry) = *retry else {
            return Poll::Ready(sent.finish(policy));
        };
        if sent.classified().retry == RetryWhen::Never {
            return Poll::Ready(sent.finish(policy));
        }
        // The first attempt failed and may be retried: the failover loop, boxed.
        let spare = spare.take();
        let mut attempts = Attempts::resume(
            shared.attempt_policy(),
            retry.idempotent,
            spare.is_some(),
            retry.started,
        )
        .with_trace(trace);
        if let Some(d) = retry.deadline {
            attempts.limit(d);
        }
        attempts.begin(sent.endpoint());
        let mut fut: BoxResponse<R::Output> =
            Box::pin(failover_owned(shared.clone(), sent, spare, attempts));
        let polled = fut.as_mut().poll(cx);
        state.set(State::Boxed { fut });
        polled
    }
}

impl<Req, Svc, Q, R, S, F> fmt::Debug for ResponseFuture<Req, Svc, Q, R, S, F>
where
    Svc: Service<Req>,
    R: ResponsePolicy<Svc::Response>,
    S: Strategy,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Once { call: Some(_), .. } => "first attempt",
            State::Once { call: None, .. } => "done",
            State::Boxed { .. } => "boxed",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}
