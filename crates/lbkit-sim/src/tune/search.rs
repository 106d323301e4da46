//! Running a search: rounds of simulations over seeds on worker threads, the ranking, and the
//! verdict on fresh seeds.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

use super::{
    survivors, Candidate, Gain, Objective, TuneOptions, Tuning, COMPARED_RUNNER_UPS, FAIL_SLACK,
    FINAL_SEED_OFFSET, ROUND_SEEDS,
};
use crate::error::SimError;
use crate::metrics::StrategyResult;
use crate::report::{run_one, Report, RunOptions};
use crate::scenario::Scenario;

/// What the search keeps of one run.
#[derive(Debug, Clone, Copy)]
pub(super) struct Summary {
    pub(super) p99_ms: f64,
    pub(super) p999_ms: f64,
    pub(super) mean_ms: f64,
    pub(super) failed: f64,
}

impl From<&StrategyResult> for Summary {
    fn from(r: &StrategyResult) -> Summary {
        Summary {
            p99_ms: r.p99_ms,
            p999_ms: r.p999_ms,
            mean_ms: r.mean_ms,
            failed: r.error_rate + r.timeout_rate,
        }
    }
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = v.fold((0.0, 0u32), |(s, n), x| (s + x, n + 1));
    if n == 0 {
        0.0
    } else {
        sum / f64::from(n)
    }
}

/// Each label's runs, one a seed, in seed order.
type Runs = BTreeMap<String, Vec<Summary>>;

/// One search in progress.
pub(super) struct Search<'a> {
    pub(super) scenario: &'a Scenario,
    pub(super) options: &'a TuneOptions,
    pub(super) current: &'a str,
    pub(super) total: u64,
    pub(super) done: AtomicU64,
    pub(super) progress: &'a (dyn Fn(u64, u64) + Sync),
}

