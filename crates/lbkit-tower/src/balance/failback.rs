//! Failback: record a failed request and retry it in the background (Dubbo's
//! `FailbackClusterInvoker`), bounded in pending requests and attempts.
//!
//! How it differs from failover's [`Attempts`](lbkit_core::Attempts), and why:
//! * **No idempotency check**: failback is at-least-once by design (Dubbo uses it for
//!   notifications); choosing it for a service says its requests may be repeated.
//! * **A fresh pick each time, the failed endpoint included**: the attempts are `period` (5 s)
//!   apart, long enough for an endpoint to recover, and the caller already has its answer.
//! * **The retry budget still bounds them**: every failback call deposits, as a failover call
//!   does, and each background attempt withdraws from the layer's budget once it has an endpoint ([`Attempts::grant`](lbkit_core::Attempts::grant));
//!   a refused one is skipped (counted in `budget_exhausted`) and the next period tries again.
//!   So failing requests cannot add more retries than failover's would.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use lbkit_core::{FastRng, Strategy, TriedSet};
use tower::Service;

use super::Shared;
use crate::error::BoxError;
use crate::policy::{RequestPolicy, ResponsePolicy};

/// Background retries of failback (Dubbo's defaults).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailbackConfig {
    /// Attempts in the background before giving up (Dubbo `retries` for failback: 3).
    pub retries: u32,
    /// Wait before each background attempt (Dubbo `RETRY_FAILED_PERIOD`: 5 s).
    pub period: Duration,
    /// Most requests waiting for a background retry; more are dropped and counted (Dubbo
    /// `failbacktasks`: 100).
    pub max_pending: usize,
}

impl Default for FailbackConfig {
    fn default() -> Self {
        FailbackConfig {
            retries: 3,
            period: Duration::from_secs(5),
            max_pending: 100,
        }
    }
}

/// Retry `req` in the background on the current tokio runtime. A request that cannot be
/// replayed, one over `max_pending`, or one outside a runtime is dropped and counted.
pub(crate) fn schedule<Req, Svc, Q, R, S, F>(
    shared: Arc<Shared<Svc, Q, R, S, F>>,
    req: Option<Req>,
    config: FailbackConfig,
) where
    Req: Send + 'static,
    Svc: Service<Req> + Clone + Send + Sync + 'static,
    Svc::Error: Into<BoxError>,
    Svc::Future: Send,
    Svc::Response: Send,
    Q: RequestPolicy<Req>,
    R: ResponsePolicy<Svc::Response>,
    S: Strategy,
    F: Send + Sync + 'static,
{
    let metrics = &shared.pool.inner.metrics;
    let runtime = tokio::runtime::Handle::try_current();
    let (Some(req), Ok(runtime)) = (req, runtime) else {
        crate::telemetry::inc(&metrics.failback[2]);
        return;
    };
    if shared.failback_pending.fetch_add(1, Relaxed) >= config.max_pending {
        shared.failback_pending.fetch_sub(1, Relaxed);
        crate::telemetry::inc(&metrics.failback[2]);
        return;
    }
    crate::telemetry::inc(&metrics.failback[0]);
    runtime.spawn(async move {
        let succeeded = retry(&shared, req, config).await;
        let metrics = &shared.pool.inner.metrics;
        if succeeded {
            crate::telemetry::inc(&metrics.failback[1]);
        } else {
            crate::telemetry::inc(&metrics.failback[3]);
        }
        shared.failback_pending.fetch_sub(1, Relaxed);
    });
}

async fn retry<Req, Svc, Q, R, S: Strategy, F>(
    s: &Shared<Svc, Q, R, S, F>,
    mut req: Req,
    config: FailbackConfig,
) -> bool
where
    Svc: Service<Req> + Clone,
    Svc::Error: Into<BoxError>,
    Q: RequestPolicy<Req>,
    R: ResponsePolicy<Svc::Response>,
{
    let mut rng = FastRng::seed_from_u64(s.next_seed());
    for attempt in 1..=config.retries {
        tokio::time::sleep(config.period).await;
        let spare = (attempt < config.retries)
            .then(|| s.requests.replay(&req))
            .flatten();
        let now = s.clock().now();
        if let Ok(sel) = s.repick(
            &req,
            now,
            super::cluster::Again {
                attempt,
                tried: &TriedSet::new(),
                // A background retry is sampled apart from the call it retries.
                trace: lbkit_core::trace::TraceId::UNDECIDED,
                hedge: false,
            },
            &mut rng,
        ) {
            if lbkit_core::Attempts::grant(&*s.budget, now).is_err() {
                sel.call.abandon();
                crate::telemetry::inc(&s.pool.inner.metrics.budget_exhausted);
                continue;
            }
            let sent = s.send(sel, req, s.policy.per_try).await;
            let ok = !sent.is_failure();
            sent.discard();
            if ok {
                return true;
            }
        }
        match spare {
            Some(next) => req = next,
            None => return false,
        }
    }
    false
}
