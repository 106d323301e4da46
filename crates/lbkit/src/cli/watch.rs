//! `lbkit watch`: a service's providers in ZooKeeper, then every change.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use futures_util::{FutureExt as _, StreamExt};
use lbkit::discovery::governance::applied_rules;
use lbkit::discovery::governance::tag::describe_tags;
use lbkit::discovery::source::Pace;
use lbkit::discovery::xds::XdsSource;
use lbkit::discovery::zookeeper::{
    Layout, ProviderFilter, ServicePath, WatchMode, ZkConfig, ZkSource,
};
use lbkit::discovery::{Controller, ControllerConfig, DiscoveryError, RemovalProtection};
use lbkit::{diff, Clock, Endpoint, EndpointIdx, Endpoints, Snapshot};
use tracing::level_filters::LevelFilter;
use tracing_subscriber::filter::Targets;

use super::bad;

/// Where the service lives: shared by `watch` and `register`.
#[derive(Debug, Args)]
pub(super) struct RegistryArgs {
    /// ZooKeeper servers: HOST:PORT[,HOST:PORT...].
    #[arg(long, value_name = "HOST:PORT")]
    zk: Option<String>,
    /// Service: the Dubbo interface (e.g. com.acme.Greeter), or the plain-layout service name.
    #[arg(long, value_name = "NAME")]
    interface: Option<String>,
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
        let (Some(servers), Some(interface)) = (&self.zk, &self.interface) else {
            return Err(bad("give --zk HOST:PORT and --interface NAME"));
        };
        let mut zk = ZkConfig::new(servers.trim());
        zk.validate().map_err(bad)?;
        zk.connect_timeout = self.timeout().min(zk.connect_timeout);
        let layout = match self.layout {
            LayoutArg::Dubbo => Layout::Dubbo,
            LayoutArg::Plain => Layout::Plain,
        };
        let path = ServicePath::new(&self.root, interface, layout).map_err(bad)?;
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
With --xds SERVER --cluster NAME it follows a cluster of an xDS control plane instead (no \
rules or tags there: the control plane has applied them).\n\
Exit status: 0 ok, 1 ZooKeeper (or the control plane) unreachable within --timeout-ms, 2 bad \
input.\n\
Logs (malformed nodes, outages) go to stderr; LBKIT_LOG=info|debug shows more, and \
LBKIT_LOG=warn,lbkit_discovery::controller=debug each set published with the endpoints it changed."
)]
pub(crate) struct WatchArgs {
    #[command(flatten)]
    registry: RegistryArgs,
    /// Follow a cluster of an xDS control plane instead (ADS: CDS, then EDS), HOST:PORT.
    #[arg(long, value_name = "HOST:PORT", conflicts_with_all = ["zk", "interface", "group", "version", "protocol", "application", "no_rules"], requires = "cluster")]
    xds: Option<String>,
    /// The cluster followed with --xds.
    #[arg(long, value_name = "NAME", requires = "xds")]
    cluster: Option<String>,
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

/// Send `tracing` output to stderr: warnings by default, `LBKIT_LOG` for more: a level
/// (`off`, `warn`, `info`, `debug`), or a level per module as in `RUST_LOG`
/// (`warn,lbkit_discovery::controller=debug`: each publish, with the endpoints it changed).
pub(super) fn init_logging() {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let spec = std::env::var("LBKIT_LOG").unwrap_or_default();
    let targets = match spec.as_str() {
        "trace" | "debug" | "info" | "warn" | "error" | "off" => spec.parse().ok(),
        s if s.contains('=') => s.parse().ok(),
        _ => None,
    };
    let targets = targets.unwrap_or_else(|| Targets::new().with_default(LevelFilter::WARN));
    let _ = tracing_subscriber::fmt()
        .with_writer(io::stderr)
        .with_max_level(LevelFilter::TRACE)
        .with_target(false)
        .finish()
        .with(targets)
        .try_init();
}

pub(crate) fn run(args: WatchArgs) -> anyhow::Result<()> {
    let registry = match (&args.xds, &args.cluster) {
        (Some(server), Some(_)) => {
            lbkit::discovery::check_address(server).map_err(|e| bad(format!("--xds: {e}")))?;
            None
        }
        _ => Some(args.registry.parse()?),
    };
    init_logging();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let followed = match registry {
            Some((zk, path)) => zookeeper(&args, zk, path),
            None => xds(&args),
        };
        follow(&args, followed).await
    })
}

