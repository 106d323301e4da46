//! Running strategies over a scenario, and the report: aligned text, JSON, a conclusion.

use std::fmt::Write as _;
use std::sync::Arc;

use lbkit_core::{BoxStrategy, HedgeDelay, Strategy as _};
use lbkit_strategy::catalog::{self, Params};
use serde::Serialize;

use crate::engine::Engine;
use crate::error::SimError;
use crate::label::split_run;
use crate::metrics::StrategyResult;
use crate::oracle::{Oracle, Queues};
use crate::scenario::Scenario;

/// Label of the oracle baseline, present in every report: shortest expected delay, which sees
/// every server's true queue and service rate (the best-known policy no real client can run).
pub const ORACLE: &str = "oracle-sed";

/// What to run.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Client requests per strategy (default: the scenario's).
    pub requests: Option<u64>,
    /// Seed (default: the scenario's).
    pub seed: Option<u64>,
    /// Strategies as `name` or `name:param=value:...` (default: the scenario's list, else every
    /// built-in strategy). The oracle baseline is added unless `skip_oracle`.
    pub strategies: Vec<String>,
    /// Leave out the oracle baseline (benchmarks).
    pub skip_oracle: bool,
    /// Record the run of the first strategy into this trace, in virtual time, as a proxy or a
    /// pool would (`lbkit sim --record`); open it with `TraceConfig::with_lossless(true)`.
    pub record: Option<Arc<lbkit_trace::Recorder>>,
}

/// The results of every strategy on one scenario.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Report {
    /// Scenario name.
    pub scenario: String,
    /// Scenario description.
    pub description: String,
    /// Seed used.
    pub seed: u64,
    /// Requests per strategy.
    pub requests: u64,
    /// The server whose queue is plotted.
    pub watched: String,
    /// One entry per strategy, in the order run, the oracle last.
    pub results: Vec<StrategyResult>,
    /// Warnings about the comparison: strategies whose learning timer fired too few times in
    /// the run to compare them fairly.
    pub notes: Vec<String>,
    /// Whether the report shows the fleet table (connections per server, load spread, share
    /// per zone): when a run used an aperture or the scenario has stages.
    pub fleet: bool,
    /// The servers of each zone, in name order (empty when no server has a zone).
    pub zones: std::collections::BTreeMap<String, Vec<String>>,
}

/// Strategies that learn on a timer, and the parameters [`Scenario::refresh_ms`] sets for them.
pub(crate) const TIMERS: &[(&str, &[&str])] = &[
    ("weighted-response-time", &["interval_ms"]),
    ("adaptive", &["period_ms", "blackout_ms"]),
];

/// Fewer timer periods than this in a run, and the report says the strategy had no fair run.
const FAIR_PERIODS: f64 = 10.0;

/// `label` with the scenario's `refresh_ms` added for each timer parameter it does not set.
pub(crate) fn with_refresh(label: &str, refresh_ms: Option<f64>) -> String {
    let Some(ms) = refresh_ms else {
        return label.to_owned();
    };
    // The parameters go before the run suffixes (`+hedge`, `+aperture=N`, ...).
    let (label, hedge) = match label.find('+') {
        Some(at) => label.split_at(at),
        None => (label, ""),
    };
    let name = label.split(':').next().unwrap_or_default().trim();
    let Some((_, params)) = TIMERS.iter().find(|(n, _)| *n == name) else {
        return format!("{label}{hedge}");
    };
    let given: Vec<&str> = label
        .split(':')
        .skip(1)
        .filter_map(|p| p.split_once('=').map(|(k, _)| k.trim()))
        .collect();
    let mut out = label.to_owned();
    for p in params.iter().filter(|p| !given.contains(p)) {
        let _ = write!(out, ":{p}={}", ms.round() as u64);
    }
    out.push_str(hedge);
    out
}

