//! Faults under load, end to end: real processes on loopback — backends, `lbkit proxy`,
//! `lbkit register`, a private ZooKeeper — with traffic flowing while a backend is killed or
//! hung, ZooKeeper is paused past the session timeout and restarted, the registry cache's
//! directory turns read-only or full, the configuration is reloaded every 100 ms, and three of
//! five providers leave ZooKeeper in one transaction.
//!
//! `cargo test -p lbkit --test faults` runs every scenario briefly and fails when a property
//! does not hold (CI); `scripts/faults.sh` runs the longer documented version (`-- --full`) and
//! prints the table RELIABILITY.md quotes. A name filter (`-- sigkill`) runs some of them. The
//! ZooKeeper scenarios start their own servers with Debian's `zookeeper` (scripts/zookeeper.sh
//! installs it); they are skipped only where it is not installed and neither `LBKIT_ZK` nor `CI`
//! is set.
//!
//! This binary is also the backend: with `LBKIT_FAULTS_BACKEND=NAME` it serves `NAME` to every
//! request on a free port and prints `listening on ADDR`.

mod load;
mod procs;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use load::{Sample, View};
use procs::{free_port, Backend, Proc, Proxy, Result, ZooKeeper, WAIT};
use tokio::sync::watch;

const INTERFACE: &str = "com.acme.Faults";
const SERVICE: &str = "api";

/// Durations and load of one run.
#[derive(Clone, Copy, Debug)]
struct Plan {
    /// Traffic before the fault.
    warm: Duration,
    /// Traffic through each phase of a fault.
    phase: Duration,
    connections: usize,
    every: Duration,
}

impl Plan {
    fn new(full: bool) -> Plan {
        Plan {
            warm: Duration::from_millis(if full { 3_000 } else { 1_500 }),
            phase: Duration::from_millis(if full { 10_000 } else { 2_500 }),
            connections: 8,
            every: Duration::from_millis(5),
        }
    }
}

/// What a scenario did, what it measured, and which properties held.
#[derive(Debug, Default)]
struct Report {
    name: &'static str,
    figures: Vec<(String, String)>,
    checks: Vec<(String, bool)>,
    notes: Vec<String>,
}

impl Report {
    fn figure(&mut self, name: &str, value: impl std::fmt::Display) {
        self.figures.push((name.to_owned(), value.to_string()));
    }

    fn check(&mut self, property: &str, held: bool) {
        self.checks.push((property.to_owned(), held));
    }

    /// What every scenario reports: requests sent, how many failed, and that none did.
    fn requests(&mut self, samples: &[Sample]) {
        self.figure("requests", samples.len());
        self.figure("failed", describe_failures(samples));
        self.check("no request failed", failed(samples) == 0);
    }

    /// p99 and maximum latency of `samples`.
    fn latency(&mut self, name: &str, samples: &[Sample]) {
        let (p99, max) = (pct(samples, 0.99), pct(samples, 1.0));
        self.figure(
            &format!("p99 / max latency {name}"),
            format!("{} / {}", ms(p99), ms(max)),
        );
    }

    /// How long after the fault (at `fault`) the admin API first showed the endpoint ejected
    /// (at `at`), which must be within 1 s.
    fn ejection(&mut self, signal: &str, fault: Duration, at: Duration) {
        let took = at.saturating_sub(fault);
        self.figure(&format!("ejected after {signal}"), ms(took));
        self.check("ejected within 1 s", took <= Duration::from_secs(1));
    }

    fn held(&self) -> bool {
        self.checks.iter().all(|(_, ok)| *ok)
    }
}

/// Traffic through the proxy and the admin sampler, from `start` until `finish`.
struct Traffic {
    start: Instant,
    plan: Plan,
    stop: watch::Sender<bool>,
    load: tokio::task::JoinHandle<Vec<Sample>>,
    admin: tokio::task::JoinHandle<Vec<View>>,
    latest: watch::Receiver<Option<View>>,
    done: watch::Receiver<u64>,
}

