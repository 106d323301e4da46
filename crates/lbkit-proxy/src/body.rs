//! The response body sent to clients: a short proxy-made body, or the upstream's body carrying
//! the call's guard, which ends when the body does — lbkit-tower's [`TrackBody`], the one rule
//! for when an HTTP call ends (the head's outcome at the end of the stream, a failure when the
//! body breaks or a `grpc-status` trailer fails, a cancellation when the client goes away).

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{Either, Full};
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
    /// A whole body in hand, and its trailers (an upstream's small answer keeps them).
    Local(Full<Bytes>, Option<HeaderMap>),
    Upstream(TrackBody<UpstreamAnswer>),
}

/// The error of a [`ProxyBody`]: the upstream's body broke (hyper's or h2's error).
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// Largest request body buffered so that the request can be retried (64 KiB).
pub const MAX_REPLAY_BODY: u64 = 64 * 1024;

/// Largest response body (announced by `Content-Length`) read whole before answering, so that
/// head and body go out in one write, as nginx's `proxy_buffering` does; larger or unannounced
/// bodies stream. 16 KiB: most API answers, and a bounded buffer per request.
pub const MAX_BUFFERED_RESPONSE: u64 = 16 * 1024;

/// A client's request body as the engine serving the client received it: hyper's (HTTP/1.x on
/// hyper's engine) or an HTTP/2 stream of the proxy's own HTTP/2 server (`h2s/`). Its error is
/// boxed (`http_body_util::Either`'s).
pub(crate) type Inbound = Either<Incoming, crate::h2body::H2Body>;

/// An upstream's answer body: from hyper's client (HTTP/1.1 upstreams) or from the h2c client
/// (`h2c.rs`). Its error is boxed (`http_body_util::Either`'s).
pub(crate) type UpstreamAnswer = Either<Incoming, crate::h2body::H2Body>;

// === impl ProxyBody ===

impl ProxyBody {
    /// A body made by the proxy.
    pub fn local(text: impl Into<Bytes>) -> Self {
        ProxyBody(Inner::Local(Full::new(text.into()), None))
    }

    /// An upstream's answer read whole: its bytes, then its trailers if it had any.
    pub(crate) fn whole(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        ProxyBody(Inner::Local(Full::new(data), trailers))
    }

    /// An upstream body; `guard` (reading `clock` when it ends) is finished with `outcome`
    /// when the body ends.
    pub fn upstream(body: Incoming, guard: CallGuard, clock: Clock, outcome: Outcome) -> Self {
        Self::answer(Either::Left(body), guard, clock, outcome)
    }