/// A warning for each timer-driven strategy whose timer fired fewer than [`FAIR_PERIODS`]
/// times in its run.
fn fairness_notes(results: &[StrategyResult], parsed: &[(String, Params)]) -> Vec<String> {
    let mut notes = Vec::new();
    for (r, (name, params)) in results.iter().zip(parsed) {
        let Some((_, timer_params)) = TIMERS.iter().find(|(n, _)| n == name) else {
            continue;
        };
        let Some(period) = catalog::build(name, params.clone())
            .ok()
            .and_then(|s| s.refresh_interval())
        else {
            continue;
        };
        let periods = r.duration_s / period.as_secs_f64().max(1e-9);
        if periods < FAIR_PERIODS {
            notes.push(format!(
                "{} learns every {:.1} s: {:.0} time(s) in this {:.0} s run, too few for a fair \
                 run; set refresh_ms in the scenario (or {}) to compare it fairly",
                r.strategy,
                period.as_secs_f64(),
                periods.floor(),
                r.duration_s,
                timer_params.join(", ")
            ));
        }
    }
    notes
}

/// A label's strategy and its hedging: `NAME[:k=v...]` alone, or with `+hedge` (the
/// scenario's `workload.hedge`, default p95) or `+hedge=p90` / `+hedge=20ms` (and any other
/// run suffix: [`crate::label`]).
///
/// # Errors
/// A suffix that does not parse.
pub(crate) fn split_hedge<'l>(
    label: &'l str,
    scenario: Option<&Scenario>,
) -> Result<(&'l str, Option<HedgeDelay>), SimError> {
    split_run(label, scenario).map(|(base, run)| (base, run.hedge))
}

/// A strategy label parsed into something buildable (a `+hedge` suffix is the run's, not the
/// strategy's: [`split_hedge`]).
pub(crate) fn parse_label(label: &str) -> Result<(String, Params), SimError> {
    let (label, _) = split_hedge(label, None)?;
    let mut parts = label.split(':');
    let name = parts.next().unwrap_or_default().trim().to_owned();
    let mut params = Params::new();
    for p in parts {
        let (k, v) = Params::parse_pair(p)
            .map_err(|e| SimError::input(format!("strategy {label:?}"), e.to_string()))?;
        params.insert(k, v);
    }
    catalog::build(&name, params.clone())
        .map_err(|e| SimError::input(format!("strategy {label:?}"), e.to_string()))?;
    Ok((name, params))
}

/// Simulate `scenario` once per strategy. `progress(label, fraction)` hears about each run.
///
/// # Errors
/// An unknown strategy or parameter, or a scenario that cannot be built (an unreadable
/// empirical file).
pub fn run(
    scenario: &Scenario,
    options: &RunOptions,
    progress: &mut dyn FnMut(&str, f64),
) -> Result<Report, SimError> {
    let requests = options.requests.unwrap_or(scenario.requests);
    if requests == 0 {
        return Err(SimError::input("--requests", "must be at least 1"));
    }
    let seed = options.seed.unwrap_or(scenario.seed);
    let labels = labels(scenario, options);
    let parsed = labels
        .iter()
        .map(|l| parse_label(l))
        .collect::<Result<Vec<_>, _>>()?;
    let mut results = Vec::new();
    for (i, (label, (name, params))) in labels.iter().zip(&parsed).enumerate() {
        let make = || catalog::build(name, params.clone()).expect("validated above");
        let record = options.record.as_deref().filter(|_| i == 0);
        results.push(simulate(
            scenario, label, &make, None, record, requests, seed, progress,
        )?);
    }
    let queues = Queues::of(&Engine::addresses(scenario));
    let oracle = || BoxStrategy::new(Oracle(queues.clone()));
    if !options.skip_oracle {
        let queues = Some(queues.clone());
        let (oracle, seed) = (&oracle, seed);
        let result = simulate(
            scenario, ORACLE, oracle, queues, None, requests, seed, progress,
        )?;
        results.push(result);
    }
    let notes = fairness_notes(&results, &parsed);
    let watched = watched_server(scenario, &oracle, seed)?;
    let fleet = labels
        .iter()
        .any(|l| l.contains("+aperture") || l.contains("+subset"))
        || !scenario.stages.build().map_or(true, |s| s.is_default());
    Ok(Report {
        fleet,
        zones: zones(scenario),
        scenario: scenario.name.clone(),
        description: scenario.description.clone(),
        seed,
        requests,
        watched,
        results,
        notes,
    })
}