/// Wait (bounded) until the admin API shows `what`; when it first did.
async fn until(
    latest: &watch::Receiver<Option<View>>,
    what: &str,
    bound: Duration,
    f: impl Fn(&View) -> bool,
) -> Result<Duration> {
    let mut rx = latest.clone();
    let seen = tokio::time::timeout(bound, rx.wait_for(|v| v.as_ref().is_some_and(&f)))
        .await
        .map(|r| r.map(|v| v.as_ref().map(|v| v.at)));
    match seen {
        Ok(Ok(Some(at))) => Ok(at),
        _ => Err(format!(
            "the admin API never showed {what} within {bound:?}; last: {:?}",
            latest.borrow().as_ref().map(|v| &v.endpoints)
        )),
    }
}

impl Traffic {
    /// Sample the admin API; once it shows `ready` (bounded), start the load.
    async fn start(
        proxy: &Proxy,
        names: &[String],
        plan: Plan,
        ready: impl Fn(&View) -> bool,
    ) -> Result<Traffic> {
        let start = Instant::now();
        let (stop, rx) = watch::channel(false);
        let (tx, latest) = watch::channel(None);
        let admin = tokio::spawn(load::sample_admin(
            proxy.admin,
            SERVICE.to_owned(),
            Duration::from_millis(20),
            start,
            rx.clone(),
            tx,
        ));
        until(&latest, "the proxy ready", WAIT, ready).await?;
        let (done_tx, done) = watch::channel(0);
        let load = tokio::spawn(load::run(
            proxy.listen,
            plan.connections,
            plan.every,
            start,
            Arc::new(names.to_vec()),
            rx,
            Arc::new(done_tx),
        ));
        Ok(Traffic {
            start,
            plan,
            stop,
            load,
            admin,
            latest,
            done,
        })
    }

    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// Wait (bounded) until the admin API shows `what`; when it first did.
    async fn until(
        &self,
        what: &str,
        bound: Duration,
        f: impl Fn(&View) -> bool,
    ) -> Result<Duration> {
        until(&self.latest, what, bound, f).await
    }

    /// Wait until the load has finished the requests it sends in `d` at its pace (so at least
    /// `d` passes: the load never runs ahead of its pace); bounded by four times that plus
    /// [`WAIT`]. Phases of a scenario are measured in traffic, not slept through.
    async fn serve(&self, d: Duration) -> Result<()> {
        let per_conn = (d.as_nanos() / self.plan.every.as_nanos().max(1)) as u64;
        let target = *self.done.borrow() + per_conn * self.plan.connections as u64;
        let bound = d * 4 + WAIT;
        let mut rx = self.done.clone();
        let reached = tokio::time::timeout(bound, rx.wait_for(|&n| n >= target))
            .await
            .is_ok_and(|r| r.is_ok());
        match reached {
            true => Ok(()),
            false => Err(format!(
                "the load did not finish {target} requests within {bound:?} (at {})",
                *self.done.borrow()
            )),
        }
    }

    async fn finish(self) -> (Vec<Sample>, Vec<View>) {
        let _ = self.stop.send(true);
        let samples = self.load.await.unwrap_or_default();
        let views = self.admin.await.unwrap_or_default();
        (samples, views)
    }
}

fn ejected(view: &View, addr: &str) -> bool {
    view.endpoints.iter().any(|(a, e)| a == addr && *e)
}

fn pct(samples: &[Sample], q: f64) -> Duration {
    let mut l: Vec<_> = samples.iter().map(|s| s.latency).collect();
    l.sort_unstable();
    l.get(((l.len() as f64 * q).ceil() as usize).saturating_sub(1))
        .copied()
        .unwrap_or_default()
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1e3)
}

fn failed(samples: &[Sample]) -> usize {
    samples.iter().filter(|s| s.status != 200).count()
}

