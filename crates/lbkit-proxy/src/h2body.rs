//! HTTP/2 stream bodies on the `h2` crate, one way for both ends of the proxy: an incoming
//! stream read as an [`http_body::Body`] ([`H2Body`]: an upstream's answer in `h2c.rs`, a
//! client's request in `h2s/`), and a body written into a stream under flow control
//! ([`Pipe`]: a streamed upload to an h2c upstream, an answer to an HTTP/2 client).

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use h2::{Reason, RecvStream, SendStream};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

/// A body's error, boxed (what `crate::body::BodyError` is; named here so that this module
/// needs nothing above it).
type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// An incoming HTTP/2 stream's body, handing back flow-control window as it is read (so the
/// peer can send more), then its trailers. Counts the bytes it reads into `progress`, when it
/// has one (a client's stream: its idle timer reads it).
#[derive(Debug)]
pub(crate) struct H2Body {
    recv: RecvStream,
    data_done: bool,
    /// `h2`'s end of stream as of the last frame read: asked once a frame here, not at every
    /// `is_end_stream` (each asks `h2` under its lock; a relayed answer asks twice a frame).
    ended: bool,
    /// A gRPC answer: it ends with trailers, never on a DATA frame, so no frame asks.
    trailed: bool,
    /// What is left of a `Content-Length`, for the size hint.
    remaining: Option<u64>,
    progress: Option<Arc<AtomicU64>>,
    /// Dropped with the body: an h2c call's upload task stops when its answer's body goes.
    _tied: Option<tokio::sync::oneshot::Sender<()>>,
}

impl H2Body {
    /// The body of a message whose head is `headers`.
    pub(crate) fn new(recv: RecvStream, headers: &HeaderMap) -> Self {
        let ended = recv.is_end_stream();
        let remaining = if ended {
            Some(0)
        } else {
            headers
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.parse().ok())
        };
        H2Body {
            recv,
            data_done: false,
            ended,
            trailed: false,
            remaining,
            progress: None,
            _tied: None,
        }
    }

    /// Keep `tied` until the body is dropped.
    pub(crate) fn with_tied(mut self, tied: Option<tokio::sync::oneshot::Sender<()>>) -> Self {
        self._tied = tied;
        self
    }

    /// The body of a gRPC answer (`application/grpc`; not gRPC-web, whose trailers are in the
    /// body): it ends with trailers, so no DATA frame is asked whether it ended the stream.
    /// (An answer that ends on one all the same is ended by an empty DATA frame.)
    pub(crate) fn grpc_answer(mut self, headers: &HeaderMap) -> Self {
        use lbkit_tower::http::GrpcKind;
        let content_type = headers.get(http::header::CONTENT_TYPE);
        self.trailed =
            content_type.is_some_and(|v| GrpcKind::of(v.as_bytes()) == Some(GrpcKind::Grpc));
        self
    }

    /// Count the bytes read into `progress`.
    pub(crate) fn with_progress(mut self, progress: Arc<AtomicU64>) -> Self {
        self.progress = Some(progress);
        self
    }
}

impl Body for H2Body {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        let this = &mut *self;
        if !this.data_done {
            match ready!(this.recv.poll_data(cx)) {
                Some(Ok(data)) => {
                    let _ = this.recv.flow_control().release_capacity(data.len());
                    if let Some(left) = &mut this.remaining {
                        *left = left.saturating_sub(data.len() as u64);
                    }
                    if let Some(p) = &this.progress {
                        p.fetch_add(data.len() as u64 + 1, Relaxed);
                    }
                    this.ended = !this.trailed && this.recv.is_end_stream();
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => this.data_done = true,
            }
        }
        let trailers = ready!(this.recv.poll_trailers(cx));
        this.ended = true;
        match trailers {
            Ok(Some(trailers)) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Ok(None) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(e))),
        }
    }

    /// As of the last frame read (`false` while more may come, as `Body` allows).
    fn is_end_stream(&self) -> bool {
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        self.remaining
            .map_or_else(SizeHint::default, SizeHint::with_exact)
    }
}

/// How a [`Pipe`] ended.
#[derive(Debug)]
pub(crate) enum Piped {
    /// The whole body went into the stream, which is ended (end of stream, or trailers).
    Done,
    /// The peer reset the stream, or the connection is gone: nothing more can be sent.
    Gone,
    /// The body broke; the stream is left open for the caller to reset.
    Failed(BodyError),
}

