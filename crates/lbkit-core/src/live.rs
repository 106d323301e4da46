//! The hot half of an endpoint's statistics: what a pick reads, packed into one 64-byte line
//! per endpoint and allocated densely.
//!
//! A load-aware pick at 100 000 endpoints is bound by memory, not by instructions: each candidate
//! used to be a chain `Snapshot` → `Endpoint` → `EndpointStats` → the line holding its in-flight
//! count → the line holding its EWMA, each link a likely cache miss in a 100 MB spread of
//! allocations (BENCHMARKS.md, issue 3, finding 3). [`LiveStats`] puts everything a pick or an
//! availability check reads into one line: calls in flight, the failure run and the last
//! failure, cumulative successes and their latency sum, and the peak EWMA. Lines come from a
//! process-wide slab of 64 KiB chunks, so the endpoints of a set created together sit next to
//! each other (6.4 MB for 100 000 endpoints: within the last-level cache), and every
//! [`Snapshot`](crate::Snapshot) keeps a dense array of its endpoints' lines
//! ([`Snapshot::live`](crate::Snapshot::live)), so a candidate costs one array read and one line.
//!
//! The slab only grows: a line released by a dropped [`EndpointStats`](crate::EndpointStats)
//! is reused by the next one, so its memory is 64 bytes × the largest number of endpoints alive
//! at once. Taking and returning a line takes a mutex — once per endpoint lifetime, never on a
//! pick.

// Off the pick path (clippy.toml's rule allows a local exception with a reason): the slab's
// free list is locked once when an endpoint's statistics are made and once when they are
// dropped, never by a pick or a call.
#![allow(clippy::disallowed_types)]

use std::sync::PoisonError;
use std::time::Duration;

use crate::sync::{AtomicU32, AtomicU64, Ordering::Relaxed};
use crate::time::{duration_nanos, Timestamp};

/// Lines per slab chunk (64 KiB).
#[cfg(not(lbkit_loom))]
const CHUNK: usize = 1024;
/// Under loom, chunks of two lines: a model reaches a second chunk and reuses lines.
#[cfg(lbkit_loom)]
const CHUNK: usize = 2;

/// Free lines of the process-wide slab (a stack: the next line handed out is the last freed,
/// and a fresh chunk's lines come out in address order).
#[cfg(not(lbkit_loom))]
static FREE: std::sync::Mutex<Vec<&'static LiveStats>> = std::sync::Mutex::new(Vec::new());

// Under loom, one free list per model execution (loom's statics are reset between them; the
// lines an execution leaked are never seen again).
#[cfg(lbkit_loom)]
loom::lazy_static! {
    static ref FREE: loom::sync::Mutex<Vec<&'static LiveStats>> = loom::sync::Mutex::new(Vec::new());
}

/// The latest end of any endpoint's pushback in the process (ns; 0: none yet): picks skip the
/// per-endpoint check while it is past. Written only by a pushback (a rare answer), so every
/// thread keeps it cached. Outside loom's model (a plain std atomic: it only ever grows).
static PUSHBACK_ANY_UNTIL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Add `v` to `sum`, staying at `u64::MAX` instead of wrapping (latency sums). One
/// `fetch_add`, not a compare-and-swap loop: a sum that wrapped (584 years of latency) is pinned
/// at the maximum right after, so a reader racing that one add may see the wrapped value.
pub(crate) fn add_saturating(sum: &AtomicU64, v: u64) {
    if sum.fetch_add(v, Relaxed).checked_add(v).is_none() {
        sum.store(u64::MAX, Relaxed);
    }
}

