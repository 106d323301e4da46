//! The TCP (L4) relay: pick an endpoint, connect (another endpoint when the connect fails, at
//! most `retries` more), then copy both ways; the call's guard finishes when the connection
//! closes.

use std::time::Duration;

use lbkit_core::{FailureKind, FastRng, Outcome, PickContext, TriedSet};
use tokio::net::TcpStream;

use crate::service::Service;

/// Relay `client` to an endpoint of `service` until either side closes.
pub(crate) async fn relay(mut client: TcpStream, service: &Service) {
    let mut rng = FastRng::from_entropy();
    let mut tried = TriedSet::new();
    let connect_timeout = Duration::from_millis(service.config().connect_timeout_ms);
    for attempt in 0..=service.config().retries {
        let now = service.clock().now();
        let mut cx = PickContext::new(now, &mut rng).with_tried(attempt, &tried);
        let Ok(guard) = service.active().balancer.pick(&mut cx) else {
            return;
        };
        tried.insert(guard.endpoint());
        let connected = tokio::time::timeout(
            connect_timeout,
            TcpStream::connect(guard.endpoint().address()),
        )
        .await;
        match connected {
            Ok(Ok(mut upstream)) => {
                let _ = upstream.set_nodelay(true);
                let copied = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                guard.finish(match copied {
                    Ok(_) => Outcome::Success,
                    Err(_) => Outcome::Failure(FailureKind::Other),
                });
                return;
            }
            Ok(Err(_)) => guard.finish(Outcome::Failure(FailureKind::Connect)),
            Err(_) => guard.finish(Outcome::Failure(FailureKind::Timeout)),
        }
    }
}
