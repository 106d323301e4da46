//! Subcommands of the `lbkit` binary.

mod explain;
mod pick;
mod proxy;
mod register;
mod sim;
mod trace;
mod tune;
mod watch;
mod xds;

use std::fmt;

use clap::{Parser, Subcommand};

/// lbkit: client-side load balancing for service calls.
#[derive(Debug, Parser)]
#[command(name = "lbkit", version, about, propagate_version = true)]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once per process
enum Command {
    /// Dry run: pick endpoints with a strategy and show why (--explain).
    Pick(pick::PickArgs),
    /// Simulate a scenario with every strategy: tables, JSON and SVG plots.
    Sim(sim::SimArgs),
    /// Search strategies and parameters by simulation (a scenario or a trace): the winner, its
    /// gain with an interval, and the config to apply.
    Tune(tune::TuneArgs),
    /// The slow-provider scenario over every strategy, with a conclusion: start here.
    Demo(sim::DemoArgs),
    /// Show a service's providers in ZooKeeper (Dubbo or plain layout), then every change.
    Watch(watch::WatchArgs),
    /// Register a provider in ZooKeeper (ephemeral) until interrupted.
    Register(register::RegisterArgs),
    /// Run the sidecar proxy (HTTP/1.1, h2c, TCP) from a config file, or --check one.
    Proxy(proxy::ProxyArgs),
    /// Read a recorded call trace: print it as JSON lines, or summarise it.
    Trace(trace::TraceArgs),
    /// Serve services (static, file, ZooKeeper) to Envoy and proxyless gRPC over xDS, or
    /// --check a config.
    Xds(xds::XdsArgs),
}

/// Run the parsed command line.
pub(crate) fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Pick(args) => pick::run(args),
        Command::Sim(args) => sim::run(args),
        Command::Tune(args) => tune::run(args),
        Command::Demo(args) => sim::demo(args),
        Command::Watch(args) => watch::run(args),
        Command::Register(args) => register::run(args),
        Command::Proxy(args) => proxy::run(args),
        Command::Trace(args) => trace::run(args),
        Command::Xds(args) => xds::run(args),
    }
}

/// Input the user must fix: exit status 2.
#[derive(Debug)]
pub(crate) struct BadInput(pub(crate) String);

impl fmt::Display for BadInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadInput {}

/// Wrap any displayable problem with the input as a [`BadInput`].
pub(crate) fn bad(e: impl fmt::Display) -> anyhow::Error {
    BadInput(e.to_string()).into()
}
