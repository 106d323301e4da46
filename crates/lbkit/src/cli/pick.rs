//! `lbkit pick`: run a strategy over a what-if endpoint set, without calling anything.

use std::collections::HashMap;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use lbkit::config::Config;
use lbkit::discovery::file::{self, FileEndpoint};
use lbkit::discovery::parse_static_list;
use lbkit::discovery::stages::{ApertureConfig, LocalitiesConfig, StagesConfig, SubsetsConfig};
use lbkit::health::{Ejection, OutlierConfig, OutlierDetector};
use lbkit::strategy::catalog::{self, Params};
use lbkit::strategy::ZoneAware;
use lbkit::{
    Availability, Balancer, BoxStrategy, CallGuard, Clock, EndpointKey, FastRng, HealthOverlay,
    PickContext, RequestTag, SlowStart, Snapshot, SnapshotPolicy, StatsSeed, Timestamp,
};
use lbkit_core::stage::{Attr, Stages};

use super::{bad, explain};

#[derive(Debug, Args)]
#[command(
    after_help = "Endpoints file formats (by extension): .toml ([[endpoint]] tables), .json (array of objects), \
.txt (Dubbo provider URLs, one per line, plain or URL-encoded).\n\
Picks are treated as calls still in flight, so load-aware strategies see each other's picks.\n\
Tag routing follows Dubbo's TagRouter: --tag picks among that tag's endpoints (else the untagged ones, unless --force-tag); no --tag avoids tagged endpoints.\n\
Stages run before the strategy: tag, subset (--subset-keys, --attr), priority tier (endpoint fields priority / backup, --overprovisioning), zone (--locality-weight), aperture (--aperture).\n\
Exit status: 0 ok, 1 no endpoint could be picked, 2 bad input."
)]
pub(crate) struct PickArgs {
    /// Strategy name (see --list).
    #[arg(long, short = 's', required_unless_present_any = ["list", "config"])]
    strategy: Option<String>,
    /// Strategy parameter NAME=VALUE (repeatable).
    #[arg(long = "param", short = 'p', value_name = "K=V")]
    params: Vec<String>,
    /// Take the strategy from a service config file instead (with --service).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["strategy", "params"], requires = "service")]
    config: Option<PathBuf>,
    /// Service whose strategy to use from --config.
    #[arg(long, value_name = "NAME", requires = "config")]
    service: Option<String>,
    /// Method of --service (per-method strategy).
    #[arg(long, value_name = "NAME", requires = "service")]
    method: Option<String>,
    /// Endpoints: comma-separated ADDRESS[=WEIGHT].
    #[arg(long, short = 'e', value_name = "SPEC", conflicts_with = "endpoints_file", required_unless_present_any = ["list", "endpoints_file"])]
    endpoints: Option<String>,
    /// Endpoints file (.toml, .json or .txt).
    #[arg(long, short = 'f', value_name = "PATH")]
    endpoints_file: Option<PathBuf>,
    /// Number of picks (default 1); not with --key.
    #[arg(long, short = 'n', value_name = "N", conflicts_with = "keys")]
    count: Option<u64>,
    /// Seed for randomized strategies (reproducible picks).
    #[arg(long, value_name = "S")]
    seed: Option<u64>,
    /// Request key (repeatable): one pick per key, in order.
    #[arg(long = "key", short = 'k', value_name = "KEY")]
    keys: Vec<String>,
    /// Fix the clock (Unix epoch ms) used for warm-up and statistics.
    #[arg(long, value_name = "MS")]
    now_ms: Option<u64>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    format: OutputFormat,
    /// Print each endpoint's effective weight and the inputs behind it, then the picks.
    #[arg(long)]
    explain: bool,
    /// Pass over endpoints with this many calls in flight (Ribbon's active-connections limit).
    #[arg(long, value_name = "N")]
    max_in_flight: Option<u32>,
    /// Do not pass over endpoints whose circuit breaker is tripped.
    #[arg(long)]
    no_breaker: bool,
    /// The caller's zone: prefer endpoints there, spill when it is degraded or overloaded.
    #[arg(long, value_name = "ZONE")]
    zone: Option<String>,
    /// Envoy's panic threshold, percent: below this share of healthy endpoints, balance over all
    /// [default: the config's, else 50].
    #[arg(long, value_name = "PCT")]
    panic_threshold: Option<f64>,
    /// Envoy slow start: ramp the weight of endpoints added within this window, ms.
    #[arg(long, value_name = "MS")]
    slow_start_ms: Option<u64>,
    /// Slow-start curve (1.0 linear).
    #[arg(
        long,
        value_name = "A",
        default_value_t = 1.0,
        requires = "slow_start_ms"
    )]
    slow_start_aggression: f64,
    /// Slow-start floor, percent of the weight.
    #[arg(
        long,
        value_name = "PCT",
        default_value_t = 10.0,
        requires = "slow_start_ms"
    )]
    slow_start_min_percent: f64,
    /// The request's tag (Dubbo's `dubbo.tag`): pick among the endpoints with that tag (their
    /// `dubbo.tag` metadata, or the registry's tag rule), else the untagged ones. Without it,
    /// a request avoids tagged endpoints.
    #[arg(long, value_name = "TAG")]
    tag: Option<String>,
    /// No fall back to untagged endpoints when none has --tag (`dubbo.force.tag=true`).
    #[arg(long, requires = "tag")]
    force_tag: bool,
    /// Do not run passive outlier detection over the observed statistics.
    #[arg(long)]
    no_outlier: bool,
    /// A request attribute K=V (repeatable): what metadata subsets match on.
    #[arg(long = "attr", value_name = "K=V")]
    attrs: Vec<String>,
    /// A subset key set K[,K...] (repeatable: tried in order): route a request to the endpoints
    /// whose metadata carries its --attr values for those keys.
    #[arg(long = "subset-keys", value_name = "K[,K...]")]
    subset_keys: Vec<String>,
    /// What a request no subset serves gets (also when its subset has no eligible endpoint):
    /// none (no endpoint), any (every endpoint) or default (--subset-default) [default: any].
    #[arg(long, value_name = "POLICY")]
    subset_fallback: Option<String>,
    /// The default subset, K=V[,K=V...] (with --subset-fallback default).
    #[arg(long, value_name = "K=V[,K=V...]")]
    subset_default: Option<String>,
    /// Envoy's overprovisioning factor for priority tiers and zones [default: 1.4].
    #[arg(long, value_name = "F")]
    overprovisioning: Option<f64>,
    /// Locality weight ZONE=W (repeatable): balance across zones by weight and health; zones not
    /// named weigh 1.
    #[arg(long = "locality-weight", value_name = "ZONE=W")]
    locality_weights: Vec<String>,
    /// Talk to only N endpoints: this client's aperture (with --client-index and
    /// --client-count in deterministic mode).
    #[arg(long, value_name = "N")]
    aperture: Option<u32>,
    /// This client's index among --client-count clients (deterministic aperture).
    #[arg(long, value_name = "I", requires = "aperture")]
    client_index: Option<u32>,
    /// How many clients share the endpoints (deterministic aperture).
    #[arg(long, value_name = "C", requires = "aperture")]
    client_count: Option<u32>,
    /// How the aperture is chosen: deterministic (Finagle's ring coordinates) or random (gRPC
    /// A68, seeded by --seed) [default: deterministic].
    #[arg(long, value_name = "MODE", requires = "aperture")]
    aperture_mode: Option<String>,
    /// List the strategies and their parameters.
    #[arg(long, exclusive = true)]
    list: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OutputFormat {
    Text,
    Json,
}