/// The next free line of `free`, adding a fresh chunk when it is empty.
fn take(free: &mut Vec<&'static LiveStats>) -> &'static LiveStats {
    if let Some(line) = free.pop() {
        return line;
    }
    let chunk: &'static [LiveStats] = Box::leak((0..CHUNK).map(|_| LiveStats::blank()).collect());
    free.extend(chunk[1..].iter().rev());
    &chunk[0]
}

/// The statistics a pick reads, one cache line per endpoint; atomics, `Relaxed`.
///
/// Lines come from a process-wide slab that only grows: 64 bytes × the largest number of
/// endpoints alive at once (a dropped endpoint's line is reused by the next one). Endpoints
/// created together get adjacent lines, so a load-aware pick over 100 000 endpoints reads
/// from 6.4 MB instead of a 100 MB spread of allocations.
///
/// Obtained from [`EndpointStats::live`](crate::EndpointStats::live) or, densely indexed, from
/// [`Snapshot::live`](crate::Snapshot::live).
///
/// ```
/// use lbkit_core::{EndpointIdx, EndpointSpec, Snapshot, Timestamp};
/// let snap = Snapshot::from_specs(vec![EndpointSpec::new("a:1")], Timestamp::ZERO);
/// snap.endpoints()[0].stats().start();
/// assert_eq!(snap.live(EndpointIdx::new(0)).in_flight(), 1);
/// ```
#[repr(C, align(64))]
pub struct LiveStats {
    in_flight: AtomicU32,
    consecutive_failures: AtomicU32,
    successes: AtomicU64,
    success_nanos: AtomicU64,
    last_failure_ns: AtomicU64, // 0 = never
    ewma: PeakEwma,
    pushback_until_ns: AtomicU64, // 0 = never
}

#[cfg(not(lbkit_loom))]
const _: () = assert!(std::mem::size_of::<LiveStats>() == 64);

// === impl LiveStats ===

impl LiveStats {
    fn blank() -> Self {
        LiveStats {
            in_flight: AtomicU32::new(0),
            consecutive_failures: AtomicU32::new(0),
            successes: AtomicU64::new(0),
            success_nanos: AtomicU64::new(0),
            last_failure_ns: AtomicU64::new(0),
            ewma: PeakEwma::new(Duration::from_secs(1)),
            pushback_until_ns: AtomicU64::new(0),
        }
    }

    /// A zeroed line from the slab whose EWMA decays with `ewma_decay`.
    pub(crate) fn acquire(ewma_decay: Duration) -> &'static LiveStats {
        let line = take(&mut FREE.lock().unwrap_or_else(PoisonError::into_inner));
        line.reset(ewma_decay);
        line
    }

    /// Give a line back to the slab. The caller must hold the only use of it.
    pub(crate) fn release(line: &'static LiveStats) {
        FREE.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(line);
    }

    /// Change the peak EWMA's time constant, keeping its estimate.
    pub(crate) fn set_ewma_decay(&self, decay: Duration) {
        self.ewma.set_decay(decay);
    }

    fn reset(&self, ewma_decay: Duration) {
        self.in_flight.store(0, Relaxed);
        self.consecutive_failures.store(0, Relaxed);
        self.successes.store(0, Relaxed);
        self.success_nanos.store(0, Relaxed);
        self.last_failure_ns.store(0, Relaxed);
        self.pushback_until_ns.store(0, Relaxed);
        self.ewma.reset(ewma_decay);
    }

    /// Calls handed out and not yet finished.
    #[inline]
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Relaxed)
    }

    /// Failures since the last success.
    #[inline]
    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures.load(Relaxed)
    }

    /// Successful calls so far.
    #[inline]
    pub fn successes(&self) -> u64 {
        self.successes.load(Relaxed)
    }

    /// Sum of the latencies of all successful calls so far, in nanoseconds (saturating).
    ///
    /// With [`successes`](Self::successes), two readings give the mean between them: what
    /// `shortest-response` does per pick instead of reading the windowed slots.
    #[inline]
    pub fn success_nanos(&self) -> u64 {
        self.success_nanos.load(Relaxed)
    }

    /// When the last failure was recorded.
    #[inline]
    pub fn last_failure_at(&self) -> Option<Timestamp> {
        match self.last_failure_ns.load(Relaxed) {
            0 => None,
            ns => Some(Timestamp::from_nanos(ns)),
        }
    }

    /// Until when the endpoint asked to be left alone (a `429`, a `503` with `Retry-After`,
    /// `grpc-retry-pushback-ms`: [`crate::signal`]), if that is after `now`.
    #[inline]
    pub fn pushed_back_until(&self, now: Timestamp) -> Option<Timestamp> {
        // While no endpoint of the process is pushed back (nearly always), one read of a line
        // every thread keeps cached, instead of a second place in this endpoint's line: a
        // pick over 100 000 endpoints measured 50 ns with this, 160 ns without it.
        if PUSHBACK_ANY_UNTIL.load(std::sync::atomic::Ordering::Relaxed) <= now.as_nanos() {
            return None;
        }
        let until = self.pushback_until_ns.load(Relaxed);
        (until > now.as_nanos()).then(|| Timestamp::from_nanos(until))
    }

    /// Leave the endpoint alone until `until` (a later pushback extends, an earlier one does
    /// not shorten one already running).
    pub(crate) fn push_back(&self, until: Timestamp) {
        let ns = until.as_nanos().max(1);
        self.pushback_until_ns.fetch_max(ns, Relaxed);
        PUSHBACK_ANY_UNTIL.fetch_max(ns, std::sync::atomic::Ordering::Relaxed);
    }

    /// Peak-EWMA latency in nanoseconds projected to `now`, or `None` before the first sample.
    #[inline]
    pub fn ewma_ns_at(&self, now: Timestamp) -> Option<f64> {
        self.ewma.at(now)
    }

    /// The peak EWMA at `now` as `(estimate, exponent)`, the projection being
    /// `estimate × e^exponent` (`exponent ≤ 0`), or `None` before the first sample.
    ///
    /// Lets a caller compare two projections with one `exp` instead of two: `a` costs less than
    /// `b` when `a.0 × e^(a.1 − b.1) < b.0`.
    #[inline]
    pub fn ewma_terms_at(&self, now: Timestamp) -> Option<(f64, f64)> {
        self.ewma.terms(now)
    }

    #[inline]
    pub(crate) fn start(&self) {
        self.in_flight.fetch_add(1, Relaxed);
    }

    #[inline]
    pub(crate) fn add_in_flight(&self, n: u32) {
        self.in_flight.fetch_add(n, Relaxed);
    }

    /// One fewer call in flight; never wraps below zero.
    #[inline]
    pub(crate) fn end(&self) {
        // One `fetch_sub`, not a compare-and-swap loop: a call always ends after it started, so
        // the count only goes below zero when `finish` is called without `start` (a misuse of
        // the public `EndpointStats::finish`); that wrap is undone at once.
        if self.in_flight.fetch_sub(1, Relaxed) == 0 {
            self.in_flight.fetch_add(1, Relaxed);
        }
    }

    pub(crate) fn record_ewma(&self, now: Timestamp, latency_ns: u64) {
        self.ewma.record(now, ns_f64(latency_ns));
    }

    pub(crate) fn set_ewma(&self, now: Timestamp, value_ns: f64) {
        self.ewma.set(now, value_ns);
    }

    pub(crate) fn success(&self, latency_ns: u64) {
        self.successes.fetch_add(1, Relaxed);
        // Saturating: a sum that would wrap stays at the maximum instead of going back to 0.
        self.add_success_nanos(latency_ns);
        self.consecutive_failures.store(0, Relaxed);
    }

    pub(crate) fn add_successes(&self, n: u64) {
        self.successes.fetch_add(n, Relaxed);
    }

    pub(crate) fn add_success_nanos(&self, ns: u64) {
        add_saturating(&self.success_nanos, ns);
    }

    pub(crate) fn failure(&self, now: Timestamp) {
        self.consecutive_failures.fetch_add(1, Relaxed);
        self.mark_failure(now);
    }

    pub(crate) fn add_consecutive_failures(&self, n: u32) {
        self.consecutive_failures.fetch_add(n, Relaxed);
    }

    pub(crate) fn mark_failure(&self, at: Timestamp) {
        self.last_failure_ns.store(at.as_nanos().max(1), Relaxed);
    }

    pub(crate) fn clear_consecutive_failures(&self) {
        self.consecutive_failures.store(0, Relaxed);
    }
}