    /// [`upstream`](Self::upstream) for either client's answer.
    pub(crate) fn answer(
        body: UpstreamAnswer,
        guard: CallGuard,
        clock: Clock,
        outcome: Outcome,
    ) -> Self {
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
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match &mut self.get_mut().0 {
            Inner::Local(full, trailers) => match ready!(Pin::new(full).poll_frame(cx)) {
                Some(Ok(frame)) => Poll::Ready(Some(Ok(frame))),
                Some(Err(never)) => match never {},
                None => Poll::Ready(trailers.take().map(|t| Ok(Frame::trailers(t)))),
            },
            Inner::Upstream(body) => Pin::new(body).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.0 {
            Inner::Local(full, trailers) => full.is_end_stream() && trailers.is_none(),
            Inner::Upstream(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.0 {
            Inner::Local(full, _) => full.size_hint(),
            Inner::Upstream(body) => body.size_hint(),
        }
    }
}

/// A client's request body streamed upstream (one without a length, or too long to buffer
/// before sending), noting how it ended, so that a failure the client caused (a malformed or
/// aborted upload, one too slow for the call's deadline) is answered 400/408 and never recorded
/// against the endpoint.
///
/// What it sends is kept, up to [`MAX_REPLAY_BODY`], as Envoy's retry buffer does: when the
/// attempt fails, the body (the bytes sent so far, and the rest of the client's stream) comes
/// back through `Reclaim` once the attempt lets go of it, and the next attempt sends the kept
/// bytes again, then the rest. gRPC clients send their requests without a length, so this is
/// what lets a unary gRPC call be retried after a refused connection. A body that outgrew the
/// bound comes back as nothing: that request is not retried.
#[derive(Debug)]
pub struct ClientBody {
    tee: Tee,
    state: std::sync::Arc<std::sync::atomic::AtomicU8>,
    back: Option<tokio::sync::oneshot::Sender<Option<Tee>>>,
}

/// The client's stream and what was read from it.
#[derive(Debug)]
struct Tee {
    /// The client's stream; `None` once it ended.
    source: Option<Inbound>,
    /// The data read so far, in order (emptied when it outgrows the bound).
    kept: Vec<Bytes>,
    /// The trailers, once read.
    trailers: Option<http::HeaderMap>,
    /// Bytes read so far.
    read: u64,
    /// More than [`MAX_REPLAY_BODY`] was read: nothing is kept.
    overflowed: bool,
    /// The next of `kept` this attempt sends (equal to its length once caught up).
    next: usize,
    /// Whether this attempt has sent the trailers.
    trailers_sent: bool,
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

/// The body of a failed attempt, handed back when the attempt drops it.
#[derive(Debug)]
pub(crate) struct Reclaim(tokio::sync::oneshot::Receiver<Option<Tee>>);

impl Reclaim {
    /// The body again, for the next attempt, waiting at most `bound` for the failed attempt to
    /// let go of it; `None` when it outgrew the replay bound, or was not let go of in time.
    pub(crate) async fn body(
        self,
        bound: std::time::Duration,
        state: &UploadState,
    ) -> Option<(ClientBody, Reclaim)> {
        let mut tee = tokio::time::timeout(bound, self.0).await.ok()?.ok()??;
        tee.next = 0;
        tee.trailers_sent = false;
        Some(ClientBody::with(tee, state.0.clone()))
    }
}

impl ClientBody {
    /// `inner` as it streams, a handle that tells how far it got, and the way to get it back
    /// after a failed attempt.
    pub(crate) fn new(inner: Inbound) -> (Self, UploadState, Reclaim) {
        let state = std::sync::Arc::new(std::sync::atomic::AtomicU8::new(0));
        let tee = Tee {
            source: Some(inner),
            kept: Vec::new(),
            trailers: None,
            read: 0,
            overflowed: false,
            next: 0,
            trailers_sent: false,
        };
        let (body, reclaim) = ClientBody::with(tee, state.clone());
        (body, UploadState(state), reclaim)
    }

    fn with(tee: Tee, state: std::sync::Arc<std::sync::atomic::AtomicU8>) -> (Self, Reclaim) {
        let (back, reclaim) = tokio::sync::oneshot::channel();
        let body = ClientBody {
            tee,
            state,
            back: Some(back),
        };
        (body, Reclaim(reclaim))
    }

    fn set(&self, to: u8) {
        self.state.store(to, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for ClientBody {
    fn drop(&mut self) {
        if let Some(back) = self.back.take() {
            let tee = std::mem::replace(
                &mut self.tee,
                Tee {
                    source: None,
                    kept: Vec::new(),
                    trailers: None,
                    read: 0,
                    overflowed: true,
                    next: 0,
                    trailers_sent: false,
                },
            );
            let _ = back.send((!tee.overflowed).then_some(tee));
        }
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
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        let tee = &mut this.tee;
        // A retry first sends again what an earlier attempt read.
        if let Some(data) = tee.kept.get(tee.next) {
            tee.next += 1;
            return Poll::Ready(Some(Ok(Frame::data(data.clone()))));
        }
        let Some(source) = tee.source.as_mut() else {
            return Poll::Ready(match tee.trailers.as_ref() {
                Some(t) if !std::mem::replace(&mut tee.trailers_sent, true) => {
                    Some(Ok(Frame::trailers(t.clone())))
                }
                _ => None,
            });
        };
        let polled = ready!(Pin::new(&mut *source).poll_frame(cx));
        let ended = source.is_end_stream();
        match &polled {
            None => {
                tee.source = None;
                this.set(1);
            }
            Some(Err(_)) => this.set(2),
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    tee.read += data.len() as u64;
                    if tee.read > MAX_REPLAY_BODY {
                        tee.overflowed = true;
                        tee.kept = Vec::new();
                        tee.next = 0;
                    } else if !tee.overflowed {
                        tee.kept.push(data.clone());
                        tee.next += 1;
                    }
                } else if let Some(trailers) = frame.trailers_ref() {
                    tee.trailers = Some(trailers.clone());
                    tee.trailers_sent = true;
                }
                if ended {
                    tee.source = None;
                    this.set(1);
                }
            }
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        let tee = &self.tee;
        tee.next >= tee.kept.len()
            && tee.source.as_ref().is_none_or(Body::is_end_stream)
            && (tee.trailers.is_none() || tee.trailers_sent || tee.source.is_some())
    }

    fn size_hint(&self) -> SizeHint {
        let tee = &self.tee;
        let again: u64 = tee.kept[tee.next.min(tee.kept.len())..]
            .iter()
            .map(|b| b.len() as u64)
            .sum();
        let rest = tee
            .source
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint);
        let mut hint = SizeHint::new();
        hint.set_lower(again + rest.lower());
        if let Some(upper) = rest.upper() {
            hint.set_upper(again + upper);
        }
        hint
    }
}
