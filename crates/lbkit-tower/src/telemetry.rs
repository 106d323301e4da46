//! Metrics through the Prometheus project's Rust client (`prometheus-client`): the families
//! below, in the OpenMetrics text format Prometheus reads, written at scrape time from the
//! atomics the call path keeps anyway (each endpoint's lock-free statistics, a pool's
//! counters, its control loop's counters). A call pays for no metric of its own.
//!
//! `lbkit proxy` writes the endpoint, retry and discovery families with the same names and
//! labels ([`encode_endpoints`], [`encode_services`]), so one dashboard serves both. Register a
//! pool's collector ([`Pool::collector`](crate::Pool::collector)) with your registry:
//!
//! ```no_run
//! # fn demo(pool: lbkit_tower::Pool<()>) {
//! let mut registry = prometheus_client::registry::Registry::default();
//! registry.register_collector(Box::new(pool.collector()));
//! let mut text = String::new();
//! prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
//! # }
//! ```
//!
//! | family | type | labels | meaning |
//! |---|---|---|---|
//! | `lbkit_endpoint_calls_total` | counter | `service`, `endpoint` | calls that finished (successes, failures, cancellations) |
//! | `lbkit_endpoint_failures_total` | counter | `service`, `endpoint`, `kind` | calls recorded as failed (`connect`, `timeout`, `server`, `other`) |
//! | `lbkit_endpoint_cancellations_total` | counter | `service`, `endpoint` | calls given up by the caller |
//! | `lbkit_endpoint_in_flight` | gauge | `service`, `endpoint` | calls in flight |
//! | `lbkit_endpoint_eligible` | gauge | `service`, `endpoint` | 1 when the endpoint may be picked |
//! | `lbkit_endpoint_ejections_total` | counter | `service`, `endpoint` | ejections by outlier detection |
//! | `lbkit_endpoint_call_duration_seconds` | histogram | `service`, `endpoint` | latency of every finished call |
//! | `lbkit_retries_total` | counter | `service` | attempts after the first (failover) |
//! | `lbkit_retries_refused_total` | counter | `service` | retries not sent for lack of budget |
//! | `lbkit_hedges_total` | counter | `service` | hedges sent: second attempts raced against a slow first one (counted in `lbkit_retries_total` too) |
//! | `lbkit_discovery_published_total` | counter | `service` | snapshots published by the control loop |
//! | `lbkit_discovery_source_errors_total` | counter | `service` | source errors (the last good set stayed) |
//! | `lbkit_discovery_empty_held_total` | counter | `service` | updates held back by empty-push protection |
//! | `lbkit_discovery_removals_held_total` | counter | `service` | endpoints whose removal mass-removal protection held back |
//! | `lbkit_discovery_removals_confirmed_total` | counter | `service` | held endpoints confirmed gone since (health check, ejection, time) |
//! | `lbkit_discovery_endpoints_held` | gauge | `service` | endpoints held now: removed by the source, still served |
//! | `lbkit_attempts_total` | counter | `service` | attempts sent by a pool (retries and forks included) |
//! | `lbkit_pass_over_total` | counter | `service` | candidates passed over (service not ready or missing) |
//! | `lbkit_failback_total` | counter | `service`, `result` | failback retries: `scheduled`, `succeeded`, `dropped`, `exhausted` |
//! | `lbkit_endpoints` | gauge | `service` | endpoints with a client service |
//! | `lbkit_shadow_picks_total` | counter | `service`, `candidate` | first attempts a shadow candidate observed ([`lbkit_core::shadow`]) |
//! | `lbkit_shadow_disagreements_total` | counter | `service`, `candidate` | of those, where the candidate would have picked another endpoint (or none) |
//! | `lbkit_shadow_endpoint_picks_total` | counter | `service`, `candidate`, `endpoint`, `by` | first attempts per endpoint, `by` the `live` strategy or the `candidate` |

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use lbkit_core::{
    EndpointIdx, EndpointKey, FailureKind, LatencyHistogram, Snapshot, LATENCY_BUCKETS,
};
use lbkit_discovery::ControllerMetrics;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

/// One service's endpoints, for [`encode_endpoints`].
#[derive(Debug)]
pub struct EndpointRows<'a> {
    /// The `service` label (a pool's name, a proxy service's name).
    pub service: &'a str,
    /// The endpoints and their statistics.
    pub snapshot: &'a Snapshot,
    /// Times each endpoint was ejected by outlier detection.
    pub ejections: &'a HashMap<EndpointKey, u64>,
}

