//! A service's active health checks: lbkit-health's [`active`](lbkit_health::active) probes
//! (HTTP GET with an expected status over the service's protocol, or a TCP connect) with the
//! configured interval, timeout and rise/fall thresholds. Changes go to the service's control
//! loop, which publishes a new snapshot.

use std::sync::{Arc, Weak};
use std::time::Duration;

use lbkit_core::{EndpointKey, Snapshot};
use lbkit_health::active::{self, ActiveCheck, HttpProbe, TcpProbe};
use tokio::sync::mpsc;

use crate::config::{CheckKind, HealthCheck};
use crate::service::Service;

/// Probe the endpoints of the snapshot `current` gives (until it gives none), as `hc` says
/// (`h2c`: HTTP checks over HTTP/2 cleartext), sending `(endpoint, healthy)` on every change:
/// what a service's control loop takes as health results. The proxy's services and `lbkit
/// xds` run their `health_check` here.
pub async fn probe(
    hc: HealthCheck,
    h2c: bool,
    current: impl Fn() -> Option<Arc<Snapshot>> + Send + 'static,
    tx: mpsc::Sender<(EndpointKey, bool)>,
) {
    let check = ActiveCheck {
        interval: Duration::from_millis(hc.interval_ms),
        timeout: Duration::from_millis(hc.timeout_ms),
        rise: hc.rise,
        fall: hc.fall,
    };
    match hc.kind {
        CheckKind::Tcp => active::run(TcpProbe, check, current, tx).await,
        CheckKind::Http => {
            let probe = HttpProbe::with_h2c(hc.path.clone(), hc.expect_status, h2c);
            active::run(probe, check, current, tx).await;
        }
    }
}

/// Probe `service`'s endpoints until the service is gone.
async fn run(
    service: Weak<Service>,
    hc: HealthCheck,
    h2c: bool,
    tx: mpsc::Sender<(EndpointKey, bool)>,
) {
    let current = move || Some(service.upgrade()?.active().balancer.snapshot());
    probe(hc, h2c, current, tx).await;
}

/// Start the checks of `service`, if it has any.
pub(crate) fn spawn(
    service: &Arc<Service>,
    tx: mpsc::Sender<(EndpointKey, bool)>,
) -> Option<tokio::task::JoinHandle<()>> {
    let hc = service.config().health_check.clone()?;
    let h2c = service.config().h2c;
    Some(tokio::spawn(run(Arc::downgrade(service), hc, h2c, tx)))
}
