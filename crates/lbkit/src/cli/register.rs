//! `lbkit register`: keep an ephemeral provider node in ZooKeeper until interrupted.

use std::io::Write;

use anyhow::Context as _;
use clap::Args;
use lbkit::discovery::zookeeper::{Provider, ZkRegistration};
use tokio::signal::unix::{signal, SignalKind};

use super::bad;
use super::watch::{init_logging, RegistryArgs};

#[derive(Debug, Args)]
#[command(
    disable_version_flag = true,
    group = clap::ArgGroup::new("needs_zk").args(["zk"]).required(true),
    group = clap::ArgGroup::new("needs_interface").args(["interface"]).required(true),
    after_help = "Prints `registered PATH` once the node exists (and again after each \
re-registration following a session expiry); SIGINT or SIGTERM deletes it and exits 0.\n\
Exit status: 0 deregistered, 1 ZooKeeper unreachable within --timeout-ms, 2 bad input."
)]
pub(crate) struct RegisterArgs {
    #[command(flatten)]
    registry: RegistryArgs,
    /// The provider's address, HOST:PORT.
    #[arg(long, value_name = "HOST:PORT")]
    address: String,
    /// Weight (0 = registered but receives no traffic).
    #[arg(long, value_name = "W", default_value_t = lbkit::DEFAULT_WEIGHT)]
    weight: u32,
    /// Protocol of the Dubbo URL.
    #[arg(long, value_name = "NAME", default_value = "dubbo")]
    protocol: String,
    /// Dubbo group.
    #[arg(long, value_name = "GROUP")]
    group: Option<String>,
    /// Dubbo version.
    #[arg(long, value_name = "VERSION")]
    version: Option<String>,
    /// Zone of the provider.
    #[arg(long, value_name = "ZONE")]
    zone: Option<String>,
    /// Dubbo `application`.
    #[arg(long, value_name = "NAME", default_value = "lbkit")]
    application: String,
    /// Extra URL parameter (Dubbo layout) or metadata entry (plain layout), K=V; repeatable.
    #[arg(long = "meta", value_name = "K=V")]
    meta: Vec<String>,
}

pub(crate) fn run(args: RegisterArgs) -> anyhow::Result<()> {
    let (zk, path) = args.registry.parse()?;
    let mut provider = Provider::new(args.address.trim());
    provider.weight = args.weight;
    provider.protocol.clone_from(&args.protocol);
    provider.group.clone_from(&args.group);
    provider.version.clone_from(&args.version);
    provider.zone.clone_from(&args.zone);
    provider.application.clone_from(&args.application);
    for kv in &args.meta {
        let (k, v) = kv
            .split_once('=')
            .filter(|(k, _)| !k.is_empty())
            .ok_or_else(|| bad(format!("--meta {kv:?}: expected K=V")))?;
        provider.metadata.insert(k.to_owned(), v.to_owned());
    }
    provider.validate().map_err(bad)?;
    init_logging();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let registration = ZkRegistration::spawn(zk, path, provider).map_err(bad)?;
        serve(&registration, &args).await?;
        let node = registration.status().get().node.unwrap_or_default();
        registration.deregister().await;
        println!("deregistered {node}");
        Ok(())
    })
}

/// Wait for the first registration (bounded), then report re-registrations until a signal.
async fn serve(registration: &ZkRegistration, args: &RegisterArgs) -> anyhow::Result<()> {
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut status = registration.status();
    let first = tokio::time::timeout(
        args.registry.timeout(),
        status.wait_for(|s| s.registrations > 0),
    )
    .await;
    let mut seen = match first {
        Ok(s) => s.registrations,
        Err(_) => {
            let why = status.get().last_error.unwrap_or_default();
            anyhow::bail!(
                "not registered after {} ms (--timeout-ms): {why}",
                args.registry.timeout().as_millis()
            );
        }
    };
    announce(registration)?;
    loop {
        tokio::select! {
            _ = interrupt.recv() => return Ok(()),
            _ = terminate.recv() => return Ok(()),
            s = status.wait_for(|s| s.registrations > seen) => {
                anyhow::ensure!(s.registrations > seen, "the registration task ended");
                seen = s.registrations;
                announce(registration)?;
            }
        }
    }
}

fn announce(registration: &ZkRegistration) -> anyhow::Result<()> {
    let node = registration.status().get().node.unwrap_or_default();
    let mut out = std::io::stdout().lock();
    writeln!(out, "registered {node}")?;
    out.flush()?;
    Ok(())
}
