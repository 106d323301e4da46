//! Scenarios: servers, workload and events, as TOML. Every field has a default; unknown fields
//! are errors.
//!
//! ```toml
//! name = "slow-provider"
//! description = "one of ten providers is 10x slower"
//! requests = 100000            # client requests to simulate
//! seed = 1                     # default seed (the CLI's --seed wins)
//! watch = "s10"                # server whose queue is plotted (default: the slowest)
//! strategies = ["round-robin", "ketama:balance_factor=1.25"]  # default: all; NAME+hedge hedges
//!   # (workload.hedge says when), NAME+hedge=p90 or NAME+hedge=20ms with its own delay
//! compare_hedging = false      # true: run every strategy twice, as NAME and as NAME+hedge
//! refresh_ms = 1000            # how fast timer-driven strategies learn here (default: their own)
//!   # weighted-response-time: interval_ms (Ribbon's 30 s); adaptive: period_ms and blackout_ms
//!   # (gRPC's 1 s and 10 s). A strategy label that sets the parameter wins. The report warns
//!   # when a timer fires fewer than 10 times in the run: such a strategy never got a fair run.
//! report_ms = 1000             # how often servers send each balancer a load report (ORCA's
//!   # out-of-band stream): utilisation, qps and eps over the last report_ms (10 ms..60 s)
//!
//! [workload]
//! kind = "open"                # open (arrivals at `rate`) | closed (clients wait, think, repeat)
//! rate = 2000.0                # open: requests per second over all clients
//! pattern = "poisson"          # open: poisson | bursty
//! arrivals = "arrivals.csv"    # open: replay these arrival times (ms, one per line) instead of `rate`
//! burst_on_ms = 1000.0         # bursty: mean length of an on period (exponential)
//! burst_off_ms = 1000.0        # bursty: mean length of an off period (no arrivals)
//! clients = 4                  # clients (closed: concurrent callers; open: arrivals spread over them)
//! think_ms = 0.0               # closed: mean think time between calls (exponential; 0 = none)
//! balancer = "per-client"      # per-client (each client its own balancer and statistics) | shared
//! timeout_ms = 0.0             # per attempt; 0 = none. A timed-out attempt is cancelled
//! retries = 0                  # failover attempts after an error or a timeout, on untried endpoints,
//!                              # decided by lbkit-core's `Attempts` as in the tower layer and the proxy
//! deadline_ms = 0.0            # overall, per request, all attempts included; 0 = none
//! idempotent = true            # false: a server error is not retried (a refused connection is)
//! retry_budget_percent = 20.0  # retries allowed as a share of requests (the proxy's default)
//! retry_budget_min_per_sec = 10 # retries always allowed per second
//! hedge = "p95"                # the hedge delay of strategies run as `NAME+hedge`: a quantile
//!                              # of recent latencies (pNN) or a fixed delay (20ms, 1.5s); a
//!                              # hedge is an attempt: it needs `retries` >= 1 and the budget
//! key_count = 0                # request keys for hash strategies; 0 = no keys
//! key_distribution = "uniform" # uniform | zipf
//! zipf_exponent = 1.1
//! circuit_breaker = false      # Ribbon's breaker in every balancer
//! outlier_detection = false    # Envoy's outlier detection (default rules) in every balancer
//! panic_threshold = 0.5        # Envoy's panic threshold (0 = off)
//!
//! [[server]]
//! name = "s"                   # names get an index when count > 1: s1, s2, ...
//! count = 1
//! weight = 100
//! zone = "eu-1"                # optional
//! concurrency = 4              # requests served at once
//! queue = 1000                 # waiting requests beyond which new ones are rejected (error)
//! service = { dist = "exponential", mean_ms = 10.0 }
//!   # constant{mean_ms} | exponential{mean_ms} | lognormal{median_ms, sigma}
//!   # | pareto{scale_ms, shape} | empirical{file (CSV, one latency in ms per line)}
//!   # | by-load{file (CSV rows in_flight,latency_ms: latency drawn by the server's load)}
//! slow_factor = 1.0            # service times x this
//! error_rate = 0.0             # probability that a served request fails
//! hidden_load = 0.0            # share of the server's workers (0..1) held by work the clients
//!                              # cannot see (other tenants, batch jobs): their calls get the
//!                              # rest (at least one), and its load reports count it
//! stall_every_ms = 0.0         # mean time between GC-like pauses (exponential; 0 = none)
//! stall_ms = 0.0               # length of a pause: nothing progresses on the server
//! cold_factor = 1.0            # right after joining, service times x this ...
//! cold_ms = 0.0                # ... decaying linearly to x1 over this long
//! join_ms = 0.0                # when the server joins (registration time for warm-up)
//! warmup_ms = 0.0              # Dubbo warm-up window announced by the server (0 = none)
//!
//! [[event]]                    # changes over time
//! at_ms = 20000.0
//! server = "s3"
//! action = "slow"              # slow{factor} | weight{weight} | hidden{factor: the new
//!                              # hidden_load} | crash | recover | leave | join
//!                              # | down | up (health checks mark it down: it dies, stays in
//!                              # the set unhealthy)
//! factor = 10.0
//!
//! [stages]                     # which endpoints each client may use, in front of every
//!   # strategy: lbkit_discovery::stages (subsets, localities, aperture, overprovisioning);
//!   # an aperture without client_index/client_count takes each client's own place
//! localities = { weights = { a = 1, b = 1, c = 1 } }
//! ```
//!
//! A strategy label may end in `+aperture=N` (Finagle's deterministic aperture of N, each
//! client at its own index among the clients) or `+subset=N` (gRPC A68 random subsetting of
//! N, a seed per client), after any `+hedge`; the report then counts connections per server
//! (the clients that sent it a call) and the load spread (the busiest server's calls over the
//! mean).
//!
//! # Limits
//! A scenario is input: each size it can ask for is bounded, so that a file cannot ask for
//! more memory or time than a run on one machine should take. Past a limit, parsing fails with
//! an error naming the field and the limit.
//!
//! | field | at most | why |
//! |---|---|---|
//! | `requests` | [`MAX_REQUESTS`] (10^8) | time: about a minute per strategy per 10^7 |
//! | `workload.clients` | [`MAX_CLIENTS`] (10 000) | one event stream each |
//! | clients × servers with `balancer = "per-client"` | [`MAX_CLIENT_ENDPOINTS`] (10^6) | every client keeps a balancer over every server |
//! | servers (sum of `count`) | [`MAX_SERVERS`] (10 000) | |
//! | `workload.key_count` | [`MAX_KEYS`] (10^6) | a key string each (about 40 MB at the limit) |
//! | `[[event]]`s | [`MAX_EVENTS`] (10^5) | |
//! | `workload.retries` | 16 | |
//!
//! `server.concurrency` and `server.queue` are bounds, not allocations (what they hold is
//! bounded by the requests in flight), so any `u32` is accepted.

