//! Fitting a scenario to a recorded trace (lbkit-trace), so that real traffic can be replayed
//! under other strategies: `lbkit sim --trace FILE`, `lbkit sim --fit FILE --out scenario.toml`.
//!
//! What the fit takes from the trace, for one service:
//!
//! | scenario part | from the trace |
//! |---|---|
//! | arrivals | every sampled request's first pick, replayed at the recorded times (`workload.arrivals`) when every request was recorded; Poisson at the recorded rate ÷ the sample rate otherwise |
//! | each endpoint's service time | `by-load`: its answered attempts' latencies, each with the calls in flight on it when the attempt was picked, so a replayed call draws from the latencies seen at its own load (queueing included); past the highest load recorded, latencies grow in proportion |
//! | each endpoint's error rate | failed attempts (server errors, refused connections, other failures) over attempts that ended |
//! | timeouts, retries | the shortest latency of a timed-out attempt; the most attempts of one request |
//! | clients | one client with one balancer, as a proxy or a pool records (the calls in flight are its own) |
//!
//! Not in a trace, so not in the fit: weights, zones, warm-up, server-reported load, the
//! strategy's parameters (the recorded strategy runs with its defaults), membership changes.
//! The fit is checked before it is used: [`Fit::check`] replays the strategy that actually ran
//! and compares its p50 and p99 with the recorded ones.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::Path;

use lbkit_trace::{Record, Trace, TraceOutcome};

use crate::error::SimError;
use crate::metrics::StrategyResult;

/// Largest relative error of the replayed p50 and p99 for a fit to count as good.
pub const FIT_TOLERANCE: f64 = 0.10;

/// A scenario fitted to one service of a trace, with what was recorded.
#[derive(Debug, Clone)]
pub struct Fit {
    /// The service.
    pub service: String,
    /// The strategy that ran (the recorded one).
    pub strategy: String,
    /// The share of requests recorded.
    pub sample_rate: f64,
    /// Requests in the trace for the service.
    pub requests: u64,
    /// Recorded p50 of successful requests, ms (first pick to the last attempt's end).
    pub p50_ms: f64,
    /// Recorded p99, ms.
    pub p99_ms: f64,
    /// Recorded share of requests that failed.
    pub error_rate: f64,
    /// Endpoint addresses, in the order of the scenario's servers `e1`, `e2`, …
    pub endpoints: Vec<String>,
    /// The scenario, as TOML (its files are named relative to it).
    pub scenario: String,
    /// The files it names: `(file name, content)`.
    pub files: Vec<(String, String)>,
    /// What the fit could not take from the trace, or assumed.
    pub notes: Vec<String>,
}

/// Seeds [`Fit::validate`] replays the recorded strategy with: a p99 from one run of a few
/// thousand requests moves by ±20 % from seed to seed (the recorded one is one such draw), so
/// the check compares the recorded percentiles with the median over seeds.
pub const VALIDATION_SEEDS: u64 = 5;

/// How well a replay of the recorded strategy matches the trace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FitCheck {
    /// Recorded p50, ms.
    pub recorded_p50_ms: f64,
    /// Replayed p50, ms (the median over seeds).
    pub replayed_p50_ms: f64,
    /// Recorded p99, ms.
    pub recorded_p99_ms: f64,
    /// Replayed p99, ms (the median over seeds).
    pub replayed_p99_ms: f64,
    /// The lowest and highest replayed p99 over the seeds.
    pub replayed_p99_range: (f64, f64),
    /// Seeds replayed.
    pub seeds: u64,
}

impl FitCheck {
    /// Relative error of the replayed p50.
    pub fn p50_error(&self) -> f64 {
        rel(self.replayed_p50_ms, self.recorded_p50_ms)
    }

    /// Relative error of the replayed p99.
    pub fn p99_error(&self) -> f64 {
        rel(self.replayed_p99_ms, self.recorded_p99_ms)
    }