impl std::fmt::Debug for LiveStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveStats")
            .field("in_flight", &self.in_flight())
            .field("consecutive_failures", &self.consecutive_failures())
            .field("successes", &self.successes())
            .field("success_nanos", &self.success_nanos())
            .field("last_failure_at", &self.last_failure_at())
            .field("ewma", &self.ewma)
            .finish()
    }
}

/// Nanoseconds as `f64` by way of `i64`: one conversion instruction where `u64`'s takes four
/// dependent ones, on the EWMA's chain of floating-point steps that a finish waits for. Exact as
/// `ns as f64` up to 2⁶³ ns (292 years); beyond, 2⁶³.
#[inline]
fn ns_f64(ns: u64) -> f64 {
    ns.min(i64::MAX as u64) as i64 as f64
}

/// `x.exp()`, with a short series where `|x|` is below 2^-10: a decay over a gap much shorter
/// than the time constant (milliseconds between calls, a 10 s decay), which is what nearly every
/// update and read of a peak EWMA computes. There the series' error is below x^5/120 < 2^-56:
/// libm's `exp` but for the last bit or two, in five multiply-adds instead of a call.
///
/// ```
/// # use lbkit_core::exp_small;
/// assert_eq!(exp_small(0.0), 1.0);
/// assert!((exp_small(-1e-4) - (-1e-4f64).exp()).abs() < 1e-15);
/// assert_eq!(exp_small(-2.0), (-2.0f64).exp());
/// ```
#[inline]
pub fn exp_small(x: f64) -> f64 {
    if x.abs() < 1.0 / 1024.0 {
        1.0 + x * (1.0 + x * (0.5 + x * (1.0 / 6.0 + x * (1.0 / 24.0))))
    } else {
        x.exp()
    }
}

