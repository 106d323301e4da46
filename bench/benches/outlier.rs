//! Issue 3: cost of one `OutlierDetector::tick` (lbkit-health, `OutlierConfig::default()`: Envoy's
//! rules and defaults) over a snapshot of n endpoints, with realistic traffic recorded between
//! ticks so that all three rules (consecutive failures, success rate, failure percentage) run.
//!
//! Between two ticks (not timed; divan's input generator, `sample_size = 1` so each tick gets
//! the traffic of one interval) every endpoint that is not ejected records 120 calls through
//! `EndpointStats::record` at `now − 5 s`, failures spread evenly among them:
//! * every 97th endpoint (offset 3) is **bad**: 108 of 120 fail (10 % success) — it breaks all
//!   three rules and is ejected, readmitted after 30 s, 60 s, … (Envoy's timing);
//! * every 13th is **degraded**: 6 of 120 fail (95 %; below no threshold);
//! * the rest fail 0–2 of 120 (98.3–100 %).
//!
//! `now` advances by the 10 s interval per tick. Three ticks run before timing, so the detector's
//! tracks are populated and ejections are in force (steady state). The snapshot itself stays the
//! same (the tick's cost does not depend on whether the owner derives new snapshots).
//! Medians of 20 ticks.

use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::time::Duration;

use divan::{black_box, Bencher};
use lbkit_bench::{snapshot, Weights};
use lbkit_core::{FailureKind, Outcome, Snapshot, Timestamp};
use lbkit_health::{OutlierConfig, OutlierDetector};

fn main() {
    divan::main();
}

const OUTLIER_N: [usize; 3] = [1_000, 3_000, 10_000];
const CALLS: u64 = 120;
const INTERVAL: Duration = Duration::from_secs(10);

fn failures_of(i: usize) -> u64 {
    if i % 97 == 3 {
        108
    } else if i.is_multiple_of(13) {
        6
    } else {
        (i % 3) as u64
    }
}

/// One interval of traffic on every endpoint the detector has not ejected.
fn record_interval(snap: &Snapshot, detector: &OutlierDetector, now: Timestamp) {
    let at = now.saturating_sub(Duration::from_secs(5));
    for (i, e) in snap.endpoints().iter().enumerate() {
        if detector.ejection(e.key()).is_some() {
            continue; // ejected endpoints get no traffic
        }
        let fails = failures_of(i);
        for j in 0..CALLS {
            // Exactly `fails` failures, spread evenly over the 120 calls.
            let fail = (j * fails / CALLS) != ((j + 1) * fails / CALLS);
            let outcome = if fail {
                Outcome::Failure(FailureKind::Server)
            } else {
                Outcome::Success
            };
            e.stats().record(Duration::from_millis(2), at, outcome);
        }
    }
}

#[divan::bench(args = OUTLIER_N, sample_count = 20, sample_size = 1)]
fn tick(b: Bencher, n: usize) {
    let snap: Arc<Snapshot> = snapshot(n, Weights::Uniform);
    let detector = RefCell::new(OutlierDetector::new(OutlierConfig::default()));
    let now = Cell::new(Timestamp::from_millis(1_000_000));
    let mut ejected_once = false;
    for _ in 0..3 {
        now.set(now.get().saturating_add(INTERVAL));
        record_interval(&snap, &detector.borrow(), now.get());
        ejected_once |= detector.borrow_mut().tick(&snap, now.get());
    }
    assert!(ejected_once, "the bad endpoints must be ejected");
    let ejected = detector.borrow().overlay().ejected.len();
    assert!(ejected > 0, "ejections in force before timing");
    b.with_inputs(|| {
        now.set(now.get().saturating_add(INTERVAL));
        record_interval(&snap, &detector.borrow(), now.get());
        now.get()
    })
    .bench_local_values(|t| detector.borrow_mut().tick(black_box(&snap), t));
}

/// Diagnostic: `Snapshot::find(key)` for every endpoint's key, i.e. the n look-ups that each
/// `retain(|k, _| snapshot.find(k).is_some())` over the detector's n tracks performs.
#[divan::bench(args = OUTLIER_N, sample_count = 20, sample_size = 1)]
fn diagnostic_find_every_key(b: Bencher, n: usize) {
    let snap: Arc<Snapshot> = snapshot(n, Weights::Uniform);
    let keys: Vec<_> = snap.endpoints().iter().map(|e| e.key().clone()).collect();
    b.bench_local(|| {
        keys.iter()
            .filter(|k| black_box(&snap).find(k).is_some())
            .count()
    });
}
