//! `/metrics`: the proxy's numbers in the OpenMetrics text format (which Prometheus reads),
//! written by the Prometheus project's Rust client (`prometheus-client`) from the atomics the
//! request path already keeps — the service counters ([`ServiceMetrics`](crate::metrics::ServiceMetrics)),
//! each endpoint's lock-free statistics, the control loop's counters — at scrape time, so the
//! request path does no extra work. Each family is written whole, `# HELP` and `# TYPE`
//! first, then its samples for every service.

use std::fmt;

use lbkit_core::{EndpointIdx, LatencyHistogram, Snapshot, LATENCY_BUCKETS};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
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
    services: Vec<(String, std::sync::Arc<Service>, std::sync::Arc<Snapshot>)>,
    connections: (usize, usize),
}

/// The `/metrics` document for `services` and `connections` (open, most allowed).
pub(crate) fn document<'a>(
    services: impl Iterator<Item = (&'a str, &'a std::sync::Arc<Service>)>,
    connections: (usize, usize),
) -> String {
    let services = services
        .map(|(n, s)| (n.to_owned(), s.clone(), s.active().balancer.snapshot()))
        .collect();
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Scrape {
        services,
        connections,
    }));
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
    out
}

type Encode<'e> = MetricEncoder<'e>;

/// How a per-service sample's value is read.
type ServiceValue = fn(&Service) -> u64;

/// A family's name, help text, and how to read one sample's value.
type Family<F> = (&'static str, &'static str, F);

impl Collector for Scrape {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> fmt::Result {
        self.services_families(&mut enc)?;
        self.endpoint_families(&mut enc)?;
        let (open, max) = self.connections;
        let f = enc.encode_descriptor(
            "lbkit_proxy_client_connections",
            "Client connections open now, upgraded tunnels included.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(open as i64).encode(f)?;
        let f = enc.encode_descriptor(
            "lbkit_proxy_client_connections_max",
            "Most client connections allowed at once (limits.max_connections).",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(max as i64).encode(f)
    }
}

impl Scrape {
    /// Per-service families: requests as the proxy saw them, and the control loop.
    fn services_families(&self, enc: &mut DescriptorEncoder<'_>) -> fmt::Result {
        let counters: [Family<ServiceValue>; 7] = [
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
            (
                "lbkit_proxy_retries",
                "Retries sent to another endpoint.",
                |s| s.metrics().retries(),
            ),
            (
                "lbkit_proxy_retries_refused",
                "Retries not sent because the retry budget was spent.",
                |s| s.metrics().retries_refused(),
            ),
            (
                "lbkit_proxy_discovery_published",
                "Endpoint snapshots published by the service's control loop.",
                |s| s.discovery().map_or(0, |d| d.published()),
            ),
            (
                "lbkit_proxy_discovery_source_errors",
                "Errors reported by the endpoint source (the last good set stayed).",
                |s| s.discovery().map_or(0, |d| d.source_errors()),
            ),
            (
                "lbkit_proxy_discovery_empty_held",
                "Source updates held back by empty-push protection.",
                |s| s.discovery().map_or(0, |d| d.empty_held()),
            ),
        ];
        for (name, help, value) in counters {
            let mut f = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (service, s, _) in &self.services {
                ConstCounter::new(value(s))
                    .encode(f.encode_family(&[("service", service.as_str())])?)?;
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
            histogram(
                &mut f.encode_family(&[("service", service.as_str())])?,
                &s.metrics().histogram(),
            )?;
        }
        Ok(())
    }

    /// Per-endpoint families, from each endpoint's statistics in the current snapshot.
    fn endpoint_families(&self, enc: &mut DescriptorEncoder<'_>) -> fmt::Result {
        type Value = fn(&Service, &Snapshot, EndpointIdx) -> u64;
        let counters: [Family<Value>; 3] = [
            (
                "lbkit_proxy_endpoint_requests",
                "Calls to the endpoint that finished (successes, failures, cancellations).",
                |_, s, i| s.endpoint(i).stats().total(),
            ),
            (
                "lbkit_proxy_endpoint_failures",
                "Calls to the endpoint recorded as failures.",
                |_, s, i| s.endpoint(i).stats().failures(),
            ),
            (
                "lbkit_proxy_endpoint_ejections",
                "Times outlier detection ejected the endpoint.",
                |svc, s, i| {
                    svc.ejections()
                        .get(s.endpoint(i).key())
                        .copied()
                        .unwrap_or(0)
                },
            ),
        ];
        for (name, help, value) in counters {
            let mut f = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
            self.each_endpoint(|labels, svc, snap, i| {
                ConstCounter::new(value(svc, snap, i)).encode(f.encode_family(labels)?)
            })?;
        }
        let gauges: [Family<Value>; 2] = [
            (
                "lbkit_proxy_endpoint_in_flight",
                "Calls to the endpoint in flight.",
                |_, s, i| u64::from(s.endpoint(i).stats().in_flight()),
            ),
            (
                "lbkit_proxy_endpoint_eligible",
                "1 when the endpoint may be picked (healthy, weighted, not ejected), else 0.",
                |_, s, i| u64::from(s.is_eligible(i)),
            ),
        ];
        for (name, help, value) in gauges {
            let mut f = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
            self.each_endpoint(|labels, svc, snap, i| {
                let v = i64::try_from(value(svc, snap, i)).unwrap_or(i64::MAX);
                ConstGauge::new(v).encode(f.encode_family(labels)?)
            })?;
        }
        let mut f = enc.encode_descriptor(
            "lbkit_proxy_endpoint_call_duration_seconds",
            "Latency of every finished call to the endpoint, success or failure.",
            None,
            MetricType::Histogram,
        )?;
        self.each_endpoint(|labels, _, snap, i| {
            histogram(
                &mut f.encode_family(labels)?,
                &snap.endpoint(i).stats().latency_histogram(),
            )
        })
    }

    /// Run `f` for every endpoint of every service with its labels.
    fn each_endpoint(
        &self,
        mut f: impl FnMut(&[(&str, &str); 2], &Service, &Snapshot, EndpointIdx) -> fmt::Result,
    ) -> fmt::Result {
        for (service, svc, snap) in &self.services {
            for (i, e) in snap.endpoints().iter().enumerate() {
                let labels = [("service", service.as_str()), ("endpoint", e.address())];
                f(&labels, svc, snap, EndpointIdx::new(i))?;
            }
        }
        Ok(())
    }
}

/// Encode `h` (counts per bucket of [`LATENCY_BUCKETS`], then above them) as a histogram.
fn histogram(enc: &mut Encode<'_>, h: &LatencyHistogram) -> fmt::Result {
    let buckets: Vec<(f64, u64)> = LATENCY_BUCKETS
        .iter()
        .map(|b| b.as_secs_f64())
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
