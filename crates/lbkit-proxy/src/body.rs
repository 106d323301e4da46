//! The response body sent to clients: a short proxy-made body, or the upstream's body carrying
//! the call's [`CallGuard`], finished when the body ends (a call "ends" at end of stream, as
//! tower's `TrackCompletion` does).

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use lbkit_core::{CallGuard, FailureKind, Outcome};

use crate::pool::{self, Lease};

/// A response body: proxy-made or streamed from an upstream.
#[derive(Debug)]
pub struct ProxyBody(Inner);

#[derive(Debug)]
enum Inner {
    Local(Full<Bytes>),
    Upstream {
        body: Incoming,
        /// Finished at end of stream with `outcome`; dropped unfinished (a cancellation) when
        /// the client goes away first.
        guard: Option<CallGuard>,
        outcome: Outcome,
        /// The upstream connection when the proxy drives it (HTTP/1.1): polled with the body,
        /// back to its pool at the end of the body, closed if the body is dropped before.
        lease: Option<Lease>,
    },
}

// === impl ProxyBody ===

impl ProxyBody {
    /// A body made by the proxy.
    pub fn local(text: impl Into<Bytes>) -> Self {
        ProxyBody(Inner::Local(Full::new(text.into())))
    }

    /// An upstream body; `guard` is finished with `outcome` when it ends.
    pub fn upstream(body: Incoming, guard: CallGuard, outcome: Outcome) -> Self {
        ProxyBody::upstream_on(body, guard, outcome, None)
    }

    /// An upstream body read from the connection of `lease`, which this body drives.
    pub(crate) fn upstream_on(
        body: Incoming,
        guard: CallGuard,
        outcome: Outcome,
        mut lease: Option<Lease>,
    ) -> Self {
        let mut guard = Some(guard);
        if body.is_end_stream() {
            if let Some(g) = guard.take() {
                g.finish(outcome);
            }
            if let Some(l) = lease.take() {
                l.release();
            }
        }
        ProxyBody(Inner::Upstream {
            body,
            guard,
            outcome,
            lease,
        })
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
            Inner::Upstream {
                body,
                guard,
                outcome,
                lease,
            } => {
                let frame =
                    ready!(pool::poll_with(lease, cx, |cx| Pin::new(&mut *body).poll_frame(cx)));
                let end = match &frame {
                    None => Some(*outcome),
                    Some(Err(_)) => Some(Outcome::Failure(FailureKind::Other)),
                    Some(Ok(_)) if body.is_end_stream() => Some(*outcome),
                    Some(Ok(_)) => None,
                };
                if let Some(end) = end {
                    if let Some(g) = guard.take() {
                        g.finish(end);
                    }
                    // A body that failed leaves its connection closed (dropped).
                    if let Some(l) = lease.take().filter(|_| !matches!(frame, Some(Err(_)))) {
                        l.release();
                    }
                }
                Poll::Ready(frame)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.0 {
            Inner::Local(full) => full.is_end_stream(),
            Inner::Upstream { body, .. } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.0 {
            Inner::Local(full) => full.size_hint(),
            Inner::Upstream { body, .. } => body.size_hint(),
        }
    }
}
