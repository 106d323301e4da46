//! One HTTP/2 stream of a client, served within its connection's task (`Conn::serve`; a task of
//! its own on a multi-thread runtime): its request routed and forwarded (`forward::serve`, as
//! on hyper's engine) while the stream is watched for the client's reset and for idleness, then
//! its answer written under flow control ([`Pipe`]).

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{Reason, RecvStream, SendStream};
use http::{Request, Response};
use http_body::Body;
use tokio::time::{Instant, Sleep};

use super::Shared;
use crate::body::{Inbound, ProxyBody};
use crate::forward;
use crate::h1::FAR;
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
    let limit = shared.stream_idle;
    let mut idle = Idle::new(limit);
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
/// request at once (checked first, so a stream reset before it is first polled is never
/// routed, and opens or takes no upstream connection), and so does the idle limit.
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
/// have not changed for `limit`, noticed within a quarter of it. Progress costs nothing (no
/// clock read, no timer change): a timer looks every quarter of the limit at whether the count
/// moved since its last look, so a call that ends in time reads the clock once here.
struct Idle {
    sleep: Pin<Box<Sleep>>,
    /// `moved` at the last look.
    looked: u64,
    /// When a look last found the count moved (at first: the stream's start).
    quiet_since: Instant,
}

impl Idle {
    fn new(limit: Duration) -> Self {
        let now = Instant::now();
        Idle {
            sleep: Box::pin(tokio::time::sleep_until(now + quarter(limit))),
            looked: 0,
            quiet_since: now,
        }
    }

    fn poll(&mut self, moved: u64, limit: Duration, cx: &mut Context<'_>) -> Poll<()> {
        let limit = limit.min(FAR);
        // A shorter limit than the timer was set for (a stalled answer's) holds at once.
        let due = self.quiet_since + limit;
        if self.sleep.deadline() > due {
            self.sleep.as_mut().reset(due);
        }
        loop {
            ready!(self.sleep.as_mut().poll(cx));
            let now = Instant::now();
            if moved != self.looked {
                self.looked = moved;
                self.quiet_since = now;
            } else if now >= self.quiet_since + limit {
                return Poll::Ready(());
            }
            let next = (now + quarter(limit)).min(self.quiet_since + limit);
            self.sleep.as_mut().reset(next);
        }
    }
}

/// How often [`Idle`] looks: a quarter of `limit` (at least a millisecond).
fn quarter(limit: Duration) -> Duration {
    (limit.min(FAR) / 4).max(Duration::from_millis(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How long after its start `Idle` is ready when the count moves at `progress` (if ever).
    async fn fires_after(limit: Duration, progress: Option<Duration>) -> Duration {
        let start = Instant::now();
        let moved = Arc::new(AtomicU64::new(0));
        if let Some(at) = progress {
            let moved = moved.clone();
            tokio::spawn(async move {
                tokio::time::sleep(at).await;
                moved.store(1, Relaxed);
            });
        }
        let mut idle = Idle::new(limit);
        poll_fn(|cx| idle.poll(moved.load(Relaxed), limit, cx)).await;
        start.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_stream_is_idle_after_the_limit() {
        let limit = Duration::from_secs(4);
        assert_eq!(fires_after(limit, None).await, limit);
    }

    #[tokio::test(start_paused = true)]
    async fn progress_puts_it_off_by_the_limit_give_or_take_a_quarter() {
        let limit = Duration::from_secs(4);
        let after = fires_after(limit, Some(Duration::from_millis(2_500))).await;
        let last = Duration::from_millis(2_500);
        assert!(
            after >= last + limit && after <= last + limit + limit / 4,
            "idle {after:?} after the start, the last progress at {last:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_shorter_limit_holds_at_once() {
        let (long, short) = (Duration::from_secs(300), Duration::from_secs(2));
        let start = Instant::now();
        let mut idle = Idle::new(long);
        let mut polls = 0;
        // The first poll arms the long limit's look; the next ones ask for the short limit
        // (an answer stalled on the client's window), woken by the look a quarter later at
        // the latest.
        poll_fn(|cx| {
            polls += 1;
            let limit = if polls == 1 { long } else { short };
            if polls == 1 {
                cx.waker().wake_by_ref();
            }
            idle.poll(0, limit, cx)
        })
        .await;
        assert_eq!(start.elapsed(), short);
    }
}