/// What `watch` follows: a source's updates, whether its last set came from the cache file,
/// its name for headers, and the servers it reaches (for the give-up message).
struct Followed {
    updates: lbkit::discovery::source::UpdateStream,
    from_cache: Box<dyn Fn() -> bool>,
    dir: String,
    servers: String,
}

fn zookeeper(args: &WatchArgs, zk: ZkConfig, path: ServicePath) -> Followed {
    let filter = ProviderFilter {
        group: args.group.clone(),
        version: args.version.clone(),
        protocol: args.protocol.clone(),
    };
    let servers = format!("zookeeper {}", zk.servers);
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
    let from_cache = Box::new(move || status.get().from_cache);
    Followed {
        updates,
        from_cache,
        dir,
        servers,
    }
}

fn xds(args: &WatchArgs) -> Followed {
    let server = args.xds.clone().unwrap_or_default();
    let cluster = args.cluster.clone().unwrap_or_default();
    let mut source = XdsSource::new(&server, &cluster);
    if let Some(cache) = &args.cache {
        source = source.with_cache(cache);
    }
    let (updates, status) = source.spawn();
    let from_cache = Box::new(move || status.get().from_cache);
    let dir = format!("xds {server} cluster {cluster}");
    Followed {
        updates,
        from_cache,
        dir,
        servers: format!("xds {server}"),
    }
}

