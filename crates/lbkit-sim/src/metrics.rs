//! What a run measures, in constant memory: an HDR histogram of latencies, counters, a bounded
//! time series for the plots, and the time integral behind the Little's law check.

use hdrhistogram::Histogram;
use serde::Serialize;

/// One server's row in a result.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ServerResult {
    /// Server name.
    pub name: String,
    /// Share of all attempts sent to it.
    pub share: f64,
    /// Most calls on it at once (served plus waiting).
    pub max_queue: usize,
}

/// Little's law, measured: L (time-average requests in the system) and λ·W.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Little {
    /// Time-average number of requests in the system.
    pub l: f64,
    /// Throughput of finished requests × their mean time in the system.
    pub lambda_w: f64,
}

/// The outcome of one strategy on one scenario.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StrategyResult {
    /// Strategy label (`name` or `name:param=value`).
    pub strategy: String,
    /// Client requests simulated.
    pub requests: u64,
    /// Virtual seconds from the first arrival to the last response.
    pub duration_s: f64,
    /// Successful requests per virtual second.
    pub throughput: f64,
    /// Latency of successful requests, ms.
    pub mean_ms: f64,
    /// Median, ms.
    pub p50_ms: f64,
    /// 90th percentile, ms.
    pub p90_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// 99.9th percentile, ms.
    pub p999_ms: f64,
    /// Share of requests that ended in an error.
    pub error_rate: f64,
    /// Share of requests that ended in a timeout.
    pub timeout_rate: f64,
    /// Attempts per request (1 without retries).
    pub attempts_per_request: f64,
    /// Per server.
    pub servers: Vec<ServerResult>,
    /// Little's law check.
    pub little: Little,
    /// Most requests alive at once (the simulator's memory high-water mark; flat in the
    /// number of requests simulated).
    pub peak_live_requests: usize,
    /// Connections per server: how many clients (balancers) sent it at least one call — the
    /// busiest server's, and the mean over the servers.
    pub connections_max: u32,
    /// The mean of connections per server.
    pub connections_mean: f64,
    /// The busiest server's calls over the mean per server (1.0 = perfectly even).
    pub load_spread: f64,
    /// Data behind the plots (not in the JSON report).
    #[serde(skip)]
    pub series: Series,
}

/// Time series sampled at a fixed number of points per run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Series {
    /// Sample times, s.
    pub t: Vec<f64>,
    /// Per sample: each server's share of the attempts in the interval.
    pub share: Vec<Vec<f64>>,
    /// Per sample: calls on the watched server.
    pub watch_queue: Vec<f64>,
    /// Latency CDF: (ms, cumulative fraction).
    pub cdf: Vec<(f64, f64)>,
}

/// How a client request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    Ok,
    Error,
    Timeout,
}

#[derive(Debug)]
pub(crate) struct Collector {
    latency: Histogram<u64>,
    ok: u64,
    errors: u64,
    timeouts: u64,
    finished: u64,
    sojourn_ns: f64,
    pub(crate) attempts: Vec<u64>,
    pub(crate) max_queue: Vec<usize>,
    in_system: u64,
    last_change: u64,
    area: f64,
    first_start: Option<u64>,
    last_end: u64,
    interval: Vec<u64>,
    series: Series,
    /// Which (balancer, server) pairs carried a call: `balancer * servers + server`, a bit each.
    pairs: Vec<u64>,
    servers: usize,
}

impl Collector {
    pub(crate) fn new(servers: usize, balancers: usize) -> Collector {
        Collector {
            latency: Histogram::new_with_bounds(1_000, 3_600_000_000_000, 3)
                .expect("valid histogram bounds"),
            ok: 0,
            errors: 0,
            timeouts: 0,
            finished: 0,
            sojourn_ns: 0.0,
            attempts: vec![0; servers],
            max_queue: vec![0; servers],
            in_system: 0,
            last_change: 0,
            area: 0.0,
            first_start: None,
            last_end: 0,
            interval: vec![0; servers],
            series: Series::default(),
            pairs: vec![0; (servers * balancers).div_ceil(64)],
            servers,
        }
    }

    /// Balancer `lb` sent server `server` a call (so holds a connection to it).
    pub(crate) fn connect(&mut self, lb: usize, server: usize) {
        let bit = lb * self.servers + server;
        if let Some(w) = self.pairs.get_mut(bit / 64) {
            *w |= 1 << (bit % 64);
        }
    }

    /// Per server, how many balancers sent it a call.
    fn connections(&self) -> Vec<u32> {
        let mut per = vec![0u32; self.servers];
        for (w, &word) in self.pairs.iter().enumerate() {
            let mut bits = word;
            while bits != 0 {
                let b = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let server = (w * 64 + b) % self.servers.max(1);
                per[server] += 1;
            }
        }
        per
    }

