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
        let mut inner = Inner::Upstream {
            body,
            guard: Some(guard),
            outcome,
        };
        if let Inner::Upstream {
            body,
            guard,
            outcome,
        } = &mut inner
        {
            if body.is_end_stream() {
                if let Some(g) = guard.take() {
                    g.finish(*outcome);
                }
            }
        }
        ProxyBody(inner)
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
            } => {
                let frame = ready!(Pin::new(&mut *body).poll_frame(cx));
                let end = match &frame {
                    None => Some(*outcome),
                    Some(Err(_)) => Some(Outcome::Failure(FailureKind::Other)),
                    Some(Ok(_)) if body.is_end_stream() => Some(*outcome),
                    Some(Ok(_)) => None,
                };
                if let Some(g) = end.and_then(|_| guard.take()) {
                    g.finish(end.unwrap_or(*outcome));
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
