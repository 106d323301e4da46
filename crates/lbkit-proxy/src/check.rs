//! Active health checks: every interval, probe each endpoint of the service (HTTP GET with an
//! expected status, or a TCP connect) under a timeout; `fall` failures in a row mark it down,
//! `rise` successes in a row mark it up again (pingora's and HAProxy's thresholds). Changes go
//! to the service's upkeep task, which publishes a new snapshot.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Uri};
use http_body_util::{Either, Full};
use lbkit_core::EndpointKey;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::MissedTickBehavior;

use crate::config::{CheckKind, HealthCheck};
use crate::service::Service;

/// Consecutive results of one endpoint.
#[derive(Debug, Clone, Copy)]
struct Streak {
    up: bool,
    count: u32,
}

/// Probe `service`'s endpoints forever, sending `(endpoint, healthy)` on every change.
pub(crate) async fn run(
    service: Arc<Service>,
    hc: HealthCheck,
    tx: mpsc::Sender<(EndpointKey, bool)>,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(hc.interval_ms));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut streaks: HashMap<EndpointKey, Streak> = HashMap::new();
    loop {
        tick.tick().await;
        let snapshot = service.active().balancer.snapshot();
        let mut probes = JoinSet::new();
        for e in snapshot.endpoints() {
            let (key, address) = (e.key().clone(), e.address().to_owned());
            let (svc, hc) = (service.clone(), hc.clone());
            probes.spawn(async move { (key, probe(&svc, &hc, &address).await) });
        }
        let mut seen = Vec::new();
        while let Some(Ok((key, ok))) = probes.join_next().await {
            seen.push(key.clone());
            let s = streaks
                .entry(key.clone())
                .or_insert(Streak { up: true, count: 0 });
            if let Some(healthy) = step(s, ok, &hc) {
                if tx.send((key, healthy)).await.is_err() {
                    return;
                }
            }
        }
        streaks.retain(|k, _| seen.contains(k));
    }
}

/// Record one result; returns the new state when it flips.
fn step(s: &mut Streak, ok: bool, hc: &HealthCheck) -> Option<bool> {
    if ok == s.up {
        s.count = 0;
        return None;
    }
    s.count += 1;
    let needed = if s.up { hc.fall } else { hc.rise };
    if s.count < needed {
        return None;
    }
    s.up = ok;
    s.count = 0;
    Some(ok)
}

async fn probe(service: &Service, hc: &HealthCheck, address: &str) -> bool {
    let timeout = Duration::from_millis(hc.timeout_ms);
    match hc.kind {
        CheckKind::Tcp => matches!(
            tokio::time::timeout(timeout, tokio::net::TcpStream::connect(address)).await,
            Ok(Ok(_))
        ),
        CheckKind::Http => {
            let Ok(uri) = Uri::builder()
                .scheme("http")
                .authority(address)
                .path_and_query(hc.path.as_str())
                .build()
            else {
                return false;
            };
            let mut req = Request::new(Either::Left(Full::new(Bytes::new())));
            *req.uri_mut() = uri;
            if service.config().h2c {
                *req.version_mut() = http::Version::HTTP_2;
            }
            match tokio::time::timeout(timeout, service.client().request(req)).await {
                Ok(Ok(resp)) => resp.status().as_u16() == hc.expect_status,
                _ => false,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rise_and_fall_thresholds() {
        let hc: HealthCheck = toml::from_str("kind = \"tcp\"\nrise = 2\nfall = 3").unwrap();
        let mut s = Streak { up: true, count: 0 };
        assert_eq!(step(&mut s, false, &hc), None);
        assert_eq!(step(&mut s, false, &hc), None);
        assert_eq!(step(&mut s, false, &hc), Some(false));
        assert_eq!(step(&mut s, true, &hc), None);
        assert_eq!(step(&mut s, false, &hc), None);
        assert_eq!(step(&mut s, true, &hc), None);
        assert_eq!(step(&mut s, true, &hc), Some(true));
    }
}