/// When the failed requests were sent: the first and the last.
fn failed_when(samples: &[Sample]) -> String {
    let mut f = samples.iter().filter(|s| s.status != 200).map(|s| s.at);
    let first = f.next();
    match (first, f.next_back()) {
        (Some(a), Some(b)) => format!(" (sent {} to {})", ms(a), ms(b)),
        (Some(a), None) => format!(" (sent at {})", ms(a)),
        _ => String::new(),
    }
}

fn between(samples: &[Sample], from: Duration, to: Duration) -> Vec<Sample> {
    samples
        .iter()
        .filter(|s| s.at >= from && s.at < to)
        .copied()
        .collect()
}

/// How many requests failed, with which status, sent when (the first and the last).
fn describe_failures(samples: &[Sample]) -> String {
    let mut by_status = std::collections::BTreeMap::new();
    for s in samples.iter().filter(|s| s.status != 200) {
        *by_status.entry(s.status).or_insert(0) += 1;
    }
    let mut out = failed(samples).to_string();
    for (status, n) in by_status {
        let what = match status {
            0 => "no answer".to_owned(),
            s => s.to_string(),
        };
        let _ = write!(out, ", {n}× {what}");
    }
    out + &failed_when(samples)
}

/// The proxy's configuration for `source` (the `[service.api]` source line).
fn config(listen: u16, admin: u16, source: &str, strategy: &str, retries: u32) -> String {
    format!(
        r#"# Written by the fault run (crates/lbkit/tests/faults).
[admin]
bind = "127.0.0.1:{admin}"

[[listener]]
bind = "127.0.0.1:{listen}"

[[route]]
path_prefix = "/faults/"
service = "{SERVICE}"
timeout_ms = 3000
per_try_timeout_ms = 250

[service.{SERVICE}]
{source}
strategy = "{strategy}"
retries = {retries}
connect_timeout_ms = 250
outlier_detection = {{ interval_ms = 250, consecutive_failures = 3, base_ejection_ms = 3000, max_ejection_percent = 50 }}
"#
    )
}

fn write_atomically(path: &Path, text: &str) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn static_source(backends: &[Backend]) -> String {
    let list: Vec<_> = backends.iter().map(|b| format!("\"{}\"", b.addr)).collect();
    format!("endpoints = [{}]", list.join(", "))
}

async fn backends(n: usize, dir: &Path) -> Result<Vec<Backend>> {
    let mut out = Vec::new();
    for i in 0..n {
        out.push(Backend::start(&format!("b{i}"), dir).await?);
    }
    Ok(out)
}

fn names(backends: &[Backend]) -> Vec<String> {
    backends.iter().map(|b| b.name.clone()).collect()
}

async fn static_proxy(dir: &Path, backends: &[Backend]) -> Result<(Proxy, PathBuf)> {
    let path = dir.join("proxy.toml");
    let (listen, admin) = (free_port()?, free_port()?);
    write_atomically(
        &path,
        &config(listen, admin, &static_source(backends), "round-robin", 2),
    )?;
    Ok((Proxy::start(&path, dir).await?, path))
}

// === Scenarios ===

/// A backend killed (SIGKILL) under load: no idempotent request fails; ejected within 1 s.
async fn sigkill(plan: Plan, dir: &Path, r: &mut Report) -> Result<()> {
    let mut backends = backends(3, dir).await?;
    let (proxy, _) = static_proxy(dir, &backends).await?;
    let traffic =
        Traffic::start(&proxy, &names(&backends), plan, |v| v.endpoints.len() == 3).await?;
    traffic.serve(plan.warm).await?; // traffic before the fault
    let victim = backends[0].addr.to_string();
    let killed = traffic.now();
    backends[0].proc.kill().await;
    let ejected_at = traffic
        .until("b0 ejected", WAIT, |v| ejected(v, &victim))
        .await?;
    traffic.serve(plan.phase).await?;
    let (samples, _) = traffic.finish().await;
    let after = between(&samples, killed, Duration::MAX);
    r.requests(&samples);
    r.ejection("SIGKILL", killed, ejected_at);
    r.latency("after SIGKILL", &after);
    Ok(())
}