    /// Both within [`FIT_TOLERANCE`].
    pub fn is_good(&self) -> bool {
        self.p50_error().abs() <= FIT_TOLERANCE && self.p99_error().abs() <= FIT_TOLERANCE
    }

    /// One paragraph for the report, before any candidate is shown.
    pub fn describe(&self, strategy: &str) -> String {
        let verdict = if self.is_good() {
            format!(
                "within {:.0} %: the comparison below can be trusted as far as the trace goes",
                FIT_TOLERANCE * 100.0
            )
        } else {
            format!(
                "NOT within {:.0} %: the fitted scenario does not reproduce this trace, so treat the comparison below with care",
                FIT_TOLERANCE * 100.0
            )
        };
        format!(
            "fit check: replaying {strategy} (what ran; median of {} seeds) gives p50 {:.2} ms against {:.2} ms recorded ({:+.1} %), p99 {:.2} ms against {:.2} ms ({:+.1} %; {:.2}–{:.2} ms over the seeds): {verdict}.",
            self.seeds,
            self.replayed_p50_ms,
            self.recorded_p50_ms,
            self.p50_error() * 100.0,
            self.replayed_p99_ms,
            self.recorded_p99_ms,
            self.p99_error() * 100.0,
            self.replayed_p99_range.0,
            self.replayed_p99_range.1
        )
    }
}

fn rel(a: f64, b: f64) -> f64 {
    if b <= 0.0 {
        if a <= 0.0 {
            0.0
        } else {
            f64::INFINITY
        }
    } else {
        a / b - 1.0
    }
}

/// One request of the trace.
struct Req {
    start: u64,
    end: u64,
    last_attempt: u16,
    ok: bool,
}

/// Fit a scenario to `service`'s records in `trace` (the service with the most records when
/// `None`).
///
/// # Errors
/// No records (for that service); a service name not in the trace.
pub fn fit(trace: &Trace, service: Option<&str>) -> Result<Fit, SimError> {
    let mut notes = Vec::new();
    let chosen = choose_service(trace, service, &mut notes)?;
    let records: Vec<&Record> = trace
        .records
        .iter()
        .filter(|r| *r.service == *chosen)
        .collect();
    let strategy = replayed_strategy(&records, &mut notes);
    let sample_rate = sample_rate(&records, &mut notes);
    let requests = Requests::of(&records);
    let (endpoints, servers, mut files) = fit_servers(&records, &mut notes);
    let workload = Workload::fit(&records, &requests, sample_rate, &mut files, &mut notes);
    notes.push(
        "weights, zones, warm-up and the strategy's parameters are not in a trace: the fit uses the defaults".to_owned(),
    );
    let n = requests.count();
    let scenario = format!(
        "# Fitted by `lbkit sim --fit` to {n} requests of service {} ({} attempts, {:.1} s; strategy {}, {:.1} % sampled).\n\
         # Edit and rerun with `lbkit sim --scenario THIS_FILE`.\n\
         name = {}\n\
         description = {}\n\
         requests = {}\n\
         strategies = [{}]\n\n\
         {}\
         {servers}",
        comment(&chosen),
        records.len(),
        workload.span_s,
        comment(&strategy),
        sample_rate * 100.0,
        quoted(&format!("trace-{chosen}")),
        quoted(&format!("{n} recorded requests of {chosen}, replayed")),
        workload.requests,
        quoted(&strategy),
        workload.table(),
    );
    Ok(Fit {
        service: chosen,
        strategy,
        sample_rate,
        requests: n,
        p50_ms: requests.quantile(0.5),
        p99_ms: requests.quantile(0.99),
        error_rate: requests.failed as f64 / n.max(1) as f64,
        endpoints,
        scenario,
        files,
        notes,
    })
}