use std::collections::HashSet;
use std::path::Path;

use serde::Deserialize;

/// Most client requests per strategy a scenario (or `--requests`) may ask for.
pub const MAX_REQUESTS: u64 = 100_000_000;
/// Most clients.
pub const MAX_CLIENTS: u32 = 10_000;
/// Most servers, after expanding `count`.
pub const MAX_SERVERS: u64 = 10_000;
/// Most (client, server) pairs with per-client balancers.
pub const MAX_CLIENT_ENDPOINTS: u64 = 1_000_000;
/// Most request keys.
pub const MAX_KEYS: u32 = 1_000_000;
/// Most events.
pub const MAX_EVENTS: usize = 100_000;

use crate::error::SimError;

/// A parsed, validated scenario.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Short name.
    pub name: String,
    /// One line.
    #[serde(default)]
    pub description: String,
    /// Client requests to simulate.
    #[serde(default = "default_requests")]
    pub requests: u64,
    /// Default seed.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Which server to follow in the queue plot (default: the slowest).
    #[serde(default)]
    pub watch: Option<String>,
    /// Strategies to compare by default (`name` or `name:param=value:...`, with `+hedge` to
    /// hedge); empty = all.
    #[serde(default)]
    pub strategies: Vec<String>,
    /// Run every strategy twice: as it is, and hedged (`NAME+hedge`).
    #[serde(default)]
    pub compare_hedging: bool,
    /// How fast timer-driven strategies learn in this scenario, ms: `weighted-response-time`'s
    /// `interval_ms` and `adaptive`'s `period_ms` and `blackout_ms`, unless a strategy label
    /// sets them (default: each strategy's own).
    #[serde(default)]
    pub refresh_ms: Option<f64>,
    /// How often servers send each balancer a load report, ms (ORCA's out-of-band stream;
    /// default 1 000): utilisation, qps and eps over the last period.
    #[serde(default = "default_report_ms")]
    pub report_ms: f64,
    /// The clients.
    #[serde(default)]
    pub workload: Workload,
    /// The servers.
    #[serde(rename = "server")]
    pub servers: Vec<ServerSpec>,
    /// Changes over time.
    #[serde(default, rename = "event")]
    pub events: Vec<EventSpec>,
    /// Stages every client's balancer runs (`[stages]`).
    #[serde(default)]
    pub stages: lbkit_discovery::stages::StagesConfig,
    /// The TOML text it was parsed from, shown in the HTML report.
    #[serde(skip)]
    pub source: String,
}