/// A backend hung (SIGSTOP) under load: bounded latency, ejected, readmitted after SIGCONT.
async fn sigstop(plan: Plan, dir: &Path, r: &mut Report) -> Result<()> {
    let backends = backends(3, dir).await?;
    let (proxy, _) = static_proxy(dir, &backends).await?;
    let traffic =
        Traffic::start(&proxy, &names(&backends), plan, |v| v.endpoints.len() == 3).await?;
    traffic.serve(plan.warm).await?;
    let victim = backends[1].addr.to_string();
    let stopped = traffic.now();
    backends[1].proc.signal("STOP")?;
    let ejected_at = traffic
        .until("b1 ejected", WAIT, |v| ejected(v, &victim))
        .await?;
    // Hung for less than its first ejection (3 s), so it comes back when that ends.
    traffic.serve(Duration::from_secs(2)).await?;
    let resumed = traffic.now();
    backends[1].proc.signal("CONT")?;
    let readmitted = traffic
        .until("b1 readmitted", WAIT, |v| {
            v.at > resumed && !ejected(v, &victim)
        })
        .await?;
    traffic
        .serve(plan.phase.min(Duration::from_secs(3)))
        .await?;
    let (samples, _) = traffic.finish().await;
    let hung = between(&samples, stopped, resumed);
    let back = samples
        .iter()
        .find(|s| s.at >= resumed && s.backend == Some(1))
        .map(|s| s.at.saturating_sub(resumed));
    r.requests(&samples);
    r.ejection("SIGSTOP", stopped, ejected_at);
    r.latency("while hung", &hung);
    r.figure(
        "readmitted after SIGCONT",
        ms(readmitted.saturating_sub(resumed)),
    );
    r.figure(
        "first answer from b1 after SIGCONT",
        back.map_or("none".into(), ms),
    );
    r.check(
        "latency bounded by the per-try timeout (max < 1 s with 250 ms)",
        pct(&hung, 1.0) < Duration::from_secs(1),
    );
    r.check("b1 serves again after SIGCONT", back.is_some());
    Ok(())
}

/// Providers in ZooKeeper as `lbkit watch --once` lists them.
async fn listed(zk: &str) -> Result<usize> {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_lbkit"))
        .args(["watch", "--once", "--zk", zk, "--interface", INTERFACE])
        .output()
        .await
        .map_err(|e| format!("lbkit watch: {e}"))?;
    if !out.status.success() {
        return Err(format!("lbkit watch --once: {}", out.status));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("127.0.0.1:"))
        .count())
}

async fn zk_proxy(dir: &Path, zk: &str) -> Result<Proxy> {
    let path = dir.join("proxy.toml");
    let source = format!(
        r#"zookeeper = {{ zk = "{zk}", interface = "{INTERFACE}", cache = "cache/{SERVICE}.json" }}"#
    );
    let (listen, admin) = (free_port()?, free_port()?);
    write_atomically(&path, &config(listen, admin, &source, "round-robin", 2))?;
    Proxy::start(&path, dir).await
}

/// Whether the ZooKeeper scenarios run: Debian's `zookeeper` is installed, or the environment
/// says ZooKeeper tests are expected (`LBKIT_ZK`, as scripts/test.sh sets it, or `CI`: then
/// scripts/zookeeper.sh installs it, and a failure to is a failure, not a skip).
fn zk_available(r: &mut Report) -> bool {
    let installed = Path::new("/usr/share/java/zookeeper.jar").exists();
    if installed || std::env::var_os("LBKIT_ZK").is_some() || std::env::var_os("CI").is_some() {
        return true;
    }
    r.notes
        .push("skipped: ZooKeeper is not installed (scripts/zookeeper.sh install)".into());
    false
}