/// The service to fit: `service` when the trace has it, else the one with the most records.
fn choose_service(
    trace: &Trace,
    service: Option<&str>,
    notes: &mut Vec<String>,
) -> Result<String, SimError> {
    let counts = tally(trace.records.iter().map(|r| &*r.service));
    let chosen = match service {
        Some(s) if counts.contains_key(s) => s.to_owned(),
        Some(s) => {
            let known: Vec<&str> = counts.keys().copied().collect();
            return Err(SimError::input(
                "--service",
                format!("{s:?} is not in the trace (it has: {})", known.join(", ")),
            ));
        }
        None => most(&counts).ok_or_else(|| SimError::input("trace", "no records"))?,
    };
    if service.is_none() && counts.len() > 1 {
        notes.push(format!(
            "the trace has {} services; fitted {chosen:?}, the one with the most records (--service picks another)",
            counts.len()
        ));
    }
    Ok(chosen)
}

/// The strategy the replay runs: the one with the most attempts in `records`.
fn replayed_strategy(records: &[&Record], notes: &mut Vec<String>) -> String {
    let strategies = tally(records.iter().map(|r| &*r.strategy));
    let strategy = most(&strategies).unwrap_or_default();
    if strategies.len() > 1 {
        notes.push(format!(
            "the service ran {} strategies while recording; the fit replays {strategy:?}, the one with the most attempts",
            strategies.len()
        ));
    }
    strategy
}

/// The share of requests the trace recorded: its first record's, 1 when that is not within
/// (0, 1].
fn sample_rate(records: &[&Record], notes: &mut Vec<String>) -> f64 {
    let recorded_rate = records.first().map_or(1.0, |r| r.sample_rate);
    if recorded_rate > 0.0 && recorded_rate <= 1.0 {
        recorded_rate
    } else {
        notes.push(format!(
            "the trace's sample rate {recorded_rate} is not within (0, 1]: taken as 1"
        ));
        1.0
    }
}

/// The requests of the records: when each started, and how long the successful ones took.
struct Requests {
    /// Start of each request, ascending (ns).
    starts: Vec<u64>,
    /// Latency of each successful request, ascending (ms).
    ok_latency: Vec<f64>,
    /// Requests whose last attempt failed.
    failed: usize,
}

impl Requests {
    /// The records' attempts gathered into requests: from the first attempt's pick to the
    /// last attempt's end, successful when the last attempt was.
    fn of(records: &[&Record]) -> Requests {
        let mut reqs: HashMap<u64, Req> = HashMap::new();
        for r in records {
            let end = r.picked_at_ns.saturating_add(r.latency_ns);
            let e = reqs.entry(r.request).or_insert(Req {
                start: r.picked_at_ns,
                end,
                last_attempt: r.attempt,
                ok: r.outcome == TraceOutcome::Success,
            });
            e.start = e.start.min(r.picked_at_ns);
            e.end = e.end.max(end);
            if r.attempt >= e.last_attempt {
                e.last_attempt = r.attempt;
                e.ok = r.outcome == TraceOutcome::Success;
            }
        }
        let mut starts: Vec<u64> = reqs.values().map(|r| r.start).collect();
        starts.sort_unstable();
        let mut ok_latency: Vec<f64> = reqs
            .values()
            .filter(|r| r.ok)
            .map(|r| (r.end - r.start) as f64 / 1e6)
            .collect();
        ok_latency.sort_by(f64::total_cmp);
        let failed = reqs.values().filter(|r| !r.ok).count();
        Requests {
            starts,
            ok_latency,
            failed,
        }
    }

    /// Requests in all.
    fn count(&self) -> u64 {
        self.starts.len() as u64
    }

    /// The `q` quantile of the successful requests' latency (ms), 0 when none succeeded.
    fn quantile(&self, q: f64) -> f64 {
        let ok = &self.ok_latency;
        if ok.is_empty() {
            return 0.0;
        }
        let i = ((q * ok.len() as f64).ceil() as usize).clamp(1, ok.len()) - 1;
        ok[i]
    }
}