fn default_requests() -> u64 {
    100_000
}

fn default_report_ms() -> f64 {
    1_000.0
}

fn default_seed() -> u64 {
    1
}

/// Open or closed workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum WorkloadKind {
    /// Arrivals at a rate, whatever the responses.
    #[default]
    Open,
    /// Each client waits for its response, thinks, then calls again.
    Closed,
}

/// Arrival pattern of an open workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Pattern {
    /// Poisson arrivals.
    #[default]
    Poisson,
    /// Poisson arrivals during on periods, none during off periods.
    Bursty,
}

/// One balancer per client, or one for all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum BalancerMode {
    /// Each client has its own balancer and statistics (what a fleet of clients sees).
    #[default]
    PerClient,
    /// One balancer shared by every client.
    Shared,
}

/// Key popularity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum KeyDistribution {
    /// Every key equally likely.
    #[default]
    Uniform,
    /// Zipf: key k with probability ∝ 1 / k^s.
    Zipf,
}

/// The clients and what they send.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// Open or closed.
    #[serde(default)]
    pub kind: WorkloadKind,
    /// Open: requests per second.
    #[serde(default = "default_rate")]
    pub rate: f64,
    /// Open: arrival pattern.
    #[serde(default)]
    pub pattern: Pattern,
    /// Open: a file of arrival times (ms from the start, one per line) to replay instead of
    /// drawing arrivals at `rate`; at most its number of requests are simulated.
    #[serde(default)]
    pub arrivals: Option<String>,
    /// Bursty: mean on period, ms.
    #[serde(default = "default_burst")]
    pub burst_on_ms: f64,
    /// Bursty: mean off period, ms.
    #[serde(default = "default_burst")]
    pub burst_off_ms: f64,
    /// Number of clients.
    #[serde(default = "default_clients")]
    pub clients: u32,
    /// Closed: mean think time, ms.
    #[serde(default)]
    pub think_ms: f64,
    /// Balancer per client or shared.
    #[serde(default)]
    pub balancer: BalancerMode,
    /// Attempt timeout, ms (0 = none).
    #[serde(default)]
    pub timeout_ms: f64,
    /// Failover retries.
    #[serde(default)]
    pub retries: u32,
    /// Overall deadline of a request, ms, attempts included (0 = none).
    #[serde(default)]
    pub deadline_ms: f64,
    /// Requests may be sent again after they reached a server (default true).
    #[serde(default = "default_true")]
    pub idempotent: bool,
    /// Retry budget: retries as a percentage of requests over 10 s (default 20, as the proxy).
    #[serde(default = "default_budget_percent")]
    pub retry_budget_percent: f64,
    /// Retry budget: retries always allowed per second (default 10, as the proxy).
    #[serde(default = "default_budget_min")]
    pub retry_budget_min_per_sec: u32,
    /// The hedge delay of strategies run as `NAME+hedge` (`p95`, `20ms`); default p95.
    #[serde(default)]
    pub hedge: Option<String>,
    /// Number of distinct request keys (0 = none).
    #[serde(default)]
    pub key_count: u32,
    /// Key popularity.
    #[serde(default)]
    pub key_distribution: KeyDistribution,
    /// Zipf exponent.
    #[serde(default = "default_zipf")]
    pub zipf_exponent: f64,
    /// Ribbon's circuit breaker in every balancer (off: strategies are compared as they are).
    #[serde(default)]
    pub circuit_breaker: bool,
    /// Envoy's outlier detection (default rules, 10 s interval) in every balancer.
    #[serde(default)]
    pub outlier_detection: bool,
    /// Envoy's panic threshold, a fraction (0 = off).
    #[serde(default = "default_panic")]
    pub panic_threshold: f64,
}