/// ZooKeeper paused (SIGSTOP) past the session timeout, resumed, then restarted: no empty
/// snapshot, the last set keeps serving, the providers re-register.
async fn zookeeper(plan: Plan, dir: &Path, r: &mut Report) -> Result<()> {
    if !zk_available(r) {
        return Ok(());
    }
    let zk = ZooKeeper::start(&dir.join("zk"))?;
    let backends = backends(3, dir).await?;
    let mut registers = Vec::new();
    for b in &backends {
        registers.push(procs::register(&zk.addr, INTERFACE, b, dir).await?);
    }
    let proxy = zk_proxy(dir, &zk.addr).await?;
    let traffic =
        Traffic::start(&proxy, &names(&backends), plan, |v| v.endpoints.len() == 3).await?;
    traffic
        .until("3 providers", WAIT, |v| v.endpoints.len() == 3)
        .await?;
    traffic.serve(plan.warm).await?;
    // Paused past the session timeout (6 s, the consumer's and `lbkit register`'s).
    let paused = traffic.now();
    procs::signal(zk.pid()?, "STOP")?;
    traffic.serve(Duration::from_secs(8)).await?;
    procs::signal(zk.pid()?, "CONT")?;
    let resumed = traffic.now();
    traffic
        .until("3 providers after the pause", WAIT, |v| {
            v.at > resumed && v.endpoints.len() == 3
        })
        .await?;
    traffic.serve(plan.phase).await?;
    let restarted = traffic.now();
    let dir_zk = dir.join("zk");
    tokio::task::spawn_blocking(move || procs::zk_restart(&dir_zk))
        .await
        .map_err(|e| e.to_string())??;
    let back = traffic.now();
    traffic
        .until("3 providers after the restart", WAIT, |v| {
            v.at > back && v.endpoints.len() == 3
        })
        .await?;
    traffic.serve(plan.phase).await?;
    let (samples, views) = traffic.finish().await;
    let in_zk = listed(&zk.addr).await?;
    let during: Vec<_> = views.iter().filter(|v| v.at >= paused).collect();
    let least = during.iter().map(|v| v.endpoints.len()).min().unwrap_or(0);
    let reregistered: usize = registers
        .iter()
        .map(|p| p.count("registered ").saturating_sub(1))
        .sum();
    let alive = registers.iter_mut().all(Proc::alive);
    r.requests(&samples);
    r.figure(
        "fewest endpoints served from the pause on",
        format!("{least} (of 3, {} admin samples)", during.len()),
    );
    r.figure(
        "p99 latency from the pause on",
        ms(pct(&between(&samples, paused, Duration::MAX), 0.99)),
    );
    r.figure("re-registrations (session expiries)", reregistered);
    r.figure("restart took", ms(back.saturating_sub(restarted)));
    r.figure(
        "the proxy's ZooKeeper sessions (a new one after an expiry)",
        proxy.proc.count("new session established"),
    );
    r.figure("providers in ZooKeeper at the end", in_zk);
    r.check("never an empty snapshot", least > 0);
    r.check("all 3 providers registered at the end", in_zk == 3);
    r.check("the registrations lived through it", alive);
    Ok(())
}

