//! One HTTP/2 stream of a client, in a task of its own: its request routed and forwarded
//! (`forward::serve`, as on hyper's engine) while the stream is watched for the client's reset
//! and for idleness, then its answer written under flow control ([`Pipe`]).

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{Reason, RecvStream, SendStream};
use http::{Request, Response};
use http_body::Body;
use tokio::time::Instant;

use super::Shared;
use crate::body::{Inbound, ProxyBody};
use crate::forward;
use crate::h1::Timer;
use crate::h2body::{reset_reason, H2Body, Pipe, Piped};
use crate::hub::Defences;
use crate::watchdog::Busy;

/// A stream as `h2` hands it over.
pub(super) type Accepted = (Request<RecvStream>, SendResponse<Bytes>);

/// How the wait for the answer's head ended.
#[allow(clippy::large_enum_variant)] // made once per stream, moved out at once
enum Head {
    Answer(Response<ProxyBody>, Option<Duration>),
    /// The client reset the stream first.
    Reset,
    /// The connection is gone.
    Gone,
    /// No byte either way for the idle limit.
    Idle,
}

/// Serve one stream; `busy` keeps it in flight for the connection's watchdog.
pub(super) async fn serve(
    req: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    shared: Arc<Shared>,
    busy: Busy,
) {
    let _busy = busy;
    // Bytes of the request body read so far (a few more per frame, so an empty one counts).
    let progress = Arc::new(AtomicU64::new(0));
    let (parts, recv) = req.into_parts();
    let body = H2Body::new(recv, &parts.headers).with_progress(progress.clone());
    let req = Request::from_parts(parts, Inbound::Right(body));
    let mut idle = Idle::new();
    let limit = shared.stream_idle;
    // Boxed: the request's future is large (see `server.rs`), and a box moves as a pointer.
    let answer = Box::pin(forward::serve(&shared.hub, shared.peer, req));
    let (resp, route_timeout) = match head(answer, &mut respond, &mut idle, &progress, limit).await
    {
        Head::Answer(resp, t) => (resp, t),
        Head::Reset => return shared.premature_reset(),
        Head::Gone => return,
        Head::Idle => {
            respond.send_reset(Reason::CANCEL);
            return Defences::count(&shared.hub.defences.idle_resets);
        }
    };
    let Some((tx, body)) = send_head(resp, &mut respond) else {
        return;
    };
    // Waiting for the client's window is bounded by the route's timeout too.
    let stalled = route_timeout.map_or(limit, |t| t.min(limit));
    let mut pipe = Pipe::new(body, tx);
    let expired = poll_fn(|cx| {
        match pipe.poll(cx) {
            Poll::Ready(Piped::Failed(e)) => {
                pipe.reset(reset_reason(&*e));
                return Poll::Ready(false);
            }
            Poll::Ready(_) => return Poll::Ready(false),
            Poll::Pending => {}
        }
        let limit = if pipe.stalled() { stalled } else { limit };
        let moved = progress.load(Relaxed) + pipe.sent();
        idle.poll(moved, limit, cx).map(|()| true)
    })
    .await;
    if expired {
        pipe.reset(Reason::CANCEL);
        Defences::count(&shared.hub.defences.idle_resets);
    }
}

/// Send the answer's head (with a `Content-Length` when its body's size is known, as hyper's
/// server adds it); the stream and the body still to send, or `None` when the answer is
/// complete (or could not be sent: the stream is reset).
fn send_head(
    resp: Response<ProxyBody>,
    respond: &mut SendResponse<Bytes>,
) -> Option<(SendStream<Bytes>, ProxyBody)> {
    let (mut parts, body) = resp.into_parts();
    let eos = body.is_end_stream();
    if let Some(n) = body.size_hint().exact().filter(|_| !eos) {
        parts
            .headers
            .entry(http::header::CONTENT_LENGTH)
            .or_insert_with(|| http::HeaderValue::from(n));
    }
    match respond.send_response(Response::from_parts(parts, ()), eos) {
        Ok(tx) => (!eos).then_some((tx, body)),
        Err(e) => {
            tracing::debug!(error = %e, "HTTP/2 answer head not sent");
            respond.send_reset(Reason::INTERNAL_ERROR);
            None
        }
    }
}

/// Wait for the answer's head while watching the stream: a reset by the client drops the
/// request at once (checked first, so a stream reset before its task runs is never routed,
/// and opens or takes no upstream connection), and so does the idle limit.
async fn head<F>(
    mut answer: Pin<Box<F>>,
    respond: &mut SendResponse<Bytes>,
    idle: &mut Idle,
    progress: &AtomicU64,
    limit: Duration,
) -> Head
where
    F: Future<Output = (Response<ProxyBody>, Option<Duration>)>,
{
    poll_fn(|cx| {
        match respond.poll_reset(cx) {
            Poll::Ready(Ok(_)) => return Poll::Ready(Head::Reset),
            Poll::Ready(Err(_)) => return Poll::Ready(Head::Gone),
            Poll::Pending => {}
        }
        if let Poll::Ready((resp, timeout)) = answer.as_mut().poll(cx) {
            return Poll::Ready(Head::Answer(resp, timeout));
        }
        idle.poll(progress.load(Relaxed), limit, cx)
            .map(|()| Head::Idle)
    })
    .await
}

/// A stream's idle limit: ready once the bytes moved either way (`moved`, read at each poll)
/// have not changed for `limit`. One timer, re-armed lazily (`h1::Timer`): progress costs a
/// clock read, not a timer registration.
struct Idle {
    timer: Timer,
    seen: u64,
    since: Instant,
}

impl Idle {
    fn new() -> Self {
        Idle {
            timer: Timer::new(),
            seen: 0,
            since: Instant::now(),
        }
    }

    fn poll(&mut self, moved: u64, limit: Duration, cx: &mut Context<'_>) -> Poll<()> {
        if moved != self.seen {
            self.seen = moved;
            self.since = Instant::now();
        }
        self.timer.set(self.since + limit);
        self.timer.poll_expired(cx)
    }
}
