//! Searching strategies and their parameters by simulation (`lbkit tune`): which setting would
//! do best on a scenario or a fitted trace, by how much, and how sure that is.
//!
//! # The search
//! 1. **Candidates** ([`search_space`]): every built-in strategy with each combination of the
//!    values its catalog entry lists for tuning
//!    ([`ParamInfo::tune`](lbkit_strategy::catalog::ParamInfo::tune)): choice count and
//!    active-request bias, default RTT and peak-EWMA decay, response-time windows and
//!    intervals, the adaptive penalty and blackout, the bounded-load balance factor. A service on a consistent-hashing
//!    strategy needs its keys' affinity, so its candidates are the hashing strategies; any other
//!    service's are the rest. When the scenario's requests may be hedged (idempotent, with
//!    `retries` ≥ 1) and need no affinity, each strategy is also tried hedged at [`HEDGE_DELAYS`] (`NAME+hedge=p95`).
//! 2. **Successive halving over seeds** (the racing of Jamieson and Talwalkar, *Non-stochastic
//!    best arm identification and hyperparameter optimization*, 2016): every candidate runs one
//!    seed, the best third (at least two) two seeds more, the best third of those (at least two)
//!    six more: nine seeds for the last ones standing. The current setting runs every seed of
//!    every round, as the yardstick, and candidates are compared on the same seeds.
//! 3. **Ranking** by the objective's mean over the seeds run. On a latency objective a candidate
//!    that fails more requests than the current setting (by over [`FAIL_SLACK`]) ranks after
//!    every one that does not: a lower p99 bought with failed requests is no gain.
//! 4. **The verdict on fresh seeds.** The winner and the current setting run [`FINAL_SEEDS`]
//!    seeds the search never saw — the winner of a race among dozens is partly the luckiest, and
//!    fresh seeds do not flatter it — paired seed by seed (same arrivals, same service times).
//!    The gain is the mean per-seed change with a 95 % Student-t interval. A winner whose
//!    interval includes no change is reported as not clearly better.
//!
//! A plan costs [`plan_runs`] runs, each of `requests` requests; `lbkit tune --budget SECONDS`
//! sizes `requests` from the speed of a first run so that the plan fits the budget.
//!
//! ```
//! use lbkit_sim::tune::{tune, Objective, TuneOptions};
//! use lbkit_sim::Scenario;
//! let scenario = Scenario::named("slow-provider").unwrap();
//! let options = TuneOptions {
//!     candidates: vec!["p2c-ewma".into(), "random".into(), "least-active".into()],
//!     requests: 4_000,
//!     final_seeds: 4,
//!     ..TuneOptions::new(Objective::P99, "round-robin")
//! };
//! let tuning = tune(&scenario, &options, &|_, _| {}).unwrap();
//! assert_ne!(tuning.winner, "round-robin");
//! assert!(tuning.gain.high < 0.0, "the winner's p99 is lower on every reading");
//! ```
//!
//! Not searched, because lbkit has none yet: aperture sizes.

use std::sync::atomic::AtomicU64;

use lbkit_strategy::catalog;
use serde::Serialize;

use crate::error::SimError;
use crate::report::{parse_label, with_refresh, Report, TIMERS};
use crate::scenario::{Scenario, MAX_REQUESTS};

/// The hedge delays searched for each strategy, when the scenario's requests may be hedged.
pub const HEDGE_DELAYS: [&str; 3] = ["p90", "p95", "p99"];

/// Fresh seeds the winner and the current setting run for the verdict.
pub const FINAL_SEEDS: u64 = 10;

/// How many more failed requests (a share: 0.001 = 0.1 percentage point) a candidate may have
/// than the current setting and still win on latency: within the noise of a run, not a trade.
pub const FAIL_SLACK: f64 = 0.001;

/// Seeds run by the candidates still standing after each round of the search (cumulative).
const ROUND_SEEDS: [u64; 3] = [1, 3, 9];

/// The final seeds start this far from the search's, so the two never overlap.
const FINAL_SEED_OFFSET: u64 = 1_000_000;

/// Runner-ups drawn beside the winner and the current setting in the comparison report.
const COMPARED_RUNNER_UPS: usize = 3;

/// What the search minimises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Objective {
    /// The 99th percentile latency of successful requests.
    P99,
    /// The 99.9th percentile.
    P999,
    /// The mean latency.
    Mean,
    /// The share of requests that failed or timed out (ties by p99).
    Errors,
}

