//! `lbkit trace`: read a recorded call trace (lbkit-trace's format).

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::bad;

#[derive(Debug, Args)]
pub(crate) struct TraceArgs {
    #[command(subcommand)]
    command: TraceCommand,
}

#[derive(Debug, Subcommand)]
enum TraceCommand {
    /// Print every recorded attempt as one JSON object per line (FILE.1, the older segment,
    /// first when it exists).
    Print {
        /// The trace file (`[service.NAME.trace] path`, or the tower pool's).
        file: PathBuf,
        /// Print at most N attempts.
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
    },
    /// Count requests, attempts, outcomes and endpoints per service.
    Summary {
        /// The trace file.
        file: PathBuf,
    },
}

pub(crate) fn run(args: TraceArgs) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    match args.command {
        TraceCommand::Print { file, limit } => {
            let trace = lbkit_trace::read(&file).map_err(bad)?;
            for r in trace.records.iter().take(limit.unwrap_or(usize::MAX)) {
                serde_json::to_writer(&mut out, r)?;
                out.write_all(b"\n")?;
            }
            if trace.truncated {
                eprintln!(
                    "lbkit trace: {}: the last record was cut short (the writer stopped mid-write); the records before it are printed",
                    file.display()
                );
            }
        }
        TraceCommand::Summary { file } => {
            let trace = lbkit_trace::read(&file).map_err(bad)?;
            write!(out, "{}", summary(&trace))?;
        }
    }
    out.flush()?;
    Ok(())
}

/// Per service and strategy: requests, attempts, retries, outcomes, endpoints, time span.
fn summary(trace: &lbkit_trace::Trace) -> String {
    use std::collections::{BTreeMap, BTreeSet};
    use std::fmt::Write as _;
    #[derive(Default)]
    struct Row {
        requests: BTreeSet<u64>,
        attempts: u64,
        retries: u64,
        hedges: u64,
        failures: u64,
        endpoints: BTreeSet<String>,
        first: u64,
        last: u64,
    }
    let mut rows: BTreeMap<(String, String), Row> = BTreeMap::new();
    for r in &trace.records {
        let row = rows
            .entry((r.service.to_string(), r.strategy.to_string()))
            .or_insert_with(|| Row {
                first: u64::MAX,
                ..Row::default()
            });
        row.requests.insert(r.request);
        row.attempts += 1;
        row.retries += u64::from(r.retry);
        row.hedges += u64::from(r.hedge);
        row.failures += u64::from(r.outcome.is_failure());
        row.endpoints.insert(r.endpoint.to_string());
        row.first = row.first.min(r.picked_at_ns);
        row.last = row.last.max(r.picked_at_ns + r.latency_ns);
    }
    let mut out = format!(
        "{} attempts in {} segment(s){}\n",
        trace.records.len(),
        trace.segments,
        if trace.truncated {
            " (the last cut short)"
        } else {
            ""
        }
    );
    for ((service, strategy), row) in &rows {
        let _ = writeln!(
            out,
            "{service} ({strategy}): {} requests, {} attempts ({} retries, {} hedges), {} failed, {} endpoints, {:.1} s",
            row.requests.len(),
            row.attempts,
            row.retries,
            row.hedges,
            row.failures,
            row.endpoints.len(),
            row.last.saturating_sub(row.first) as f64 / 1e9
        );
    }
    out
}