/// Most picks one run makes (keeps a typo like `--count 1e12` from running for hours).
const MAX_COUNT: u64 = 10_000_000;

pub(crate) fn run(args: PickArgs) -> anyhow::Result<()> {
    let out = std::io::stdout();
    let mut out = BufWriter::new(out.lock());
    if args.list {
        list(&mut out)?;
        return Ok(out.flush()?);
    }
    let clock_now = args
        .now_ms
        .map_or_else(|| Clock::System.now(), Timestamp::from_millis);
    let mut setup = setup(&args)?;
    if let Some(n) = args.max_in_flight {
        setup.availability.max_in_flight = Some(n);
    }
    if args.no_breaker {
        setup.availability.circuit_breaker = None;
    }
    let endpoints = endpoints(&args, clock_now)?;
    let policy = policy(&args, setup.policy)?;
    let stages = stages(&args, &setup.stages)?;
    let attrs = attrs(&args.attrs)?;
    let attrs: Vec<Attr<'_>> = attrs
        .iter()
        .map(|(k, v)| (k.as_bytes(), v.as_bytes()))
        .collect();
    let strategy = match args.zone.as_ref().or(setup.zone.as_ref()) {
        Some(zone) => BoxStrategy::new(ZoneAware::new(setup.strategy, zone.as_str())),
        None => setup.strategy,
    };
    let availability = setup.availability;
    let count = count(&args)?;
    let detector = (setup.outlier_detection && !args.no_outlier)
        .then(|| OutlierDetector::new(OutlierConfig::default()));
    let run = Run::new(
        strategy,
        availability,
        endpoints,
        clock_now,
        &policy,
        detector,
    );
    run.balancer.set_stages(stages, clock_now);
    let mut rng = args
        .seed
        .map_or_else(FastRng::from_entropy, FastRng::seed_from_u64);
    // The report shows the inputs as given, before the picks add their own in-flight calls.
    let tag = args.tag.as_deref().map(|t| RequestTag {
        name: t.as_bytes(),
        force: args.force_tag,
    });
    let report = args
        .explain
        .then(|| explain::Report::new(&run, tag, &attrs));
    let picks = run.picks(count, &args.keys, tag, &attrs, &mut rng)?;
    write_picks(&mut out, args.format, report, &picks)?;
    Ok(out.flush()?)
}