/// The strategies to run, as labels: the options', else the scenario's, else every
/// strategy of the catalog; each with its hedged twin when the scenario compares hedging,
/// and the scenario's `refresh_ms`.
fn labels(scenario: &Scenario, options: &RunOptions) -> Vec<String> {
    let labels: Vec<String> = if !options.strategies.is_empty() {
        options.strategies.clone()
    } else if !scenario.strategies.is_empty() {
        scenario.strategies.clone()
    } else {
        catalog::strategies().map(|s| s.name.to_owned()).collect()
    };
    labels
        .iter()
        .flat_map(|l| {
            let hedged =
                (scenario.compare_hedging && !l.contains("+hedge")).then(|| format!("{l}+hedge"));
            std::iter::once(l.clone()).chain(hedged)
        })
        .map(|l| with_refresh(&l, scenario.refresh_ms))
        .collect()
}

/// The server whose load the report follows: the scenario's `watch`, else the one the
/// engine picks.
fn watched_server(
    scenario: &Scenario,
    oracle: &dyn Fn() -> BoxStrategy,
    seed: u64,
) -> Result<String, SimError> {
    if let Some(w) = &scenario.watch {
        return Ok(w.clone());
    }
    let probe = Engine::new(scenario, oracle, None, None, 1, seed)
        .map_err(|e| SimError::input(&scenario.name, e))?;
    Ok(scenario.server_names()[probe.watched()].clone())
}

/// One run of the strategy `label` (as given: the scenario's `refresh_ms` is not added), no
/// oracle, no recording: what a parameter search repeats.
pub(crate) fn run_one(
    scenario: &Scenario,
    label: &str,
    requests: u64,
    seed: u64,
) -> Result<StrategyResult, SimError> {
    let (name, params) = parse_label(label)?;
    let make = || catalog::build(&name, params.clone()).expect("validated above");
    simulate(
        scenario,
        label,
        &make,
        None,
        None,
        requests,
        seed,
        &mut |_, _| {},
    )
}

#[allow(clippy::too_many_arguments)] // one internal call site per kind of run
fn simulate(
    scenario: &Scenario,
    label: &str,
    make: &dyn Fn() -> BoxStrategy,
    oracle: Option<Arc<Queues>>,
    record: Option<&lbkit_trace::Recorder>,
    requests: u64,
    seed: u64,
    progress: &mut dyn FnMut(&str, f64),
) -> Result<StrategyResult, SimError> {
    let (_, run) = split_run(label, Some(scenario))?;
    let engine = Engine::new(scenario, make, oracle, record, requests, seed)
        .map_err(|e| SimError::input(&scenario.name, e))?
        .with_hedge(run.hedge)
        .with_stages(run.aperture, seed);
    progress(label, 0.0);
    let result = engine.run(label.to_owned(), &mut |done| {
        progress(label, done as f64 / requests as f64)
    });
    progress(label, 1.0);
    Ok(result)
}

/// The servers of each zone (by expanded name).
fn zones(scenario: &Scenario) -> std::collections::BTreeMap<String, Vec<String>> {
    let names = scenario.server_names();
    let mut zones: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let mut at = 0;
    for spec in &scenario.servers {
        for _ in 0..spec.count {
            if let Some(z) = &spec.zone {
                zones.entry(z.clone()).or_default().push(names[at].clone());
            }
            at += 1;
        }
    }
    zones
}

// === impl Report ===

impl Report {
    /// The index of the watched server.
    pub fn watched_index(&self) -> usize {
        self.results
            .first()
            .and_then(|r| r.servers.iter().position(|s| s.name == self.watched))
            .unwrap_or(0)
    }