/// One service's retry and control-loop counters, for [`encode_services`].
#[derive(Debug)]
pub struct ServiceRow<'a> {
    /// The `service` label.
    pub service: &'a str,
    /// Retries sent.
    pub retries: u64,
    /// Retries refused by the budget.
    pub retries_refused: u64,
    /// Hedges sent (among the retries).
    pub hedges: u64,
    /// The control loop's counters, once it runs.
    pub discovery: Option<&'a ControllerMetrics>,
}

/// Write the endpoint families of the [module docs](self) for `rows`, each family whole.
///
/// # Errors
/// The encoder's (a `String` never fails).
pub fn encode_endpoints(enc: &mut DescriptorEncoder<'_>, rows: &[EndpointRows<'_>]) -> fmt::Result {
    endpoint_counters(enc, rows)?;
    endpoint_failures(enc, rows)?;
    endpoint_gauges(enc, rows)?;
    let mut f = enc.encode_descriptor(
        "lbkit_endpoint_call_duration_seconds",
        "Latency of every finished call to the endpoint, success or failure.",
        None,
        MetricType::Histogram,
    )?;
    each(rows, |labels, r, i| {
        histogram(
            &mut f.encode_family(labels)?,
            &r.snapshot.endpoint(i).stats().latency_histogram(),
        )
    })
}

/// An endpoint's value in one of the plain endpoint families.
type Value = fn(&EndpointRows<'_>, EndpointIdx) -> u64;

/// The endpoint counters: calls, cancellations, ejections.
fn endpoint_counters(enc: &mut DescriptorEncoder<'_>, rows: &[EndpointRows<'_>]) -> fmt::Result {
    let counters: [(&str, &str, Value); 3] = [
        (
            "lbkit_endpoint_calls",
            "Calls to the endpoint that finished (successes, failures, cancellations).",
            |r, i| r.snapshot.endpoint(i).stats().total(),
        ),
        (
            "lbkit_endpoint_cancellations",
            "Calls to the endpoint given up by the caller.",
            |r, i| r.snapshot.endpoint(i).stats().cancellations(),
        ),
        (
            "lbkit_endpoint_ejections",
            "Times outlier detection ejected the endpoint.",
            |r, i| {
                r.ejections
                    .get(r.snapshot.endpoint(i).key())
                    .copied()
                    .unwrap_or(0)
            },
        ),
    ];
    for (name, help, value) in counters {
        let mut f = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
        each(rows, |labels, r, i| {
            ConstCounter::new(value(r, i)).encode(f.encode_family(labels)?)
        })?;
    }
    Ok(())
}

/// Failures by kind, one series for each endpoint and kind.
fn endpoint_failures(enc: &mut DescriptorEncoder<'_>, rows: &[EndpointRows<'_>]) -> fmt::Result {
    let mut f = enc.encode_descriptor(
        "lbkit_endpoint_failures",
        "Calls to the endpoint recorded as failures, by kind.",
        None,
        MetricType::Counter,
    )?;
    each(rows, |labels, r, i| {
        let counts = r.snapshot.endpoint(i).stats().failures_by_kind();
        for (kind, n) in FailureKind::ALL.iter().zip(counts) {
            let labels = [labels[0], labels[1], ("kind", kind.name())];
            ConstCounter::new(n).encode(f.encode_family(&labels)?)?;
        }
        Ok(())
    })
}

/// The endpoint gauges: calls in flight, eligibility.
fn endpoint_gauges(enc: &mut DescriptorEncoder<'_>, rows: &[EndpointRows<'_>]) -> fmt::Result {
    let gauges: [(&str, &str, Value); 2] = [
        (
            "lbkit_endpoint_in_flight",
            "Calls to the endpoint in flight.",
            |r, i| u64::from(r.snapshot.endpoint(i).stats().in_flight()),
        ),
        (
            "lbkit_endpoint_eligible",
            "1 when the endpoint may be picked (healthy, weighted, not ejected), else 0.",
            |r, i| u64::from(r.snapshot.is_eligible(i)),
        ),
    ];
    for (name, help, value) in gauges {
        let mut f = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
        each(rows, |labels, r, i| {
            gauge(f.encode_family(labels)?, value(r, i))
        })?;
    }
    Ok(())
}

