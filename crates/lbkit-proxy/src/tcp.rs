//! The TCP (L4) relay: pick an endpoint, connect, then copy both ways; the call's guard
//! finishes when the connection closes. A failed connect goes to another endpoint under the
//! same rules as an HTTP request (lbkit-core's [`Attempts`], through `Service::retry`: nothing
//! was sent, so it is always retried, at most `retries` times, each on an endpoint not tried
//! yet, within the retry budget); nothing is retried once bytes flow. A connection with no byte
//! either way for `limits.tcp_idle_timeout_ms` is closed (nginx's stream `proxy_timeout`), so
//! idle clients cannot hold connection slots for ever.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use lbkit_core::{AttemptPolicy, Attempts, CallGuard, FastRng, Observed, Route};
use tokio::net::TcpStream;

use crate::idle::{quiet_for, Counted};
use crate::service::Service;

/// Relay `client` to an endpoint of `service` until either side closes or nothing moved for
/// `idle`.
pub(crate) async fn relay(client: TcpStream, service: &Service, idle: Duration) {
    let mut rng = FastRng::from_entropy();
    let connect_timeout = Duration::from_millis(service.config().connect_timeout_ms);
    let policy = AttemptPolicy {
        retries: service.config().retries,
        per_try: Some(connect_timeout),
        overall: None,
    };
    let mut now = service.clock().now();
    // A connection's bytes are not kept: only a connect that failed may go elsewhere.
    let mut attempts = Attempts::start(policy, service.budget(), false, true, now);
    let Ok(mut guard) = service.pick(&mut attempts, now, Route::default(), &mut rng) else {
        return;
    };
    loop {
        let limit = attempts.timeout(now).unwrap_or(connect_timeout);
        let connect = TcpStream::connect(guard.endpoint().address());
        if let Ok(Ok(upstream)) = tokio::time::timeout(limit, connect).await {
            return copy(client, upstream, guard, idle).await;
        }
        // A connect timeout is a connect failure: nothing was sent.
        let c = Observed::ConnectFailed.classify();
        match service.retry(&mut attempts, c, Route::default(), &mut rng) {
            Ok((next, at)) => {
                guard.finish_at(c.outcome, at);
                (guard, now) = (next, at);
            }
            Err(_) => return guard.finish(c.outcome),
        }
    }
}

/// Copy both ways until both sides closed, or nothing moved for `idle` (not the endpoint's
/// failure); the call ends then.
async fn copy(client: TcpStream, upstream: TcpStream, guard: CallGuard, idle: Duration) {
    let _ = upstream.set_nodelay(true);
    let moved = AtomicU64::new(0);
    let (mut client, mut upstream) = (Counted::new(client, &moved), Counted::new(upstream, &moved));
    let end = tokio::select! {
        copied = tokio::io::copy_bidirectional(&mut client, &mut upstream) => match copied {
            Ok(_) => Observed::Done,
            Err(_) => Observed::ResetAfterResponse,
        },
        () = quiet_for(&moved, idle) => Observed::Done,
    };
    guard.finish(end.classify().outcome);
}