    /// Strategies whose runs came out identical (same latencies, failures and shares: on equal
    /// weights, round robin and weighted round robin make the same picks), as groups of indices
    /// into `results` in the order of their first member. The plots and the HTML report draw a
    /// group once.
    pub fn groups(&self) -> Vec<Vec<usize>> {
        let mut groups: Vec<Vec<usize>> = Vec::new();
        for (i, r) in self.results.iter().enumerate() {
            match groups
                .iter_mut()
                .find(|g| same_outcome(&self.results[g[0]], r))
            {
                Some(g) => g.push(i),
                None => groups.push(vec![i]),
            }
        }
        groups
    }

    /// A group's name: its members joined by " = ".
    pub fn group_label(&self, group: &[usize]) -> String {
        group
            .iter()
            .map(|&i| self.results[i].strategy.as_str())
            .collect::<Vec<_>>()
            .join(" = ")
    }

    /// Aligned text tables: one row per strategy, then each server's share of requests.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        let w = self
            .results
            .iter()
            .map(|r| r.strategy.len())
            .max()
            .unwrap_or(8)
            .max(8);
        let _ = writeln!(
            out,
            "scenario {} ({} requests per strategy, seed {}): {}",
            self.scenario, self.requests, self.seed, self.description
        );
        self.results_table(&mut out, w);
        if self.results.iter().any(|r| r.strategy == ORACLE) {
            let _ = writeln!(
                out,
                "({ORACLE}: shortest expected delay, seeing every server's true queue and service \
                 rate — the best-known baseline, which no real client can run)"
            );
        }
        let n = self.results.first().map_or(0, |r| r.servers.len());
        if n <= 16 {
            self.share_table(&mut out, w);
        }
        if self.fleet {
            self.fleet_table(&mut out, w);
        }
        for note in &self.notes {
            let _ = writeln!(out, "\nnote: {note}");
        }
        out
    }

    /// Latency, errors and the watched server's share and queue, one row per strategy
    /// (`w`: the strategy column's width).
    fn results_table(&self, out: &mut String, w: usize) {
        let watched = self.watched_index();
        let _ = writeln!(
            out,
            "{:w$}  {:>9}  {:>8}  {:>8}  {:>9}  {:>9}  {:>6}  {:>8}  {:>7}  {:>9}",
            "strategy",
            "ok req/s",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "p99.9 ms",
            "err %",
            "timeout%",
            format!("{} %", truncate(&self.watched, 5)),
            "max queue"
        );
        for r in &self.results {
            let s = &r.servers[watched];
            let _ = writeln!(
                out,
                "{:w$}  {:>9.1}  {:>8.2}  {:>8.2}  {:>9.2}  {:>9.2}  {:>6.2}  {:>8.2}  {:>7.2}  {:>9}",
                r.strategy,
                r.throughput,
                r.p50_ms,
                r.p90_ms,
                r.p99_ms,
                r.p999_ms,
                r.error_rate * 100.0,
                r.timeout_rate * 100.0,
                s.share * 100.0,
                s.max_queue
            );
        }
    }

    /// Each server's share of requests, one row per strategy (`w`: the strategy column's
    /// width).
    fn share_table(&self, out: &mut String, w: usize) {
        let _ = writeln!(out, "\nshare of requests per server, %");
        let names: Vec<String> = self.results[0]
            .servers
            .iter()
            .map(|s| format!("{:>6}", truncate(&s.name, 6)))
            .collect();
        let _ = writeln!(out, "{:w$}  {}", "strategy", names.join(" "));
        for r in &self.results {
            let cells: Vec<String> = r
                .servers
                .iter()
                .map(|s| format!("{:>6.1}", s.share * 100.0))
                .collect();
            let _ = writeln!(out, "{:w$}  {}", r.strategy, cells.join(" "));
        }
    }

    /// Connections per server, load spread and share per zone, one row per strategy.
    fn fleet_table(&self, out: &mut String, w: usize) {
        let zones: Vec<&String> = self.zones.keys().collect();
        let head: Vec<String> = zones
            .iter()
            .map(|z| format!("{:>7}", truncate(z, 7)))
            .collect();
        let _ = writeln!(
            out,
            "\nfleet: connections per server (clients that called it), load spread (busiest / mean){}",
            if zones.is_empty() { "" } else { ", share per zone %" }
        );
        let _ = writeln!(
            out,
            "{:w$}  {:>8}  {:>9}  {:>7}  {:>8}  {}",
            "strategy",
            "conn max",
            "conn mean",
            "spread",
            "p99 ms",
            head.join(" ")
        );
        for r in &self.results {
            let shares: Vec<String> = self
                .zones
                .values()
                .map(|names| {
                    let share: f64 = r
                        .servers
                        .iter()
                        .filter(|s| names.contains(&s.name))
                        .map(|s| s.share)
                        .sum();
                    format!("{:>7.1}", share * 100.0)
                })
                .collect();
            let _ = writeln!(
                out,
                "{:w$}  {:>8}  {:>9.1}  {:>7.2}  {:>8.2}  {}",
                r.strategy,
                r.connections_max,
                r.connections_mean,
                r.load_spread,
                r.p99_ms,
                shares.join(" ")
            );
        }
    }

    /// Pretty JSON (byte-identical for the same scenario, options and seed).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report always serialises")
    }

    /// Two lines: the winner on p99 and how it compares with round robin (when it ran).
    pub fn conclusion(&self) -> String {
        let real: Vec<&StrategyResult> = self
            .results
            .iter()
            .filter(|r| r.strategy != ORACLE)
            .collect();
        let Some(best) = real.iter().min_by(|a, b| score(a).total_cmp(&score(b))) else {
            return String::new();
        };
        let mut out = format!(
            "Best p99: {} at {:.1} ms ({:.2}% of requests failed or timed out).",
            best.strategy,
            best.p99_ms,
            (best.error_rate + best.timeout_rate) * 100.0
        );
        if let Some(oracle) = self.results.iter().find(|r| r.strategy == ORACLE) {
            let _ = write!(
                out,
                "\nThe best-known baseline ({ORACLE}, which no real client can run) reaches {:.1} ms: \
                 {} is {:.0}% above it.",
                oracle.p99_ms,
                best.strategy,
                (best.p99_ms / oracle.p99_ms.max(1e-9) - 1.0) * 100.0
            );
        }
        if let Some(rr) = real.iter().find(|r| r.strategy == "round-robin") {
            let ratio = rr.p99_ms / best.p99_ms.max(1e-9);
            let _ = write!(
                out,
                "\nRound robin's p99 is {:.1} ms: {} is {:.1}x better; round robin sent {:.1}% of requests to {}, {} sent {:.1}%.",
                rr.p99_ms,
                best.strategy,
                ratio,
                rr.servers[self.watched_index()].share * 100.0,
                self.watched,
                best.strategy,
                best.servers[self.watched_index()].share * 100.0
            );
        }
        out
    }
}

/// Whether two runs came out the same, their labels aside (exact: a run is deterministic, so
/// the same picks give the same bits).
fn same_outcome(a: &StrategyResult, b: &StrategyResult) -> bool {
    let key = |r: &StrategyResult| {
        [
            r.requests as f64,
            r.duration_s,
            r.mean_ms,
            r.p50_ms,
            r.p90_ms,
            r.p99_ms,
            r.p999_ms,
            r.error_rate,
            r.timeout_rate,
            r.attempts_per_request,
        ]
        .map(f64::to_bits)
    };
    key(a) == key(b)
        && a.servers.len() == b.servers.len()
        && a.servers
            .iter()
            .zip(&b.servers)
            .all(|(x, y)| x.share.to_bits() == y.share.to_bits() && x.max_queue == y.max_queue)
}

/// Ranking key for the conclusion: p99, with failed requests counted as worse than any latency.
pub(crate) fn score(r: &StrategyResult) -> f64 {
    r.p99_ms * (1.0 + 10.0 * (r.error_rate + r.timeout_rate))
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}