impl Search<'_> {
    pub(super) fn run(&self, candidates: Vec<String>) -> Result<Tuning, SimError> {
        let (runs, rounds) = self.rounds(candidates)?;
        let ranking = self.ranking(&runs, &rounds);
        let winner = ranking[0].label.clone();
        let gain = if winner == self.current {
            let current = ranking[0].objective;
            Gain {
                seeds: 0,
                current,
                winner: current,
                change: 0.0,
                low: 0.0,
                high: 0.0,
            }
        } else {
            self.verdict(&winner)?
        };
        let comparison = self.comparison(&ranking)?;
        Ok(Tuning {
            scenario: self.scenario.name.clone(),
            objective: self.options.objective,
            current: self.current.to_owned(),
            winner,
            requests: self.options.requests,
            runs: self.done.load(Relaxed),
            ranking,
            gain,
            comparison,
        })
    }

    /// The rounds of [`ROUND_SEEDS`]: each round runs the candidates still in (and the
    /// current setting) on the seeds they have not run yet, ranks them, and keeps the
    /// [`survivors`] for the next. Each label's runs, and the rounds it stayed in.
    fn rounds(&self, candidates: Vec<String>) -> Result<(Runs, BTreeMap<String, usize>), SimError> {
        let mut runs: Runs = BTreeMap::new();
        let mut rounds: BTreeMap<String, usize> = BTreeMap::new();
        let mut alive = candidates;
        for (round, &seeds) in ROUND_SEEDS.iter().enumerate() {
            let jobs: Vec<(String, u64)> = alive
                .iter()
                .map(String::as_str)
                .chain([self.current])
                .flat_map(|l| {
                    let have = runs.get(l).map_or(0, Vec::len) as u64;
                    (have..seeds).map(move |s| (l.to_owned(), self.options.seed.wrapping_add(s)))
                })
                .collect();
            for ((label, _), result) in jobs.iter().zip(self.execute(&jobs)?) {
                runs.entry(label.clone())
                    .or_default()
                    .push(Summary::from(&result));
            }
            for l in alive.iter().map(String::as_str).chain([self.current]) {
                rounds.insert(l.to_owned(), round + 1);
            }
            let limit = self.fail_limit(&runs);
            alive.sort_by(|a, b| self.compare(&runs[a], &runs[b], limit).then(a.cmp(b)));
            if round + 1 < ROUND_SEEDS.len() {
                alive.truncate(survivors(alive.len()));
            }
        }
        Ok((runs, rounds))
    }

    /// The candidates best first: those that stayed in more rounds first, then by the
    /// objective; the current setting (which ran every seed) before the first candidate it
    /// beats on that candidate's own seeds (the seeds are the same prefix for everyone).
    fn ranking(&self, runs: &Runs, rounds: &BTreeMap<String, usize>) -> Vec<Candidate> {
        let limit = self.fail_limit(runs);
        let mut ranking: Vec<Candidate> = runs
            .iter()
            .filter(|(label, _)| *label != self.current)
            .map(|(label, rs)| self.candidate(label, rounds[label], rs, Some(limit)))
            .collect();
        ranking.sort_by(|a, b| {
            b.rounds
                .cmp(&a.rounds)
                .then_with(|| self.compare(&runs[&a.label], &runs[&b.label], limit))
                .then(a.label.cmp(&b.label))
        });
        let yardstick = &runs[self.current];
        let at = ranking
            .iter()
            .position(|c| {
                let seeds = &yardstick[..c.seeds as usize];
                self.compare(seeds, &runs[&c.label], limit).is_lt()
            })
            .unwrap_or(ranking.len());
        let current = self.candidate(self.current, ROUND_SEEDS.len(), yardstick, None);
        ranking.insert(at, current);
        ranking
    }

    /// `label`'s line of the ranking from its runs `rs`: means over its seeds. `limit`: the
    /// most failures it may have on a latency objective (`None` for the current setting).
    fn candidate(
        &self,
        label: &str,
        rounds: usize,
        rs: &[Summary],
        limit: Option<f64>,
    ) -> Candidate {
        let objective = self.options.objective;
        let failed = mean(rs.iter().map(|r| r.failed));
        Candidate {
            label: label.to_owned(),
            rounds,
            seeds: rs.len() as u64,
            objective: mean(rs.iter().map(|r| objective.value(r))),
            p99_ms: mean(rs.iter().map(|r| r.p99_ms)),
            failed,
            fails_more: objective != Objective::Errors && limit.is_some_and(|l| failed > l),
        }
    }

    /// The most failures a candidate may have on a latency objective: the current setting's
    /// mean plus [`FAIL_SLACK`].
    fn fail_limit(&self, runs: &BTreeMap<String, Vec<Summary>>) -> f64 {
        mean(runs[self.current].iter().map(|r| r.failed)) + FAIL_SLACK
    }

    /// Order two candidates by their runs so far (means over the same seeds).
    pub(super) fn compare(
        &self,
        a: &[Summary],
        b: &[Summary],
        fail_limit: f64,
    ) -> std::cmp::Ordering {
        let objective = self.options.objective;
        let key = |rs: &[Summary]| {
            let failed = mean(rs.iter().map(|r| r.failed));
            let value = mean(rs.iter().map(|r| objective.value(r)));
            match objective {
                Objective::Errors => (false, value, mean(rs.iter().map(|r| r.p99_ms))),
                _ => (failed > fail_limit, value, 0.0),
            }
        };
        let (ka, kb) = (key(a), key(b));
        ka.0.cmp(&kb.0)
            .then(ka.1.total_cmp(&kb.1))
            .then(ka.2.total_cmp(&kb.2))
    }

    /// The winner and the current setting on fresh seeds, paired.
    fn verdict(&self, winner: &str) -> Result<Gain, SimError> {
        let objective = self.options.objective;
        let seeds: Vec<u64> = (0..self.options.final_seeds)
            .map(|i| {
                self.options
                    .seed
                    .wrapping_add(FINAL_SEED_OFFSET)
                    .wrapping_add(i)
            })
            .collect();
        let jobs: Vec<(String, u64)> = seeds
            .iter()
            .flat_map(|&s| [(self.current.to_owned(), s), (winner.to_owned(), s)])
            .collect();
        let results = self.execute(&jobs)?;
        let pairs: Vec<(f64, f64)> = results
            .chunks(2)
            .map(|p| {
                (
                    objective.value(&Summary::from(&p[0])),
                    objective.value(&Summary::from(&p[1])),
                )
            })
            .collect();
        let changes: Vec<f64> = pairs
            .iter()
            .map(|&(c, w)| match objective {
                Objective::Errors => w - c,
                _ => w / c.max(1e-9) - 1.0,
            })
            .collect();
        let (change, half) = interval(&changes);
        Ok(Gain {
            seeds: seeds.len() as u64,
            current: mean(pairs.iter().map(|p| p.0)),
            winner: mean(pairs.iter().map(|p| p.1)),
            change,
            low: change - half,
            high: change + half,
        })
    }

    /// The current setting, the winner and the runner-ups on the first fresh seed, with the
    /// oracle, as `lbkit sim` reports it.
    fn comparison(&self, ranking: &[Candidate]) -> Result<Report, SimError> {
        let mut strategies = vec![self.current.to_owned()];
        strategies.extend(
            ranking
                .iter()
                .filter(|c| c.label != self.current)
                .take(COMPARED_RUNNER_UPS + 1)
                .map(|c| c.label.clone()),
        );
        let mut last = String::new();
        let report = crate::run(
            self.scenario,
            &RunOptions {
                requests: Some(self.options.requests),
                seed: Some(self.options.seed.wrapping_add(FINAL_SEED_OFFSET)),
                strategies,
                ..RunOptions::default()
            },
            &mut |label, _| {
                if label != last {
                    last = label.to_owned();
                    self.tick();
                }
            },
        )?;
        Ok(report)
    }

    fn tick(&self) {
        let done = self.done.fetch_add(1, Relaxed) + 1;
        (self.progress)(done, self.total.max(done));
    }

    /// Run `jobs` (label, seed) on the worker threads; results in the order of `jobs`.
    fn execute(&self, jobs: &[(String, u64)]) -> Result<Vec<StrategyResult>, SimError> {
        let next = AtomicUsize::new(0);
        let work = || {
            let mut out = Vec::new();
            loop {
                let i = next.fetch_add(1, Relaxed);
                let Some((label, seed)) = jobs.get(i) else {
                    return out;
                };
                let result = run_one(self.scenario, label, self.options.requests, *seed);
                self.tick();
                let failed = result.is_err();
                out.push((i, result));
                if failed {
                    // Stop handing out work: the first error ends the search.
                    next.store(jobs.len(), Relaxed);
                    return out;
                }
            }
        };
        let threads = self.options.threads.clamp(1, jobs.len().max(1));
        let mut done: Vec<(usize, Result<StrategyResult, SimError>)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads).map(|_| s.spawn(work)).collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        done.sort_by_key(|(i, _)| *i);
        done.into_iter().map(|(_, r)| r).collect()
    }
}

/// The mean of `xs` and the half-width of its 95 % Student-t interval.
pub(super) fn interval(xs: &[f64]) -> (f64, f64) {
    let n = xs.len();
    let m = mean(xs.iter().copied());
    if n < 2 {
        return (m, f64::INFINITY);
    }
    let var = xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1) as f64;
    (m, t975(n - 1) * (var / n as f64).sqrt())
}

/// The 97.5th percentile of Student's t with `df` degrees of freedom (two-sided 95 %).
pub(super) fn t975(df: usize) -> f64 {
    // Standard tables; past 30 degrees of freedom the normal's 1.96 is within 2 %.
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    T.get(df.wrapping_sub(1)).copied().unwrap_or(1.96)
}