/// Three of five providers deleted from ZooKeeper in one transaction while their servers still
/// answer (issue 40: sessions expiring together, an operator's script): mass-removal protection
/// keeps all five served; when the three servers stop, their failing health checks confirm them
/// gone and they leave; no request fails throughout.
async fn mass(plan: Plan, dir: &Path, r: &mut Report) -> Result<()> {
    if !zk_available(r) {
        return Ok(());
    }
    let zk = ZooKeeper::start(&dir.join("zk"))?;
    let mut backends = backends(5, dir).await?;
    let mut registers = Vec::new();
    for b in &backends {
        registers.push(procs::register(&zk.addr, INTERFACE, b, dir).await?);
    }
    let path = dir.join("proxy.toml");
    let source = format!(
        "zookeeper = {{ zk = \"{}\", interface = \"{INTERFACE}\" }}\n\
         health_check = {{ kind = \"tcp\", interval_ms = 100, timeout_ms = 250, rise = 1, fall = 1 }}",
        zk.addr
    );
    let (listen, admin) = (free_port()?, free_port()?);
    write_atomically(&path, &config(listen, admin, &source, "round-robin", 4))?;
    let proxy = Proxy::start(&path, dir).await?;
    let traffic =
        Traffic::start(&proxy, &names(&backends), plan, |v| v.endpoints.len() == 5).await?;
    traffic.serve(plan.warm).await?;
    let deleted = traffic.now();
    let nodes = procs::delete_together(&zk.addr, INTERFACE, &backends[..3]).await?;
    proxy.proc.line("mass removal held").await?;
    traffic.serve(plan.phase).await?;
    let stopped = traffic.now();
    for b in &mut backends[..3] {
        b.proc.kill().await;
    }
    let gone = traffic
        .until("the three gone", WAIT, |v| {
            v.at > stopped && v.endpoints.len() == 2
        })
        .await?;
    traffic.serve(plan.phase / 2).await?;
    let (samples, views) = traffic.finish().await;
    let held: Vec<&load::View> = views
        .iter()
        .filter(|v| v.at >= deleted && v.at < stopped)
        .collect();
    let fewest = held.iter().map(|v| v.endpoints.len()).min().unwrap_or(0);
    let answered: std::collections::BTreeSet<usize> = between(&samples, deleted, stopped)
        .iter()
        .filter_map(|s| s.backend)
        .collect();
    r.requests(&samples);
    r.figure("provider nodes deleted in one transaction", nodes);
    r.figure(
        "fewest endpoints served while held",
        format!("{fewest} (of 5, {} admin samples)", held.len()),
    );
    r.figure("backends answering while held", answered.len());
    r.figure(
        "gone after their servers stopped",
        ms(gone.saturating_sub(stopped)),
    );
    r.figure(
        "holds logged (one transaction, one update: 1)",
        proxy.proc.count("mass removal held"),
    );
    r.check("3 nodes deleted", nodes == 3);
    r.check(
        "all five served while held",
        fewest == 5 && answered.len() == 5,
    );
    drop(registers);
    Ok(())
}