/// Each endpoint of the records fitted as a server, in address order: the addresses, the
/// `[[server]]` tables and each server's CSV file.
fn fit_servers(
    records: &[&Record],
    notes: &mut Vec<String>,
) -> (Vec<String>, String, Vec<(String, String)>) {
    let mut by_endpoint: BTreeMap<&str, Vec<&Record>> = BTreeMap::new();
    for &r in records {
        by_endpoint.entry(&r.endpoint).or_default().push(r);
    }
    let endpoints: Vec<String> = by_endpoint.keys().map(|e| (*e).to_owned()).collect();
    let mut files = Vec::new();
    let mut servers = String::new();
    for (i, (address, rs)) in by_endpoint.iter().enumerate() {
        let name = format!("e{}", i + 1);
        let answered: Vec<&Record> = rs
            .iter()
            .copied()
            .filter(|r| matches!(r.outcome, TraceOutcome::Success | TraceOutcome::Server))
            .collect();
        let (server, csv) = fit_server(&name, address, &answered, error_rate(rs), notes);
        servers.push_str(&server);
        files.push((format!("{name}.csv"), csv));
    }
    (endpoints, servers, files)
}

/// The share of an endpoint's ended attempts (not cancelled) that failed at the server, to
/// connect or otherwise.
fn error_rate(records: &[&Record]) -> f64 {
    let ended = records
        .iter()
        .filter(|r| r.outcome != TraceOutcome::Cancelled)
        .count();
    let failures = records.iter().filter(|r| {
        matches!(
            r.outcome,
            TraceOutcome::Server | TraceOutcome::Connect | TraceOutcome::Other
        )
    });
    failures.count() as f64 / ended.max(1) as f64
}

/// The fitted `[workload]`: arrivals, retries and timeout as recorded.
struct Workload {
    /// `arrivals = "arrivals.csv"` (every request recorded) or `rate = …` (sampled).
    arrivals: String,
    /// Requests to replay: those recorded, scaled up by the sample rate.
    requests: u64,
    /// Retries: the most attempts any request made, less one (at most 16).
    retries: u16,
    /// The shortest timed-out attempt (ms, at least 1), 0 when none timed out.
    timeout_ms: f64,
    /// From the first request's start to the last one's (s).
    span_s: f64,
}

impl Workload {
    /// The workload of `records`: the recorded arrival times when every request was recorded
    /// (written to `arrivals.csv` in `files`), else Poisson arrivals at the recorded rate
    /// over the sample rate.
    fn fit(
        records: &[&Record],
        requests: &Requests,
        sample_rate: f64,
        files: &mut Vec<(String, String)>,
        notes: &mut Vec<String>,
    ) -> Workload {
        let retries = records.iter().map(|r| r.attempt).max().unwrap_or(0).min(16);
        let timeout_ms = records
            .iter()
            .filter(|r| r.outcome == TraceOutcome::Timeout)
            .map(|r| r.latency_ns as f64 / 1e6)
            .fold(f64::INFINITY, f64::min);
        let timeout_ms = if timeout_ms.is_finite() {
            timeout_ms.floor().max(1.0)
        } else {
            0.0
        };
        let starts = &requests.starts;
        let t0 = starts.first().copied().unwrap_or(0);
        let span_s = (starts.last().copied().unwrap_or(t0) - t0) as f64 / 1e9;
        let n = requests.count();
        let (arrivals, requests) = if sample_rate >= 1.0 {
            let mut csv = String::from("arrival_ms\n");
            for s in starts {
                let _ = writeln!(csv, "{:.6}", (s - t0) as f64 / 1e6);
            }
            files.push(("arrivals.csv".to_owned(), csv));
            ("arrivals = \"arrivals.csv\"".to_owned(), n)
        } else {
            poisson_arrivals(n, span_s, sample_rate, notes)
        };
        Workload {
            arrivals,
            requests,
            retries,
            timeout_ms,
            span_s,
        }
    }

