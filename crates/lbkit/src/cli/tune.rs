//! `lbkit tune`: search strategies and their parameters by simulation, on a scenario or on a
//! recorded trace, and print the winner, its gain with an interval, and the config to apply.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{ArgGroup, Args};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use lbkit_sim::tune::{self, Objective, TuneOptions, Tuning, FINAL_SEEDS};
use lbkit_sim::{html, Scenario, MAX_REQUESTS};

use super::bad;
use super::sim::{fit_and_check, list_paths, load_scenario, Fitted, SimFormat};

/// Fewest requests per run a budget may shrink a run to: below it a run's p99 rests on a few
/// dozen requests and the search ranks noise.
const MIN_REQUESTS: u64 = 2_000;

/// Requests of the run that measures the simulator's speed for `--budget`.
const CALIBRATION_REQUESTS: u64 = 20_000;

/// Candidates shown in the terminal (all are in index.html and the JSON).
const TOP: usize = 10;

#[derive(Debug, Args)]
#[command(
    group(ArgGroup::new("input").required(true).args(["scenario", "trace"])),
    after_help = "The search: every built-in strategy with the parameter values the catalog lists \
for tuning, raced over seeds (successive halving), the winner then compared with the current \
setting on 10 fresh seeds, paired. Details: the docs of lbkit_sim::tune."
)]
pub(crate) struct TuneArgs {
    /// A scenario file (.toml) or a built-in scenario name.
    #[arg(long, short = 's', value_name = "FILE|NAME")]
    scenario: Option<String>,
    /// A recorded trace: fit a scenario to it (checked by replaying the strategy that ran,
    /// which is the current setting), then search.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// What to minimise.
    #[arg(long, value_name = "p99|p999|mean|errors", default_value = "p99", value_parser = parse_objective)]
    objective: Objective,
    /// Wall-clock seconds the search may take: sizes the requests per run from the speed of a
    /// first run. Ignored with --requests.
    #[arg(long, value_name = "SECONDS", default_value_t = 60.0)]
    budget: f64,
    /// The setting in use now, as a strategy label [default: the trace's strategy, else
    /// round-robin, the proxy's default].
    #[arg(long, value_name = "LABEL")]
    current: Option<String>,
    /// Only these candidates (labels, comma-separated) [default: the whole search space].
    #[arg(long, value_delimiter = ',', value_name = "a,b,...")]
    strategies: Vec<String>,
    /// Requests per run, fixed (the search is then the same on every machine) [default: sized
    /// by --budget, at most the scenario's].
    #[arg(long, short = 'n', value_name = "N")]
    requests: Option<u64>,
    /// First seed of the search.
    #[arg(long, value_name = "S", default_value_t = 1)]
    seed: u64,
    /// With --trace: the service to fit [default: the one with the most records]. Also the
    /// service named in the printed config [default: the trace's service, else the scenario's
    /// name].
    #[arg(long, value_name = "NAME")]
    service: Option<String>,
    /// Folder for index.html and the SVG plots [default: lbkit-tune-out/SCENARIO].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = SimFormat::Table)]
    format: SimFormat,
    /// Simulations run at once [default: the machine's cores].
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
}

fn parse_objective(s: &str) -> Result<Objective, String> {
    s.parse()
}

pub(crate) fn run(args: TuneArgs) -> anyhow::Result<()> {
    check(&args)?;
    // With --format json, stdout carries the JSON alone: the rest goes to stderr.
    let mut text: Box<dyn Write> = match args.format {
        SimFormat::Table => Box::new(std::io::stdout()),
        SimFormat::Json => Box::new(std::io::stderr()),
    };
    let Target {
        scenario,
        dir,
        current,
        service,
    } = target(&args, &mut text)?;
    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let mut options = TuneOptions {
        candidates: args.strategies.clone(),
        seed: args.seed,
        final_seeds: FINAL_SEEDS,
        threads,
        ..TuneOptions::new(args.objective, &current)
    };
    let candidates = tune::candidates(&scenario, &options).map_err(bad)?.len();
    options.requests = match args.requests {
        Some(n) => n,
        None => size_runs(&scenario, &options, candidates, args.budget, &mut text)?,
    };
    writeln!(
        text,
        "lbkit tune: {} — objective {}, current setting {current}; {} candidates, {} requests \
         per run, at most {} runs on {threads} thread(s)",
        scenario.name,
        args.objective.name(),
        candidates,
        options.requests,
        tune::plan_runs(candidates, options.final_seeds)
    )?;
    let tuning = search_with_progress(&scenario, &options, args.format == SimFormat::Table)?;
    let written = html::write_tuning(&tuning, &scenario, &service, &dir)?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match args.format {
        SimFormat::Json => {
            writeln!(out, "{}", tuning.to_json())?;
            eprintln!("report: {}", written.page.display());
        }
        SimFormat::Table => print(&mut out, &tuning, &service, &written)?,
    }
    Ok(())
}