async fn follow(args: &WatchArgs, followed: Followed) -> anyhow::Result<()> {
    let Followed {
        updates,
        from_cache,
        dir,
        servers,
    } = followed;
    let mut updates = updates.peekable();
    // Registry contents are shown as they are: no empty-push or mass-removal protection here
    // (a line says when a change is one a consumer holds back).
    let mut controller = Controller::new(ControllerConfig {
        empty_protection: false,
        removal_protection: None,
        ..ControllerConfig::default()
    });
    let mut printer = Printer::new(dir);
    let mut mass = MassRemoval::new(RemovalProtection::default());
    let deadline = tokio::time::Instant::now() + args.registry.timeout();
    let mut last_error: Option<DiscoveryError> = None;
    // No change is taken before the last one's end plus what it cost to apply and print
    // (as the controller paces its batches), so a registry changing faster than sets are built
    // costs at most about half a core here and its changes are coalesced, not queued.
    let mut pace = Pace::default();
    loop {
        pace.wait().await;
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
                if !printer.shown() && from_cache() {
                    eprintln!("lbkit: {servers} unreachable; showing the registry cache");
                }
                let batch = with_queued(update, &mut updates);
                let began = tokio::time::Instant::now();
                show(&mut controller, &mut printer, &mut mass, batch, began)?;
                pace.done(began);
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

/// `first` and whatever else is queued already behind it: the registry changes faster than the
/// terminal shows it, so a queue of full listings is compared and printed once, not once each,
/// and the lag cannot build up.
fn with_queued(
    first: lbkit::Update,
    updates: &mut futures_util::stream::Peekable<lbkit::discovery::source::UpdateStream>,
) -> Vec<lbkit::Update> {
    let mut batch = vec![first];
    while let Some(Some(Ok(next))) = std::pin::Pin::new(&mut *updates)
        .next_if(Result::is_ok)
        .now_or_never()
    {
        batch.push(next);
    }
    batch
}

/// Apply one batch of updates and print what changed (and a mass removal's note).
fn show(
    controller: &mut Controller,
    printer: &mut Printer,
    mass: &mut MassRemoval,
    batch: Vec<lbkit::Update>,
    began: tokio::time::Instant,
) -> io::Result<()> {
    if let Some(snapshot) = controller.apply_batch(batch) {
        let (listed, gone) = (printer.listed(), printer.print(&snapshot)?);
        let change = (gone, listed, snapshot.len());
        if let Some(note) = mass.note(change, began) {
            println!("{note}");
        }
    } else if !printer.shown() {
        // The first listing equals the empty start: still show it.
        printer.print(&Arc::new(Snapshot::new(0, vec![])))?;
    }
    Ok(())
}

fn unreachable(
    servers: &str,
    last: Option<DiscoveryError>,
    registry: &RegistryArgs,
) -> anyhow::Error {
    let gave_up = format!("gave up after {} ms (--timeout-ms)", registry.timeout_ms);
    match last {
        Some(e) => anyhow::Error::new(e).context(gave_up),
        None => anyhow::anyhow!("{servers} unreachable: {gave_up}"),
    }
}

/// Printing a set costs O(changes) in text compared and printed: the snapshot builder keeps an
/// unchanged provider the same [`lbkit::Endpoint`], so the printer walks the last set and this
/// one in key order side by side, comparing pointers, and reads keys only where they differ
/// (which also checks that the new set is in key order). A set out of key order is walked
/// sorted (registry sources list in key order).
struct Printer {
    dir: String,
    clock: Clock,
    /// The last set shown: a snapshot in key order is kept as it is (no copy).
    last: Option<Last>,
}

/// The providers of the last set shown, in key order.
enum Last {
    Snapshot(Arc<Snapshot>),
    Sorted(Endpoints),
}

impl Last {
    fn endpoints(&self) -> &Endpoints {
        match self {
            Last::Snapshot(s) => s.endpoints(),
            Last::Sorted(v) => v,
        }
    }
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

    /// The providers of the last set shown.
    fn listed(&self) -> usize {
        self.last.as_ref().map_or(0, |l| l.endpoints().len())
    }

    /// Show `snapshot`; returns how many providers of the last set it no longer has.
    fn print(&mut self, snapshot: &Arc<Snapshot>) -> io::Result<usize> {
        self.write(snapshot, &mut io::stdout().lock())
    }

    fn write<W: Write>(&mut self, snapshot: &Arc<Snapshot>, mut out: W) -> io::Result<usize> {
        let all = snapshot.endpoints();
        let Some(last) = &self.last else {
            self.listing(snapshot, &mut out)?;
            out.flush()?;
            let in_order = all
                .iter()
                .zip(all.iter().skip(1))
                .all(|(a, b)| a.key() < b.key());
            self.last = Some(keep(snapshot, in_order));
            return Ok(0);
        };
        let last_set = last.endpoints();
        let (d, in_order) = match diff::between(last_set, all, None) {
            Some(d) => (d, true),
            None => (
                diff::between(last_set, all, Some(&diff::key_order(all))).unwrap_or_default(),
                false,
            ),
        };
        let now = self.clock.now();
        writeln!(out, "# change: {} providers", snapshot.len())?;
        for &(i, old) in &d.changed {
            let eff = snapshot.effective_weight(EndpointIdx::new(i), now);
            changed(&mut out, old.map(|o| &last_set[o]), &all[i], eff)?;
        }
        for &o in &d.gone {
            writeln!(out, "- {}", last_set[o].key())?;
        }
        out.flush()?;
        self.last = Some(keep(snapshot, in_order));
        Ok(d.gone.len())
    }

    /// The first set, whole, in its own order.
    fn listing<W: Write>(&self, snapshot: &Snapshot, out: &mut W) -> io::Result<()> {
        let now = self.clock.now();
        writeln!(out, "# {}: {} providers", self.dir, snapshot.len())?;
        let width = snapshot
            .endpoints()
            .iter()
            .map(|e| e.address().len())
            .max()
            .unwrap_or(7)
            .max(7);
        writeln!(
            out,
            "{:<width$}  {:>9}  {:>9}",
            "address", "weight", "effective"
        )?;
        for (i, e) in snapshot.endpoints().iter().enumerate() {
            let eff = snapshot.effective_weight(EndpointIdx::new(i), now);
            writeln!(out, "{:<width$}  {:>9}  {eff:>9}", e.address(), e.weight())?;
            details(out, e, &describe_tags(e.metadata()))?;
        }
        Ok(())
    }
}

/// The last set to keep: the snapshot itself when it is in key order, else its endpoints sorted.
fn keep(snapshot: &Arc<Snapshot>, in_order: bool) -> Last {
    if in_order {
        return Last::Snapshot(snapshot.clone());
    }
    let all = snapshot.endpoints();
    Last::Sorted(
        diff::key_order(all)
            .into_iter()
            .map(|i| all[i].clone())
            .collect(),
    )
}

/// Under a provider's row: the override rules that changed it, one line each, then its tags
/// (own `dubbo.tag`, the tag rule's).
fn details<W: Write>(out: &mut W, e: &Endpoint, tags: &[String]) -> io::Result<()> {
    for rule in applied_rules(e.metadata()) {
        writeln!(out, "  rule {rule}")?;
    }
    if !tags.is_empty() {
        writeln!(out, "  tag {}", tags.join(", "))?;
    }
    Ok(())
}

/// A provider new (`old` none) or not the same object as before: its line when its weight or
/// tags changed, or it is new.
fn changed<W: Write>(
    out: &mut W,
    old: Option<&Endpoint>,
    e: &Endpoint,
    eff: u32,
) -> io::Result<()> {
    let w = e.weight();
    let tags = describe_tags(e.metadata());
    match old {
        None => writeln!(out, "+ {}  weight {w}  effective {eff}", e.address())?,
        Some(old) if old.weight() != w => writeln!(
            out,
            "~ {}  weight {} -> {w}  effective {eff}",
            e.address(),
            old.weight()
        )?,
        Some(old) if describe_tags(old.metadata()) != tags => {
            writeln!(out, "~ {}  weight {w}  effective {eff}", e.address())?;
            if tags.is_empty() {
                writeln!(out, "  untagged")?;
            }
        }
        Some(_) => return Ok(()),
    }
    details(out, e, &tags)
}

/// Says when a change of the registry is a mass removal that `lbkit proxy` and tower pools
/// hold back ([`RemovalProtection`], with its default rule): `lbkit watch` shows the registry
/// as it is, and this line says what a consumer keeps serving.
struct MassRemoval {
    rule: RemovalProtection,
    /// The providers listed before each change within the rule's window: when, how many.
    sizes: VecDeque<(tokio::time::Instant, usize)>,
}

impl MassRemoval {
    fn new(rule: RemovalProtection) -> Self {
        MassRemoval {
            rule,
            sizes: VecDeque::new(),
        }
    }

    /// The line for a change at `now` that took `gone` providers from a set of `listed`,
    /// leaving `after`.
    fn note(
        &mut self,
        (gone, listed, after): (usize, usize, usize),
        now: tokio::time::Instant,
    ) -> Option<String> {
        let window = self.rule.window;
        while self
            .sizes
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > window)
        {
            self.sizes.pop_front();
        }
        self.sizes.push_back((now, listed));
        let peak = self.sizes.iter().map(|(_, n)| *n).max().unwrap_or(listed);
        if gone == 0 || !self.rule.holds(peak, after) {
            return None;
        }
        self.sizes.clear();
        Some(format!(
            "! mass removal: {peak} -> {after} providers within {} s; lbkit proxy and tower \
             pools keep serving the ones gone until each is confirmed gone (removal_protection)",
            window.as_secs()
        ))
    }
}

#[cfg(test)]
mod tests {
    use lbkit::{EndpointKey, EndpointSpec, SnapshotBuilder, Timestamp, Update};

    use super::*;

    fn spec(addr: &str, weight: u32) -> EndpointSpec {
        EndpointSpec::new(addr).with_weight(weight)
    }

    fn shown(printer: &mut Printer, snapshot: &Arc<Snapshot>) -> String {
        let mut out = Vec::new();
        printer.write(snapshot, &mut out).expect("written");
        String::from_utf8(out).expect("UTF-8")
    }

    /// The first set in full, then per change only what changed: added, reweighted, retagged
    /// and removed providers; unchanged ones (the same endpoint objects) print nothing.
    #[test]
    fn a_change_prints_only_the_providers_it_changed() {
        let (clock, _) = Clock::manual(Timestamp::ZERO);
        let mut printer = Printer::new("/dubbo/x/providers".into());
        printer.clock = clock;
        let mut builder = SnapshotBuilder::new();
        let first = builder.apply(
            Update::Reset(vec![
                spec("a:1", 100),
                spec("b:1", 100),
                spec("c:1", 100),
                spec("d:1", 100),
            ]),
            Timestamp::ZERO,
        );
        let text = shown(&mut printer, &first);
        assert_eq!(
            text,
            "# /dubbo/x/providers: 4 providers\n\
             address     weight  effective\n\
             a:1            100        100\n\
             b:1            100        100\n\
             c:1            100        100\n\
             d:1            100        100\n"
        );
        let second = builder.apply_all(
            [
                Update::Add(vec![
                    spec("b:1", 50),
                    spec("c:1", 100).with_meta("dubbo.tag", "blue"),
                    spec("e:1", 10),
                ]),
                Update::Remove(vec![EndpointKey::from("a:1")]),
            ],
            Timestamp::ZERO,
        );
        assert_eq!(
            shown(&mut printer, &second),
            "# change: 4 providers\n\
             ~ b:1  weight 100 -> 50  effective 50\n\
             ~ c:1  weight 100  effective 100\n  tag blue (own)\n\
             + e:1  weight 10  effective 10\n\
             - a:1\n"
        );
        // A spec sent again unchanged is no change; the tag going is.
        let third = builder.apply(
            Update::Add(vec![spec("c:1", 100), spec("d:1", 100)]),
            Timestamp::ZERO,
        );
        assert_eq!(
            shown(&mut printer, &third),
            "# change: 4 providers\n~ c:1  weight 100  effective 100\n  untagged\n"
        );
        // A provider that went and came back is new again.
        builder.apply(
            Update::Remove(vec![EndpointKey::from("e:1")]),
            Timestamp::ZERO,
        );
        let back = builder.apply(Update::Add(vec![spec("a:1", 100)]), Timestamp::ZERO);
        assert_eq!(
            shown(&mut printer, &back),
            "# change: 4 providers\n+ a:1  weight 100  effective 100\n- e:1\n"
        );
    }

    /// A set out of key order (a static list, a file) is diffed the same way, in key order:
    /// the unchanged providers print nothing however they are ordered.
    #[test]
    fn a_set_out_of_key_order_prints_the_same_changes() {
        let (clock, _) = Clock::manual(Timestamp::ZERO);
        let mut printer = Printer::new("/dubbo/x/providers".into());
        printer.clock = clock;
        let mut builder = SnapshotBuilder::new();
        let set = ["d:1", "b:1", "a:1", "c:1"].map(|a| spec(a, 100));
        let first = builder.apply(Update::Reset(set.to_vec()), Timestamp::ZERO);
        shown(&mut printer, &first);
        let second = builder.apply_all(
            [
                Update::Add(vec![spec("e:1", 10), spec("b:1", 50)]),
                Update::Remove(vec![EndpointKey::from("a:1")]),
            ],
            Timestamp::ZERO,
        );
        assert_eq!(
            shown(&mut printer, &second),
            "# change: 4 providers\n~ b:1  weight 100 -> 50  effective 50\n\
             + e:1  weight 10  effective 10\n- a:1\n"
        );
        // The same endpoints in another order: nothing changed.
        let mut moved = second.endpoints().to_vec();
        moved.reverse();
        let third = Arc::new(Snapshot::new(9, moved));
        assert_eq!(shown(&mut printer, &third), "# change: 4 providers\n");
    }

    /// A change that leaves fewer than half of the providers listed within the window gets
    /// its line; one provider gone, or a set replaced whole, or one after the window, not.
    #[test]
    fn a_mass_removal_gets_its_line() {
        let mut m = MassRemoval::new(RemovalProtection::default());
        let t0 = tokio::time::Instant::now();
        let s = std::time::Duration::from_secs;
        assert!(m.note((1, 5, 4), t0).is_none(), "one of five");
        assert!(
            m.note((4, 4, 4), t0).is_none(),
            "four replaced by four others"
        );
        let line = m
            .note((2, 4, 2), t0 + s(1))
            .expect("five to two within 10 s");
        assert!(
            line.starts_with("! mass removal: 5 -> 2 providers within 10 s"),
            "{line}"
        );
        assert!(m.note((1, 2, 1), t0 + s(30)).is_none(), "one alone, later");
    }
}