fn default_true() -> bool {
    true
}
fn default_budget_percent() -> f64 {
    20.0
}
fn default_budget_min() -> u32 {
    10
}

fn default_panic() -> f64 {
    0.5
}

fn default_rate() -> f64 {
    1000.0
}
fn default_burst() -> f64 {
    1000.0
}
fn default_clients() -> u32 {
    4
}
fn default_zipf() -> f64 {
    1.1
}

impl Default for Workload {
    fn default() -> Self {
        toml::from_str("").expect("an empty workload table takes every default")
    }
}

/// A service-time distribution.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(tag = "dist", rename_all = "kebab-case", deny_unknown_fields)]
pub enum ServiceSpec {
    /// Always `mean_ms`.
    Constant {
        /// Milliseconds.
        mean_ms: f64,
    },
    /// Exponential with mean `mean_ms`.
    Exponential {
        /// Milliseconds.
        mean_ms: f64,
    },
    /// Log-normal with median `median_ms` and shape `sigma`.
    Lognormal {
        /// Milliseconds.
        median_ms: f64,
        /// Standard deviation of the logarithm.
        sigma: f64,
    },
    /// Pareto with scale `scale_ms` and shape `shape` (> 1 for a finite mean).
    Pareto {
        /// Milliseconds (the minimum).
        scale_ms: f64,
        /// Tail index.
        shape: f64,
    },
    /// Recorded latencies: a CSV file with one latency in ms per line (a header is skipped).
    Empirical {
        /// Path, relative to the scenario file.
        file: String,
    },
    /// Recorded latencies by load: a CSV file of `in_flight,latency_ms` rows, each the calls
    /// already on the server when a call began and how long that call took (what `lbkit sim
    /// --fit` writes from a trace). A server with it serves every call at once: its recorded
    /// latencies already hold its queueing, and a call draws from the rows of its load.
    ByLoad {
        /// Path, relative to the scenario file.
        file: String,
    },
}

impl Default for ServiceSpec {
    fn default() -> Self {
        ServiceSpec::Exponential { mean_ms: 10.0 }
    }
}

/// One server (or `count` alike).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSpec {
    /// Name (indexed when `count > 1`).
    #[serde(default = "default_server_name")]
    pub name: String,
    /// How many alike.
    #[serde(default = "one")]
    pub count: u32,
    /// Configured weight.
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// Zone.
    #[serde(default)]
    pub zone: Option<String>,
    /// Requests served at once.
    #[serde(default = "default_concurrency")]
    pub concurrency: u32,
    /// Waiting room.
    #[serde(default = "default_queue")]
    pub queue: u32,
    /// Service times.
    #[serde(default)]
    pub service: ServiceSpec,
    /// Multiplier of service times.
    #[serde(default = "one_f")]
    pub slow_factor: f64,
    /// Probability of an error.
    #[serde(default)]
    pub error_rate: f64,
    /// Share of the server's workers held by work the clients cannot see (0..1): their calls
    /// get the rest (at least one), and the server's load reports count the hidden work.
    #[serde(default)]
    pub hidden_load: f64,
    /// Mean time between pauses, ms (0 = none).
    #[serde(default)]
    pub stall_every_ms: f64,
    /// Pause length, ms.
    #[serde(default)]
    pub stall_ms: f64,
    /// Cold-start multiplier right after joining.
    #[serde(default = "one_f")]
    pub cold_factor: f64,
    /// Cold-start length, ms.
    #[serde(default)]
    pub cold_ms: f64,
    /// Join time, ms.
    #[serde(default)]
    pub join_ms: f64,
    /// Dubbo warm-up window the server announces, ms (0 = none).
    #[serde(default)]
    pub warmup_ms: f64,
}