/// The registry cache's directory read-only, then full, while providers change: service goes
/// on and each run of failures is one error line.
async fn cache(plan: Plan, dir: &Path, r: &mut Report) -> Result<()> {
    if !zk_available(r) {
        return Ok(());
    }
    let zk = ZooKeeper::start(&dir.join("zk"))?;
    let backends = backends(4, dir).await?;
    let mut registers = Vec::new();
    for b in &backends[..3] {
        registers.push(procs::register(&zk.addr, INTERFACE, b, dir).await?);
    }
    let proxy = zk_proxy(dir, &zk.addr).await?;
    let cache_dir = dir.join("cache");
    let cache_file = cache_dir.join(format!("{SERVICE}.json"));
    let traffic =
        Traffic::start(&proxy, &names(&backends), plan, |v| v.endpoints.len() == 3).await?;
    traffic
        .until("3 providers", WAIT, |v| v.endpoints.len() == 3)
        .await?;
    traffic.serve(plan.warm).await?;
    let cached = |n: usize| {
        std::fs::read_to_string(&cache_file).is_ok_and(|t| t.matches("\"address\"").count() == n)
    };
    const NOT_WRITTEN: &str = "registry cache not written";
    // Read-only: two changes (a provider comes and goes), no cache write can land.
    let ro = procs::read_only(&cache_dir, true)?;
    let mut extra = procs::register(&zk.addr, INTERFACE, &backends[3], dir).await?;
    let t = traffic.now();
    traffic
        .until("4 providers", WAIT, |v| v.at > t && v.endpoints.len() == 4)
        .await?;
    traffic.serve(plan.phase / 2).await?;
    let served_extra_from = traffic.now();
    extra.stop().await;
    let t = traffic.now();
    traffic
        .until("3 providers", WAIT, |v| v.at > t && v.endpoints.len() == 3)
        .await?;
    proxy.proc.line(NOT_WRITTEN).await?;
    let errors_ro = proxy.proc.count(NOT_WRITTEN);
    procs::read_only(&cache_dir, false)?;
    r.figure(
        "read-only directory",
        format!("{ro}; 2 changes, {errors_ro} error line(s)"),
    );
    // Writable again: the next change is written, and said so once.
    let mut extra = procs::register(&zk.addr, INTERFACE, &backends[3], dir).await?;
    proxy.proc.line("registry cache written again").await?;
    let t = traffic.now();
    traffic
        .until("4 providers", WAIT, |v| v.at > t && v.endpoints.len() == 4)
        .await?;
    let recovered = cached(4);
    // Full: a 64 KiB tmpfs over the directory, filled up.
    let full = match procs::full_disk(&cache_dir) {
        Ok(mount) => {
            extra.stop().await;
            let t = traffic.now();
            traffic
                .until("3 providers", WAIT, |v| v.at > t && v.endpoints.len() == 3)
                .await?;
            proxy.proc.nth_line(NOT_WRITTEN, errors_ro + 1).await?;
            let errors = proxy.proc.count(NOT_WRITTEN) - errors_ro;
            drop(mount);
            Some(errors)
        }
        Err(why) => {
            r.notes.push(format!("full disk not tried: {why}"));
            None
        }
    };
    traffic.serve(plan.phase / 2).await?;
    let (samples, _) = traffic.finish().await;
    let extra_served = samples
        .iter()
        .any(|s| s.at < served_extra_from && s.backend == Some(3));
    r.figure(
        "full directory (64 KiB tmpfs)",
        full.map_or("not tried".into(), |n| {
            format!("1 change, {n} error line(s)")
        }),
    );
    r.requests(&samples);
    r.check(
        "a provider added while the cache was read-only got traffic",
        extra_served,
    );
    r.check("one error line for the read-only run", errors_ro == 1);
    r.check(
        "the cache is written again once the directory is",
        recovered,
    );
    if let Some(n) = full {
        r.check("one error line for the full-disk run", n == 1);
    }
    drop(registers);
    Ok(())
}

/// A reload every 100 ms under load, each changing the service (strategy and retries): no
/// request fails.
async fn reload(plan: Plan, dir: &Path, r: &mut Report) -> Result<()> {
    let backends = backends(3, dir).await?;
    let (proxy, path) = static_proxy(dir, &backends).await?;
    let text = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
    let traffic =
        Traffic::start(&proxy, &names(&backends), plan, |v| v.endpoints.len() == 3).await?;
    traffic.serve(plan.warm).await?;
    let from = traffic.now();
    let before = proxy.proc.count("configuration reloaded");
    let mut sent = 0;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    while traffic.now() < from + plan.phase {
        tick.tick().await;
        sent += 1;
        let (strategy, retries) = if sent % 2 == 1 {
            ("least-request", "3")
        } else {
            ("round-robin", "2")
        };
        let next = text
            .replace(
                "strategy = \"round-robin\"",
                &format!("strategy = \"{strategy}\""),
            )
            .replace("retries = 2", &format!("retries = {retries}"));
        write_atomically(&path, &next)?;
        proxy.proc.signal("HUP")?;
    }
    let to = traffic.now();
    // Every SIGHUP so far has been applied (the file watcher adds its own reloads).
    proxy
        .proc
        .nth_line("configuration reloaded", before + sent)
        .await?;
    traffic.serve(Duration::from_millis(500)).await?;
    let (samples, _) = traffic.finish().await;
    let applied = proxy.proc.count("configuration reloaded") - before;
    let rejected = proxy.proc.count("configuration rejected");
    let during = between(&samples, from, to);
    r.figure("reloads sent (SIGHUP, each a changed service)", sent);
    r.figure("reloads applied (SIGHUP and file watcher)", applied);
    r.requests(&samples);
    r.figure("requests during the reloads", during.len());
    r.figure(
        "p99 latency before / during",
        format!(
            "{} / {}",
            ms(pct(&between(&samples, Duration::ZERO, from), 0.99)),
            ms(pct(&during, 0.99))
        ),
    );
    r.check(
        "every reload applied, none rejected",
        applied >= sent && rejected == 0,
    );
    Ok(())
}

