//! `lbkit sim` and `lbkit demo`: which strategy wins for a service, in numbers and plots.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
// MAX_REQUESTS: most requests per strategy one run takes (keeps a typo from running for hours);
// scenario files have the same limit.
use lbkit_sim::{html, run as simulate, Report, RunOptions, Scenario, MAX_REQUESTS};

use super::bad;

#[derive(Debug, Args)]
#[command(
    after_help = "Built-in scenarios: see `lbkit sim --list`. Scenario files are TOML; \
the format is documented in crates/lbkit-sim/src/scenario.rs.\n\
Strategies take parameters as name:param=value, e.g. ketama:balance_factor=1.25."
)]
pub(crate) struct SimArgs {
    /// A scenario file (.toml) or a built-in scenario name [default: slow-provider].
    #[arg(long, short = 's', value_name = "FILE|NAME")]
    scenario: Option<String>,
    /// Strategies to compare, comma-separated [default: the scenario's list, else all].
    #[arg(long, value_delimiter = ',', value_name = "a,b,...")]
    strategies: Vec<String>,
    /// Client requests per strategy [default: the scenario's].
    #[arg(long, short = 'n', value_name = "N")]
    requests: Option<u64>,
    /// Seed [default: the scenario's, 1 for the built-in ones].
    #[arg(long, value_name = "S")]
    seed: Option<u64>,
    /// Folder for index.html and the SVG plots [default: lbkit-sim-out/SCENARIO-seedS].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = SimFormat::Table)]
    format: SimFormat,
    /// List the built-in scenarios.
    #[arg(long, exclusive = true)]
    list: bool,
    /// Replay a recorded trace (lbkit-trace: `[service.NAME.trace]`, `PoolBuilder::trace`):
    /// fit a scenario to it, check the fit by replaying the strategy that ran, then compare
    /// the strategies. The fitted scenario is written into --out (default
    /// lbkit-sim-out/trace-SERVICE).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["scenario", "fit"])]
    trace: Option<PathBuf>,
    /// Fit a scenario to a recorded trace and write it to --out (a .toml path; its files go
    /// beside it), to edit and rerun with --scenario.
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with = "scenario",
        requires = "out"
    )]
    fit: Option<PathBuf>,
    /// With --trace or --fit: the service to fit [default: the one with the most records].
    #[arg(long, value_name = "NAME")]
    service: Option<String>,
    /// Record the first strategy's run into this trace (every request, in virtual time), as
    /// `lbkit proxy` would record real traffic: input for --trace and --fit.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["trace", "fit"])]
    record: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum SimFormat {
    Table,
    Json,
}

#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Folder for index.html and the SVG plots [default: lbkit-sim-out/demo].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Client requests per strategy [default: the scenario's, 240000: two minutes].
    #[arg(long, short = 'n', value_name = "N")]
    requests: Option<u64>,
}

pub(crate) fn run(args: SimArgs) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if args.list {
        for (name, description) in Scenario::built_in() {
            writeln!(out, "{name:14} {description}")?;
        }
        return Ok(());
    }
    if let Some(file) = &args.fit {
        return fit_command(&args, file, &mut out);
    }
    if let Some(file) = &args.trace {
        return replay(&args, file, &mut out);
    }
    let scenario = load_scenario(args.scenario.as_deref().unwrap_or("slow-provider"))?;
    if let Some(n) = args.requests {
        if n == 0 || n > MAX_REQUESTS {
            return Err(bad(format!("--requests must be within 1..={MAX_REQUESTS}")));
        }
    }
    let options = RunOptions {
        requests: args.requests,
        seed: args.seed,
        strategies: args.strategies,
        skip_oracle: false,
        record: args.record.as_deref().map(recorder).transpose()?,
    };
    let show_progress = args.format == SimFormat::Table;
    let report = run_with_progress(&scenario, &options, show_progress)?;
    if let (Some(recorder), Some(path)) = (&options.record, &args.record) {
        recorder.flush();
        eprintln!(
            "recorded {} attempts of {} into {}",
            recorder.stats().written,
            report.results.first().map_or("", |r| r.strategy.as_str()),
            path.display()
        );
    }
    let dir = args.out.unwrap_or_else(|| default_out(&report));
    let written = print_report(&mut out, &report, &scenario, &dir, args.format)?;
    if args.format == SimFormat::Json {
        eprintln!(
            "plots: {}\nreport: {}",
            list_paths(&written.plots),
            written.page.display()
        );
    }
    Ok(())
}

