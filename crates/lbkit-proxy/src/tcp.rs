//! The TCP (L4) relay: pick an endpoint, connect, then copy both ways; the call's guard
//! finishes when the connection closes. A failed connect goes to another endpoint under the
//! same rules as an HTTP request (lbkit-core's [`Attempts`]: nothing was sent, so it is always
//! retried, at most `retries` times, each on an endpoint not tried yet, within the retry
//! budget); nothing is retried once bytes flow.

use std::time::Duration;

use lbkit_core::{AttemptPolicy, Attempts, FastRng, Next, Observed};
use tokio::net::TcpStream;

use crate::service::Service;

/// Relay `client` to an endpoint of `service` until either side closes.
pub(crate) async fn relay(mut client: TcpStream, service: &Service) {
    let mut rng = FastRng::from_entropy();
    let connect_timeout = Duration::from_millis(service.config().connect_timeout_ms);
    let policy = AttemptPolicy {
        retries: service.config().retries,
        per_try: Some(connect_timeout),
        overall: None,
    };
    let clock = service.clock();
    // A connection's bytes are not kept: only a connect that failed may go elsewhere.
    let mut attempts = Attempts::start(policy, service.budget(), false, true, clock.now());
    loop {
        let now = clock.now();
        let Ok(guard) = attempts.pick(&service.active().balancer, now, None, &mut rng) else {
            return;
        };
        let limit = attempts.timeout(now).unwrap_or(connect_timeout);
        let connected =
            tokio::time::timeout(limit, TcpStream::connect(guard.endpoint().address())).await;
        let observed = match connected {
            Ok(Ok(mut upstream)) => {
                let _ = upstream.set_nodelay(true);
                let copied = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                let end = match copied {
                    Ok(_) => Observed::Done,
                    Err(_) => Observed::ResetAfterResponse,
                };
                guard.finish(end.classify().outcome);
                return;
            }
            // A connect timeout is a connect failure: nothing was sent.
            Ok(Err(_)) | Err(_) => Observed::ConnectFailed,
        };
        let c = observed.classify();
        guard.finish(c.outcome);
        match attempts.after(c, service.budget(), clock) {
            Next::Retry => service.metrics().retried(),
            Next::Answer(stop) => {
                if stop == lbkit_core::Stop::BudgetExhausted {
                    service.metrics().retry_refused();
                }
                return;
            }
        }
    }
}