fn default_server_name() -> String {
    "s".into()
}
fn one() -> u32 {
    1
}
fn one_f() -> f64 {
    1.0
}
fn default_weight() -> u32 {
    100
}
fn default_concurrency() -> u32 {
    4
}
fn default_queue() -> u32 {
    1000
}

/// What an event does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// Set the slow factor to `factor`.
    Slow,
    /// Set the configured weight to `weight`.
    Weight,
    /// Set the hidden load to `factor` (0..1).
    Hidden,
    /// The server dies: requests in progress fail, new ones are refused.
    Crash,
    /// The server is back.
    Recover,
    /// The server leaves the endpoint set.
    Leave,
    /// The server (re)joins the endpoint set.
    Join,
    /// The server dies and its health checks mark it down: it stays in the endpoint set,
    /// unhealthy (what priority tiers and locality weights count).
    Down,
    /// The server is back and marked up again.
    Up,
}

/// A change at a point in time.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventSpec {
    /// When, ms.
    pub at_ms: f64,
    /// Which server (by its expanded name, e.g. `s3`).
    pub server: String,
    /// What happens.
    pub action: Action,
    /// For `slow`.
    #[serde(default)]
    pub factor: Option<f64>,
    /// For `weight`.
    #[serde(default)]
    pub weight: Option<u32>,
}

const BUILT_IN: &[(&str, &str)] = &[
    (
        "slow-provider",
        include_str!("../scenarios/slow-provider.toml"),
    ),
    ("warmup", include_str!("../scenarios/warmup.toml")),
    ("degraded", include_str!("../scenarios/degraded.toml")),
    ("crash", include_str!("../scenarios/crash.toml")),
    ("hot-keys", include_str!("../scenarios/hot-keys.toml")),
    ("hidden-load", include_str!("../scenarios/hidden-load.toml")),
    ("fleet", include_str!("../scenarios/fleet.toml")),
    (
        "aperture-edges",
        include_str!("../scenarios/aperture-edges.toml"),
    ),
    ("tail", include_str!("../scenarios/tail.toml")),
    (
        "heterogeneous",
        include_str!("../scenarios/heterogeneous.toml"),
    ),
];

// === impl Scenario ===

impl Scenario {
    /// The built-in scenarios: `(name, description)`.
    pub fn built_in() -> Vec<(&'static str, String)> {
        BUILT_IN
            .iter()
            .map(|(name, text)| {
                let s = Scenario::parse(text, name).expect("built-in scenarios parse");
                (*name, s.description)
            })
            .collect()
    }

