//! The response body sent to clients: a short proxy-made body, or the upstream's body carrying
//! the call's guard, which ends when the body does — lbkit-tower's [`TrackBody`], the one rule
//! for when an HTTP call ends (the head's outcome at the end of the stream, a failure when the
//! body breaks or a `grpc-status` trailer fails, a cancellation when the client goes away).

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use lbkit_core::{CallGuard, Clock, Outcome};
use lbkit_tower::http::{CompleteAt, TrackBody};
use lbkit_tower::policy::GrpcCodes;
use lbkit_tower::Completion;

/// A response body: proxy-made or streamed from an upstream.
#[derive(Debug)]
pub struct ProxyBody(Inner);

#[derive(Debug)]
enum Inner {
    Local(Full<Bytes>),
    Upstream(TrackBody<Incoming>),
}

// === impl ProxyBody ===

impl ProxyBody {
    /// A body made by the proxy.
    pub fn local(text: impl Into<Bytes>) -> Self {
        ProxyBody(Inner::Local(Full::new(text.into())))
    }

    /// An upstream body; `guard` (reading `clock` when it ends) is finished with `outcome`
    /// when the body ends.
    pub fn upstream(body: Incoming, guard: CallGuard, clock: Clock, outcome: Outcome) -> Self {
        let call = Completion::from_guard(guard, clock);
        ProxyBody(Inner::Upstream(TrackBody::new(
            body,
            call,
            outcome,
            CompleteAt::EndOfStream,
            GrpcCodes::DEFAULT,
        )))
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match &mut self.get_mut().0 {
            Inner::Local(full) => match ready!(Pin::new(full).poll_frame(cx)) {
                Some(Ok(frame)) => Poll::Ready(Some(Ok(frame))),
                Some(Err(never)) => match never {},
                None => Poll::Ready(None),
            },
            Inner::Upstream(body) => Pin::new(body).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.0 {
            Inner::Local(full) => full.is_end_stream(),
            Inner::Upstream(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.0 {
            Inner::Local(full) => full.size_hint(),
            Inner::Upstream(body) => body.size_hint(),
        }
    }
}

/// A client's request body streamed upstream, noting how it ended, so that a failure the
/// client caused (a malformed or aborted upload, one too slow for the call's deadline) is
/// answered 400/408 and never recorded against the endpoint.
#[derive(Debug)]
pub struct ClientBody {
    inner: Incoming,
    state: std::sync::Arc<std::sync::atomic::AtomicU8>,
}

/// How far a [`ClientBody`] got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Upload {
    /// Still streaming (not all of it read from the client yet).
    Streaming,
    /// Read whole.
    Done,
    /// The client's body broke: malformed framing, or the client went away mid-upload.
    Broken,
}

impl ClientBody {
    /// `inner` as it streams, and a handle that tells how far it got.
    pub(crate) fn new(inner: Incoming) -> (Self, UploadState) {
        let state = std::sync::Arc::new(std::sync::atomic::AtomicU8::new(0));
        let handle = UploadState(state.clone());
        (ClientBody { inner, state }, handle)
    }

    fn set(&self, to: u8) {
        self.state.store(to, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Where a [`ClientBody`] is, read after the attempt that sent it.
#[derive(Clone, Debug)]
pub(crate) struct UploadState(std::sync::Arc<std::sync::atomic::AtomicU8>);

impl UploadState {
    pub(crate) fn get(&self) -> Upload {
        match self.0.load(std::sync::atomic::Ordering::Relaxed) {
            0 => Upload::Streaming,
            1 => Upload::Done,
            _ => Upload::Broken,
        }
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let polled = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        match &polled {
            None => this.set(1),
            Some(Err(_)) => this.set(2),
            Some(Ok(_)) if this.inner.is_end_stream() => this.set(1),
            Some(Ok(_)) => {}
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
