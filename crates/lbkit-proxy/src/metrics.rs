//! Per-service request counters and a latency histogram: atomics, `Relaxed`, written on the
//! request path without locks and read by the admin API.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use lbkit_core::LatencyHistogram;
/// Upper bounds of the latency buckets: lbkit-core's (Prometheus' default buckets, 5 ms to
/// 10 s, plus 1 ms and 2.5 ms below them), shared with the per-endpoint histograms.
pub use lbkit_core::LATENCY_BUCKETS;

/// Counters of one service, as seen by the proxy (one request may be several upstream calls).
///
/// One shard of counters per worker thread (each on its own cache lines), so worker threads
/// never write the same line; readers add the shards up.
#[derive(Debug)]
pub struct ServiceMetrics {
    shards: Box<[Shard]>,
}

#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard {
    requests: AtomicU64,
    failures: AtomicU64,
    retries: AtomicU64,
    retries_refused: AtomicU64,
    hedges: AtomicU64,
    /// Starts minus ends on this shard, wrapping: a request may end on another shard than it
    /// started on (a multi-threaded runtime), only the sum over the shards means anything.
    in_flight: AtomicU64,
    /// Count per bucket of [`LATENCY_BUCKETS`], then one for `+Inf`.
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    latency_sum_ns: AtomicU64,
}

impl Default for ServiceMetrics {
    fn default() -> Self {
        ServiceMetrics::with_shards(1)
    }
}

// === impl ServiceMetrics ===

impl ServiceMetrics {
    /// Counters with `shards` shards (at least one); a thread writes shard
    /// `worker index % shards`.
    pub fn with_shards(shards: usize) -> Self {
        ServiceMetrics {
            shards: (0..shards.max(1)).map(|_| Shard::default()).collect(),
        }
    }

    #[inline]
    fn shard(&self) -> &Shard {
        &self.shards[crate::worker::index() % self.shards.len()]
    }

    fn sum(&self, field: impl Fn(&Shard) -> &AtomicU64) -> u64 {
        self.shards
            .iter()
            .fold(0u64, |n, s| n.wrapping_add(field(s).load(Relaxed)))
    }

    /// A request starts.
    pub fn start(&self) {
        let s = self.shard();
        s.requests.fetch_add(1, Relaxed);
        s.in_flight.fetch_add(1, Relaxed);
    }

    /// A request ends after `latency`, answered with a failure (5xx or a proxy error) or not.
    pub fn finish(&self, latency: Duration, failed: bool) {
        let s = self.shard();
        s.in_flight.fetch_sub(1, Relaxed);
        if failed {
            s.failures.fetch_add(1, Relaxed);
        }
        let i = LATENCY_BUCKETS.partition_point(|&b| b < latency);
        s.buckets[i].fetch_add(1, Relaxed);
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        s.latency_sum_ns.fetch_add(ns, Relaxed);
    }

    /// A retry was sent.
    pub fn retried(&self) {
        self.shard().retries.fetch_add(1, Relaxed);
    }

    /// A hedge was sent (counted as a retry too).
    pub fn hedged(&self) {
        self.shard().hedges.fetch_add(1, Relaxed);
    }

    /// Hedges sent.
    pub fn hedges(&self) -> u64 {
        self.sum(|s| &s.hedges)
    }

    /// A retry was refused by the budget.
    pub fn retry_refused(&self) {
        self.shard().retries_refused.fetch_add(1, Relaxed);
    }

    /// Requests received.
    pub fn requests(&self) -> u64 {
        self.sum(|s| &s.requests)
    }

    /// Requests answered with a failure.
    pub fn failures(&self) -> u64 {
        self.sum(|s| &s.failures)
    }

    /// Retries sent.
    pub fn retries(&self) -> u64 {
        self.sum(|s| &s.retries)
    }

    /// Requests in flight (0 while an end is counted before its start is seen).
    pub fn in_flight(&self) -> u64 {
        let n = self.sum(|s| &s.in_flight);
        if n > u64::MAX / 2 {
            0
        } else {
            n
        }
    }

    /// Retries refused by the budget.
    pub fn retries_refused(&self) -> u64 {
        self.sum(|s| &s.retries_refused)
    }

    /// Latencies of the requests that ended, per bucket of [`LATENCY_BUCKETS`].
    pub fn histogram(&self) -> LatencyHistogram {
        LatencyHistogram {
            counts: std::array::from_fn(|i| self.sum(|s| &s.buckets[i])),
            sum: Duration::from_nanos(self.sum(|s| &s.latency_sum_ns)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_add_up_even_when_a_request_ends_on_another() {
        let m = ServiceMetrics::with_shards(3);
        m.start();
        m.start();
        // This thread is worker 0: move one end to shard 1 by hand.
        m.shards[1].in_flight.fetch_sub(1, Relaxed);
        assert_eq!(m.in_flight(), 1);
        m.shards[1].in_flight.fetch_sub(1, Relaxed);
        m.shards[2].in_flight.fetch_sub(1, Relaxed);
        assert_eq!(m.in_flight(), 0, "a transient negative sum reads as 0");
        m.finish(Duration::from_millis(3), true);
        assert_eq!((m.requests(), m.failures()), (2, 1));
    }

    #[test]
    fn histogram_buckets_are_upper_bounds() {
        let m = ServiceMetrics::default();
        for ms in [0, 3, 700, 20_000] {
            m.start();
            m.finish(Duration::from_millis(ms), ms > 1000);
        }
        let h = m.histogram();
        assert_eq!(h.cumulative()[0], 1, "0 ms: the 1 ms bucket");
        assert_eq!(h.cumulative()[LATENCY_BUCKETS.len()], 4, "+Inf");
        assert_eq!((m.requests(), m.failures()), (4, 1));
    }
}