/// Run `f` for every endpoint of `rows` with its `service` and `endpoint` labels.
fn each(
    rows: &[EndpointRows<'_>],
    mut f: impl FnMut(&[(&str, &str); 2], &EndpointRows<'_>, EndpointIdx) -> fmt::Result,
) -> fmt::Result {
    for r in rows {
        for (i, e) in r.snapshot.endpoints().iter().enumerate() {
            let labels = [("service", r.service), ("endpoint", e.address())];
            f(&labels, r, EndpointIdx::new(i))?;
        }
    }
    Ok(())
}

/// A service row's value of one counter.
type ServiceValue = fn(&ServiceRow<'_>) -> u64;

/// The counters of [`encode_services`]: name, help and each row's value.
const SERVICE_COUNTERS: [(&str, &str, ServiceValue); 8] = [
    (
        "lbkit_retries",
        "Attempts after the first, each on an endpoint not tried yet.",
        |r| r.retries,
    ),
    (
        "lbkit_hedges",
        "Hedges sent: second attempts raced against a slow first one (counted as retries too).",
        |r| r.hedges,
    ),
    (
        "lbkit_retries_refused",
        "Retries not sent because the retry budget was spent.",
        |r| r.retries_refused,
    ),
    (
        "lbkit_discovery_published",
        "Endpoint snapshots published by the control loop.",
        |r| r.discovery.map_or(0, ControllerMetrics::published),
    ),
    (
        "lbkit_discovery_source_errors",
        "Errors reported by the endpoint source (the last good set stayed).",
        |r| r.discovery.map_or(0, ControllerMetrics::source_errors),
    ),
    (
        "lbkit_discovery_empty_held",
        "Source updates held back by empty-push protection.",
        |r| r.discovery.map_or(0, ControllerMetrics::empty_held),
    ),
    (
        "lbkit_discovery_removals_held",
        "Endpoints whose removal mass-removal protection held back (served until \
         confirmed gone).",
        |r| r.discovery.map_or(0, ControllerMetrics::removals_held),
    ),
    (
        "lbkit_discovery_removals_confirmed",
        "Held endpoints confirmed gone since (health check, ejection or time) and let go.",
        |r| r.discovery.map_or(0, ControllerMetrics::removals_confirmed),
    ),
];

/// Write the retry and discovery families of the [module docs](self) for `rows`.
///
/// # Errors
/// The encoder's.
pub fn encode_services(enc: &mut DescriptorEncoder<'_>, rows: &[ServiceRow<'_>]) -> fmt::Result {
    for (name, help, value) in SERVICE_COUNTERS {
        let mut f = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
        for r in rows {
            ConstCounter::new(value(r)).encode(f.encode_family(&[("service", r.service)])?)?;
        }
    }
    let mut f = enc.encode_descriptor(
        "lbkit_discovery_endpoints_held",
        "Endpoints held now by mass-removal protection: removed by the source, still served.",
        None,
        MetricType::Gauge,
    )?;
    for r in rows {
        let held = r.discovery.map_or(0, ControllerMetrics::held);
        gauge(f.encode_family(&[("service", r.service)])?, held)?;
    }
    Ok(())
}

/// A gauge sample.
fn gauge(enc: MetricEncoder<'_>, value: u64) -> fmt::Result {
    ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX)).encode(enc)
}

/// Encode `h` (counts per bucket of [`LATENCY_BUCKETS`], then above them) as a histogram.
///
/// # Errors
/// The encoder's.
pub fn histogram(enc: &mut MetricEncoder<'_>, h: &LatencyHistogram) -> fmt::Result {
    let buckets: Vec<(f64, u64)> = LATENCY_BUCKETS
        .iter()
        .map(|b| b.as_secs_f64())
        // prometheus-client writes f64::MAX as `+Inf`.
        .chain(std::iter::once(f64::MAX))
        .zip(h.counts)
        .collect();
    enc.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
        h.sum.as_secs_f64(),
        h.count(),
        &buckets,
        None,
    )
}

/// A pool's own counters; atomics, `Relaxed`, bumped by calls, read at scrape time.
#[derive(Debug, Default)]
pub(crate) struct PoolMetrics {
    pub(crate) attempts: AtomicU64,
    pub(crate) retries: AtomicU64,
    pub(crate) hedges: AtomicU64,
    pub(crate) budget_exhausted: AtomicU64,
    pub(crate) pass_over: AtomicU64,
    /// scheduled, succeeded, dropped, exhausted.
    pub(crate) failback: [AtomicU64; 4],
}

/// Failback results, in the order of [`PoolMetrics::failback`].
pub(crate) const FAILBACK: [&str; 4] = ["scheduled", "succeeded", "dropped", "exhausted"];

/// Bump a counter.
#[inline]
pub(crate) fn inc(counter: &AtomicU64) {
    counter.fetch_add(1, Relaxed);
}

/// What a pool collector reads: object-safe, so the collector needs no generic parameters.
pub(crate) trait PoolView: Send + Sync + 'static {
    fn name(&self) -> &str;
    fn snapshot(&self) -> Arc<Snapshot>;
    fn metrics(&self) -> &PoolMetrics;
    fn ejections(&self) -> Arc<HashMap<EndpointKey, u64>>;
    fn discovery(&self) -> Option<Arc<ControllerMetrics>>;
    fn services(&self) -> usize;
    fn shadow(&self) -> Option<lbkit_core::shadow::ShadowReport>;
}