/// The numeric arguments' bounds: a positive budget, `--requests` within the simulator's
/// bounds, at least one thread.
fn check(args: &TuneArgs) -> anyhow::Result<()> {
    if !(args.budget.is_finite() && args.budget > 0.0) {
        return Err(bad("--budget must be a positive number of seconds"));
    }
    if let Some(n) = args.requests {
        if n == 0 || n > MAX_REQUESTS {
            return Err(bad(format!("--requests must be within 1..={MAX_REQUESTS}")));
        }
    }
    if args.threads == Some(0) {
        return Err(bad("--threads must be at least 1"));
    }
    Ok(())
}

/// What a search runs on and writes to.
struct Target {
    scenario: Scenario,
    /// The report's folder.
    dir: PathBuf,
    /// The setting to beat.
    current: String,
    /// The service named in the snippet.
    service: String,
}

/// The scenario to search: fitted to `--trace` (checked against it, notes to `text`), else
/// `--scenario`; with the report's folder, the current setting and the service's name.
fn target(args: &TuneArgs, text: &mut Box<dyn Write>) -> anyhow::Result<Target> {
    Ok(match &args.trace {
        Some(file) => {
            let Fitted { fit, scenario, dir } = fit_and_check(
                file,
                args.service.as_deref(),
                args.out.as_deref(),
                ("lbkit tune --trace", "lbkit-tune-out"),
                text,
            )?;
            let current = args.current.clone().unwrap_or(fit.strategy);
            Target {
                scenario,
                dir,
                current,
                service: fit.service,
            }
        }
        None => {
            let scenario = load_scenario(args.scenario.as_deref().unwrap_or_default())?;
            let dir = args
                .out
                .clone()
                .unwrap_or_else(|| Path::new("lbkit-tune-out").join(&scenario.name));
            let current = args.current.clone().unwrap_or_else(|| "round-robin".into());
            let service = args
                .service
                .clone()
                .unwrap_or_else(|| scenario.name.clone());
            Target {
                scenario,
                dir,
                current,
                service,
            }
        }
    })
}

fn print(
    out: &mut impl Write,
    tuning: &Tuning,
    service: &str,
    written: &html::Written,
) -> anyhow::Result<()> {
    writeln!(out, "\n{}", tuning.to_table(TOP))?;
    writeln!(out, "{}", tuning.verdict())?;
    let snippet = tuning.snippet(service);
    if !snippet.is_empty() && tuning.gain.is_clear() {
        write!(out, "\n{snippet}")?;
    }
    writeln!(out, "\nplots: {}", list_paths(&written.plots))?;
    writeln!(
        out,
        "report: {} (open it in a browser)",
        written.page.display()
    )?;
    Ok(())
}

/// Requests per run that fit the plan into `budget` seconds, from the speed of one run of the
/// current setting; at least [`MIN_REQUESTS`], at most the scenario's.
fn size_runs(
    scenario: &Scenario,
    options: &TuneOptions,
    candidates: usize,
    budget: f64,
    text: &mut impl Write,
) -> anyhow::Result<u64> {
    let most = scenario.requests.clamp(1, MAX_REQUESTS);
    let probe = CALIBRATION_REQUESTS.min(most);
    #[allow(clippy::disallowed_methods)] // wall-clock time to size the search to --budget
    let started = Instant::now();
    lbkit_sim::run(
        scenario,
        &lbkit_sim::RunOptions {
            requests: Some(probe),
            strategies: vec![options.current.clone()],
            skip_oracle: true,
            ..lbkit_sim::RunOptions::default()
        },
        &mut |_, _| {},
    )
    .map_err(bad)?;
    let per_request = started.elapsed().as_secs_f64().max(1e-9) / probe as f64;
    let runs = tune::plan_runs(candidates, options.final_seeds) as f64;
    // Runs spread over the threads; the machine's other work is not counted.
    let affordable = budget * options.threads as f64 / (runs * per_request);
    let requests = (affordable as u64).clamp(MIN_REQUESTS.min(most), most);
    if affordable < MIN_REQUESTS.min(most) as f64 {
        writeln!(
            text,
            "note: --budget {budget} s affords {:.0} requests per run; running {requests} \
             (about {:.0} s)",
            affordable,
            runs * requests as f64 * per_request / options.threads as f64
        )?;
    }
    Ok(requests)
}

/// Run the search; a progress bar appears on stderr when it takes over a second and stderr is
/// a terminal.
fn search_with_progress(
    scenario: &Scenario,
    options: &TuneOptions,
    wanted: bool,
) -> anyhow::Result<Tuning> {
    let bar = ProgressBar::with_draw_target(Some(1), ProgressDrawTarget::hidden());
    bar.set_style(
        ProgressStyle::with_template("{spinner} searching [{bar:30}] {pos}/{len} runs")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let interactive = wanted && std::io::stderr().is_terminal();
    #[allow(clippy::disallowed_methods)] // wall-clock time for the progress display only
    let started = Instant::now();
    let tuning = tune::tune(scenario, options, &|done, total| {
        if interactive && bar.is_hidden() && started.elapsed() > Duration::from_secs(1) {
            bar.set_draw_target(ProgressDrawTarget::stderr());
        }
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish_and_clear();
    tuning.map_err(bad)
}
