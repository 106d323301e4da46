//! `lbkit watch`: a service's providers in ZooKeeper, then every change.

use std::collections::HashMap;
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use futures_util::{FutureExt as _, StreamExt};
use lbkit::discovery::governance::applied_rules;
use lbkit::discovery::governance::tag::describe_tags;
use lbkit::discovery::zookeeper::{
    Layout, ProviderFilter, ServicePath, WatchMode, ZkConfig, ZkSource,
};
use lbkit::discovery::{Controller, ControllerConfig, DiscoveryError};
use lbkit::{Clock, EndpointIdx, Snapshot};
use tracing::level_filters::LevelFilter;

use super::bad;

/// Where the service lives: shared by `watch` and `register`.
#[derive(Debug, Args)]
pub(super) struct RegistryArgs {
    /// ZooKeeper servers: HOST:PORT[,HOST:PORT...].
    #[arg(long, value_name = "HOST:PORT")]
    zk: String,
    /// Service: the Dubbo interface (e.g. com.acme.Greeter), or the plain-layout service name.
    #[arg(long, value_name = "NAME")]
    interface: String,
    /// Root znode.
    #[arg(long, value_name = "NAME", default_value = "dubbo")]
    root: String,
    /// Node layout: dubbo = /ROOT/INTERFACE/providers/URL-encoded-URL; plain = /ROOT/NAME/HOST:PORT
    /// with optional JSON data {"weight", "zone", "metadata"}.
    #[arg(long, value_enum, default_value_t = LayoutArg::Dubbo)]
    layout: LayoutArg,
    /// How long to try reaching ZooKeeper before giving up (exit status 1), ms.
    #[arg(long, value_name = "MS", default_value_t = 5000)]
    timeout_ms: u64,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LayoutArg {
    Dubbo,
    Plain,
}

impl RegistryArgs {
    /// The connection settings and the service path; bad values are the user's to fix.
    pub(super) fn parse(&self) -> anyhow::Result<(ZkConfig, ServicePath)> {
        let mut zk = ZkConfig::new(self.zk.trim());
        zk.validate().map_err(bad)?;
        zk.connect_timeout = self.timeout().min(zk.connect_timeout);
        let layout = match self.layout {
            LayoutArg::Dubbo => Layout::Dubbo,
            LayoutArg::Plain => Layout::Plain,
        };
        let path = ServicePath::new(&self.root, &self.interface, layout).map_err(bad)?;
        Ok((zk, path))
    }

    pub(super) fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.max(1))
    }
}

#[derive(Debug, Args)]
#[command(
    disable_version_flag = true,
    after_help = "Prints the providers (address, configured and effective weight), then one \
line per change: + added, - removed, ~ changed. Under a provider that override rules (the \
service's configurators, as dubbo-admin writes them) changed: one `  rule RULE sets K=V` line \
per rule, in the order they applied; under a tagged provider: `  tag NAME (own)` (its \
`dubbo.tag`) or `  tag NAME (rule APPLICATION)` (the application's tag rule). A provider \
whose tags changed is a ~ line too.\n\
Exit status: 0 ok, 1 ZooKeeper unreachable within --timeout-ms, 2 bad input.\n\
Logs (malformed nodes, outages) go to stderr; LBKIT_LOG=info|debug shows more."
)]
pub(crate) struct WatchArgs {
    #[command(flatten)]
    registry: RegistryArgs,
    /// Print the current providers and exit.
    #[arg(long)]
    once: bool,
    /// Only providers of this Dubbo group ("*" = any, "a,b" = either, "" = none); default any.
    #[arg(long, value_name = "GROUP")]
    group: Option<String>,
    /// Only providers of this Dubbo version ("*" = any); default any.
    #[arg(long, value_name = "VERSION")]
    version: Option<String>,
    /// Only providers of these protocols (comma-separated); default any known protocol.
    #[arg(long, value_name = "PROTOCOL")]
    protocol: Option<String>,
    /// Registry cache file (JSON endpoints file): written after each change, and shown when
    /// ZooKeeper is unreachable at start-up (not with --once).
    #[arg(long, value_name = "FILE", conflicts_with = "once")]
    cache: Option<PathBuf>,
    /// The consumer's Dubbo application, for override rules scoped to one (a rule applies
    /// when it names this application or the provider's own).
    #[arg(long, value_name = "NAME")]
    application: Option<String>,
    /// Ignore the service's override rules (show providers as registered).
    #[arg(long)]
    no_rules: bool,
    /// How to watch: auto (persistent recursive watches; one-shot watches on servers older
    /// than ZooKeeper 3.6), persistent, one-shot.
    #[arg(long, value_name = "MODE", default_value = "auto", value_parser = WatchMode::parse)]
    watch: WatchMode,
}

