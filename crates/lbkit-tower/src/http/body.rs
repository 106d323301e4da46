//! [`TrackBody`]: a response body that carries its call's [`Completion`] and finishes it at the
//! first frame or at the end of the stream (tower's `TrackCompletion` for bodies).

use std::fmt;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http_body::{Body, Frame, SizeHint};
use lbkit_core::{FailureKind, Outcome};
use pin_project_lite::pin_project;

use super::trailers_outcome;
use crate::completion::Completion;
use crate::policy::GrpcCodes;

/// When a streamed response counts as finished.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CompleteAt {
    /// At the first body frame (time to first byte; a gRPC status in the trailers is not seen).
    FirstFrame,
    /// At the end of the body (the default): the latency covers the whole stream, and a failing
    /// `grpc-status` trailer makes the call a failure.
    #[default]
    EndOfStream,
}

pin_project! {
    /// A response body that ends its call when read to the chosen point. Dropping it earlier
    /// records a cancellation; a body error records a failure.
    pub struct TrackBody<B> {
        #[pin]
        inner: Inner<B>,
        call: Pending,
        at: CompleteAt,
        grpc: GrpcCodes,
        outcome: Outcome,
        // After a call ended at the first frame: where a load report in the trailers still
        // goes (the endpoint, the clock).
        late: Option<(lbkit_core::Endpoint, lbkit_core::Clock)>,
    }
}

pin_project! {
    #[project = InnerProj]
    enum Inner<B> {
        Body { #[pin] body: B },
        Empty,
    }
}

/// The call a body still tracks, and the outcome its head had. Dropped unfinished, it
/// records that outcome when the head was a failure (a caller that drops a 503's body does not
/// make it a cancellation), else a cancellation.
struct Pending(Option<Completion>, Outcome);

impl Pending {
    fn finish(&mut self, outcome: Outcome) {
        if let Some(call) = self.0.take() {
            call.finish(outcome);
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if matches!(self.1, Outcome::Failure(_)) {
            self.finish(self.1);
        }
        // Otherwise the completion's own drop records a cancellation.
    }
}

// === impl TrackBody ===

impl<B: Body> TrackBody<B> {
    /// Track `body`, whose head was classified as `outcome`: the call ends with `outcome` at
    /// `at` (first frame or end of stream), as a failure when the body fails (`Other`) or a
    /// `grpc-status` trailer in `grpc` says so, and as a cancellation when the body is dropped
    /// before. The one rule for when an HTTP call ends, used by the tower layer and by both
    /// engines of `lbkit proxy`.
    pub fn new(
        body: B,
        call: Completion,
        outcome: Outcome,
        at: CompleteAt,
        grpc: GrpcCodes,
    ) -> Self {
        let mut call = Pending(Some(call), outcome);
        if body.is_end_stream() {
            call.finish(outcome);
        }
        TrackBody {
            inner: Inner::Body { body },
            call,
            at,
            grpc,
            outcome,
            late: None,
        }
    }
}

impl<B> TrackBody<B> {
    /// A body whose call is already finished (or was never tracked).
    pub fn untracked(body: B) -> Self {
        TrackBody {
            inner: Inner::Body { body },
            call: Pending(None, Outcome::Success),
            at: CompleteAt::EndOfStream,
            grpc: GrpcCodes::DEFAULT,
            outcome: Outcome::Success,
            late: None,
        }
    }

    /// An empty body, for fallback responses (failsafe, failback).
    pub fn empty() -> Self {
        TrackBody {
            inner: Inner::Empty,
            call: Pending(None, Outcome::Success),
            at: CompleteAt::EndOfStream,
            grpc: GrpcCodes::DEFAULT,
            outcome: Outcome::Success,
            late: None,
        }
    }

    /// Whether the call is still being tracked.
    pub fn is_tracking(&self) -> bool {
        self.call.0.is_some()
    }
}

impl<B: Body> Body for TrackBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let InnerProj::Body { mut body } = this.inner.project() else {
            return Poll::Ready(None);
        };
        let polled = ready!(body.as_mut().poll_frame(cx));
        let end = match &polled {
            Some(Ok(frame)) => {
                if let Some(trailers) = frame.trailers_ref() {
                    *this.outcome = trailers_outcome(*this.outcome, trailers, *this.grpc);
                    if let Some(call) = &this.call.0 {
                        call.record_load(trailers);
                    } else if let Some((endpoint, clock)) = this.late.as_ref() {
                        crate::orca::record(trailers, endpoint.stats(), clock);
                    }
                }
                let first = *this.at == CompleteAt::FirstFrame && this.call.0.is_some();
                if first && !body.is_end_stream() {
                    // The call ends now; its trailers may still carry a load report.
                    let call = this.call.0.as_ref();
                    *this.late = call.map(|c| (c.endpoint().clone(), c.clock().clone()));
                }
                *this.at == CompleteAt::FirstFrame || body.is_end_stream()
            }
            Some(Err(_)) => {
                *this.outcome = Outcome::Failure(FailureKind::Other);
                true
            }
            None => true,
        };
        if end {
            this.call.finish(*this.outcome);
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Body { body } => body.is_end_stream(),
            Inner::Empty => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Body { body } => body.size_hint(),
            Inner::Empty => SizeHint::with_exact(0),
        }
    }
}

impl<B> fmt::Debug for TrackBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TrackBody")
            .field("tracking", &self.call.0.is_some())
            .field("at", &self.at)
            .finish_non_exhaustive()
    }
}