    /// The `[workload]` table.
    fn table(&self) -> String {
        format!(
            "[workload]\n\
             kind = \"open\"\n\
             {}\n\
             clients = 1\n\
             balancer = \"shared\"\n\
             timeout_ms = {}\n\
             retries = {}\n\
             # Retries draw on a retry budget, the proxy's default unless set here:\n\
             # retry_budget_percent = 20.0\n\
             # retry_budget_min_per_sec = 10\n\
             panic_threshold = 0.0\n",
            self.arrivals, self.timeout_ms, self.retries
        )
    }
}

/// Arrivals of a sampled trace: `rate = …` at the recorded rate over the sample rate, and the
/// requests to replay.
fn poisson_arrivals(
    n: u64,
    span_s: f64,
    sample_rate: f64,
    notes: &mut Vec<String>,
) -> (String, u64) {
    let rate = (n as f64 / span_s.max(1e-3)) / sample_rate.max(1e-9);
    // Written whole (`{rate}`: a rate of 1e-8/s must not round to 0), and positive.
    let rate = if rate.is_finite() && rate > 0.0 {
        rate
    } else {
        1.0
    };
    notes.push(format!(
        "{:.1} % of requests were recorded: arrivals are Poisson at {rate:.1}/s (the recorded rate / the sample rate), not the recorded times",
        sample_rate * 100.0
    ));
    (
        format!("rate = {rate}"),
        ((n as f64 / sample_rate) as u64).clamp(1, crate::MAX_REQUESTS),
    )
}

/// How many times each name occurs.
fn tally<'a>(names: impl Iterator<Item = &'a str>) -> BTreeMap<&'a str, usize> {
    let mut counts = BTreeMap::new();
    for n in names {
        *counts.entry(n).or_default() += 1;
    }
    counts
}

/// The name that occurs most (the first of equals, by name).
fn most(counts: &BTreeMap<&str, usize>) -> Option<String> {
    counts
        .iter()
        .max_by_key(|(_, n)| **n)
        .map(|(s, _)| (*s).to_owned())
}

/// `text` as a TOML string (quoted and escaped: names come from the trace).
fn quoted(text: &str) -> String {
    toml::Value::String(text.to_owned()).to_string()
}