/// A body being written into an HTTP/2 stream with `h2`'s flow control: a chunk is handed to
/// `h2` only as far as the stream's window admits, so no more than one chunk of the body is
/// held beyond the window (Envoy's and hyper's pipes do the same). Each poll also watches for
/// the peer resetting the stream.
#[derive(Debug)]
pub(crate) struct Pipe<B> {
    body: B,
    tx: SendStream<Bytes>,
    /// A chunk read from the body, not yet all handed to `h2`, and whether it ends the body.
    pending: Option<(Bytes, bool)>,
    /// Window `h2` assigned to the stream that no chunk has used yet (as `h2` counts it): a
    /// chunk within it is sent without asking `h2` again (each ask takes its lock).
    granted: usize,
    /// Bytes handed to `h2` so far.
    sent: u64,
}

impl<B> Pipe<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BodyError>,
{
    /// Write `body` into `tx`.
    pub(crate) fn new(body: B, tx: SendStream<Bytes>) -> Self {
        Pipe {
            body,
            tx,
            pending: None,
            granted: 0,
            sent: 0,
        }
    }

    /// Bytes handed to `h2` so far: they leave within the stream's window.
    pub(crate) fn sent(&self) -> u64 {
        self.sent
    }

    /// Whether a chunk waits for the peer's flow-control window.
    pub(crate) fn stalled(&self) -> bool {
        self.pending
            .as_ref()
            .is_some_and(|(data, _)| !data.is_empty())
    }

    /// Reset the stream with `reason` (the pipe is over).
    pub(crate) fn reset(&mut self, reason: Reason) {
        self.tx.send_reset(reason);
    }

    /// Move the body on as far as the window and the body allow. A reset by the peer is looked
    /// for once a poll (each look takes `h2`'s lock), and a send after it fails anyway.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Piped> {
        if self.tx.poll_reset(cx).is_ready() {
            return Poll::Ready(Piped::Gone);
        }
        loop {
            if let Some((data, eos)) = &mut self.pending {
                if data.len() > self.granted {
                    self.tx.reserve_capacity(data.len());
                    self.granted = self.tx.capacity();
                    if self.granted == 0 {
                        match ready!(self.tx.poll_capacity(cx)) {
                            Some(Ok(_)) => continue,
                            _ => return Poll::Ready(Piped::Gone),
                        }
                    }
                }
                let chunk = data.split_to(self.granted.min(data.len()));
                self.granted -= chunk.len();
                let last = data.is_empty() && *eos;
                self.sent += chunk.len() as u64;
                if self.tx.send_data(chunk, last).is_err() {
                    return Poll::Ready(Piped::Gone);
                }
                if last {
                    return Poll::Ready(Piped::Done);
                }
                if data.is_empty() {
                    self.pending = None;
                }
                continue;
            }
            match ready!(Pin::new(&mut self.body).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        let eos = self.body.is_end_stream();
                        if !data.is_empty() || eos {
                            self.pending = Some((data, eos));
                        }
                    }
                    Err(frame) => {
                        if let Ok(trailers) = frame.into_trailers() {
                            self.tx.reserve_capacity(0);
                            return Poll::Ready(match self.tx.send_trailers(trailers) {
                                Ok(()) => Piped::Done,
                                Err(_) => Piped::Gone,
                            });
                        }
                    }
                },
                Some(Err(e)) => return Poll::Ready(Piped::Failed(e.into())),
                None => {
                    return Poll::Ready(match self.tx.send_data(Bytes::new(), true) {
                        Ok(()) => Piped::Done,
                        Err(_) => Piped::Gone,
                    });
                }
            }
        }
    }
}

/// The `RST_STREAM` code for a stream whose answer broke with `error`: the code of the `h2`
/// error behind it (an upstream that reset its stream with `CANCEL` is passed on as `CANCEL`,
/// as hyper's server does), else `INTERNAL_ERROR`.
pub(crate) fn reset_reason(error: &(dyn std::error::Error + 'static)) -> Reason {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if let Some(reason) = e.downcast_ref::<h2::Error>().and_then(h2::Error::reason) {
            return reason;
        }
        cause = e.source();
    }
    Reason::INTERNAL_ERROR
}