/// The picks, with the `--explain` report when there is one, in `format`.
fn write_picks(
    out: &mut impl Write,
    format: OutputFormat,
    report: Option<explain::Report>,
    picks: &[String],
) -> anyhow::Result<()> {
    match (format, report) {
        (OutputFormat::Text, None) => picks.iter().try_for_each(|p| writeln!(out, "{p}"))?,
        (OutputFormat::Json, None) => writeln!(out, "{}", serde_json::to_string(&picks)?)?,
        (OutputFormat::Text, Some(r)) => explain::text(out, &r, picks)?,
        (OutputFormat::Json, Some(r)) => explain::json(out, &r, picks)?,
    }
    Ok(())
}

/// How many picks to make: `--count`, else one per `--key`, else one.
fn count(args: &PickArgs) -> anyhow::Result<u64> {
    match args.count {
        Some(0) => Err(bad("--count must be at least 1")),
        Some(n) if n > MAX_COUNT => {
            Err(bad(format!("--count {n} is over the limit of {MAX_COUNT}")))
        }
        Some(n) => Ok(n),
        None if !args.keys.is_empty() => Ok(args.keys.len() as u64),
        None => Ok(1),
    }
}

fn list(out: &mut impl Write) -> anyhow::Result<()> {
    let width = catalog::strategies()
        .map(|s| s.name.len())
        .max()
        .unwrap_or(0);
    for s in catalog::strategies() {
        writeln!(out, "{:width$}  {}", s.name, s.summary)?;
        for p in s.params {
            writeln!(
                out,
                "{:width$}    --param {}={}  {}",
                "", p.name, p.default, p.doc
            )?;
        }
    }
    Ok(())
}

/// What the strategy flags or the service config ask for.
struct Setup {
    strategy: BoxStrategy,
    availability: Availability,
    policy: SnapshotPolicy,
    outlier_detection: bool,
    zone: Option<String>,
    stages: StagesConfig,
}

fn setup(args: &PickArgs) -> anyhow::Result<Setup> {
    if let Some(path) = &args.config {
        let config = Config::load(path).map_err(bad)?;
        let service = args.service.as_deref().unwrap_or_default();
        let r = config.resolve(service, args.method.as_deref());
        return Ok(Setup {
            strategy: catalog::build(&r.strategy, r.params.clone()).map_err(bad)?,
            availability: r.availability,
            policy: r.policy,
            outlier_detection: r.outlier_detection,
            zone: r.zone,
            stages: r.stages,
        });
    }
    let name = args.strategy.as_deref().unwrap_or_default();
    let mut params = Params::new();
    for p in &args.params {
        let (k, v) = Params::parse_pair(p).map_err(bad)?;
        params.insert(k, v);
    }
    Ok(Setup {
        strategy: catalog::build(name, params).map_err(bad)?,
        availability: Availability::default(),
        policy: SnapshotPolicy::envoy(),
        outlier_detection: true,
        zone: None,
        stages: StagesConfig::default(),
    })
}