// === The run ===

type Scenario = for<'a> fn(
    Plan,
    &'a Path,
    &'a mut Report,
)
    -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + 'a>>;

const SCENARIOS: [(&str, &str, Scenario); 6] = [
    (
        "sigkill",
        "a backend killed (SIGKILL) under load",
        |p, d, r| Box::pin(sigkill(p, d, r)),
    ),
    (
        "sigstop",
        "a backend hung (SIGSTOP), then resumed (SIGCONT)",
        |p, d, r| Box::pin(sigstop(p, d, r)),
    ),
    (
        "zookeeper",
        "ZooKeeper paused 8 s (past the 6 s session timeout), resumed, then restarted",
        |p, d, r| Box::pin(zookeeper(p, d, r)),
    ),
    (
        "cache",
        "the registry cache's directory read-only, then full, while providers change",
        |p, d, r| Box::pin(cache(p, d, r)),
    ),
    ("reload", "a reload every 100 ms under load", |p, d, r| {
        Box::pin(reload(p, d, r))
    }),
    (
        "mass",
        "three of five providers deleted from ZooKeeper in one transaction, their servers up, then stopped",
        |p, d, r| Box::pin(mass(p, d, r)),
    ),
];

fn main() -> ExitCode {
    if let Ok(name) = std::env::var("LBKIT_FAULTS_BACKEND") {
        return load::backend(&name);
    }
    let mut full = false;
    let mut filters = Vec::new();
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--full" => full = true,
            "--list" => {
                for (name, ..) in SCENARIOS {
                    println!("{name}: test");
                }
                return ExitCode::SUCCESS;
            }
            a if a.starts_with('-') => {} // libtest's flags (--nocapture, --test-threads=N, ...)
            a => filters.push(a.to_owned()),
        }
    }
    let plan = Plan::new(full);
    let root =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("faults-{}", std::process::id()));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let mut reports = Vec::new();
    for (name, what, scenario) in SCENARIOS {
        if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        let dir = root.join(name);
        let _ = std::fs::create_dir_all(&dir);
        eprintln!("faults: {name}: {what} (logs in {})", dir.display());
        let mut report = Report {
            name,
            ..Report::default()
        };
        let started = Instant::now();
        let result = runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(180), scenario(plan, &dir, &mut report)).await
        });
        match result {
            Ok(Ok(())) => {}
            Ok(Err(e)) => report.check(&format!("ran to the end ({e})"), false),
            Err(_) => report.check("ran to the end (within 180 s)", false),
        }
        report.figure("took", format!("{:.1} s", started.elapsed().as_secs_f64()));
        print_report(what, &report);
        reports.push(report);
    }
    let failed: Vec<_> = reports
        .iter()
        .filter(|r| !r.held())
        .map(|r| r.name)
        .collect();
    println!(
        "\nfaults: {} scenario(s), {} held{}",
        reports.len(),
        reports.len() - failed.len(),
        if failed.is_empty() {
            String::new()
        } else {
            format!("; FAILED: {}", failed.join(", "))
        }
    );
    if failed.is_empty() {
        let _ = std::fs::remove_dir_all(&root);
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn print_report(what: &str, r: &Report) {
    println!("\n### {} — {what}\n", r.name);
    println!("| figure | value |\n|---|---|");
    for (k, v) in &r.figures {
        println!("| {k} | {v} |");
    }
    println!();
    for (property, held) in &r.checks {
        println!("- [{}] {property}", if *held { "x" } else { " " });
    }
    for note in &r.notes {
        println!("- note: {note}");
    }
}