/// `lbkit sim --fit FILE`: fit a scenario to the trace, write it (`--out`, default
/// `scenario.toml`) and say what was fitted.
fn fit_command(args: &SimArgs, file: &Path, out: &mut impl Write) -> anyhow::Result<()> {
    let fit = fit_trace(file, args.service.as_deref())?;
    let path = args.out.as_deref().unwrap_or(Path::new("scenario.toml"));
    fit.write(path).map_err(bad)?;
    if args.format == SimFormat::Json {
        return fit_json(out, &fit, path);
    }
    writeln!(
        out,
        "wrote {} ({} file(s) beside it): {} recorded requests of {} ({:.1} % sampled), strategy {}, recorded p50 {:.2} ms, p99 {:.2} ms, {:.2} % failed",
        path.display(),
        fit.files.len(),
        fit.requests,
        fit.service,
        fit.sample_rate * 100.0,
        fit.strategy,
        fit.p50_ms,
        fit.p99_ms,
        fit.error_rate * 100.0
    )?;
    for note in &fit.notes {
        writeln!(out, "note: {note}")?;
    }
    writeln!(out, "next: lbkit sim --scenario {}", path.display())?;
    Ok(())
}

/// `--record PATH`: a recorder of every attempt, lossless, as big as a trace may be.
fn recorder(path: &Path) -> anyhow::Result<std::sync::Arc<lbkit_trace::Recorder>> {
    let config = lbkit_trace::TraceConfig::new(path)
        .with_sample_rate(1.0)
        .with_max_bytes(lbkit_trace::MAX_MAX_BYTES)
        .with_lossless(true);
    Ok(std::sync::Arc::new(
        lbkit_trace::Recorder::open(&config).map_err(bad)?,
    ))
}

pub(super) fn fit_trace(file: &Path, service: Option<&str>) -> anyhow::Result<lbkit_sim::fit::Fit> {
    let trace = lbkit_trace::read(file).map_err(bad)?;
    lbkit_sim::fit::fit(&trace, service).map_err(bad)
}

/// What a trace's fit gives a command: the fit, the fitted scenario (loaded back) and the
/// folder it was written into.
pub(super) struct Fitted {
    pub(super) fit: lbkit_sim::fit::Fit,
    pub(super) scenario: Scenario,
    pub(super) dir: PathBuf,
}

/// Fit a scenario to one service of a trace and write it into `dir` (`scenario.toml` and its
/// files; default `ROOT/trace-SERVICE`), then print what was recorded and how well a replay of
/// the recorded strategy matches it.
pub(super) fn fit_and_check(
    file: &Path,
    service: Option<&str>,
    dir: Option<&Path>,
    (command, root): (&str, &str),
    out: &mut impl Write,
) -> anyhow::Result<Fitted> {
    let fit = fit_trace(file, service)?;
    let dir = dir.map_or_else(
        || PathBuf::from(root).join(format!("trace-{}", fit.service)),
        Path::to_path_buf,
    );
    let path = dir.join("scenario.toml");
    fit.write(&path).map_err(bad)?;
    let scenario = Scenario::load(&path).map_err(bad)?;
    if lbkit_strategy::catalog::build(&fit.strategy, Default::default()).is_err() {
        return Err(bad(format!(
            "the trace's strategy {:?} is not a built-in one: the fit cannot be checked by replaying it",
            fit.strategy
        )));
    }
    writeln!(
        out,
        "{command}: {} recorded requests of {} ({:.1} % sampled), strategy {}; fitted scenario: {}",
        fit.requests,
        fit.service,
        fit.sample_rate * 100.0,
        fit.strategy,
        path.display()
    )?;
    for note in &fit.notes {
        writeln!(out, "note: {note}")?;
    }
    let check = fit.validate(&scenario).map_err(bad)?;
    writeln!(out, "\n{}\n", check.describe(&fit.strategy))?;
    Ok(Fitted { fit, scenario, dir })
}

/// `lbkit sim --fit FILE --format json`: what was fitted and written, as one JSON object.
fn fit_json(out: &mut impl Write, fit: &lbkit_sim::fit::Fit, path: &Path) -> anyhow::Result<()> {
    let doc = serde_json::json!({
        "scenario": path.display().to_string(),
        "files": fit.files.len(),
        "requests": fit.requests,
        "service": fit.service,
        "sample_rate": fit.sample_rate,
        "strategy": fit.strategy,
        "p50_ms": fit.p50_ms,
        "p99_ms": fit.p99_ms,
        "error_rate": fit.error_rate,
        "notes": fit.notes,
    });
    writeln!(out, "{doc}")?;
    Ok(())
}

