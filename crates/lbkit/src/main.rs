//! The `lbkit` command-line tool. See `lbkit --help`.

mod cli;

use std::io::ErrorKind;
use std::process::ExitCode;

use clap::Parser;

/// jemalloc (the default `jemalloc` feature): its per-thread caches take a proxy's bursts of
/// streams that overflow glibc's (BENCHMARKS.md, "gRPC CPU a call against HAProxy, unary and
/// server streaming").
#[cfg(all(feature = "jemalloc", unix))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let args = cli::Cli::parse(); // usage errors exit with status 2 (clap)
    match cli::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lbkit: {}", one_line(&format!("{e:#}")));
            ExitCode::from(if e.is::<cli::BadInput>() { 2 } else { 1 })
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.downcast_ref::<std::io::Error>()
        .is_some_and(|io| io.kind() == ErrorKind::BrokenPipe)
}

fn one_line(s: &str) -> String {
    s.lines().map(str::trim).collect::<Vec<_>>().join(" ")
}