/// Send `tracing` output to stderr: warnings by default, `LBKIT_LOG` for more.
pub(super) fn init_logging() {
    let level = match std::env::var("LBKIT_LOG").as_deref() {
        Ok("debug") => LevelFilter::DEBUG,
        Ok("info") => LevelFilter::INFO,
        Ok("off") => LevelFilter::OFF,
        _ => LevelFilter::WARN,
    };
    let _ = tracing_subscriber::fmt()
        .with_writer(io::stderr)
        .with_max_level(level)
        .with_target(false)
        .try_init();
}

pub(crate) fn run(args: WatchArgs) -> anyhow::Result<()> {
    let (zk, path) = args.registry.parse()?;
    let filter = ProviderFilter {
        group: args.group.clone(),
        version: args.version.clone(),
        protocol: args.protocol.clone(),
    };
    init_logging();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(watch(args, zk, path, filter))
}

async fn watch(
    args: WatchArgs,
    zk: ZkConfig,
    path: ServicePath,
    filter: ProviderFilter,
) -> anyhow::Result<()> {
    let servers = zk.servers.clone();
    let dir = path.dir();
    let mut source = ZkSource::new(zk, path)
        .with_filter(filter)
        .with_watch(args.watch)
        .with_governance(!args.no_rules);
    if let Some(app) = &args.application {
        source = source.with_application(app);
    }
    if let Some(cache) = &args.cache {
        source = source.with_cache(cache);
    }
    let (updates, status) = source.spawn();
    let mut updates = updates.peekable();
    // Registry contents are shown as they are: no empty-push protection here.
    let mut controller = Controller::new(ControllerConfig {
        empty_protection: false,
        ..ControllerConfig::default()
    });
    let mut printer = Printer::new(dir);
    let deadline = tokio::time::Instant::now() + args.registry.timeout();
    let mut last_error: Option<DiscoveryError> = None;
    loop {
        let item = if printer.shown() {
            updates.next().await
        } else {
            match tokio::time::timeout_at(deadline, updates.next()).await {
                Ok(item) => item,
                Err(_) => return Err(unreachable(&servers, last_error, &args.registry)),
            }
        };
        match item {
            Some(Ok(update)) => {
                if !printer.shown() && status.get().from_cache {
                    eprintln!("lbkit: ZooKeeper unreachable; showing the registry cache");
                }
                // Whatever else is queued already (the registry changes faster than the
                // terminal shows it) is one change on screen: a queue of full listings is
                // compared and printed once, not once each, so the lag cannot build up.
                let mut batch = vec![update];
                while let Some(Some(Ok(next))) = std::pin::Pin::new(&mut updates)
                    .next_if(Result::is_ok)
                    .now_or_never()
                {
                    batch.push(next);
                }
                if let Some(snapshot) = controller.apply_batch(batch) {
                    printer.print(&snapshot)?;
                } else if !printer.shown() {
                    // The first listing equals the empty start: still show it.
                    printer.print(&Arc::new(Snapshot::new(0, vec![])))?;
                }
                if args.once {
                    return Ok(());
                }
            }
            Some(Err(e)) => {
                if printer.shown() {
                    controller.source_error(&e);
                }
                last_error = Some(e);
            }
            None => anyhow::bail!("the registry watch ended"),
        }
    }
}