/// Peak-sensitive EWMA (linkerd's `PeakEwma`), stored as f64 bits plus the time of the last
/// update. Atomics, Relaxed: the estimate and its time may be one update apart. The decay is an
/// atomic because slab lines are reused and because a strategy may ask for its own
/// ([`Strategy::ewma_decay`](crate::Strategy::ewma_decay)): set when an endpoint is made and
/// when a balancer with such a strategy publishes it, never per call.
#[derive(Debug)]
struct PeakEwma {
    per_ns: AtomicU64, // f64 bits of 1 / decay in ns: a multiply on reads, not a divide
    estimate_bits: AtomicU64, // f64 nanoseconds; NaN bits = no sample yet
    at_ns: AtomicU64,
}

const NO_SAMPLE: u64 = f64::NAN.to_bits();

impl PeakEwma {
    fn new(decay: Duration) -> Self {
        let e = PeakEwma {
            per_ns: AtomicU64::new(0),
            estimate_bits: AtomicU64::new(NO_SAMPLE),
            at_ns: AtomicU64::new(0),
        };
        e.reset(decay);
        e
    }

    fn reset(&self, decay: Duration) {
        self.set_decay(decay);
        self.estimate_bits.store(NO_SAMPLE, Relaxed);
        self.at_ns.store(0, Relaxed);
    }

    /// Store the time constant, unless it is already this one (a publish sets it on every
    /// endpoint: unchanged lines are only read, not written).
    fn set_decay(&self, decay: Duration) {
        let decay_ns = (duration_nanos(decay) as f64).max(1.0);
        let bits = (1.0 / decay_ns).to_bits();
        if self.per_ns.load(Relaxed) != bits {
            self.per_ns.store(bits, Relaxed);
        }
    }

    /// 1 / the time constant in nanoseconds.
    #[inline]
    fn per_ns(&self) -> f64 {
        f64::from_bits(self.per_ns.load(Relaxed))
    }

    /// The estimate decayed toward zero from its last update to `now`.
    #[inline]
    fn at(&self, now: Timestamp) -> Option<f64> {
        self.terms(now).map(|(est, x)| est * exp_small(x))
    }