/// The stages: the config's, with the flags given over them.
fn stages(args: &PickArgs, base: &StagesConfig) -> anyhow::Result<Stages> {
    let mut c = base.clone();
    let subset_flags = !args.subset_keys.is_empty()
        || args.subset_fallback.is_some()
        || args.subset_default.is_some();
    if subset_flags {
        c.subsets = Some(subsets(args, c.subsets.clone().unwrap_or_default())?);
    }
    c.overprovisioning = args.overprovisioning.or(c.overprovisioning);
    if !args.locality_weights.is_empty() {
        c.localities = Some(localities(args, c.localities.clone().unwrap_or_default())?);
    }
    if let Some(size) = args.aperture {
        let deterministic =
            args.aperture_mode.as_deref().unwrap_or("deterministic") == "deterministic";
        if deterministic && (args.client_index.is_none() || args.client_count.is_none()) {
            return Err(bad(
                "--aperture in deterministic mode needs --client-index and --client-count",
            ));
        }
        c.aperture = Some(ApertureConfig {
            size,
            mode: args.aperture_mode.clone(),
            client_index: args.client_index,
            client_count: args.client_count,
            seed: args.seed,
        });
    }
    c.build().map_err(|(field, why)| {
        let flag = match field.as_str() {
            "overprovisioning" if args.overprovisioning.is_some() => "--overprovisioning",
            "subsets.fallback" if subset_flags => "--subset-fallback",
            f if f.starts_with("subsets") && subset_flags => "--subset-keys/--subset-default",
            "aperture.mode" if args.aperture.is_some() => "--aperture-mode",
            f if f.starts_with("aperture") && args.aperture.is_some() => "--aperture",
            _ => return bad(format!("stages.{field}: {why}")),
        };
        bad(format!("{flag}: {why}"))
    })
}

/// The config's subsets with `--subset-keys`, `--subset-fallback` and `--subset-default`
/// over them.
fn subsets(args: &PickArgs, mut s: SubsetsConfig) -> anyhow::Result<SubsetsConfig> {
    if !args.subset_keys.is_empty() {
        s.keys = args.subset_keys.iter().map(|k| key_list(k)).collect();
    }
    if let Some(f) = &args.subset_fallback {
        s.fallback = Some(f.clone());
    }
    if let Some(d) = &args.subset_default {
        s.default = d
            .split(',')
            .map(|p| pair(p, "--subset-default"))
            .collect::<anyhow::Result<_>>()?;
    }
    Ok(s)
}

/// The config's locality weights with each `--locality-weight ZONE=W` over them (its other
/// zones and its default weight stay).
fn localities(args: &PickArgs, base: LocalitiesConfig) -> anyhow::Result<LocalitiesConfig> {
    let mut weights = base.weights;
    for w in &args.locality_weights {
        let (zone, weight) = pair(w, "--locality-weight")?;
        let weight = weight.parse().map_err(|_| {
            bad(format!(
                "--locality-weight {w}: the weight is not a whole number"
            ))
        })?;
        weights.insert(zone, weight);
    }
    Ok(LocalitiesConfig {
        weights,
        default_weight: base.default_weight,
    })
}

/// `a,b , c` → `["a", "b", "c"]`.
fn key_list(s: &str) -> Vec<String> {
    s.split(',').map(|k| k.trim().to_owned()).collect()
}

/// `K=V`, or an error naming `flag`.
fn pair(s: &str, flag: &str) -> anyhow::Result<(String, String)> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.trim().to_owned())),
        _ => Err(bad(format!("{flag} {s:?}: expected K=V"))),
    }
}

/// The `--attr K=V` flags.
fn attrs(flags: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    flags.iter().map(|a| pair(a, "--attr")).collect()
}