impl std::str::FromStr for Objective {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "p99" => Ok(Objective::P99),
            "p999" => Ok(Objective::P999),
            "mean" => Ok(Objective::Mean),
            "errors" => Ok(Objective::Errors),
            _ => Err(format!(
                "unknown objective {s:?} (known: p99, p999, mean, errors)"
            )),
        }
    }
}

impl Objective {
    /// Its name, as `--objective` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Objective::P99 => "p99",
            Objective::P999 => "p999",
            Objective::Mean => "mean",
            Objective::Errors => "errors",
        }
    }

    /// The value of one run: ms, or a share of requests for [`Objective::Errors`].
    fn value(self, r: &Summary) -> f64 {
        match self {
            Objective::P99 => r.p99_ms,
            Objective::P999 => r.p999_ms,
            Objective::Mean => r.mean_ms,
            Objective::Errors => r.failed,
        }
    }

    /// A value as text with its unit.
    fn show(self, v: f64) -> String {
        match self {
            Objective::Errors => format!("{:.2} % failed", v * 100.0),
            _ => format!("{v:.2} ms"),
        }
    }
}

/// What to search.
#[derive(Debug, Clone)]
pub struct TuneOptions {
    /// What to minimise.
    pub objective: Objective,
    /// The setting in use now, as a strategy label (`name` or `name:param=value:...`).
    pub current: String,
    /// Candidate labels; empty: [`search_space`].
    pub candidates: Vec<String>,
    /// Requests per run.
    pub requests: u64,
    /// First seed of the search.
    pub seed: u64,
    /// Fresh seeds for the verdict (at least 2).
    pub final_seeds: u64,
    /// Runs simulated at once (threads).
    pub threads: usize,
}

impl TuneOptions {
    /// The defaults: every candidate, 20 000 requests per run, seed 1, [`FINAL_SEEDS`], one
    /// thread.
    pub fn new(objective: Objective, current: &str) -> TuneOptions {
        TuneOptions {
            objective,
            current: current.to_owned(),
            candidates: Vec::new(),
            requests: 20_000,
            seed: 1,
            final_seeds: FINAL_SEEDS,
            threads: 1,
        }
    }
}

/// One candidate's standing at the end of the search.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Candidate {
    /// Strategy label.
    pub label: String,
    /// Rounds of the search it ran (1 to 3; the current setting runs them all).
    pub rounds: usize,
    /// Seeds it ran.
    pub seeds: u64,
    /// Mean of the objective over them (ms, or a share for `errors`).
    pub objective: f64,
    /// Mean p99 over them, ms.
    pub p99_ms: f64,
    /// Mean share of requests failed or timed out.
    pub failed: f64,
    /// Whether it fails more requests than the current setting (beyond [`FAIL_SLACK`]), which
    /// ranks it last on a latency objective.
    pub fails_more: bool,
}

/// The winner against the current setting on fresh seeds, paired seed by seed.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Gain {
    /// Seeds compared.
    pub seeds: u64,
    /// The current setting's mean objective.
    pub current: f64,
    /// The winner's mean objective.
    pub winner: f64,
    /// Mean per-seed change: winner / current − 1 for latency (−0.3 = 30 % lower), winner −
    /// current for `errors` (a difference of shares).
    pub change: f64,
    /// Lower end of the 95 % interval of `change`.
    pub low: f64,
    /// Upper end.
    pub high: f64,
}

impl Gain {
    /// Whether the winner is better on the whole interval.
    pub fn is_clear(&self) -> bool {
        self.high < 0.0
    }
}

/// The result of a search.
#[derive(Debug, Clone, Serialize)]
pub struct Tuning {
    /// Scenario name.
    pub scenario: String,
    /// What was minimised.
    pub objective: Objective,
    /// The current setting's label.
    pub current: String,
    /// The best label (the current one when nothing beat it).
    pub winner: String,
    /// Requests per run.
    pub requests: u64,
    /// Runs simulated.
    pub runs: u64,
    /// Every candidate and the current setting, best first.
    pub ranking: Vec<Candidate>,
    /// The verdict (`seeds` 0 when the current setting won the search).
    pub gain: Gain,
    /// The current setting, the winner and the runner-ups on one fresh seed, with the oracle:
    /// the plots of the HTML report.
    #[serde(skip)]
    pub comparison: Report,
}

