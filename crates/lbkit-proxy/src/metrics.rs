//! Per-service request counters and a latency histogram: atomics, `Relaxed`, written on the
//! request path without locks and read by the admin API.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds of the latency buckets, seconds (Prometheus' default buckets, which span
/// 5 ms to 10 s; a loopback proxy adds the 1 ms and 2.5 ms buckets below them).
pub const LATENCY_BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Counters of one service, as seen by the proxy (one request may be several upstream calls).
#[derive(Debug, Default)]
pub struct ServiceMetrics {
    requests: AtomicU64,
    failures: AtomicU64,
    retries: AtomicU64,
    retries_refused: AtomicU64,
    in_flight: AtomicU64,
    /// Count per bucket of [`LATENCY_BUCKETS`], then one for `+Inf`.
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    latency_sum_ns: AtomicU64,
}

// === impl ServiceMetrics ===

impl ServiceMetrics {
    /// A request starts.
    pub fn start(&self) {
        self.requests.fetch_add(1, Relaxed);
        self.in_flight.fetch_add(1, Relaxed);
    }

    /// A request ends after `latency`, answered with a failure (5xx or a proxy error) or not.
    pub fn finish(&self, latency: Duration, failed: bool) {
        self.in_flight.fetch_sub(1, Relaxed);
        if failed {
            self.failures.fetch_add(1, Relaxed);
        }
        let secs = latency.as_secs_f64();
        let i = LATENCY_BUCKETS
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.buckets[i].fetch_add(1, Relaxed);
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.latency_sum_ns.fetch_add(ns, Relaxed);
    }

    /// A retry was sent.
    pub fn retried(&self) {
        self.retries.fetch_add(1, Relaxed);
    }

    /// A retry was refused by the budget.
    pub fn retry_refused(&self) {
        self.retries_refused.fetch_add(1, Relaxed);
    }

    /// Requests received.
    pub fn requests(&self) -> u64 {
        self.requests.load(Relaxed)
    }

    /// Requests answered with a failure.
    pub fn failures(&self) -> u64 {
        self.failures.load(Relaxed)
    }

    /// Retries sent.
    pub fn retries(&self) -> u64 {
        self.retries.load(Relaxed)
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Relaxed)
    }

    /// Append this service's Prometheus samples to `out`.
    pub fn render(&self, service: &str, out: &mut String) {
        let l = format!("service=\"{}\"", escape(service));
        let _ = writeln!(out, "lbkit_proxy_requests_total{{{l}}} {}", self.requests());
        let _ = writeln!(out, "lbkit_proxy_failures_total{{{l}}} {}", self.failures());
        let _ = writeln!(out, "lbkit_proxy_retries_total{{{l}}} {}", self.retries());
        let refused = self.retries_refused.load(Relaxed);
        let _ = writeln!(out, "lbkit_proxy_retries_refused_total{{{l}}} {refused}");
        let _ = writeln!(out, "lbkit_proxy_in_flight{{{l}}} {}", self.in_flight());
        let mut cumulative = 0;
        for (i, bound) in LATENCY_BUCKETS.iter().enumerate() {
            cumulative += self.buckets[i].load(Relaxed);
            let _ = writeln!(
                out,
                "lbkit_proxy_request_duration_seconds_bucket{{{l},le=\"{bound}\"}} {cumulative}"
            );
        }
        cumulative += self.buckets[LATENCY_BUCKETS.len()].load(Relaxed);
        let _ = writeln!(
            out,
            "lbkit_proxy_request_duration_seconds_bucket{{{l},le=\"+Inf\"}} {cumulative}"
        );
        let sum = self.latency_sum_ns.load(Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "lbkit_proxy_request_duration_seconds_sum{{{l}}} {sum}");
        let _ = writeln!(
            out,
            "lbkit_proxy_request_duration_seconds_count{{{l}}} {cumulative}"
        );
    }
}

/// Escape a Prometheus label value.
pub(crate) fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative() {
        let m = ServiceMetrics::default();
        for ms in [0, 3, 700, 20_000] {
            m.start();
            m.finish(Duration::from_millis(ms), ms > 1000);
        }
        let mut out = String::new();
        m.render("api", &mut out);
        assert!(out.contains(
            "lbkit_proxy_request_duration_seconds_bucket{service=\"api\",le=\"0.001\"} 1"
        ));
        assert!(out.contains("le=\"1\"} 3"));
        assert!(out.contains("le=\"+Inf\"} 4"));
        assert!(out.contains("lbkit_proxy_failures_total{service=\"api\"} 1"));
    }
}
