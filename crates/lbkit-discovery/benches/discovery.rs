//! Discovery figures for BENCHMARKS.md:
//!
//! 1. snapshot rebuild for 10 000 providers (decode the registry's URLs, one controller batch);
//! 2. memory per endpoint (a byte-counting allocator: snapshot only, and the whole consumer);
//! 3. propagation delay, provider registration → consumer's new snapshot, with 1 000 providers
//!    registered (needs `LBKIT_ZK`; skipped with a message otherwise).
//!
//! ```sh
//! eval "$(scripts/zookeeper.sh start)"
//! cargo bench -p lbkit-discovery --features zookeeper --bench discovery
//! ```
#![allow(clippy::unwrap_used, clippy::disallowed_methods)]

use std::alloc::{GlobalAlloc, Layout as AllocLayout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lbkit_core::{
    Balancer, Clock, EndpointIdx, EndpointSpec, PickContext, PickError, Picker, Snapshot,
    SnapshotBuilder, Strategy, Timestamp, Update,
};
use lbkit_discovery::dubbo::ProviderUrl;
use lbkit_discovery::zookeeper::{Layout, Provider, ServicePath, ZkConfig, ZkSource, ZkStatus};
use lbkit_discovery::{publisher, Controller, ControllerConfig};
use tokio::sync::mpsc;
use tokio::time::Instant;
use zookeeper_client::{Acls, Client, CreateMode};

/// Live heap bytes, for the memory figures.
struct Bytes;
static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Bytes {
    unsafe fn alloc(&self, l: AllocLayout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded unchanged.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: AllocLayout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded unchanged.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: AllocLayout, n: usize) -> *mut u8 {
        LIVE.fetch_add(n as isize - l.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static ALLOC: Bytes = Bytes;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

struct First;
struct FirstPicker(Option<EndpointIdx>);
impl Picker for FirstPicker {
    fn pick(&self, _: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> {
        self.0.ok_or(PickError::NoEndpoints)
    }
}
impl Strategy for First {
    type Picker = FirstPicker;
    fn name(&self) -> &str {
        "first"
    }
    fn prepare(&self, s: &Arc<Snapshot>, _: Timestamp) -> FirstPicker {
        FirstPicker(s.eligible().first().copied())
    }
}

/// A realistic Dubbo provider node name (what `lbkit register` writes), for provider `i`.
fn node_name(i: usize, weight: u32) -> String {
    let mut p = Provider::new(format!(
        "10.{}.{}.{}:20880",
        i / 65536,
        (i / 256) % 256,
        i % 256
    ));
    p.weight = weight;
    p.version = Some("1.0.0".into());
    p.metadata.insert("methods", "hello,bye");
    let path = ServicePath::new("dubbo", "com.acme.Greeter", Layout::Dubbo).unwrap();
    p.node(&path, 1_700_000_000_000).0
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn rebuild_10k() {
    const N: usize = 10_000;
    let names: Vec<String> = (0..N).map(|i| node_name(i, 100)).collect();
    let mut decode = Vec::new();
    let mut batch = Vec::new();
    let mut core = Vec::new();
    let mut controller = Controller::new(ControllerConfig::default());
    let mut builder = SnapshotBuilder::new();
    for round in 0..21u32 {
        let t = Instant::now();
        let mut specs: Vec<EndpointSpec> = names
            .iter()
            .map(|n| ProviderUrl::parse(n).unwrap().to_spec().unwrap())
            .collect();
        specs.sort_by(|a, b| a.key.cmp(&b.key));
        decode.push(t.elapsed());
        specs[round as usize].weight = 200 + round; // one provider changed, as after a push
        let copy = specs.clone();
        let t = Instant::now();
        let _ = builder.apply(Update::Reset(copy), Timestamp::ZERO);
        core.push(t.elapsed());
        let t = Instant::now();
        let s = controller.apply_batch(vec![Update::Reset(specs)]).unwrap();
        batch.push(t.elapsed());
        assert_eq!(s.len(), N);
    }
    for v in [&mut decode, &mut batch, &mut core] {
        v.remove(0); // the first batch builds every endpoint; later ones diff
        v.sort();
    }
    println!("rebuild, 10 000 providers (20 rounds, median / max):");
    println!(
        "  decode 10 000 provider URLs + sort: {} / {}",
        ms(percentile(&decode, 0.5)),
        ms(decode[decode.len() - 1])
    );
    println!(
        "  controller batch (diff by key, keep stats, new snapshot): {} / {}",
        ms(percentile(&batch, 0.5)),
        ms(batch[batch.len() - 1])
    );
    println!(
        "    of which lbkit-core SnapshotBuilder::apply(Reset): {} / {}",
        ms(percentile(&core, 0.5)),
        ms(core[core.len() - 1])
    );
}

fn memory() {
    const N: usize = 10_000;
    type Make = fn(usize) -> EndpointSpec;
    let plain: Make = |i| EndpointSpec::new(format!("10.0.{}.{}:80", i / 256, i % 256));
    let dubbo: Make = |i| {
        ProviderUrl::parse(&node_name(i, 100))
            .unwrap()
            .to_spec()
            .unwrap()
    };
    for (what, make) in [
        ("plain endpoint (address only)", plain),
        ("Dubbo provider (URL with 9 parameters)", dubbo),
    ] {
        let base = live();
        let specs: Vec<EndpointSpec> = (0..N).map(make).collect();
        let spec_bytes = live() - base;
        let mut b = SnapshotBuilder::new();
        let snap = b.apply(Update::Reset(specs), Timestamp::ZERO);
        let with_builder = live() - base;
        drop(b);
        let snapshot_only = live() - base;
        println!(
            "memory, {what}: spec {} B; snapshot {} B per endpoint ({} B with the builder's list)",
            spec_bytes / N as isize,
            snapshot_only / N as isize,
            with_builder / N as isize,
        );
        drop(snap);
    }
}

/// When the controller published a snapshot of `n` endpoints (bounded wait).
async fn wait_for(
    rx: &mut mpsc::UnboundedReceiver<(Instant, usize)>,
    n: usize,
) -> Result<Instant, tokio::time::error::Elapsed> {
    let fut = async {
        loop {
            let (at, len) = rx.recv().await.unwrap();
            if len == n {
                return at;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), fut).await
}

async fn bulk_create(client: &Client, dir: &str, range: std::ops::Range<usize>) {
    let ephemeral = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
    let paths: Vec<String> = range
        .map(|i| format!("{dir}/{}", node_name(i, 100)))
        .collect();
    let creates: Vec<_> = paths
        .iter()
        .map(|p| client.create(p, &[], &ephemeral))
        .collect();
    for c in creates {
        c.await.unwrap();
    }
}

async fn propagation(addr: String) {
    const PROVIDERS: usize = 1_000;
    const SAMPLES: usize = 200;
    let zk = ZkConfig::new(addr);
    let service = format!("lbkit.bench.Propagation{}", std::process::id());
    let path = ServicePath::new("dubbo", &service, Layout::Dubbo).unwrap();
    let dir = path.dir();
    let client = Client::connect(&zk.servers).await.unwrap();
    client
        .mkdir(&dir, &CreateMode::Persistent.with_acls(Acls::anyone_all()))
        .await
        .unwrap();
    bulk_create(&client, &dir, 0..PROVIDERS).await;

    let (mut rx, _status) = follow(&zk, &path);
    wait_for(&mut rx, PROVIDERS).await.unwrap();
    let live_1k = live();
    bulk_create(&client, &dir, PROVIDERS..2 * PROVIDERS).await;
    wait_for(&mut rx, 2 * PROVIDERS).await.unwrap();
    let per_provider = (live() - live_1k) / PROVIDERS as isize;
    for i in PROVIDERS..2 * PROVIDERS {
        client
            .delete(&format!("{dir}/{}", node_name(i, 100)), None)
            .await
            .unwrap();
    }
    wait_for(&mut rx, PROVIDERS).await.unwrap();

    let (add, remove) = samples(&client, &dir, &mut rx, PROVIDERS, SAMPLES).await;
    println!("propagation with {PROVIDERS} providers registered ({SAMPLES} samples, median / p99 / max):");
    print_latencies(&add, &remove);
    println!("memory, whole consumer (ZkSource + Controller + snapshot), marginal: {per_provider} B per provider");
    for i in 0..PROVIDERS {
        let _ = client
            .delete(&format!("{dir}/{}", node_name(i, 100)), None)
            .await;
    }
    let _ = client.delete(&dir, None).await;
}

/// Registrations' and deregistrations' latencies (each sorted): median, p99 and max.
fn print_latencies(add: &[Duration], remove: &[Duration]) {
    for (what, d) in [
        ("registration -> new snapshot published", add),
        ("deregistration -> new snapshot published", remove),
    ] {
        println!(
            "  {what}: {} / {} / {}",
            ms(percentile(d, 0.5)),
            ms(percentile(d, 0.99)),
            ms(d[d.len() - 1])
        );
    }
}

/// A balancer following `path` through a `ZkSource` and a `Controller`; each publish sends
/// when it happened and the snapshot's size. The source's status is the caller's to keep.
fn follow(
    zk: &ZkConfig,
    path: &ServicePath,
) -> (
    mpsc::UnboundedReceiver<(Instant, usize)>,
    lbkit_discovery::source::Status<ZkStatus>,
) {
    let clock = Clock::System;
    let balancer = Arc::new(Balancer::new(
        First,
        Arc::new(Snapshot::new(0, vec![])),
        clock.now(),
    ));
    let (updates, status) = ZkSource::new(zk.clone(), path.clone()).spawn();
    let (tx, rx) = mpsc::unbounded_channel::<(Instant, usize)>();
    let mut publish = publisher(balancer, clock);
    tokio::spawn(Controller::new(ControllerConfig::default()).run(
        updates,
        move |s: Arc<Snapshot>| {
            let n = s.len();
            publish(s);
            let _ = tx.send((Instant::now(), n));
        },
    ));
    (rx, status)
}

/// `n` registrations and deregistrations of one provider beside `providers` in `dir`, each
/// timed to the snapshot that shows it published; both sorted.
async fn samples(
    client: &Client,
    dir: &str,
    rx: &mut mpsc::UnboundedReceiver<(Instant, usize)>,
    providers: usize,
    n: usize,
) -> (Vec<Duration>, Vec<Duration>) {
    let ephemeral = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
    let mut add = Vec::new();
    let mut remove = Vec::new();
    for i in 0..n {
        let node = format!("{dir}/{}", node_name(50_000 + i, 100));
        let t0 = Instant::now();
        client.create(&node, &[], &ephemeral).await.unwrap();
        add.push(wait_for(rx, providers + 1).await.unwrap() - t0);
        let t0 = Instant::now();
        client.delete(&node, None).await.unwrap();
        remove.push(wait_for(rx, providers).await.unwrap() - t0);
    }
    add.sort();
    remove.sort();
    (add, remove)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` probes bench binaries this way
    }
    rebuild_10k();
    memory();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    match std::env::var("LBKIT_ZK") {
        Ok(addr) => runtime.block_on(propagation(addr)),
        Err(_) => println!("propagation: SKIPPED (LBKIT_ZK is not set; run `eval \"$(scripts/zookeeper.sh start)\"`)"),
    }
}