/// `text` fit for a TOML comment: control characters (a newline would end the comment) as
/// `?`.
fn comment(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// A bin of latencies at one load counts from this many samples.
const MIN_LEVEL: usize = 20;
/// Mean latency past this multiple of the unloaded mean: calls were waiting.
const QUEUED: f64 = 1.3;

/// One endpoint's `[[server]]` table and its CSV file.
///
/// A server queues when its latency rises with its load: the first load `c` at which the
/// mean latency passes [`QUEUED`] × the mean at load 0 is taken as its worker count, and the
/// latencies of calls that found fewer than `c` calls on it (they did not wait) as its service
/// times; the simulator then queues what arrives beyond `c`, as the server did. A server whose
/// latency never rose that way in the trace gets `by-load` latencies (each call draws from
/// those recorded at its own load) and serves every call at once.
fn fit_server(
    name: &str,
    address: &str,
    answered: &[&Record],
    error_rate: f64,
    notes: &mut Vec<String>,
) -> (String, String) {
    let ms = |r: &lbkit_trace::Record| r.latency_ns as f64 / 1e6;
    if answered.is_empty() {
        notes.push(format!(
            "{address} ({name}) never answered in the trace: modelled as failing in 1 ms"
        ));
        let server = format!(
            "\n[[server]]\nname = \"{name}\"   # {}\nconcurrency = 1000000\nservice = {{ dist = \"empirical\", file = \"{name}.csv\" }}\nerror_rate = 1.0\n",
            comment(address)
        );
        return (server, "latency_ms\n1.0\n".to_owned());
    }
    let mut levels: BTreeMap<u32, (f64, usize)> = BTreeMap::new();
    for r in answered {
        let e = levels.entry(r.in_flight).or_default();
        e.0 += ms(r);
        e.1 += 1;
    }
    let mean = |l: &(f64, usize)| l.0 / l.1 as f64;
    let base = levels.get(&0).filter(|l| l.1 >= MIN_LEVEL).map(mean);
    let workers = base.and_then(|b| {
        levels
            .iter()
            .filter(|(_, l)| l.1 >= MIN_LEVEL)
            .find(|(_, l)| mean(l) > QUEUED * b)
            .map(|(k, _)| (*k).max(1))
    });
    match workers {
        Some(c) => {
            let mut csv = String::from("latency_ms\n");
            for r in answered.iter().filter(|r| r.in_flight < c) {
                let _ = writeln!(csv, "{:.6}", ms(r));
            }
            let server = format!(
                "\n[[server]]\nname = \"{name}\"   # {}: latency rises from {c} calls in flight, so {c} worker(s) and a queue\nconcurrency = {c}\nqueue = 1000000\nservice = {{ dist = \"empirical\", file = \"{name}.csv\" }}\nerror_rate = {:.6}\n",
                comment(address),
                error_rate.min(1.0)
            );
            (server, csv)
        }
        None => {
            let mut csv = String::from("in_flight,latency_ms\n");
            for r in answered {
                let _ = writeln!(csv, "{},{:.6}", r.in_flight, ms(r));
            }
            let server = format!(
                "\n[[server]]\nname = \"{name}\"   # {}: no queueing seen, latencies by load\nservice = {{ dist = \"by-load\", file = \"{name}.csv\" }}\nerror_rate = {:.6}\n",
                comment(address),
                error_rate.min(1.0)
            );
            (server, csv)
        }
    }
}

// === impl Fit ===

impl Fit {
    /// Write the scenario to `path` and its files beside it.
    ///
    /// # Errors
    /// A file cannot be written.
    pub fn write(&self, path: &Path) -> Result<(), SimError> {
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
        if let Some(d) = dir {
            std::fs::create_dir_all(d).map_err(|e| {
                SimError::input(d.display().to_string(), format!("cannot create: {e}"))
            })?;
        }
        let write = |p: &Path, text: &str| {
            std::fs::write(p, text)
                .map_err(|e| SimError::input(p.display().to_string(), format!("cannot write: {e}")))
        };
        write(path, &self.scenario)?;
        for (name, content) in &self.files {
            write(&dir.unwrap_or(Path::new(".")).join(name), content)?;
        }
        Ok(())
    }

    /// Compare replays of the recorded strategy (one per seed) with the trace.
    pub fn check(&self, replays: &[StrategyResult]) -> FitCheck {
        let median = |f: fn(&StrategyResult) -> f64| {
            let mut v: Vec<f64> = replays.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(0.0)
        };
        let p99s = replays.iter().map(|r| r.p99_ms);
        FitCheck {
            recorded_p50_ms: self.p50_ms,
            replayed_p50_ms: median(|r| r.p50_ms),
            recorded_p99_ms: self.p99_ms,
            replayed_p99_ms: median(|r| r.p99_ms),
            replayed_p99_range: (
                p99s.clone().fold(f64::INFINITY, f64::min),
                p99s.fold(0.0, f64::max),
            ),
            seeds: replays.len() as u64,
        }
    }

    /// Replay the recorded strategy over `scenario` (this fit, written and loaded) with
    /// [`VALIDATION_SEEDS`] seeds and compare.
    ///
    /// # Errors
    /// The recorded strategy is not a built-in one; the scenario cannot run.
    pub fn validate(&self, scenario: &crate::Scenario) -> Result<FitCheck, SimError> {
        let mut replays = Vec::new();
        for seed in 1..=VALIDATION_SEEDS {
            let report = crate::run(
                scenario,
                &crate::RunOptions {
                    strategies: vec![self.strategy.clone()],
                    seed: Some(seed),
                    skip_oracle: true,
                    ..crate::RunOptions::default()
                },
                &mut |_, _| {},
            )?;
            replays.extend(report.results);
        }
        Ok(self.check(&replays))
    }
}
