//! Shared inputs for the lbkit side-by-side benchmarks. Everything here runs outside the
//! timed closures.

use std::cell::Cell;
use std::sync::Arc;
use std::time::Duration;

use lbkit_core::{EndpointSpec, Outcome, Snapshot, Timestamp};

/// Endpoint counts of the pick benchmarks.
pub const N: [usize; 3] = [10, 1_000, 100_000];

/// Weight of every endpoint in the uniform case (lbkit's default weight).
pub const UNIFORM_WEIGHT: u32 = 100;

/// Weight of endpoint `i` in the skewed case: 1..=997, many distinct values.
#[inline]
pub fn skewed_weight(i: usize) -> u32 {
    1 + ((i * 7919) % 997) as u32
}

/// Which weights to give the endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Weights {
    /// All 100.
    Uniform,
    /// `1 + (i * 7919 % 997)`.
    Skewed,
}

impl std::fmt::Display for Weights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Weights::Uniform => "uniform",
            Weights::Skewed => "skewed",
        })
    }
}

impl Weights {
    /// Weight of endpoint `i`.
    pub fn of(self, i: usize) -> u32 {
        match self {
            Weights::Uniform => UNIFORM_WEIGHT,
            Weights::Skewed => skewed_weight(i),
        }
    }
}

/// A distinct `ip:port` per index (valid socket addresses, no DNS): `127.0.0.1:1` …
/// `127.0.0.1:65535`, then `127.0.0.2:1` …
pub fn address(i: usize) -> String {
    let port = 1 + (i % 65_535);
    let host = 1 + i / 65_535;
    format!("127.0.{}.{}:{port}", host / 256, host % 256)
}

/// A snapshot of `n` endpoints with the given weights, fresh statistics, at `Timestamp::ZERO`.
pub fn snapshot(n: usize, weights: Weights) -> Arc<Snapshot> {
    let specs = (0..n)
        .map(|i| EndpointSpec::new(address(i)).with_weight(weights.of(i)))
        .collect();
    Arc::new(Snapshot::from_specs(specs, Timestamp::ZERO))
}

/// The time at which response times are recorded for the weighted `WeightedResponseTime` case.
pub const STATS_NOW: Timestamp = Timestamp::from_millis(100_000);

/// A snapshot of `n` uniform-weight endpoints whose statistics hold one successful call each at
/// [`STATS_NOW`], with response times 0.5 ms … 10.5 ms spread like [`skewed_weight`], so
/// `WeightedResponseTime` prepared at `STATS_NOW` takes its weighted (alias-table) path.
pub fn snapshot_with_response_times(n: usize) -> Arc<Snapshot> {
    let snap = snapshot(n, Weights::Uniform);
    for (i, e) in snap.endpoints().iter().enumerate() {
        let latency = Duration::from_micros(500 + 10 * u64::from(skewed_weight(i)));
        e.stats().record(latency, STATS_NOW, Outcome::Success);
    }
    snap
}

/// A slice of `n` `u32` indices (the same element size as `EndpointIdx`), for the floors.
pub fn index_slice(n: usize) -> Box<[u32]> {
    (0..n as u32).collect()
}

thread_local! {
    static XORSHIFT: Cell<u64> = const { Cell::new(0x9E37_79B9_7F4A_7C15) };
}

/// The RNG floor: one step of a thread-local xorshift64, mapped to `0..n` by multiply-shift
/// (Lemire's method without the rejection step).
#[inline]
pub fn xorshift_index(n: usize) -> usize {
    XORSHIFT.with(|s| {
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        ((u128::from(x) * n as u128) >> 64) as usize
    })
}

// ---------------------------------------------------------------------------------------------
// Load-aware strategies (issue 3), consistent hashing (issue 4), outlier detection: shared inputs.
// ---------------------------------------------------------------------------------------------

/// Endpoint counts of the consistent-hashing lookup benchmarks (issue 4).
pub const HASH_N: [usize; 3] = [10, 1_000, 10_000];

/// The time load-aware picks run at: half a second after the samples recorded at [`STATS_NOW`]
/// (same 5 s slot of the windowed mean; the peak EWMA decays over 500 ms, so its projection
/// does real arithmetic).
pub const PICK_NOW: Timestamp = Timestamp::from_millis(100_500);

/// Calls in flight on endpoint `i` in [`loaded_snapshot`]: 1–3 on every 7th endpoint, 0 elsewhere.
#[inline]
pub fn in_flight_of(i: usize) -> u32 {
    if i.is_multiple_of(7) {
        1 + (i / 7 % 3) as u32
    } else {
        0
    }
}

/// Server-reported load of endpoint `i` (utilisation, qps, eps), spread like [`skewed_weight`].
pub fn load_report_of(i: usize) -> (f64, f64, f64) {
    let s = f64::from(skewed_weight(i)); // 1..=997
    (0.2 + 0.7 * s / 997.0, 50.0 + s, s / 200.0)
}

/// A snapshot of `n` endpoints with `weights` whose statistics look like a fleet in service:
///
/// * one successful call per endpoint recorded at [`STATS_NOW`], latency 0.5–10.5 ms spread
///   like [`skewed_weight`] (so the peak EWMA and the windowed mean hold a sample);
/// * [`in_flight_of`]`(i)` calls in flight (`EndpointStats::start`, never finished);
/// * two load reports per endpoint ([`load_report_of`]), at `STATS_NOW − 60 s` and at
///   `STATS_NOW`, so `Adaptive` prepared at `STATS_NOW` is past its 10 s blackout and uses them.
pub fn loaded_snapshot(n: usize, weights: Weights) -> Arc<Snapshot> {
    let snap = snapshot(n, weights);
    let earlier = STATS_NOW.saturating_sub(Duration::from_secs(60));
    for (i, e) in snap.endpoints().iter().enumerate() {
        let stats = e.stats();
        let latency = Duration::from_micros(500 + 10 * u64::from(skewed_weight(i)));
        stats.record(latency, STATS_NOW, Outcome::Success);
        for _ in 0..in_flight_of(i) {
            stats.start();
        }
        let (util, qps, eps) = load_report_of(i);
        stats.report_load(earlier, util, qps, eps);
        stats.report_load(STATS_NOW, util, qps, eps);
    }
    snap
}

/// `count` random request keys (`"user-"` + 16 hex digits, 21 bytes), fixed by `seed`.
pub fn request_keys(count: usize, seed: u64) -> Vec<String> {
    let mut rng = lbkit_core::FastRng::seed_from_u64(seed);
    (0..count)
        .map(|_| format!("user-{:016x}", rng.next_u64()))
        .collect()
}

/// Number of pre-built request keys the lookup benchmarks cycle through (a power of two).
pub const KEYS: usize = 1_024;

/// A snapshot of `n` endpoints ([`address`]) all of weight `weight`, fresh statistics, at
/// `Timestamp::ZERO`. Weight 1 is nginx's and Pingora's default (160 ketama points each).
pub fn snapshot_with_weight(n: usize, weight: u32) -> Arc<Snapshot> {
    let specs = (0..n)
        .map(|i| EndpointSpec::new(address(i)).with_weight(weight))
        .collect();
    Arc::new(Snapshot::from_specs(specs, Timestamp::ZERO))
}