/// One service's shadow, for [`encode_shadows`].
#[derive(Debug)]
pub struct ShadowRow<'a> {
    /// The `service` label.
    pub service: &'a str,
    /// What the shadow saw.
    pub report: &'a lbkit_core::shadow::ShadowReport,
}

/// The shadow families of the table above, for every service that runs a shadow (nothing when
/// none does).
///
/// # Errors
/// The encoder's.
pub fn encode_shadows(enc: &mut DescriptorEncoder<'_>, rows: &[ShadowRow<'_>]) -> fmt::Result {
    if rows.is_empty() {
        return Ok(());
    }
    type Value = fn(&lbkit_core::shadow::ShadowReport) -> u64;
    let counters: [(&str, &str, Value); 2] = [
        (
            "lbkit_shadow_picks",
            "First attempts a shadow candidate strategy observed.",
            |r| r.picks,
        ),
        (
            "lbkit_shadow_disagreements",
            "First attempts the shadow candidate would have sent to another endpoint (or to none).",
            |r| r.disagreements,
        ),
    ];
    for (name, help, value) in counters {
        let mut f = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
        for row in rows {
            let labels = [
                ("service", row.service),
                ("candidate", row.report.candidate.as_str()),
            ];
            ConstCounter::new(value(row.report)).encode(f.encode_family(&labels)?)?;
        }
    }
    let mut f = enc.encode_descriptor(
        "lbkit_shadow_endpoint_picks",
        "First attempts per endpoint, by the live strategy or the shadow candidate.",
        None,
        MetricType::Counter,
    )?;
    for row in rows {
        for e in &row.report.endpoints {
            for (by, n) in [("live", e.live), ("candidate", e.candidate)] {
                let labels = [
                    ("service", row.service),
                    ("candidate", row.report.candidate.as_str()),
                    ("endpoint", e.address.as_str()),
                    ("by", by),
                ];
                ConstCounter::new(n).encode(f.encode_family(&labels)?)?;
            }
        }
    }
    Ok(())
}

/// A pool's families, for a `prometheus_client` registry; see
/// [`Pool::collector`](crate::Pool::collector).
pub struct PoolCollector(pub(crate) Arc<dyn PoolView>);

impl fmt::Debug for PoolCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PoolCollector")
            .field(&self.0.name())
            .finish()
    }
}

impl prometheus_client::collector::Collector for PoolCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> fmt::Result {
        let p = &*self.0;
        let (name, m) = (p.name(), p.metrics());
        let snapshot = p.snapshot();
        let ejections = p.ejections();
        let rows = [EndpointRows {
            service: name,
            snapshot: &snapshot,
            ejections: &ejections,
        }];
        encode_endpoints(&mut enc, &rows)?;
        let discovery = p.discovery();
        let row = ServiceRow {
            service: name,
            retries: m.retries.load(Relaxed),
            retries_refused: m.budget_exhausted.load(Relaxed),
            hedges: m.hedges.load(Relaxed),
            discovery: discovery.as_deref(),
        };
        encode_services(&mut enc, &[row])?;
        if let Some(report) = p.shadow() {
            encode_shadows(
                &mut enc,
                &[ShadowRow {
                    service: name,
                    report: &report,
                }],
            )?;
        }
        encode_pool(&mut enc, name, m, p.services())
    }
}

/// The pool's own families for service `name`: attempts, candidates passed over, failback
/// retries by result, and the endpoints with a client service (`services`).
fn encode_pool(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    m: &PoolMetrics,
    services: usize,
) -> fmt::Result {
    let service = [("service", name)];
    for (family, help, counter) in [
        (
            "lbkit_attempts",
            "Attempts sent by the pool (retries and forks included).",
            &m.attempts,
        ),
        (
            "lbkit_pass_over",
            "Candidates passed over because their service was not ready or missing.",
            &m.pass_over,
        ),
    ] {
        let mut f = enc.encode_descriptor(family, help, None, MetricType::Counter)?;
        ConstCounter::new(counter.load(Relaxed)).encode(f.encode_family(&service)?)?;
    }
    let mut f = enc.encode_descriptor(
        "lbkit_failback",
        "Failback retries by result.",
        None,
        MetricType::Counter,
    )?;
    for (result, n) in FAILBACK.iter().zip(&m.failback) {
        let labels = [("service", name), ("result", result)];
        ConstCounter::new(n.load(Relaxed)).encode(f.encode_family(&labels)?)?;
    }
    let mut f = enc.encode_descriptor(
        "lbkit_endpoints",
        "Endpoints with a client service.",
        None,
        MetricType::Gauge,
    )?;
    gauge(f.encode_family(&service)?, services as u64)
}