    /// A built-in scenario by name.
    ///
    /// # Errors
    /// An unknown name.
    pub fn named(name: &str) -> Result<Scenario, SimError> {
        let text = BUILT_IN
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, t)| *t)
            .ok_or_else(|| {
                let known: Vec<&str> = BUILT_IN.iter().map(|(n, _)| *n).collect();
                SimError::input(
                    name,
                    format!("unknown scenario (built-in: {})", known.join(", ")),
                )
            })?;
        Scenario::parse(text, name)
    }

    /// Read a scenario file; empirical service files are resolved next to it.
    ///
    /// # Errors
    /// Unreadable file, TOML error, invalid field.
    pub fn load(path: &Path) -> Result<Scenario, SimError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| SimError::input(&origin, format!("cannot read: {e}")))?;
        let mut s = Scenario::parse(&text, &origin)?;
        let base = path.parent().unwrap_or(Path::new("."));
        for server in &mut s.servers {
            if let ServiceSpec::Empirical { file } | ServiceSpec::ByLoad { file } =
                &mut server.service
            {
                *file = base.join(&*file).display().to_string();
            }
        }
        if let Some(file) = &mut s.workload.arrivals {
            *file = base.join(&*file).display().to_string();
        }
        Ok(s)
    }

    /// Parse scenario text; `origin` names it in errors.
    ///
    /// # Errors
    /// TOML error, invalid field, or a size past its limit ([`MAX_REQUESTS`], [`MAX_CLIENTS`],
    /// [`MAX_SERVERS`], [`MAX_CLIENT_ENDPOINTS`], [`MAX_KEYS`], [`MAX_EVENTS`]).
    pub fn parse(text: &str, origin: &str) -> Result<Scenario, SimError> {
        let mut s: Scenario = toml::from_str(text).map_err(|e| {
            let line = e
                .span()
                .map(|sp| text[..sp.start.min(text.len())].lines().count().max(1));
            SimError::input(
                line.map_or(origin.to_owned(), |l| format!("{origin}:{l}")),
                e.message(),
            )
        })?;
        s.validate()
            .map_err(|reason| SimError::input(origin, reason))?;
        s.source = text.to_owned();
        Ok(s)
    }

    /// Server names after expanding `count`.
    pub fn server_names(&self) -> Vec<String> {
        self.servers
            .iter()
            .flat_map(|s| {
                (1..=s.count).map(move |i| {
                    if s.count == 1 {
                        s.name.clone()
                    } else {
                        format!("{}{i}", s.name)
                    }
                })
            })
            .collect()
    }

    fn validate(&self) -> Result<(), String> {
        positive("requests", self.requests as f64)?;
        if let Some(r) = self.refresh_ms {
            positive("refresh_ms", r)?;
            if r > 3_600_000.0 {
                return Err(format!("refresh_ms is {r}: at most 3600000 (an hour)"));
            }
        }
        if !(10.0..=60_000.0).contains(&self.report_ms) {
            return Err(format!(
                "report_ms is {}: it must be within 10..60000",
                self.report_ms
            ));
        }
        self.within_limits()?;
        self.workload.check()?;
        self.stages
            .build()
            .map_err(|(field, why)| format!("stages.{field}: {why}"))?;
        if self.servers.is_empty() {
            return Err("at least one [[server]] is needed".into());
        }
        for s in &self.servers {
            s.check()?;
        }
        let names = self.server_names();
        let mut seen = HashSet::new();
        for n in &names {
            if !seen.insert(n) {
                return Err(format!("two servers are named {n:?}"));
            }
        }
        if let Some(wn) = &self.watch {
            if !seen.contains(wn) {
                return Err(format!("watch: no server named {wn:?}"));
            }
        }
        for e in &self.events {
            if !seen.contains(&e.server) {
                return Err(format!(
                    "event at {} ms: no server named {:?} (servers: {})",
                    e.at_ms,
                    e.server,
                    names.join(", ")
                ));
            }
            e.check()?;
        }
        Ok(())
    }
}

impl Workload {
    /// The workload's fields, each within its range.
    fn check(&self) -> Result<(), String> {
        let w = self;
        if w.kind == WorkloadKind::Open && w.arrivals.is_none() {
            positive("workload.rate", w.rate)?;
        }
        if w.arrivals.is_some() && (w.kind != WorkloadKind::Open || w.pattern != Pattern::Poisson) {
            return Err(
                "workload.arrivals: only with kind = \"open\" and pattern = \"poisson\"".into(),
            );
        }
        positive("workload.clients", f64::from(w.clients))?;
        non_negative("workload.think_ms", w.think_ms)?;
        non_negative("workload.timeout_ms", w.timeout_ms)?;
        non_negative("workload.deadline_ms", w.deadline_ms)?;
        if !(0.0..=100_000.0).contains(&w.retry_budget_percent) {
            return Err("workload.retry_budget_percent must be within 0..=100000".into());
        }
        positive("workload.burst_on_ms", w.burst_on_ms)?;
        positive("workload.burst_off_ms", w.burst_off_ms)?;
        if !(0.0..=1.0).contains(&w.panic_threshold) {
            return Err("workload.panic_threshold must be within 0..=1".into());
        }
        if let Some(h) = &w.hedge {
            h.parse::<lbkit_core::HedgeDelay>()
                .map_err(|why| format!("workload.hedge is {why}"))?;
        }
        if w.retries > 16 {
            return Err("workload.retries: at most 16".into());
        }
        if w.key_distribution == KeyDistribution::Zipf
            && !(w.zipf_exponent > 0.0 && w.zipf_exponent.is_finite())
        {
            return Err("workload.zipf_exponent must be positive".into());
        }
        Ok(())
    }
}