    fn advance(&mut self, now: u64) {
        self.area += self.in_system as f64 * now.saturating_sub(self.last_change) as f64;
        self.last_change = now;
    }

    pub(crate) fn request_started(&mut self, now: u64) {
        self.advance(now);
        self.in_system += 1;
        self.first_start.get_or_insert(now);
    }

    pub(crate) fn request_ended(&mut self, started: u64, now: u64, end: End) {
        self.advance(now);
        self.in_system -= 1;
        self.finished += 1;
        self.last_end = self.last_end.max(now);
        let t = now - started;
        self.sojourn_ns += t as f64;
        match end {
            End::Ok => {
                self.ok += 1;
                self.latency.saturating_record(t.max(1_000));
            }
            End::Error => self.errors += 1,
            End::Timeout => self.timeouts += 1,
        }
    }

    pub(crate) fn attempt(&mut self, server: usize, outstanding: usize) {
        self.attempts[server] += 1;
        self.interval[server] += 1;
        self.max_queue[server] = self.max_queue[server].max(outstanding);
    }

    pub(crate) fn sample(&mut self, now: u64, watch_queue: usize) {
        let total: u64 = self.interval.iter().sum();
        self.series.t.push(now as f64 / 1e9);
        self.series.share.push(
            self.interval
                .iter()
                .map(|&a| {
                    if total == 0 {
                        0.0
                    } else {
                        a as f64 / total as f64
                    }
                })
                .collect(),
        );
        self.series.watch_queue.push(watch_queue as f64);
        self.interval.iter_mut().for_each(|a| *a = 0);
    }

    pub(crate) fn finish(
        mut self,
        strategy: String,
        names: &[String],
        peak_live_requests: usize,
    ) -> StrategyResult {
        let start = self.first_start.unwrap_or(0);
        let duration = (self.last_end.saturating_sub(start)).max(1) as f64 / 1e9;
        let q = |p: f64| self.latency.value_at_quantile(p) as f64 / 1e6;
        let n = self.finished.max(1) as f64;
        let total_attempts: u64 = self.attempts.iter().sum();
        self.series.cdf = cdf_points(&self.latency);
        let connections = self.connections();
        let servers = self.servers.max(1) as f64;
        StrategyResult {
            strategy,
            requests: self.finished,
            duration_s: duration,
            throughput: self.ok as f64 / duration,
            mean_ms: if self.ok == 0 {
                0.0
            } else {
                self.latency.mean() / 1e6
            },
            p50_ms: q(0.5),
            p90_ms: q(0.9),
            p99_ms: q(0.99),
            p999_ms: q(0.999),
            error_rate: self.errors as f64 / n,
            timeout_rate: self.timeouts as f64 / n,
            attempts_per_request: total_attempts as f64 / n,
            servers: self.server_results(names, total_attempts),
            little: self.little(start, n),
            peak_live_requests,
            connections_max: connections.iter().copied().max().unwrap_or(0),
            connections_mean: connections.iter().map(|&c| f64::from(c)).sum::<f64>() / servers,
            load_spread: self.load_spread(total_attempts, servers),
            series: self.series,
        }
    }
}

impl Collector {
    /// Each server's share of the `total` attempts and its longest queue, named by `names`.
    fn server_results(&self, names: &[String], total: u64) -> Vec<ServerResult> {
        names
            .iter()
            .enumerate()
            .map(|(i, name)| ServerResult {
                name: name.clone(),
                share: if total == 0 {
                    0.0
                } else {
                    self.attempts[i] as f64 / total as f64
                },
                max_queue: self.max_queue[i],
            })
            .collect()
    }

    /// The busiest server's attempts over the mean of `servers` (0 with no attempt).
    fn load_spread(&self, total: u64, servers: f64) -> f64 {
        let mean_load = total as f64 / servers;
        let max_load = self.attempts.iter().copied().max().unwrap_or(0) as f64;
        if mean_load > 0.0 {
            max_load / mean_load
        } else {
            0.0
        }
    }

    /// Little's law's two sides from `start` on, over `n` finished requests (at least 1).
    fn little(&self, start: u64, n: f64) -> Little {
        let span = (self.last_change.saturating_sub(start)).max(1) as f64;
        Little {
            l: self.area / span,
            lambda_w: (self.finished as f64 / span) * (self.sojourn_ns / n),
        }
    }
}

fn cdf_points(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    if h.is_empty() {
        return Vec::new();
    }
    (0..=200)
        .map(|i| {
            let q = 1.0 - 10f64.powf(-(f64::from(i) / 50.0)); // denser toward the tail, up to 0.9999
            (h.value_at_quantile(q.max(0.0)) as f64 / 1e6, q)
        })
        .collect()
}