/// `lbkit sim --trace FILE`: fit, check the fit, compare. With `--format json` the fit and
/// its check go to stderr, so stdout carries the report's JSON alone.
fn replay(args: &SimArgs, file: &Path, out: &mut impl Write) -> anyhow::Result<()> {
    let mut stderr = std::io::stderr();
    let mut notes: &mut dyn Write = match args.format {
        SimFormat::Json => &mut stderr,
        SimFormat::Table => out,
    };
    let Fitted { fit, scenario, dir } = fit_and_check(
        file,
        args.service.as_deref(),
        args.out.as_deref(),
        ("lbkit sim --trace", "lbkit-sim-out"),
        &mut notes,
    )?;
    let mut strategies = vec![fit.strategy.clone()];
    strategies.extend(
        args.strategies
            .iter()
            .filter(|s| **s != fit.strategy)
            .cloned(),
    );
    if args.strategies.is_empty() {
        strategies.extend(
            lbkit_strategy::catalog::strategies()
                .map(|s| s.name.to_owned())
                .filter(|s| *s != fit.strategy),
        );
    }
    let options = RunOptions {
        requests: args.requests,
        seed: args.seed,
        strategies,
        ..RunOptions::default()
    };
    let report = run_with_progress(&scenario, &options, args.format == SimFormat::Table)?;
    print_report(out, &report, &scenario, &dir, args.format)?;
    Ok(())
}

/// Write the plots and the HTML page into `dir` and print the report in `format` (the table
/// with its verdict and the files' paths, or JSON).
fn print_report(
    out: &mut impl Write,
    report: &Report,
    scenario: &Scenario,
    dir: &Path,
    format: SimFormat,
) -> anyhow::Result<html::Written> {
    let written = html::write_report(report, scenario, dir)?;
    match format {
        SimFormat::Json => writeln!(out, "{}", report.to_json())?,
        SimFormat::Table => print_table(out, report, &written)?,
    }
    Ok(written)
}

/// The table, its verdict and where the plots and the page are.
fn print_table(
    out: &mut impl Write,
    report: &Report,
    written: &html::Written,
) -> anyhow::Result<()> {
    write!(out, "{}", report.to_table())?;
    writeln!(out, "\n{}", report.conclusion())?;
    writeln!(out, "\nplots: {}", list_paths(&written.plots))?;
    writeln!(
        out,
        "report: {} (open it in a browser)",
        written.page.display()
    )?;
    Ok(())
}

pub(crate) fn demo(args: DemoArgs) -> anyhow::Result<()> {
    let scenario = Scenario::named("slow-provider")?;
    let requests = args.requests.unwrap_or(scenario.requests);
    if requests == 0 || requests > MAX_REQUESTS {
        return Err(bad(format!("--requests must be within 1..={MAX_REQUESTS}")));
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    writeln!(
        out,
        "lbkit demo: {} — {} requests per strategy at {:.0}/s, simulated with the production pickers.\n",
        scenario.description, requests, scenario.workload.rate
    )?;
    let options = RunOptions {
        requests: Some(requests),
        ..RunOptions::default()
    };
    let report = run_with_progress(&scenario, &options, true)?;
    let dir = args
        .out
        .unwrap_or_else(|| PathBuf::from("lbkit-sim-out").join("demo"));
    let written = html::write_report(&report, &scenario, &dir)?;
    print_table(&mut out, &report, &written)?;
    writeln!(out, "next: `lbkit sim --list` for other scenarios, `lbkit pick --help` to try a strategy on your endpoints.")?;
    Ok(())
}

pub(super) fn load_scenario(arg: &str) -> anyhow::Result<Scenario> {
    let path = Path::new(arg);
    let as_file = arg.ends_with(".toml") || path.is_file();
    let scenario = if as_file {
        Scenario::load(path)
    } else {
        Scenario::named(arg)
    };
    scenario.map_err(bad)
}

fn default_out(report: &Report) -> PathBuf {
    PathBuf::from("lbkit-sim-out").join(format!("{}-seed{}", report.scenario, report.seed))
}

pub(super) fn list_paths(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Run the scenario; a progress bar appears on stderr when the run takes over a second and
/// stderr is a terminal.
fn run_with_progress(
    scenario: &Scenario,
    options: &RunOptions,
    wanted: bool,
) -> anyhow::Result<Report> {
    let strategies = options.strategies.len().max(1) as u64;
    let bar = ProgressBar::with_draw_target(Some(1_000 * strategies), ProgressDrawTarget::hidden());
    bar.set_style(
        ProgressStyle::with_template("{spinner} simulating {msg:24} [{bar:30}] {percent:>3}%")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let interactive = wanted && std::io::stderr().is_terminal();
    #[allow(clippy::disallowed_methods)] // wall-clock time for the progress display only
    let started = Instant::now();
    let mut shown = false;
    let mut finished_runs = 0u64;
    let mut last_label = String::new();
    let report = simulate(scenario, options, &mut |label, fraction| {
        if label != last_label {
            if !last_label.is_empty() {
                finished_runs += 1;
            }
            last_label = label.to_owned();
            bar.set_message(label.to_owned());
        }
        if interactive && !shown && started.elapsed() > Duration::from_secs(1) {
            bar.set_draw_target(ProgressDrawTarget::stderr());
            shown = true;
        }
        bar.set_position(finished_runs * 1_000 + (fraction * 1_000.0) as u64);
    });
    bar.finish_and_clear();
    report.map_err(bad)
}