impl ServerSpec {
    /// The server's fields, each within its range; errors name the server.
    fn check(&self) -> Result<(), String> {
        let s = self;
        let at = |f: &str| format!("server {:?}: {f}", s.name);
        positive(&at("count"), f64::from(s.count))?;
        positive(&at("concurrency"), f64::from(s.concurrency))?;
        positive(&at("slow_factor"), s.slow_factor)?;
        positive(&at("cold_factor"), s.cold_factor)?;
        for (f, v) in [
            ("stall_every_ms", s.stall_every_ms),
            ("stall_ms", s.stall_ms),
            ("cold_ms", s.cold_ms),
            ("join_ms", s.join_ms),
            ("warmup_ms", s.warmup_ms),
        ] {
            non_negative(&at(f), v)?;
        }
        if !(0.0..1.0).contains(&s.hidden_load) {
            return Err(at("hidden_load must be within 0..1 (1 would never serve)"));
        }
        if !(0.0..=1.0).contains(&s.error_rate) {
            return Err(at("error_rate must be within 0..=1"));
        }
        crate::dist::ServiceTime::check(&s.service).map_err(|e| at(&e))
    }
}

impl EventSpec {
    /// The event's time and the fields its action needs (its server is checked by the
    /// scenario, which knows the names).
    fn check(&self) -> Result<(), String> {
        non_negative("event.at_ms", self.at_ms)?;
        let needs = match self.action {
            Action::Slow if !self.factor.is_some_and(|f| f > 0.0 && f.is_finite()) => {
                "action \"slow\" needs a positive factor"
            }
            Action::Hidden if !self.factor.is_some_and(|f| (0.0..1.0).contains(&f)) => {
                "action \"hidden\" needs a factor within 0..1"
            }
            Action::Weight if self.weight.is_none() => "action \"weight\" needs weight",
            _ => return Ok(()),
        };
        Err(format!("event at {} ms: {needs}", self.at_ms))
    }
}

impl Scenario {
    /// The sizes of the module docs' limits table.
    fn within_limits(&self) -> Result<(), String> {
        let w = &self.workload;
        let servers: u64 = self.servers.iter().map(|s| u64::from(s.count)).sum();
        let pairs = u64::from(w.clients) * servers;
        let checks = [
            ("requests", self.requests, MAX_REQUESTS),
            (
                "workload.clients",
                u64::from(w.clients),
                u64::from(MAX_CLIENTS),
            ),
            ("servers (the sum of count)", servers, MAX_SERVERS),
            (
                "workload.key_count",
                u64::from(w.key_count),
                u64::from(MAX_KEYS),
            ),
            (
                "[[event]] entries",
                self.events.len() as u64,
                MAX_EVENTS as u64,
            ),
        ];
        for (field, v, max) in checks {
            if v > max {
                return Err(format!("{field} is {v}: at most {max}"));
            }
        }
        if w.balancer == BalancerMode::PerClient && pairs > MAX_CLIENT_ENDPOINTS {
            return Err(format!(
                "workload.clients x servers is {pairs} with per-client balancers: at most \
                 {MAX_CLIENT_ENDPOINTS} (fewer clients, or balancer = \"shared\")"
            ));
        }
        Ok(())
    }
}

fn positive(field: &str, v: f64) -> Result<(), String> {
    if v > 0.0 && v.is_finite() {
        Ok(())
    } else {
        Err(format!("{field} must be positive (got {v})"))
    }
}

fn non_negative(field: &str, v: f64) -> Result<(), String> {
    if v >= 0.0 && v.is_finite() {
        Ok(())
    } else {
        Err(format!("{field} must be 0 or more (got {v})"))
    }
}
