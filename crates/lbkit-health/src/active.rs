//! Active health checks (feature `runtime`): every `interval`, probe each endpoint of the
//! current snapshot under `timeout`; `fall` failures in a row mark it down, `rise` successes in
//! a row mark it up again (HAProxy's and pingora's thresholds). Each change is sent as
//! `(endpoint, healthy)` to the control loop (lbkit-discovery's `Controller::with_health`),
//! which publishes the next snapshot. The tower `Pool` (`PoolBuilder::health_check`) and
//! `lbkit proxy` (`health_check = {..}`) both run these.
//!
//! ```no_run
//! # async fn demo() {
//! use std::sync::Arc;
//! use lbkit_core::Snapshot;
//! use lbkit_health::active::{ActiveCheck, HttpProbe};
//! let (tx, rx) = tokio::sync::mpsc::channel(64);
//! let snapshot = Arc::new(Snapshot::new(0, vec![]));
//! let current = move || Some(snapshot.clone());
//! tokio::spawn(lbkit_health::active::run(HttpProbe::new("/healthz", 200), ActiveCheck::default(), current, tx));
//! // Controller::new(..).with_health(rx).run(source, target).await;
//! # drop(rx);
//! # }
//! ```

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use lbkit_core::{EndpointKey, Snapshot};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::MissedTickBehavior;

/// How often and how strictly endpoints are probed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ActiveCheck {
    /// Time between two rounds of probes. Default 5 s.
    pub interval: Duration,
    /// Longest wait for one probe. Default 1 s.
    pub timeout: Duration,
    /// Successes in a row that mark a down endpoint up. Default 2.
    pub rise: u32,
    /// Failures in a row that mark an up endpoint down. Default 3.
    pub fall: u32,
}

impl Default for ActiveCheck {
    fn default() -> Self {
        ActiveCheck {
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(1),
            rise: 2,
            fall: 3,
        }
    }
}

/// A probe's answer, boxed: probes run off the request path, one per endpoint per round.
pub type ProbeFuture = Pin<Box<dyn Future<Output = bool> + Send>>;

/// One health probe of one endpoint address (`host:port`): `true` when healthy. The timeout is
/// applied around it.
pub trait Probe: Send + Sync + 'static {
    /// Probe `address`.
    fn probe(&self, address: &str) -> ProbeFuture;
}

/// A TCP connect succeeds.
#[derive(Clone, Copy, Debug, Default)]
pub struct TcpProbe;

impl Probe for TcpProbe {
    fn probe(&self, address: &str) -> ProbeFuture {
        let address = address.to_owned();
        Box::pin(async move { tokio::net::TcpStream::connect(address).await.is_ok() })
    }
}

/// `GET path` answers `expect_status` (over HTTP/1.1, or h2c with [`HttpProbe::with_h2c`]).
#[derive(Clone, Debug)]
pub struct HttpProbe {
    path: String,
    expect_status: u16,
    client: Client<HttpConnector, Empty<Bytes>>,
}

impl HttpProbe {
    /// Probe with `GET path`, healthy on `expect_status`.
    pub fn new(path: impl Into<String>, expect_status: u16) -> Self {
        HttpProbe::with_h2c(path, expect_status, false)
    }

    /// The same over HTTP/2 cleartext (prior knowledge) when `h2c`.
    pub fn with_h2c(path: impl Into<String>, expect_status: u16, h2c: bool) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        HttpProbe {
            path: path.into(),
            expect_status,
            client: Client::builder(TokioExecutor::new())
                .http2_only(h2c)
                .build(connector),
        }
    }
}

impl Probe for HttpProbe {
    fn probe(&self, address: &str) -> ProbeFuture {
        let uri = http::Uri::builder()
            .scheme("http")
            .authority(address)
            .path_and_query(self.path.as_str())
            .build();
        let (client, expect) = (self.client.clone(), self.expect_status);
        Box::pin(async move {
            let Ok(uri) = uri else { return false };
            let mut req = http::Request::new(Empty::new());
            *req.uri_mut() = uri;
            match client.request(req).await {
                Ok(resp) => resp.status().as_u16() == expect,
                Err(_) => false,
            }
        })
    }
}