/// The candidates [`tune`] searches when none are given: see the module docs. Labels carry the
/// scenario's `refresh_ms` as [`run`](crate::run) would add it.
///
/// # Errors
/// The current label is not a built-in strategy.
pub fn search_space(scenario: &Scenario, current: &str) -> Result<Vec<String>, SimError> {
    let (current_name, _) = parse_label(current)?;
    let keyed = catalog::is_keyed(&current_name);
    let mut labels = Vec::new();
    for info in catalog::strategies().filter(|s| catalog::is_keyed(s.name) == keyed) {
        let mut combos = vec![info.name.to_owned()];
        for p in info.params.iter().filter(|p| !p.tune.is_empty()) {
            let timer = TIMERS
                .iter()
                .any(|(n, ps)| *n == info.name && ps.contains(&p.name));
            combos = combos
                .iter()
                .flat_map(|label| {
                    p.tune.iter().map(move |v| {
                        // A timer parameter is always written: left out, the scenario's
                        // refresh_ms would stand in for its default.
                        if *v == p.default && !timer {
                            label.clone()
                        } else {
                            format!("{label}:{}={v}", p.name)
                        }
                    })
                })
                .collect();
        }
        labels.extend(combos);
        // A hedge goes to another endpoint: not for a service that needs its keys' affinity.
        if hedgeable(scenario) && !keyed {
            labels.extend(
                HEDGE_DELAYS
                    .iter()
                    .map(|d| format!("{}+hedge={d}", info.name)),
            );
        }
    }
    let mut seen = std::collections::HashSet::new();
    Ok(labels
        .into_iter()
        .map(|l| with_refresh(&l, scenario.refresh_ms))
        .filter(|l| seen.insert(l.clone()))
        .collect())
}

/// Whether the scenario's requests may be hedged: idempotent, with an attempt beyond the first.
fn hedgeable(scenario: &Scenario) -> bool {
    scenario.workload.idempotent && scenario.workload.retries >= 1
}

/// The labels [`tune`] searches for `options` (its candidates, else [`search_space`]), each
/// once, without the current setting.
///
/// # Errors
/// A label that is not a built-in strategy or has a bad parameter; no candidate besides the
/// current setting.
pub fn candidates(scenario: &Scenario, options: &TuneOptions) -> Result<Vec<String>, SimError> {
    let current = with_refresh(&options.current, scenario.refresh_ms);
    parse_label(&current)?;
    let mut labels = if options.candidates.is_empty() {
        search_space(scenario, &current)?
    } else {
        let mut seen = std::collections::HashSet::new();
        options
            .candidates
            .iter()
            .map(|l| with_refresh(l, scenario.refresh_ms))
            .filter(|l| seen.insert(l.clone()))
            .collect()
    };
    for label in &labels {
        parse_label(label)?;
    }
    labels.retain(|l| *l != current);
    if labels.is_empty() {
        return Err(SimError::input(
            "candidates",
            format!("none besides the current setting {current}"),
        ));
    }
    Ok(labels)
}

/// The most runs a search of `candidates` (besides the current setting) can take, with
/// `final_seeds` and the comparison report.
pub fn plan_runs(candidates: usize, final_seeds: u64) -> u64 {
    let mut runs = 0;
    let mut alive = candidates as u64;
    let mut done = 0;
    for &seeds in &ROUND_SEEDS {
        runs += (alive + 1) * (seeds - done);
        done = seeds;
        alive = survivors(alive as usize) as u64;
    }
    runs + 2 * final_seeds + 2 + COMPARED_RUNNER_UPS as u64 + 1
}

/// Candidates kept after a round of `n`: the best third, at least two.
fn survivors(n: usize) -> usize {
    n.div_ceil(3).max(2).min(n)
}

/// Search `scenario` for the setting that minimises `options.objective`; `progress(done,
/// total)` hears about every run (from any thread).
///
/// # Errors
/// A label that is not a built-in strategy or has a bad parameter, no candidate besides the
/// current setting, `requests` out of range, fewer than two final seeds, a scenario that cannot
/// run.
pub fn tune(
    scenario: &Scenario,
    options: &TuneOptions,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<Tuning, SimError> {
    if options.requests == 0 || options.requests > MAX_REQUESTS {
        return Err(SimError::input(
            "requests",
            format!("must be within 1..={MAX_REQUESTS}"),
        ));
    }
    if options.final_seeds < 2 {
        return Err(SimError::input(
            "final seeds",
            "at least 2 are needed for an interval",
        ));
    }
    let current = with_refresh(&options.current, scenario.refresh_ms);
    let candidates = candidates(scenario, options)?;
    let search = Search {
        scenario,
        options,
        current: &current,
        total: plan_runs(candidates.len(), options.final_seeds),
        done: AtomicU64::new(0),
        progress,
    };
    search.run(candidates)
}

mod search;
mod verdict;

use search::{Search, Summary};

#[cfg(test)]
mod tests;
