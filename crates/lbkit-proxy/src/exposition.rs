//! `/metrics`: the proxy's numbers in the OpenMetrics text format (which Prometheus reads),
//! written by the Prometheus project's Rust client (`prometheus-client`) from the atomics the
//! request path already keeps — the service counters
//! ([`ServiceMetrics`](crate::metrics::ServiceMetrics)), each endpoint's lock-free statistics,
//! the control loop's counters — at scrape time, so the request path does no extra work. Each
//! family is written whole, `# HELP` and `# TYPE` first, then its samples for every service.
//! The endpoint, retry and discovery families are lbkit-tower's (`lbkit_tower::telemetry`): a
//! tower pool writes the same names and labels.

use std::fmt;
use std::sync::Arc;

use lbkit_core::Snapshot;
use lbkit_tower::telemetry::{
    encode_endpoints, encode_services, encode_shadows, histogram, EndpointRows, ServiceRow,
    ShadowRow,
};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::service::Service;

/// The content type of the document.
pub(crate) const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// One scrape's view: every service with its current snapshot, and the client connections.
#[derive(Debug)]
struct Scrape {
    services: Vec<(String, Arc<Service>, Arc<Snapshot>)>,
    connections: (usize, usize),
    per_worker: Vec<usize>,
    defences: [u64; 4],
}

/// The `/metrics` document for `services` and `connections` (open, most allowed), the
/// connections each worker thread serves (`per_worker`; empty with one worker), and what the
/// client connections' defences did (`defences`, `Defences::read`).
pub(crate) fn document<'a>(
    services: impl Iterator<Item = (&'a str, &'a Arc<Service>)>,
    connections: (usize, usize),
    per_worker: Vec<usize>,
    defences: [u64; 4],
) -> String {
    let services = services
        .map(|(n, s)| (n.to_owned(), s.clone(), s.active().balancer.snapshot()))
        .collect();
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Scrape {
        services,
        connections,
        per_worker,
        defences,
    }));
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
    out
}

/// How a per-service sample's value is read.
type ServiceValue = fn(&Service) -> u64;

impl Collector for Scrape {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> fmt::Result {
        self.service_families(&mut enc)?;
        self.endpoint_families(&mut enc)?;
        let shadows: Vec<_> = self
            .services
            .iter()
            .filter_map(|(name, s, _)| s.shadow_report().map(|r| (name, r)))
            .collect();
        let rows: Vec<ShadowRow<'_>> = shadows
            .iter()
            .map(|(service, report)| ShadowRow { service, report })
            .collect();
        encode_shadows(&mut enc, &rows)?;
        let (open, max) = self.connections;
        for (name, help, value) in [
            (
                "lbkit_proxy_client_connections",
                "Client connections open now, upgraded tunnels included.",
                open,
            ),
            (
                "lbkit_proxy_client_connections_max",
                "Most client connections allowed at once (limits.max_connections).",
                max,
            ),
        ] {
            let f = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX)).encode(f)?;
        }
        self.defence_families(&mut enc)?;
        if !self.per_worker.is_empty() {
            let mut f = enc.encode_descriptor(
                "lbkit_proxy_worker_connections",
                "Client connections each worker thread serves now (kept even: a worker serving \
                 more than the least loaded hands a new connection over).",
                None,
                MetricType::Gauge,
            )?;
            for (w, &n) in self.per_worker.iter().enumerate() {
                let worker = (w + 1).to_string();
                let n = i64::try_from(n).unwrap_or(i64::MAX);
                ConstGauge::new(n).encode(f.encode_family(&[("worker", worker.as_str())])?)?;
            }
        }
        Ok(())
    }
}

impl Scrape {
    /// What the client connections' defences did (`hub::Defences`).
    fn defence_families(&self, enc: &mut DescriptorEncoder<'_>) -> fmt::Result {
        let [premature, calmed, capped, idle] = self.defences;
        for (name, help, value) in [
            (
                "lbkit_proxy_http2_premature_resets",
                "HTTP/2 streams their client reset before the answer started.",
                premature,
            ),
            (
                "lbkit_proxy_http2_stream_idle_resets",
                "HTTP/2 streams reset (CANCEL) after limits.stream_idle_timeout_ms without a \
                 byte either way, or their route's timeout_ms waiting for the client's window.",
                idle,
            ),
        ] {
            let f = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
            ConstCounter::new(value).encode(f)?;
        }
        let mut f = enc.encode_descriptor(
            "lbkit_proxy_client_connections_limited",
            "Client connections ended by a limit: premature_resets (HTTP/2 GOAWAY \
             ENHANCE_YOUR_CALM, limits.max_premature_resets) or max_requests \
             (limits.max_requests_per_connection).",
            None,
            MetricType::Counter,
        )?;
        for (reason, value) in [("premature_resets", calmed), ("max_requests", capped)] {
            ConstCounter::new(value).encode(f.encode_family(&[("reason", reason)])?)?;
        }
        Ok(())
    }

    /// Per-service families: the shared retry and control-loop ones, and requests as the
    /// proxy saw them.
    fn service_families(&self, enc: &mut DescriptorEncoder<'_>) -> fmt::Result {
        let rows: Vec<ServiceRow<'_>> = self
            .services
            .iter()
            .map(|(name, s, _)| ServiceRow {
                service: name,
                retries: s.metrics().retries(),
                retries_refused: s.metrics().retries_refused(),
                hedges: s.metrics().hedges(),
                discovery: s.discovery(),
            })
            .collect();
        encode_services(enc, &rows)?;
        let counters: [(&str, &str, ServiceValue); 2] = [
            (
                "lbkit_proxy_requests",
                "Requests received, per service.",
                |s| s.metrics().requests(),
            ),
            (
                "lbkit_proxy_failures",
                "Requests answered with a failure (5xx from the upstream or the proxy).",
                |s| s.metrics().failures(),
            ),
        ];
        for (name, help, value) in counters {
            let mut f = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (service, s, _) in &self.services {
                let labels = [("service", service.as_str())];
                ConstCounter::new(value(s)).encode(f.encode_family(&labels)?)?;
            }
        }
        let mut f = enc.encode_descriptor(
            "lbkit_proxy_in_flight",
            "Requests in flight, per service.",
            None,
            MetricType::Gauge,
        )?;
        for (service, s, _) in &self.services {
            let n = i64::try_from(s.metrics().in_flight()).unwrap_or(i64::MAX);
            ConstGauge::new(n).encode(f.encode_family(&[("service", service.as_str())])?)?;
        }
        let mut f = enc.encode_descriptor(
            "lbkit_proxy_request_duration_seconds",
            "Time from a request's arrival to its answer, retries included.",
            None,
            MetricType::Histogram,
        )?;
        for (service, s, _) in &self.services {
            let labels = [("service", service.as_str())];
            histogram(&mut f.encode_family(&labels)?, &s.metrics().histogram())?;
        }
        Ok(())
    }

    /// Per-endpoint families (lbkit-tower's, the same names a tower pool writes).
    fn endpoint_families(&self, enc: &mut DescriptorEncoder<'_>) -> fmt::Result {
        let ejections: Vec<_> = self
            .services
            .iter()
            .map(|(_, s, _)| s.ejections())
            .collect();
        let rows: Vec<EndpointRows<'_>> = self
            .services
            .iter()
            .zip(&ejections)
            .map(|((name, _, snapshot), ejections)| EndpointRows {
                service: name,
                snapshot,
                ejections,
            })
            .collect();
        encode_endpoints(enc, &rows)
    }
}