fn unreachable(
    servers: &str,
    last: Option<DiscoveryError>,
    registry: &RegistryArgs,
) -> anyhow::Error {
    let gave_up = format!("gave up after {} ms (--timeout-ms)", registry.timeout_ms);
    match last {
        Some(e) => anyhow::Error::new(e).context(gave_up),
        None => anyhow::anyhow!("zookeeper {servers} unreachable: {gave_up}"),
    }
}

/// What was shown of a provider: weight, effective weight, tags.
type Shown = (u32, u32, Vec<String>);

/// Prints the first set as a table and later ones as differences.
struct Printer {
    dir: String,
    clock: Clock,
    /// Address, configured and effective weight of the last set shown, by key.
    last: Option<HashMap<String, Shown>>,
}

impl Printer {
    fn new(dir: String) -> Self {
        Printer {
            dir,
            clock: Clock::System,
            last: None,
        }
    }

    fn shown(&self) -> bool {
        self.last.is_some()
    }

    fn print(&mut self, snapshot: &Snapshot) -> io::Result<()> {
        let now = self.clock.now();
        let rows: Vec<(String, &str, u32, u32, Vec<String>)> = (0..snapshot.len())
            .map(|i| {
                let idx = EndpointIdx::new(i);
                let e = snapshot.endpoint(idx);
                let key = e.key().to_string();
                (
                    key,
                    e.address(),
                    e.weight(),
                    snapshot.effective_weight(idx, now),
                    describe_tags(e.metadata()),
                )
            })
            .collect();
        // Its tags (own `dubbo.tag`, the tag rule's), one line under its row.
        let tag_line =
            |tags: &[String]| (!tags.is_empty()).then(|| format!("  tag {}", tags.join(", ")));
        // The override rules that changed a provider, one line each, under its row.
        let rules = |i: usize| -> Vec<&str> {
            let e = snapshot.endpoint(EndpointIdx::new(i));
            applied_rules(e.metadata())
        };
        let mut out = io::stdout().lock();
        match &self.last {
            None => {
                writeln!(out, "# {}: {} providers", self.dir, rows.len())?;
                let width = rows.iter().map(|r| r.1.len()).max().unwrap_or(7).max(7);
                writeln!(
                    out,
                    "{:<width$}  {:>9}  {:>9}",
                    "address", "weight", "effective"
                )?;
                for (i, (_, addr, w, eff, tags)) in rows.iter().enumerate() {
                    writeln!(out, "{addr:<width$}  {w:>9}  {eff:>9}")?;
                    for rule in rules(i) {
                        writeln!(out, "  rule {rule}")?;
                    }
                    if let Some(line) = tag_line(tags) {
                        writeln!(out, "{line}")?;
                    }
                }
            }
            Some(last) => {
                writeln!(out, "# change: {} providers", rows.len())?;
                for (i, (key, addr, w, eff, tags)) in rows.iter().enumerate() {
                    match last.get(key) {
                        None => writeln!(out, "+ {addr}  weight {w}  effective {eff}")?,
                        Some((old, _, _)) if old != w => {
                            writeln!(out, "~ {addr}  weight {old} -> {w}  effective {eff}")?;
                        }
                        Some((_, _, old_tags)) if old_tags != tags => {
                            writeln!(out, "~ {addr}  weight {w}  effective {eff}")?;
                            if tags.is_empty() {
                                writeln!(out, "  untagged")?;
                            }
                        }
                        Some(_) => continue,
                    }
                    for rule in rules(i) {
                        writeln!(out, "  rule {rule}")?;
                    }
                    if let Some(line) = tag_line(tags) {
                        writeln!(out, "{line}")?;
                    }
                }
                let now_keys: HashMap<&str, ()> = rows.iter().map(|r| (r.0.as_str(), ())).collect();
                let mut gone: Vec<&String> = last
                    .keys()
                    .filter(|k| !now_keys.contains_key(k.as_str()))
                    .collect();
                gone.sort();
                for key in gone {
                    writeln!(out, "- {key}")?;
                }
            }
        }
        out.flush()?;
        self.last = Some(
            rows.into_iter()
                .map(|(k, _, w, e, t)| (k, (w, e, t)))
                .collect(),
        );
        Ok(())
    }
}
