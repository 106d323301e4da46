//! Counters and histograms through the [`metrics`] facade.
//!
//! Handles are registered once per endpoint when its service is made (and once per pool), never
//! per request: a call only bumps handles it already holds. Install the recorder (Prometheus
//! exporter, …) before building the [`Pool`](crate::Pool); handles registered earlier stay
//! no-ops.
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `lbkit_requests_total` | counter | `pool`, `endpoint` | attempts sent (retries and forks included) |
//! | `lbkit_retries_total` | counter | `pool`, `endpoint` | attempts after the first (failover) |
//! | `lbkit_failures_total` | counter | `pool`, `endpoint`, `kind` | calls recorded as failed (`connect`, `timeout`, `server`, `other`) |
//! | `lbkit_cancellations_total` | counter | `pool`, `endpoint` | calls given up by the caller (future or body dropped, lost fork) |
//! | `lbkit_request_duration_seconds` | histogram | `pool`, `endpoint` | time from pick to completion |
//! | `lbkit_retry_budget_exhausted_total` | counter | `pool` | retries not sent for lack of budget |
//! | `lbkit_pass_over_total` | counter | `pool` | candidates passed over (service not ready or missing) |
//! | `lbkit_failback_total` | counter | `pool`, `result` | failback retries: `scheduled`, `succeeded`, `dropped`, `exhausted` |
//! | `lbkit_endpoints` | gauge | `pool` | endpoints with a client service |

use std::time::Duration;

use lbkit_core::{FailureKind, Outcome};
use metrics::{Counter, Gauge, Histogram};

/// Per-endpoint handles.
#[derive(Debug)]
pub(crate) struct EndpointMetrics {
    pub(crate) requests: Counter,
    pub(crate) retries: Counter,
    failures: [Counter; 4],
    pub(crate) cancellations: Counter,
    latency: Histogram,
}

// === impl EndpointMetrics ===

impl EndpointMetrics {
    pub(crate) fn register(pool: &str, endpoint: &str) -> Self {
        let labels = || [("pool", pool.to_owned()), ("endpoint", endpoint.to_owned())];
        let failure = |kind: &'static str| {
            metrics::counter!(
                "lbkit_failures_total",
                "pool" => pool.to_owned(),
                "endpoint" => endpoint.to_owned(),
                "kind" => kind
            )
        };
        EndpointMetrics {
            requests: metrics::counter!("lbkit_requests_total", &labels()),
            retries: metrics::counter!("lbkit_retries_total", &labels()),
            failures: [
                failure("connect"),
                failure("timeout"),
                failure("server"),
                failure("other"),
            ],
            cancellations: metrics::counter!("lbkit_cancellations_total", &labels()),
            latency: metrics::histogram!("lbkit_request_duration_seconds", &labels()),
        }
    }

    /// Record a finished call.
    #[inline]
    pub(crate) fn record(&self, latency: Duration, outcome: Outcome) {
        self.latency.record(latency.as_secs_f64());
        match outcome {
            Outcome::Success => {}
            Outcome::Failure(kind) => self.failures[failure_index(kind)].increment(1),
            Outcome::Cancelled => self.cancellations.increment(1),
        }
    }
}

fn failure_index(kind: FailureKind) -> usize {
    match kind {
        FailureKind::Connect => 0,
        FailureKind::Timeout => 1,
        FailureKind::Server => 2,
        _ => 3,
    }
}

/// Pool-wide handles.
#[derive(Debug)]
pub(crate) struct PoolMetrics {
    pub(crate) budget_exhausted: Counter,
    pub(crate) pass_over: Counter,
    pub(crate) failback_scheduled: Counter,
    pub(crate) failback_succeeded: Counter,
    pub(crate) failback_dropped: Counter,
    pub(crate) failback_exhausted: Counter,
    pub(crate) endpoints: Gauge,
}

// === impl PoolMetrics ===

impl PoolMetrics {
    pub(crate) fn register(pool: &str) -> Self {
        let failback = |result: &'static str| metrics::counter!("lbkit_failback_total", "pool" => pool.to_owned(), "result" => result);
        PoolMetrics {
            budget_exhausted: metrics::counter!(
                "lbkit_retry_budget_exhausted_total",
                "pool" => pool.to_owned()
            ),
            pass_over: metrics::counter!("lbkit_pass_over_total", "pool" => pool.to_owned()),
            failback_scheduled: failback("scheduled"),
            failback_succeeded: failback("succeeded"),
            failback_dropped: failback("dropped"),
            failback_exhausted: failback("exhausted"),
            endpoints: metrics::gauge!("lbkit_endpoints", "pool" => pool.to_owned()),
        }
    }
}
