//! `lbkit pick --explain`: each endpoint's effective weight and the inputs behind it.

use std::io::Write;

use lbkit::health::EjectionRule;
use lbkit::{Endpoint, EndpointIdx, Picker, Prepared, Snapshot, Strategy, Timestamp, Unavailable};
use lbkit::{RequestTag, Routed};
use lbkit_core::stage::{Attr, StageReport};
use lbkit_discovery::governance::applied_rules;
use lbkit_discovery::governance::tag::describe_tags;
use lbkit_discovery::stages::{report_json, report_lines};
use serde_json::{json, Value};

use super::pick::Run;

/// What `--explain` shows, computed before the picks.
pub(crate) struct Report {
    strategy: String,
    now: Timestamp,
    rows: Vec<Row>,
    /// The panic threshold, when the snapshot is in panic.
    panic: Option<f64>,
    /// Where the request's tag (or its lack) routes it, when the snapshot has tags.
    routing: Option<Routing>,
    /// What the stages decide for the request (subset, tiers, zones, aperture), when any
    /// runs; or why none serves it.
    stages: Option<Result<StageReport, String>>,
}

/// The tag routing of the explained request.
struct Routing {
    /// The request's tag, and whether it is forced.
    tag: Option<(String, bool)>,
    /// The tag rule in force, if any.
    rule: Option<String>,
    /// Which set it goes to, or why none.
    outcome: Result<Routed, String>,
}

struct Row {
    address: String,
    zone: Option<String>,
    weight: u32,
    effective: u32,
    state: String,
    eligible: bool,
    warmup: Option<Warmup>,
    in_flight: u32,
    avg_response_ms: Option<f64>,
    ewma_ms: Option<f64>,
    failures: u64,
    consecutive_failures: u32,
    /// The server's last load report (ORCA), which `adaptive` weighs.
    load: Option<lbkit_core::LoadReport>,
    note: Option<String>,
    /// The registry's override rules that changed the endpoint (`RULE sets k=v`), in order.
    rules: Vec<String>,
    /// Its tags, and where they come from.
    tags: Vec<String>,
    /// Whether the request's tag routing leaves it in the set picked from.
    routed: bool,
}

struct Warmup {
    registered_at_ms: u64,
    uptime_ms: i64,
    window_ms: u64,
}

/// Window over which `--explain` reads the observed average response time.
const AVG_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

impl Report {
    pub(crate) fn new(run: &Run, tag: Option<RequestTag<'_>>, attrs: &[Attr<'_>]) -> Self {
        let prepared = run.balancer.current();
        let snapshot = prepared.snapshot();
        let now = run.now;
        let routed = prepared.routed(tag);
        let in_set = |idx: EndpointIdx| routed.as_ref().is_ok_and(|(_, set)| set.contains(idx));
        let tagged = snapshot
            .endpoints()
            .iter()
            .any(|e| !describe_tags(e.metadata()).is_empty());
        let routing = (tagged || prepared.tag_rule().is_some() || tag.is_some()).then(|| Routing {
            tag: tag.map(|t| (String::from_utf8_lossy(t.name).into_owned(), t.force)),
            rule: prepared.tag_rule().map(str::to_owned),
            outcome: routed.as_ref().map(|(r, _)| *r).map_err(|e| e.to_string()),
        });
        let rows = snapshot
            .endpoints()
            .iter()
            .enumerate()
            .map(|(i, e)| Row::of(e, EndpointIdx::new(i), run, &prepared, in_set))
            .collect();
        Report {
            strategy: run.balancer.strategy().name().to_owned(),
            now,
            rows,
            panic: snapshot
                .in_panic()
                .then(|| snapshot.policy().panic_threshold),
            routing,
            stages: prepared
                .stage_report(tag, attrs)
                .map_err(|e| e.to_string())
                .transpose(),
        }
    }
}

impl Row {
    /// The row of endpoint `e` (at `idx`), its note from the prepared picker.
    fn of(
        e: &Endpoint,
        idx: EndpointIdx,
        run: &Run,
        prepared: &Prepared<Box<dyn Picker>>,
        in_set: impl Fn(EndpointIdx) -> bool,
    ) -> Row {
        let now = run.now;
        let snapshot = prepared.snapshot();
        let (state, eligible) = state(e, idx, snapshot, run, now);
        Row {
            address: e.address().to_owned(),
            zone: e.zone().map(str::to_owned),
            weight: e.weight(),
            effective: snapshot.effective_weight(idx, now),
            state,
            eligible,
            warmup: e.registered_at().map(|at| Warmup {
                registered_at_ms: at.as_millis(),
                uptime_ms: now.as_millis() as i64 - at.as_millis() as i64,
                window_ms: e.warmup().as_millis() as u64,
            }),
            in_flight: e.stats().in_flight(),
            avg_response_ms: e.stats().avg_response_at(now, AVG_WINDOW).map(ms),
            ewma_ms: e.stats().ewma_at(now).map(ms),
            failures: e.stats().failures(),
            consecutive_failures: e.stats().consecutive_failures(),
            load: e.stats().load_report(),
            rules: applied_rules(e.metadata())
                .into_iter()
                .map(str::to_owned)
                .collect(),
            tags: describe_tags(e.metadata()),
            routed: in_set(idx),
            note: e
                .is_eligible()
                .then(|| prepared.picker().explain(idx, now))
                .flatten(),
        }
    }
}

