//! A service's out-of-band load reports (`orca_oob_ms`): lbkit-tower's
//! [`watch_endpoints`](lbkit_tower::orca::oob::watch_endpoints) over the service's balancer,
//! one ORCA stream per endpoint on an HTTP/2 connection of its own (hyper's client), the
//! reports recorded in the endpoints' statistics, where `adaptive` weighs them and
//! `/endpoints` shows them. The streams end with the service.

use std::sync::Arc;
use std::time::Duration;

use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use lbkit_core::Endpoint;
use lbkit_tower::http::SetOrigin;
use lbkit_tower::orca::oob::{self, GrpcBody, OobConfig, OobReports};

use crate::service::Service;

/// Start the streams of `service`, if it asks for them.
pub(crate) fn spawn(service: &Arc<Service>) -> Option<OobReports> {
    let ms = service.config().orca_oob_ms?;
    let weak = Arc::downgrade(service);
    let current = move || Some(weak.upgrade()?.active().balancer.snapshot());
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<GrpcBody>();
    let make = move |ep: &Endpoint| SetOrigin::http(client.clone(), ep.address());
    let config = OobConfig {
        interval: Duration::from_millis(ms),
        ..OobConfig::default()
    };
    Some(oob::watch_endpoints(
        current,
        service.clock().clone(),
        make,
        config,
    ))
}
