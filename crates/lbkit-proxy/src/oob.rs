//! A service's out-of-band load reports (`orca_oob_ms`): lbkit-tower's
//! [`watch_endpoints`](lbkit_tower::orca::oob::watch_endpoints) over the service's balancer,
//! one ORCA stream per endpoint on an HTTP/2 connection of its own (hyper's client, with the
//! service's connect timeout and HTTP/2 keep-alive pings, so a peer that vanished is noticed),
//! the reports recorded in the endpoints' statistics, where `adaptive` weighs them and
//! `/endpoints` shows them. The task is the service's: stopped with its other upkeep tasks.

use std::sync::Arc;
use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use lbkit_core::Endpoint;
use lbkit_tower::http::SetOrigin;
use lbkit_tower::orca::oob::{self, GrpcBody, OobConfig};
use tokio::task::JoinHandle;

use crate::service::Service;

/// HTTP/2 keep-alive ping period of the streams' connections.
const KEEP_ALIVE: Duration = Duration::from_secs(30);

/// Start the streams of `service`, if it asks for them: the task that keeps them.
pub(crate) fn spawn(service: &Arc<Service>) -> Option<JoinHandle<()>> {
    let config = service.config();
    let ms = config.orca_oob_ms?;
    let connect = Duration::from_millis(config.connect_timeout_ms);
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(connect));
    let client = Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .http2_only(true)
        .http2_keep_alive_interval(KEEP_ALIVE)
        .http2_keep_alive_timeout(connect.max(Duration::from_secs(1)))
        .http2_keep_alive_while_idle(true)
        .build::<_, GrpcBody>(connector);
    let make = move |ep: &Endpoint| SetOrigin::http(client.clone(), ep.address());
    let weak = Arc::downgrade(service);
    let current = move || Some(weak.upgrade()?.active().balancer.snapshot());
    let oob = OobConfig {
        interval: Duration::from_millis(ms),
        ..OobConfig::default()
    };
    let (_, task) = oob::watch_endpoints(current, service.clock().clone(), make, oob);
    Some(task)
}