/// Consecutive results of one endpoint.
#[derive(Debug, Clone, Copy)]
struct Streak {
    up: bool,
    count: u32,
}

/// Record one result; returns the new state when it flips.
fn step(s: &mut Streak, ok: bool, check: &ActiveCheck) -> Option<bool> {
    if ok == s.up {
        s.count = 0;
        return None;
    }
    s.count += 1;
    let needed = if s.up { check.fall } else { check.rise };
    if s.count < needed.max(1) {
        return None;
    }
    s.up = ok;
    s.count = 0;
    Some(ok)
}

/// Probe the endpoints of `current()` (every one, eligible or not) with `probe` every
/// `check.interval`, sending `(endpoint, healthy)` on `tx` at each flip. Every endpoint starts
/// up. Ends when `current` returns `None` (its owner is gone) or the receiver is dropped.
pub async fn run<P, F>(
    probe: P,
    check: ActiveCheck,
    current: F,
    tx: mpsc::Sender<(EndpointKey, bool)>,
) where
    P: Probe,
    F: Fn() -> Option<Arc<Snapshot>> + Send,
{
    let probe = Arc::new(probe);
    let mut tick = tokio::time::interval(check.interval);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut streaks: HashMap<EndpointKey, Streak> = HashMap::new();
    loop {
        tick.tick().await;
        let Some(snapshot) = current() else { return };
        let mut probes = JoinSet::new();
        for e in snapshot.endpoints() {
            let (key, address) = (e.key().clone(), e.address().to_owned());
            let probe = probe.clone();
            probes.spawn(async move {
                let ok = tokio::time::timeout(check.timeout, probe.probe(&address)).await;
                (key, matches!(ok, Ok(true)))
            });
        }
        let mut seen = Vec::new();
        while let Some(Ok((key, ok))) = probes.join_next().await {
            seen.push(key.clone());
            let s = streaks
                .entry(key.clone())
                .or_insert(Streak { up: true, count: 0 });
            if let Some(healthy) = step(s, ok, &check) {
                if tx.send((key, healthy)).await.is_err() {
                    return;
                }
            }
        }
        streaks.retain(|k, _| seen.contains(k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lbkit_core::{EndpointSpec, Timestamp};

    #[test]
    fn rise_and_fall_thresholds() {
        let check = ActiveCheck {
            rise: 2,
            fall: 3,
            ..ActiveCheck::default()
        };
        let mut s = Streak { up: true, count: 0 };
        assert_eq!(step(&mut s, false, &check), None);
        assert_eq!(step(&mut s, false, &check), None);
        assert_eq!(step(&mut s, false, &check), Some(false));
        assert_eq!(step(&mut s, true, &check), None);
        assert_eq!(step(&mut s, false, &check), None);
        assert_eq!(step(&mut s, true, &check), None);
        assert_eq!(step(&mut s, true, &check), Some(true));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_closed_port_falls_and_an_open_one_stays_up() {
        let open = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let closed_addr = closed.local_addr().unwrap();
        drop(closed);
        let snapshot = Arc::new(Snapshot::from_specs(
            vec![
                EndpointSpec::new(open.local_addr().unwrap().to_string()),
                EndpointSpec::new(closed_addr.to_string()),
            ],
            Timestamp::ZERO,
        ));
        let check = ActiveCheck {
            interval: Duration::from_millis(10),
            timeout: Duration::from_millis(500),
            rise: 1,
            fall: 2,
        };
        let (tx, mut rx) = mpsc::channel(4);
        let current = move || Some(snapshot.clone());
        let task = tokio::spawn(run(TcpProbe, check, current, tx));
        let (key, healthy) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("a flip in time")
            .expect("a flip");
        assert_eq!(
            (key.as_str(), healthy),
            (closed_addr.to_string().as_str(), false)
        );
        task.abort();
    }
}