    /// The last estimate and the decay exponent from its update to `now`.
    #[inline]
    fn terms(&self, now: Timestamp) -> Option<(f64, f64)> {
        let est = f64::from_bits(self.estimate_bits.load(Relaxed));
        if est.is_nan() {
            return None;
        }
        let elapsed = ns_f64(now.as_nanos().saturating_sub(self.at_ns.load(Relaxed)));
        Some((est, -elapsed * self.per_ns()))
    }

    fn record(&self, now: Timestamp, rtt_ns: f64) {
        let rtt_ns = if rtt_ns.is_finite() {
            rtt_ns.max(0.0)
        } else {
            return;
        };
        let per_ns = self.per_ns();
        let mut bits = self.estimate_bits.load(Relaxed);
        loop {
            let prev = f64::from_bits(bits);
            let elapsed = ns_f64(now.as_nanos().saturating_sub(self.at_ns.load(Relaxed)));
            let w = exp_small(-elapsed * per_ns);
            // The estimate as a reader sees it now: decayed toward zero since the last update.
            let decayed = prev * w;
            let next = if prev.is_nan() || rtt_ns >= decayed {
                rtt_ns // a new peak replaces the estimate at once
            } else {
                decayed * w + rtt_ns * (1.0 - w) // then move toward the sample
            };
            match self
                .estimate_bits
                .compare_exchange_weak(bits, next.to_bits(), Relaxed, Relaxed)
            {
                Ok(_) => break,
                Err(seen) => bits = seen,
            }
        }
        // The estimate's time only moves forward. Not a fetch_max: a plain store when it moves
        // (none when calls end within the same nanosecond), so a racing writer may leave it a
        // little early, and the decay is then projected from a little before the update: a
        // reader sees the estimate a hair lower, never a NaN or a jump.
        let now_ns = now.as_nanos();
        if self.at_ns.load(Relaxed) < now_ns {
            self.at_ns.store(now_ns, Relaxed);
        }
    }

    fn set(&self, now: Timestamp, value_ns: f64) {
        self.estimate_bits.store(value_ns.to_bits(), Relaxed);
        self.at_ns.store(now.as_nanos(), Relaxed);
    }
}

