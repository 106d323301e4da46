//! `lbkit proxy`: run the sidecar proxy, or check its configuration file.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use lbkit_proxy::{Config, Proxy, Supervisor};

use super::bad;

#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("file").required(true))]
pub(crate) struct ProxyArgs {
    /// Run with this configuration file (reloaded on SIGHUP and when it changes).
    #[arg(long, value_name = "FILE", group = "file")]
    config: Option<PathBuf>,
    /// Only validate this configuration file: prints `ok` or one line naming the field; exit 2
    /// when it is invalid.
    #[arg(long, value_name = "FILE", group = "file")]
    check: Option<PathBuf>,
    /// Worker threads, each with its own runtime, sockets and upstream pools (default: one per
    /// CPU; 1 serves on the main thread).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
}

pub(crate) fn run(args: ProxyArgs) -> anyhow::Result<()> {
    if let Some(path) = &args.check {
        let config = Config::load(path).map_err(bad)?;
        println!(
            "ok: {}: {} listener(s), {} route(s), {} service(s)",
            path.display(),
            config.listeners.len(),
            config.routes.len(),
            config.services.len()
        );
        return Ok(());
    }
    let Some(path) = args.config else {
        return Err(bad("give --config FILE or --check FILE"));
    };
    let config = Config::load(&path).map_err(bad)?;
    super::watch::init_logging();
    // Worker threads serve traffic, each on its own current-thread runtime (nginx's model);
    // this thread's runtime keeps the admin API, health checks and discovery.
    let workers = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let drain = config.drain_timeout();
        // This thread drives its runtime until the end: the fast path may use its write gate.
        Proxy::pin_runtime_thread();
        let proxy = Proxy::start_workers(config, workers).await?;
        let (listeners, admin) = (proxy.listeners().to_vec(), proxy.admin_addr());
        let supervisor = Supervisor::new(proxy, path, drain);
        let mut ready = supervisor.reloads();
        let run = supervisor.run(std::future::pending());
        tokio::pin!(run);
        // Announce the listeners only once SIGTERM and reloads are handled, so a script that
        // waits for these lines can signal the proxy at once.
        let early = tokio::select! {
            result = &mut run => Some(result),
            _ = ready.wait_for(|c| c.watching) => None,
        };
        if early.is_none() {
            for addr in &listeners {
                eprintln!("lbkit proxy: listening on {addr}");
            }
            eprintln!("lbkit proxy: admin on {admin}");
        }
        let result = match early {
            Some(result) => result,
            None => run.await,
        };
        let drained = result.context("cannot install signal handlers or the file watcher")?;
        if !drained {
            eprintln!("lbkit proxy: drain timeout; closed the remaining connections");
        }
        anyhow::Ok(())
    })
}