/// The snapshot policy: the flags where given, else `base` (the config's or Envoy's defaults).
fn policy(args: &PickArgs, base: SnapshotPolicy) -> anyhow::Result<SnapshotPolicy> {
    let panic_threshold = match args.panic_threshold {
        None => base.panic_threshold,
        Some(p) if (0.0..=100.0).contains(&p) => p / 100.0,
        Some(p) => {
            return Err(bad(format!(
                "--panic-threshold {p} is not a percentage (0-100)"
            )))
        }
    };
    let slow_start = match args.slow_start_ms {
        None => base.slow_start,
        Some(0) => return Err(bad("--slow-start-ms must be positive")),
        Some(ms) => {
            if !(args.slow_start_aggression.is_finite() && args.slow_start_aggression > 0.0) {
                return Err(bad("--slow-start-aggression must be a positive number"));
            }
            if !(0.0..=100.0).contains(&args.slow_start_min_percent) {
                return Err(bad("--slow-start-min-percent must be within 0-100"));
            }
            Some(SlowStart {
                window: Duration::from_millis(ms),
                aggression: args.slow_start_aggression,
                min_weight_percent: args.slow_start_min_percent,
            })
        }
    };
    Ok(SnapshotPolicy {
        panic_threshold,
        slow_start,
    })
}

fn endpoints(args: &PickArgs, now: Timestamp) -> anyhow::Result<Vec<FileEndpoint>> {
    if let Some(path) = &args.endpoints_file {
        return file::load(path, now).map_err(bad);
    }
    let spec = args.endpoints.as_deref().unwrap_or_default();
    let specs = parse_static_list(spec, "--endpoints").map_err(bad)?;
    Ok(specs
        .into_iter()
        .map(|spec| FileEndpoint {
            spec,
            observed: StatsSeed::default(),
        })
        .collect())
}

/// One dry run: the balancer over the what-if endpoints, at a fixed time.
pub(crate) struct Run {
    pub(crate) balancer: Balancer<BoxStrategy>,
    pub(crate) now: Timestamp,
    /// Ejections the outlier detector made over the observed statistics.
    pub(crate) ejections: HashMap<EndpointKey, Ejection>,
}

impl Run {
    fn new(
        strategy: BoxStrategy,
        availability: Availability,
        endpoints: Vec<FileEndpoint>,
        now: Timestamp,
        policy: &SnapshotPolicy,
        detector: Option<OutlierDetector>,
    ) -> Self {
        let (specs, seeds): (Vec<_>, Vec<_>) =
            endpoints.into_iter().map(|e| (e.spec, e.observed)).unzip();
        let observed = Snapshot::from_specs(specs, now);
        for (e, seed) in observed.endpoints().iter().zip(&seeds) {
            e.stats().seed(seed, now);
        }
        let mut ejections = HashMap::new();
        let overlay = match detector {
            Some(mut d) => {
                d.tick(&observed, now);
                for e in observed.endpoints() {
                    if let Some(ej) = d.ejection(e.key()) {
                        ejections.insert(e.key().clone(), *ej);
                    }
                }
                d.overlay().clone()
            }
            None => HealthOverlay::default(),
        };
        let snapshot = Arc::new(observed.derive(1, policy, &overlay));
        let (clock, _) = Clock::manual(now);
        let balancer = Balancer::new(strategy, snapshot, now)
            .with_availability(availability)
            .with_clock(clock);
        Run {
            balancer,
            now,
            ejections,
        }
    }

    fn picks(
        &self,
        count: u64,
        keys: &[String],
        tag: Option<RequestTag<'_>>,
        attrs: &[Attr<'_>],
        rng: &mut FastRng,
    ) -> anyhow::Result<Vec<String>> {
        let mut held: Vec<CallGuard> = Vec::new();
        let mut picks = Vec::new();
        for i in 0..count {
            let mut cx = PickContext::new(self.now, rng).with_attrs(attrs);
            cx.tag = tag;
            let mut cx = match keys.get(i as usize) {
                Some(k) => cx.with_key(k.as_bytes()),
                None => cx,
            };
            let guard = self
                .balancer
                .pick(&mut cx)
                .with_context(|| format!("pick {} of {count} failed", i + 1))?;
            picks.push(guard.endpoint().address().to_owned());
            held.push(guard);
        }
        Ok(picks)
    }
}