#[cfg(all(test, not(lbkit_loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;

    fn t(ms: u64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    #[test]
    fn peak_ewma_jumps_to_peaks_and_decays() {
        let e = PeakEwma::new(Duration::from_secs(10));
        assert_eq!(e.at(t(0)), None);
        e.record(t(0), 10.0 * MS as f64);
        assert_eq!(e.at(t(0)), Some(10.0 * MS as f64));
        e.record(t(1), 100.0 * MS as f64);
        assert!(
            (e.at(t(1)).unwrap() - 100.0 * MS as f64).abs() < 1.0,
            "peak taken at once"
        );
        // One time constant later the projection is 1/e of the peak.
        let later = e.at(t(10_001)).unwrap();
        assert!((later / (100.0 * MS as f64) - (-1.0f64).exp()).abs() < 1e-9);
        // A smaller sample right away moves the estimate only a little.
        e.record(t(2), 1.0 * MS as f64);
        let est = e.at(t(2)).unwrap();
        assert!(est > 99.0 * MS as f64 && est < 100.0 * MS as f64, "{est}");
    }

    #[test]
    fn a_reused_line_starts_blank_with_its_new_decay() {
        let a = LiveStats::acquire(Duration::from_secs(10));
        a.start();
        a.failure(t(5));
        a.success(7);
        a.record_ewma(t(5), 9 * MS);
        LiveStats::release(a);
        // Other tests take lines concurrently, so look for a blank line rather than `a` itself.
        let b = LiveStats::acquire(Duration::from_secs(1));
        assert_eq!(
            (
                b.in_flight(),
                b.consecutive_failures(),
                b.successes(),
                b.success_nanos()
            ),
            (0, 0, 0, 0)
        );
        assert_eq!((b.last_failure_at(), b.ewma_ns_at(t(5))), (None, None));
        b.record_ewma(t(0), 10 * MS);
        let decayed = b.ewma_ns_at(t(1_000)).unwrap();
        assert!((decayed / (10 * MS) as f64 - (-1.0f64).exp()).abs() < 1e-9);
        LiveStats::release(b);
    }

    #[test]
    fn lines_of_one_batch_are_dense() {
        // A private free list: the lines of a fresh chunk come out in address order, one line
        // apart, and the next chunk starts when one runs out.
        let mut free = Vec::new();
        let lines: Vec<_> = (0..CHUNK + 1).map(|_| take(&mut free)).collect();
        let addr = |l: &LiveStats| l as *const LiveStats as usize;
        assert!(lines[..CHUNK]
            .windows(2)
            .all(|w| addr(w[1]) == addr(w[0]) + 64));
        assert!(free.len() == CHUNK - 1, "a second chunk was started");
    }

    #[test]
    fn concurrent_takers_never_share_a_line() {
        // Four threads take and give back lines at once: every line held at the same moment is
        // distinct and 64-byte aligned, and every line taken starts blank.
        let held: Vec<&'static LiveStats> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        let mut kept = Vec::new();
                        for i in 0..2_000u64 {
                            let l = LiveStats::acquire(Duration::from_secs(10));
                            assert_eq!((l.in_flight(), l.successes()), (0, 0));
                            l.start();
                            l.success(i);
                            if i % 3 == 0 {
                                LiveStats::release(l); // churn while the others take
                            } else {
                                kept.push(l);
                            }
                        }
                        kept
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().expect("taker thread"))
                .collect()
        });
        let addr = |l: &&LiveStats| *l as *const LiveStats as usize;
        let distinct: std::collections::HashSet<_> = held.iter().map(addr).collect();
        assert_eq!(distinct.len(), held.len(), "a line was handed out twice");
        assert!(held.iter().all(|l| addr(l) % 64 == 0));
        held.into_iter().for_each(LiveStats::release);
    }

    #[test]
    fn success_sum_saturates() {
        let l = LiveStats::acquire(Duration::from_secs(10));
        l.success(u64::MAX - 1);
        l.success(5);
        assert_eq!((l.successes(), l.success_nanos()), (2, u64::MAX));
        // The one helper serves every latency sum (the failures' too), and stays pinned.
        let sum = AtomicU64::new(u64::MAX - 1);
        add_saturating(&sum, 5);
        add_saturating(&sum, 5);
        assert_eq!(sum.load(Relaxed), u64::MAX);
        LiveStats::release(l);
    }

    #[test]
    fn ns_f64_is_the_unsigned_conversion_up_to_2_to_the_63() {
        for ns in [0, 1, 999, 1 << 53, (1 << 53) + 1, u64::MAX >> 1] {
            assert_eq!(ns_f64(ns), ns as f64, "{ns}");
        }
        assert_eq!(ns_f64(u64::MAX), (1u64 << 63) as f64);
    }

    proptest! {
        #[test]
        fn ns_f64_rounds_as_as_f64(ns in 0u64..=i64::MAX as u64) {
            prop_assert_eq!(ns_f64(ns).to_bits(), (ns as f64).to_bits());
        }

        #[test]
        fn exp_small_is_exp(x in -2e-3f64..2e-3) {
            let (fast, libm) = (exp_small(x), x.exp());
            prop_assert!((fast - libm).abs() <= 4.0 * f64::EPSILON * libm, "{x}: {fast} vs {libm}");
        }

        #[test]
        fn ewma_never_nan_or_negative(samples in proptest::collection::vec((0u64..10_000_000_000, 0u64..1u64 << 40), 1..50)) {
            let e = PeakEwma::new(Duration::from_secs(10));
            let mut now = 0u64;
            for (dt, rtt) in samples {
                now += dt;
                e.record(Timestamp::from_nanos(now), rtt as f64);
                let v = e.at(Timestamp::from_nanos(now)).unwrap();
                prop_assert!(v.is_finite() && v >= 0.0);
            }
        }
    }
}