/// How `--explain` names a tag set.
fn routed_name(set: Routed) -> &'static str {
    match set {
        Routed::All => "all endpoints",
        Routed::Tagged => "the tag's endpoints",
        Routed::Untagged => "the untagged endpoints",
        Routed::Fallback => "the untagged endpoints (no endpoint has the tag)",
    }
}

/// A load report as `--explain` shows it in text.
fn load_line(l: &lbkit_core::LoadReport, now: Timestamp) -> String {
    format!(
        "load report: utilization {:.3}, qps {}, eps {}; {} ms old, flowing for {} ms",
        l.utilization,
        l.qps,
        l.eps,
        now.saturating_duration_since(l.at).as_millis(),
        now.saturating_duration_since(l.since).as_millis()
    )
}

/// A load report as `--explain --format json` shows it.
fn load_json(l: &lbkit_core::LoadReport, now: Timestamp) -> Value {
    json!({
        "utilization": l.utilization,
        "qps": l.qps,
        "eps": l.eps,
        "age_ms": now.saturating_duration_since(l.at).as_millis() as u64,
        "flowing_ms": now.saturating_duration_since(l.since).as_millis() as u64,
    })
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn state(
    e: &Endpoint,
    idx: EndpointIdx,
    snapshot: &Snapshot,
    run: &Run,
    now: Timestamp,
) -> (String, bool) {
    if e.weight() == 0 {
        return ("not eligible: weight 0 (drained)".into(), false);
    }
    let panic = if snapshot.is_eligible(idx) {
        "eligible in panic mode"
    } else {
        "not eligible"
    };
    if !e.is_healthy() {
        return (format!("{panic}: marked down"), snapshot.is_eligible(idx));
    }
    if let Some(ej) = run.ejections.get(e.key()) {
        let rule = match ej.rule {
            EjectionRule::ConsecutiveFailures(n) => format!("{n} consecutive failures"),
            EjectionRule::SuccessRate { rate, threshold } => {
                format!("success rate {rate:.1}% < {threshold:.1}% (mean - 1.9 stdev)")
            }
            EjectionRule::FailurePercentage { percent } => format!("{percent:.1}% of calls failed"),
        };
        let left = ej.until.as_millis().saturating_sub(now.as_millis());
        return (
            format!(
                "{panic}: ejected by outlier detection for {left} ms ({rule}, ejection #{})",
                ej.times
            ),
            snapshot.is_eligible(idx),
        );
    }
    match run.balancer.availability().check(e, now) {
        None => ("eligible".into(), true),
        Some(Unavailable::Tripped { until }) => (
            format!(
                "passed over: circuit breaker tripped for {} ms more ({} consecutive failures)",
                until.as_millis().saturating_sub(now.as_millis()),
                e.stats().consecutive_failures()
            ),
            true,
        ),
        Some(Unavailable::Busy { in_flight, limit }) => (
            format!("passed over: {in_flight} calls in flight, limit {limit}"),
            true,
        ),
        Some(Unavailable::PushedBack { until }) => (
            format!(
                "passed over: pushed back (429, Retry-After or grpc-retry-pushback-ms) for {} ms more",
                until.as_millis().saturating_sub(now.as_millis())
            ),
            true,
        ),
    }
}

pub(crate) fn text(out: &mut impl Write, r: &Report, picks: &[String]) -> std::io::Result<()> {
    let eligible = r.rows.iter().filter(|x| x.eligible).count();
    writeln!(
        out,
        "strategy: {}   now: {} ms   endpoints: {} ({} eligible)",
        r.strategy,
        r.now.as_millis(),
        r.rows.len(),
        eligible
    )?;
    if let Some(t) = r.panic {
        writeln!(
            out,
            "PANIC: fewer than {:.0}% of the weighted endpoints are healthy: balancing across all of them",
            t * 100.0
        )?;
    }
    if let Some(routing) = &r.routing {
        routing_line(out, r, routing, eligible)?;
    }
    match &r.stages {
        Some(Ok(s)) => report_lines(s)
            .iter()
            .try_for_each(|l| writeln!(out, "{l}"))?,
        Some(Err(e)) => writeln!(out, "stages: no endpoint: {e}")?,
        None => {}
    }
    let width = r.rows.iter().map(|x| x.address.len()).max().unwrap_or(0);
    for x in &r.rows {
        row(out, r, x, width)?;
    }
    writeln!(out, "picks:")?;
    picks.iter().try_for_each(|p| writeln!(out, "{p}"))
}

/// The tag routing line of `--explain`.
fn routing_line(
    out: &mut impl Write,
    r: &Report,
    routing: &Routing,
    eligible: usize,
) -> std::io::Result<()> {
    let request = match &routing.tag {
        Some((t, true)) => format!("tag {t} (forced)"),
        Some((t, false)) => format!("tag {t}"),
        None => "no tag".to_owned(),
    };
    let rule = routing
        .rule
        .as_deref()
        .map(|k| format!(", tag rule {k}"))
        .unwrap_or_default();
    let routed = r.rows.iter().filter(|x| x.routed).count();
    let to = match &routing.outcome {
        Ok(set) => format!("{}: {routed} of {eligible} eligible", routed_name(*set)),
        Err(e) => format!("no endpoint: {e}"),
    };
    writeln!(out, "tag routing: request with {request}{rule} -> {to}")?;
    Ok(())
}

/// One endpoint's lines of `--explain`.
fn row(out: &mut impl Write, r: &Report, x: &Row, width: usize) -> std::io::Result<()> {
    let zone = x
        .zone
        .as_deref()
        .map(|z| format!("  zone {z}"))
        .unwrap_or_default();
    writeln!(
        out,
        "  {:width$}  weight {} -> effective {}  {}{zone}",
        x.address, x.weight, x.effective, x.state
    )?;
    for rule in &x.rules {
        writeln!(out, "      rule {rule}")?;
    }
    if !x.tags.is_empty() || r.routing.is_some() {
        let tags = if x.tags.is_empty() {
            "untagged".to_owned()
        } else {
            format!("tag {}", x.tags.join(", "))
        };
        let set = if x.routed { "in" } else { "not in" };
        writeln!(out, "      {tags}; {set} this request's set")?;
    }
    if let Some(w) = &x.warmup {
        let phase = if w.uptime_ms < 0 {
            "registered in the future: weight 1".to_owned()
        } else if (w.uptime_ms as u64) < w.window_ms && w.uptime_ms > 0 {
            format!(
                "warming: trunc({} / ({} / {})) = {}",
                w.uptime_ms, w.window_ms, x.weight, x.effective
            )
        } else {
            "warm".to_owned()
        };
        writeln!(
            out,
            "      warm-up: registered at {} ms, uptime {} ms, window {} ms; {phase}",
            w.registered_at_ms, w.uptime_ms, w.window_ms
        )?;
    }
    let mut stats = format!("in_flight {}", x.in_flight);
    if let Some(a) = x.avg_response_ms {
        stats += &format!(", avg_response {a:.3} ms");
    }
    if let Some(e) = x.ewma_ms {
        stats += &format!(", ewma {e:.3} ms");
    }
    stats += &format!(
        ", failures {} ({} consecutive)",
        x.failures, x.consecutive_failures
    );
    writeln!(out, "      stats: {stats}")?;
    if let Some(l) = &x.load {
        writeln!(out, "      {}", load_line(l, r.now))?;
    }
    if let Some(n) = &x.note {
        writeln!(out, "      {}: {n}", r.strategy)?;
    }
    Ok(())
}

pub(crate) fn json(out: &mut impl Write, r: &Report, picks: &[String]) -> std::io::Result<()> {
    let endpoints: Vec<Value> = r
        .rows
        .iter()
        .map(|x| {
            json!({
                "address": x.address,
                "zone": x.zone,
                "weight": x.weight,
                "effective_weight": x.effective,
                "eligible": x.eligible,
                "state": x.state,
                "registered_at_ms": x.warmup.as_ref().map(|w| w.registered_at_ms),
                "uptime_ms": x.warmup.as_ref().map(|w| w.uptime_ms),
                "warmup_ms": x.warmup.as_ref().map(|w| w.window_ms),
                "in_flight": x.in_flight,
                "avg_response_ms": x.avg_response_ms,
                "ewma_ms": x.ewma_ms,
                "failures": x.failures,
                "consecutive_failures": x.consecutive_failures,
                "strategy_note": x.note,
                "load": x.load.map(|l| load_json(&l, r.now)),
                "rules": x.rules,
                "tags": x.tags,
                "routed": x.routed,
            })
        })
        .collect();
    let doc = json!({
        "strategy": r.strategy,
        "now_ms": r.now.as_millis(),
        "panic": r.panic.is_some(),
        "tag_routing": r.routing.as_ref().map(|t| json!({
            "tag": t.tag.as_ref().map(|(n, _)| n),
            "force": t.tag.as_ref().is_some_and(|(_, f)| *f),
            "rule": t.rule,
            "set": t.outcome.as_ref().ok().map(|s| routed_name(*s)),
            "error": t.outcome.as_ref().err(),
        })),
        "stages": match &r.stages {
            Some(Ok(s)) => report_json(s),
            Some(Err(e)) => json!({ "error": e }),
            None => Value::Null,
        },
        "endpoints": endpoints,
        "picks": picks,
    });
    writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)
}
