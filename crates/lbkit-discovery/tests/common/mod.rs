//! Shared helpers of the discovery integration tests: the ZooKeeper address, servers of a
//! test's own (through `scripts/zookeeper.sh`), a consumer pipeline that records every
//! published snapshot, and a trivial round-robin strategy.
#![allow(dead_code, unreachable_pub)]

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lbkit_core::{
    Balancer, Clock, EndpointIdx, PickContext, PickError, Picker, Snapshot, Strategy, Timestamp,
};
use lbkit_discovery::source::Status;
#[cfg(feature = "zookeeper")]
use lbkit_discovery::zookeeper::{ZkSource, ZkStatus};
#[cfg(feature = "zookeeper")]
use lbkit_discovery::{publisher, Controller, ControllerConfig, ControllerMetrics};
use tokio::sync::mpsc;

/// Bound on every wait for an event in these tests. ZooKeeper answers in milliseconds; this
/// only stops a broken test from hanging.
pub const WAIT: Duration = Duration::from_secs(30);

/// The shared test server (`LBKIT_ZK`, set by `eval "$(scripts/zookeeper.sh start)"`).
/// Unset: a failure in CI (`CI=true`), a skip with a printed reason elsewhere.
pub fn zk() -> Option<String> {
    lbkit_testkit::zookeeper()
}

/// `let zk = require_zk!();` — the address, or return from the test (skip) outside CI.
#[macro_export]
macro_rules! require_zk {
    () => {
        match common::zk() {
            Some(addr) => addr,
            None => return,
        }
    };
}

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A service name no other test (or earlier run) uses.
pub fn unique(name: &str) -> String {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = Clock::System.now().as_nanos();
    format!("lbkit.test.{name}.p{}n{n}t{nanos}", std::process::id())
}

/// A fresh temporary directory, removed with everything in it when the value drops.
pub fn temp_dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("lbkit-discovery-{name}-"))
        .tempdir()
        .expect("temp dir")
}

/// A ZooKeeper server of the test's own, in its own state directory, started, restarted and
/// stopped by `scripts/zookeeper.sh` (each step bounded by the script). Stopped on drop.
pub struct OwnZk {
    /// The server's state directory, removed after the server is stopped (on drop).
    dir: tempfile::TempDir,
    pub addr: String,
}

fn script(dir: &Path, command: &str) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/zookeeper.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg(command)
        .env("LBKIT_ZK_DIR", dir)
        .output()
        .expect("run scripts/zookeeper.sh");
    assert!(
        out.status.success(),
        "zookeeper.sh {command} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl OwnZk {
    pub async fn start(name: &str) -> OwnZk {
        let dir = temp_dir(name);
        let d = dir.path().to_path_buf();
        let out = tokio::task::spawn_blocking(move || script(&d, "start"))
            .await
            .expect("script task");
        let addr = out
            .trim()
            .strip_prefix("export LBKIT_ZK=")
            .unwrap_or_else(|| panic!("unexpected output {out:?}"))
            .to_owned();
        OwnZk { dir, addr }
    }

    pub async fn stop(&self) {
        let d = self.dir.path().to_path_buf();
        tokio::task::spawn_blocking(move || script(&d, "stop"))
            .await
            .expect("script task");
    }

    /// Start again on the same port with the same data (after `stop`, or as a restart).
    pub async fn restart(&self) {
        let d = self.dir.path().to_path_buf();
        tokio::task::spawn_blocking(move || script(&d, "restart"))
            .await
            .expect("script task");
    }
}

impl Drop for OwnZk {
    fn drop(&mut self) {
        script(self.dir.path(), "stop");
        // `dir` is removed when the field drops, after this.
    }
}

/// Round robin over the eligible endpoints: enough to pick in tests.
#[derive(Debug)]
pub struct Rr;

pub struct RrPicker {
    eligible: Vec<EndpointIdx>,
    next: AtomicUsize,
}

impl Picker for RrPicker {
    fn pick(&self, _: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> {
        if self.eligible.is_empty() {
            return Err(PickError::NoEndpoints);
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.eligible.len();
        Ok(self.eligible[i])
    }
}

impl Strategy for Rr {
    type Picker = RrPicker;
    fn name(&self) -> &str {
        "test-rr"
    }
    fn prepare(&self, s: &Arc<Snapshot>, _: Timestamp) -> RrPicker {
        RrPicker {
            eligible: s.eligible().to_vec(),
            next: AtomicUsize::new(0),
        }
    }
}

/// A ZooKeeper source feeding a controller and a balancer, recording every published snapshot.
#[cfg(feature = "zookeeper")]
pub struct Pipeline {
    pub status: Status<ZkStatus>,
    pub balancer: Arc<Balancer<Rr>>,
    pub metrics: Arc<ControllerMetrics>,
    /// Every snapshot consumed by [`Pipeline::until`], in order.
    pub history: Vec<Arc<Snapshot>>,
    snapshots: mpsc::UnboundedReceiver<Arc<Snapshot>>,
    task: tokio::task::JoinHandle<()>,
}

#[cfg(feature = "zookeeper")]
impl Pipeline {
    pub fn start(source: ZkSource, config: ControllerConfig) -> Pipeline {
        let clock = Clock::System;
        let empty = Arc::new(Snapshot::new(0, vec![]));
        let balancer = Arc::new(Balancer::new(Rr, empty, clock.now()));
        let (updates, status) = source.spawn();
        let controller = Controller::new(config);
        let metrics = controller.metrics();
        let (tx, snapshots) = mpsc::unbounded_channel();
        let mut publish = publisher(balancer.clone(), clock);
        let task = tokio::spawn(controller.run(updates, move |s: Arc<Snapshot>| {
            publish(s.clone());
            let _ = tx.send(s);
        }));
        Pipeline {
            status,
            balancer,
            metrics,
            history: Vec::new(),
            snapshots,
            task,
        }
    }

    /// The next published snapshot for which `pred` holds (earlier ones are consumed).
    pub async fn until(&mut self, what: &str, pred: impl Fn(&Snapshot) -> bool) -> Arc<Snapshot> {
        let wait = async {
            loop {
                let s = self.snapshots.recv().await.expect("controller running");
                self.history.push(s.clone());
                if pred(&s) {
                    return s;
                }
            }
        };
        tokio::time::timeout(WAIT, wait)
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for: {what}"))
    }

    /// Published snapshots not consumed yet.
    pub fn drain(&mut self) -> Vec<Arc<Snapshot>> {
        let mut out = Vec::new();
        while let Ok(s) = self.snapshots.try_recv() {
            out.push(s);
        }
        out
    }
}

#[cfg(feature = "zookeeper")]
impl Drop for Pipeline {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Addresses and weights of a snapshot, in order.
pub fn entries(s: &Snapshot) -> Vec<(String, u32)> {
    s.endpoints()
        .iter()
        .map(|e| (e.address().to_owned(), e.weight()))
        .collect()
}

pub fn has(s: &Snapshot, address: &str) -> bool {
    s.endpoints().iter().any(|e| e.address() == address)
}

/// Wait for a status condition, bounded by [`WAIT`].
pub async fn wait_status<T: Clone>(
    status: &mut Status<T>,
    what: &str,
    pred: impl FnMut(&T) -> bool,
) -> T {
    tokio::time::timeout(WAIT, status.wait_for(pred))
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for: {what}"))
}
