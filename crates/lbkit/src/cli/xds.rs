//! `lbkit xds`: serve services to Envoy and proxyless gRPC over ADS, or check a config file.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use lbkit_xds::XdsConfig;

use super::bad;

#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("file").required(true))]
pub(crate) struct XdsArgs {
    /// Serve the services of this file (`[xds]` and the proxy's `[service.NAME]` tables).
    #[arg(long, value_name = "FILE", group = "file")]
    config: Option<PathBuf>,
    /// Only validate this file: prints `ok`, then one line per setting that Envoy and gRPC do
    /// not get as lbkit runs it; or one line naming the bad field, and exit 2.
    #[arg(long, value_name = "FILE", group = "file")]
    check: Option<PathBuf>,
}

pub(crate) fn run(args: XdsArgs) -> anyhow::Result<()> {
    if let Some(path) = &args.check {
        let config = XdsConfig::load(path).map_err(bad)?;
        println!(
            "ok: {}: {} service(s), ADS on {}",
            path.display(),
            config.services.len(),
            config.xds.bind
        );
        for note in config.notes() {
            println!("not expressed: {note}");
        }
        return Ok(());
    }
    let Some(path) = args.config else {
        return Err(bad("give --config FILE or --check FILE"));
    };
    let config = XdsConfig::load(&path).map_err(bad)?;
    super::watch::init_logging();
    // Said in full by --check; at start, one line for the lot (a fleet of services with the
    // default strategy would otherwise log a line each).
    let notes = config.notes();
    if !notes.is_empty() {
        tracing::info!(count = notes.len(), first = %notes[0], "settings not expressed in xDS (lbkit xds --check lists them)");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("cannot install the signal handler")?;
        let running = lbkit_xds::start(config).await?;
        eprintln!("lbkit xds: ADS on {}", running.ads());
        eprintln!("lbkit xds: admin on {}", running.admin());
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        drop(running);
        anyhow::Ok(())
    })
}
