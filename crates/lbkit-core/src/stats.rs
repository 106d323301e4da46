//! Live per-endpoint statistics, shared across threads with atomics only.
//!
//! Every field is an independent atomic updated with `Relaxed` ordering: a reader may see two
//! fields one sample apart, and every strategy tolerates that. No field is ever behind a lock.
//!
//! * `in_flight` is incremented when a pick hands out a [`CallGuard`](crate::CallGuard) and
//!   decremented when the guard finishes or is dropped, so it always returns to zero.
//! * The **windowed mean** of successful response times (Ribbon's `ResponseTimeAvg`, Dubbo's
//!   sliding window for `ShortestResponse`) lives in [`SLOTS`] time slots of [`SLOT`] each.
//!   Failures are left out on purpose: a server that fails fast must not look fast.
//! * The **peak EWMA** (Finagle/linkerd) jumps to any new peak and otherwise decays toward new
//!   samples with a time constant; between samples it decays toward zero so an idle endpoint is
//!   probed again. Reading never mutates: [`EndpointStats::ewma_at`] projects the decay to `now`.

use std::time::Duration;

use crate::live::{add_saturating, LiveStats};
use crate::sync::{
    fence, AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};
use crate::time::{duration_nanos, Timestamp};

/// Default EWMA time constant (linkerd's and Finagle's `decay`: 10 s).
pub const DEFAULT_EWMA_DECAY: Duration = Duration::from_secs(10);

/// Width of one slot of the windowed response-time mean.
pub const SLOT: Duration = Duration::from_secs(5);

/// Number of slots: the window can reach back `SLOTS × SLOT` = 60 s (Ribbon publishes its
/// response-time distribution every minute).
pub const SLOTS: usize = 12;

/// Upper bounds of the buckets of [`EndpointStats::latency_histogram`]: Prometheus' default
/// buckets (5 ms to 10 s) plus 1 ms and 2.5 ms below them, for services on a local network.
pub const LATENCY_BUCKETS: [Duration; 13] = [
    Duration::from_millis(1),
    Duration::from_micros(2_500),
    Duration::from_millis(5),
    Duration::from_millis(10),
    Duration::from_millis(25),
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_micros(2_500_000),
    Duration::from_secs(5),
    Duration::from_secs(10),
];

const BUCKET_NS: [u64; LATENCY_BUCKETS.len()] = {
    let mut ns = [0u64; LATENCY_BUCKETS.len()];
    let mut i = 0;
    while i < ns.len() {
        ns[i] = LATENCY_BUCKETS[i].as_nanos() as u64;
        i += 1;
    }
    ns
};

/// Latencies of an endpoint's finished calls (successes and failures; cancellations are left
/// out), counted per bucket of [`LATENCY_BUCKETS`]: a Prometheus histogram's data.
///
/// ```
/// use std::time::Duration;
/// use lbkit_core::{EndpointStats, Outcome, Timestamp};
/// let stats = EndpointStats::default();
/// stats.record(Duration::from_millis(3), Timestamp::ZERO, Outcome::Success);
/// stats.record(Duration::from_secs(20), Timestamp::ZERO, Outcome::Success);
/// let h = stats.latency_histogram();
/// assert_eq!(h.cumulative(), [0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2]);
/// assert_eq!(h.count(), 2);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencyHistogram {
    /// Calls per bucket: `counts[i]` took at most `LATENCY_BUCKETS[i]` (and more than the bucket
    /// before); the last entry counts calls above 10 s.
    pub counts: [u64; LATENCY_BUCKETS.len() + 1],
    /// Sum of all latencies (saturating).
    pub sum: Duration,
}

impl LatencyHistogram {
    /// Cumulative counts, as Prometheus' `le` buckets (the last is `+Inf`).
    pub fn cumulative(&self) -> [u64; LATENCY_BUCKETS.len() + 1] {
        let mut out = self.counts;
        for i in 1..out.len() {
            out[i] = out[i].saturating_add(out[i - 1]);
        }
        out
    }

    /// Number of calls.
    pub fn count(&self) -> u64 {
        self.counts.iter().fold(0u64, |a, &c| a.saturating_add(c))
    }
}

/// How a finished call went.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The call succeeded.
    Success,
    /// The call failed.
    Failure(FailureKind),
    /// The caller gave up (the guard was dropped unfinished).
    Cancelled,
}

/// Why a call failed; strategies and breakers may treat kinds differently.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailureKind {
    /// Could not connect: the request never reached the server.
    Connect,
    /// No answer in time.
    Timeout,
    /// The server answered with an error.
    Server,
    /// Anything else.
    Other,
}

// === impl FailureKind ===

impl FailureKind {
    /// Every kind, in the order of [`EndpointStats::failures_by_kind`].
    pub const ALL: [FailureKind; 4] = [
        FailureKind::Connect,
        FailureKind::Timeout,
        FailureKind::Server,
        FailureKind::Other,
    ];

    /// Lowercase name, as metrics labels and messages use it.
    pub const fn name(self) -> &'static str {
        match self {
            FailureKind::Connect => "connect",
            FailureKind::Timeout => "timeout",
            FailureKind::Server => "server",
            FailureKind::Other => "other",
        }
    }

    /// Position in [`FailureKind::ALL`].
    const fn index(self) -> usize {
        match self {
            FailureKind::Connect => 0,
            FailureKind::Timeout => 1,
            FailureKind::Server => 2,
            FailureKind::Other => 3,
        }
    }
}

/// How long a gap between two load reports restarts the blackout of a load-driven strategy
/// (gRPC's weighted round robin expires weights after 3 minutes).
pub const LOAD_REPORT_GAP: Duration = Duration::from_secs(180);

/// Load reported by the server itself (gRPC ORCA, Dubbo 3 adaptive), as last received.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadReport {
    /// CPU or application utilisation, usually in `[0, 1]`.
    pub utilization: f64,
    /// Queries per second the server handles.
    pub qps: f64,
    /// Errors per second.
    pub eps: f64,
    /// When the report arrived.
    pub at: Timestamp,
    /// Since when reports have arrived without a gap longer than [`LOAD_REPORT_GAP`].
    pub since: Timestamp,
}

/// Observed statistics to load into an [`EndpointStats`], for what-if tools (`lbkit pick`) and
/// simulators. Every field is optional in spirit: zero means "nothing observed".
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StatsSeed {
    /// Calls currently in flight.
    pub in_flight: u32,
    /// Average successful response time over the recent window.
    pub avg_response: Option<Duration>,
    /// Peak-EWMA latency estimate.
    pub ewma: Option<Duration>,
    /// Successful calls so far.
    pub successes: u64,
    /// Failed calls so far.
    pub failures: u64,
    /// Failures since the last success.
    pub consecutive_failures: u32,
    /// When the last failure happened.
    pub last_failure_at: Option<Timestamp>,
    /// The last load report: utilisation, qps, eps, and since when reports flow.
    pub load: Option<(f64, f64, f64, Timestamp)>,
}

/// Live statistics of one endpoint: in-flight, outcome counters, a windowed mean and a peak
/// EWMA of latency, and server-reported load; all atomics.
///
/// What a pick reads (in-flight, the failure run, cumulative successes, the peak EWMA) lives in
/// the endpoint's [`LiveStats`] line, allocated densely apart from the rest (see
/// [`live`](Self::live)); the windowed slots and load reports stay here.
#[derive(Debug)]
#[repr(C)]
pub struct EndpointStats {
    // What a success touches here is kept together, in this order (hence `repr(C)`): the
    // window's word and slot end (the last fields of `window`), `live`, then the buckets
    // (72 bytes from the word to the end of bucket 5, 50 ms): one or two cache lines, not three,
    // which is what a call pays in misses when there are too many endpoints for the cache.
    window: WindowedMean,
    // Taken from the slab at construction, given back on drop; nothing else keeps it.
    live: &'static LiveStats,
    // Latency histogram of finished calls (not cancellations): counts per bucket; its sum is
    // the successes' (kept in the live line for the strategies) plus the failures' here, so a
    // success costs no third latency sum.
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    // Written when calls fail or are cancelled; atomics, Relaxed.
    failures: AtomicU64,
    by_kind: [AtomicU64; 4],
    cancellations: AtomicU64,
    // How long cancelled calls had run (a lower bound of their latency), per latency bucket:
    // what a hedge timer counts so that the slow attempts a hedge beat keep their place in
    // the tail (`crate::hedge`).
    cancelled_buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    failure_nanos: AtomicU64,
    // Server-reported load; f64 bits. Written by whoever receives reports.
    load_utilization: AtomicU64,
    load_qps: AtomicU64,
    load_eps: AtomicU64,
    load_at_ns: AtomicU64,    // 0 = never reported
    load_since_ns: AtomicU64, // start of the current run of reports
    // Shadow mode (crate::shadow): first attempts the live strategy sent here, and those the
    // candidate would have sent, since the shadow started.
    shadow_live: AtomicU64,
    shadow_candidate: AtomicU64,
}

impl Drop for EndpointStats {
    fn drop(&mut self) {
        LiveStats::release(self.live);
    }
}

impl Default for EndpointStats {
    fn default() -> Self {
        EndpointStats::new(DEFAULT_EWMA_DECAY)
    }
}

// === impl EndpointStats ===

impl EndpointStats {
    /// Fresh statistics whose peak EWMA uses time constant `ewma_decay`.
    pub fn new(ewma_decay: Duration) -> Self {
        EndpointStats {
            live: LiveStats::acquire(ewma_decay),
            failures: AtomicU64::new(0),
            by_kind: Default::default(),
            cancellations: AtomicU64::new(0),
            cancelled_buckets: Default::default(),
            window: WindowedMean::default(),
            buckets: Default::default(),
            failure_nanos: AtomicU64::new(0),
            load_utilization: AtomicU64::new(0),
            load_qps: AtomicU64::new(0),
            load_eps: AtomicU64::new(0),
            load_at_ns: AtomicU64::new(0),
            load_since_ns: AtomicU64::new(0),
            shadow_live: AtomicU64::new(0),
            shadow_candidate: AtomicU64::new(0),
        }
    }

    /// Shadow mode: first attempts the live strategy sent to this endpoint and those the
    /// candidate would have sent, since the shadow started ([`crate::shadow`]).
    pub fn shadow_counts(&self) -> (u64, u64) {
        (
            self.shadow_live.load(Relaxed),
            self.shadow_candidate.load(Relaxed),
        )
    }

    #[inline]
    pub(crate) fn count_shadow(&self, live: bool) {
        let c = if live {
            &self.shadow_live
        } else {
            &self.shadow_candidate
        };
        c.fetch_add(1, Relaxed);
    }

    pub(crate) fn reset_shadow(&self) {
        self.shadow_live.store(0, Relaxed);
        self.shadow_candidate.store(0, Relaxed);
    }

    /// Record a load report from the server at `now`. Non-finite or negative values count as 0.
    pub fn report_load(&self, now: Timestamp, utilization: f64, qps: f64, eps: f64) {
        let clean = |v: f64| if v.is_finite() && v > 0.0 { v } else { 0.0 };
        self.load_utilization
            .store(clean(utilization).to_bits(), Relaxed);
        self.load_qps.store(clean(qps).to_bits(), Relaxed);
        self.load_eps.store(clean(eps).to_bits(), Relaxed);
        let now_ns = now.as_nanos().max(1);
        let last = self.load_at_ns.swap(now_ns, Relaxed);
        if last == 0 || now_ns.saturating_sub(last) > duration_nanos(LOAD_REPORT_GAP) {
            self.load_since_ns.store(now_ns, Relaxed);
        }
    }

    /// The endpoint asked at `now` to be left alone for `wait` (a pushback:
    /// [`crate::signal`]): picks pass it over until then when the balancer's
    /// [`Availability`](crate::Availability) honours pushback (the default). At most
    /// [`MAX_ENDPOINT_PUSHBACK`](crate::signal::MAX_ENDPOINT_PUSHBACK); a later pushback
    /// extends, an earlier one does not shorten the one running.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lbkit_core::{EndpointStats, Timestamp};
    /// let stats = EndpointStats::default();
    /// stats.push_back(Timestamp::from_millis(1_000), Duration::from_secs(2));
    /// assert_eq!(stats.pushed_back_until(Timestamp::from_millis(2_000)), Some(Timestamp::from_millis(3_000)));
    /// assert_eq!(stats.pushed_back_until(Timestamp::from_millis(3_000)), None);
    /// ```
    pub fn push_back(&self, now: Timestamp, wait: Duration) {
        let wait = wait.min(crate::signal::MAX_ENDPOINT_PUSHBACK);
        self.live.push_back(now.saturating_add(wait));
    }

    /// Until when the endpoint asked to be left alone, if that is after `now`.
    pub fn pushed_back_until(&self, now: Timestamp) -> Option<Timestamp> {
        self.live.pushed_back_until(now)
    }

    /// The last load report, if any.
    pub fn load_report(&self) -> Option<LoadReport> {
        let at = self.load_at_ns.load(Relaxed);
        (at != 0).then(|| LoadReport {
            utilization: f64::from_bits(self.load_utilization.load(Relaxed)),
            qps: f64::from_bits(self.load_qps.load(Relaxed)),
            eps: f64::from_bits(self.load_eps.load(Relaxed)),
            at: Timestamp::from_nanos(at),
            since: Timestamp::from_nanos(self.load_since_ns.load(Relaxed)),
        })
    }

    /// The hot line of these statistics: what picks read, one cache line, allocated densely
    /// with other endpoints' lines. [`Snapshot::live`](crate::Snapshot::live) indexes the same
    /// lines by [`EndpointIdx`](crate::EndpointIdx).
    #[inline]
    pub fn live(&self) -> &LiveStats {
        self.live
    }

    /// The line with the lifetime of the slab, for a snapshot's dense index. Valid (as this
    /// endpoint's line) for as long as `self` lives.
    pub(crate) fn live_line(&self) -> &'static LiveStats {
        self.live
    }

    /// Calls handed out and not yet finished.
    #[inline]
    pub fn in_flight(&self) -> u32 {
        self.live.in_flight()
    }

    /// Successful calls.
    pub fn successes(&self) -> u64 {
        self.live.successes()
    }

    /// Failed calls.
    pub fn failures(&self) -> u64 {
        self.failures.load(Relaxed)
    }

    /// Failed calls per kind, in the order of [`FailureKind::ALL`].
    pub fn failures_by_kind(&self) -> [u64; 4] {
        std::array::from_fn(|i| self.by_kind[i].load(Relaxed))
    }

    /// Cancelled calls (guards dropped unfinished).
    pub fn cancellations(&self) -> u64 {
        self.cancellations.load(Relaxed)
    }

    /// Finished calls of every outcome.
    pub fn total(&self) -> u64 {
        self.successes() + self.failures() + self.cancellations()
    }

    /// Failures since the last success.
    #[inline]
    pub fn consecutive_failures(&self) -> u32 {
        self.live.consecutive_failures()
    }

    /// When the last failure was recorded.
    pub fn last_failure_at(&self) -> Option<Timestamp> {
        self.live.last_failure_at()
    }

    /// Mean successful response time over the last `window` (rounded up to whole [`SLOT`]s, at
    /// most `SLOTS × SLOT`), or `None` when no success was recorded in it. Each sample counts
    /// in whole microseconds, rounded up.
    pub fn avg_response_at(&self, now: Timestamp, window: Duration) -> Option<Duration> {
        self.window.mean_at(now, window, self.live)
    }

    /// Number of successful samples behind [`avg_response_at`](Self::avg_response_at).
    pub fn window_count_at(&self, now: Timestamp, window: Duration) -> u64 {
        self.window.sum_at(now, window, self.live).1
    }

    /// Count and latency sum (nanoseconds) of the successful samples behind
    /// [`avg_response_at`](Self::avg_response_at).
    pub fn window_sum_at(&self, now: Timestamp, window: Duration) -> (u64, u64) {
        let (sum, count) = self.window.sum_at(now, window, self.live);
        (count, sum)
    }

    /// Latencies of the finished calls so far (successes and failures), per bucket of
    /// [`LATENCY_BUCKETS`].
    pub fn latency_histogram(&self) -> LatencyHistogram {
        LatencyHistogram {
            counts: std::array::from_fn(|i| self.buckets[i].load(Relaxed)),
            sum: Duration::from_nanos(
                self.live
                    .success_nanos()
                    .saturating_add(self.failure_nanos.load(Relaxed)),
            ),
        }
    }

    /// How long the cancelled calls had run when they were cancelled, counted per bucket of
    /// [`LATENCY_BUCKETS`] (the last: above them). Each is a lower bound of a latency never
    /// seen: a hedge timer counts them with [`latency_histogram`](Self::latency_histogram)'s, or
    /// the slow attempts its hedges beat would leave the tail and the quantile drift down.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lbkit_core::{EndpointStats, Outcome, Timestamp};
    /// let stats = EndpointStats::default();
    /// stats.record(Duration::from_millis(70), Timestamp::ZERO, Outcome::Cancelled);
    /// assert_eq!(stats.cancelled_counts()[6], 1); // above 50 ms, at most 100 ms
    /// assert_eq!(stats.latency_histogram().count(), 0);
    /// ```
    pub fn cancelled_counts(&self) -> [u64; LATENCY_BUCKETS.len() + 1] {
        std::array::from_fn(|i| self.cancelled_buckets[i].load(Relaxed))
    }

    /// Change the peak EWMA's time constant (the estimate is kept). A
    /// [`Balancer`](crate::Balancer) does this for a strategy that names its own
    /// ([`Strategy::ewma_decay`](crate::Strategy::ewma_decay)).
    pub fn set_ewma_decay(&self, decay: Duration) {
        self.live.set_ewma_decay(decay);
    }

    /// Peak-EWMA latency projected to `now`, or `None` before the first sample.
    #[inline]
    pub fn ewma_at(&self, now: Timestamp) -> Option<Duration> {
        self.live
            .ewma_ns_at(now)
            .map(|ns| Duration::from_nanos(ns as u64))
    }

    /// Peak-EWMA latency in nanoseconds (f64) projected to `now`.
    #[inline]
    pub fn ewma_ns_at(&self, now: Timestamp) -> Option<f64> {
        self.live.ewma_ns_at(now)
    }

    /// A call was handed out (done by [`CallGuard`](crate::CallGuard)).
    #[inline]
    pub fn start(&self) {
        self.live.start();
    }

    /// A call counted by [`start`](Self::start) was never sent: in flight goes back, nothing
    /// is recorded.
    pub fn abandon(&self) {
        self.live.end();
    }

    /// A call handed out at `started` finished at `now` with `outcome`.
    pub fn finish(&self, started: Timestamp, now: Timestamp, outcome: Outcome) {
        // Saturating: never wraps below zero even if finish is called without start.
        self.live.end();
        self.record_ns(
            now.as_nanos().saturating_sub(started.as_nanos()),
            now,
            outcome,
        );
    }

    /// Forget the current run of failures (an outlier detector readmitting the endpoint).
    pub fn clear_consecutive_failures(&self) {
        self.live.clear_consecutive_failures();
    }

    /// Record a call's latency and outcome without touching `in_flight` (for callers that track
    /// concurrency themselves).
    pub fn record(&self, latency: Duration, now: Timestamp, outcome: Outcome) {
        self.record_ns(duration_nanos(latency), now, outcome);
    }

    /// [`record`](Self::record) of a latency in nanoseconds.
    #[inline]
    fn record_ns(&self, ns: u64, now: Timestamp, outcome: Outcome) {
        let at = || BUCKET_NS.partition_point(|&b| b < ns);
        let bucket = || &self.buckets[at()];
        match outcome {
            Outcome::Success => {
                bucket().fetch_add(1, Relaxed);
                self.live.success(ns);
                self.window.record(now, ns, self.live);
            }
            Outcome::Failure(kind) => {
                bucket().fetch_add(1, Relaxed);
                add_saturating(&self.failure_nanos, ns);
                self.failures.fetch_add(1, Relaxed);
                self.by_kind[kind.index()].fetch_add(1, Relaxed);
                self.live.failure(now);
            }
            Outcome::Cancelled => {
                self.cancellations.fetch_add(1, Relaxed);
                self.cancelled_buckets[at()].fetch_add(1, Relaxed);
            }
        }
        // Last: the counters above need not wait for the EWMA's floating-point steps.
        self.live.record_ewma(now, ns);
    }

    /// Load observed statistics (for what-if tools and simulators; adds to what is there).
    pub fn seed(&self, seed: &StatsSeed, now: Timestamp) {
        self.live.add_in_flight(seed.in_flight);
        self.live.add_successes(seed.successes);
        self.failures.fetch_add(seed.failures, Relaxed);
        self.live
            .add_consecutive_failures(seed.consecutive_failures);
        if let Some(at) = seed
            .last_failure_at
            .or_else(|| (seed.consecutive_failures > 0 || seed.failures > 0).then_some(now))
        {
            self.live.mark_failure(at);
        }
        if let Some(avg) = seed.avg_response {
            // The mean of the seeded successes (at least one): one sample in the window, and
            // `successes × mean` in the cumulative sum.
            let ns = duration_nanos(avg);
            if seed.successes == 0 {
                self.live.add_successes(1);
            }
            self.live
                .add_success_nanos(ns.saturating_mul(seed.successes.max(1)));
            self.window
                .outside
                .fetch_add(seed.successes.saturating_sub(1), Relaxed);
            self.window.record(now, ns, self.live);
        } else {
            self.window.outside.fetch_add(seed.successes, Relaxed);
        }
        if let Some(ewma) = seed.ewma {
            self.live.set_ewma(now, duration_nanos(ewma) as f64);
        }
        if let Some((utilization, qps, eps, since)) = seed.load {
            self.report_load(since, utilization, qps, eps);
            self.report_load(now, utilization, qps, eps);
            self.load_since_ns.store(since.as_nanos().max(1), Relaxed);
        }
    }
}

/// Count and latency sum of the successes of the last few time slots.
///
/// Every success adds to one word, `acc`: 1 in its low [`COUNT_BITS`] and its latency in whole
/// microseconds (rounded up) above, wrapping: one `fetch_add`, so every value of the word is an
/// exact state — a count and the sum of exactly those samples — and a reader never sees a sum
/// lagging its count (a slow endpoint never reads as fast). The first success of each slot
/// notes where the slot starts: the word as its own `fetch_add` found it (a `Mark`). A window's
/// count and sum are the word now minus the mark of its oldest slot that has one. So a success
/// costs one `fetch_add` and one load (is the slot still the one marked?); the compare-and-swap
/// that opens a slot runs once per slot, not per call.
///
/// The word's count wraps after 2^24 samples (a window of 60 s at 280 000 calls a second): a
/// reader recovers the high bits from the live line's cumulative successes (exact but not read
/// together with the word: off by the few samples being recorded meanwhile, far below the
/// 2^23 the recovery tolerates). The sum wraps after 2^40 µs (12.7 days of latency within one
/// window). A sample counts in the slot in which it is recorded: one recorded late (its `now`
/// taken before the slot opened) counts in the open slot, and one racing the slot's first
/// success may count in the slot before. The `lbkit_loom` models in `tests/loom.rs` check the
/// reader against racing writers and a rollover.
#[derive(Debug, Default)]
#[repr(C)] // `acc` and `next_slot_ns` last, next to what follows in `EndpointStats`
struct WindowedMean {
    marks: [Mark; SLOTS],
    // Successes the live line counts that were not recorded here (a seed's beyond its one
    // sample), subtracted when recovering the count's high bits.
    outside: AtomicU64,
    acc: AtomicU64,
    // The end of the newest slot marked (ns); a success at or past it opens its own slot.
    next_slot_ns: AtomicU64,
}

/// Where one slot starts: `acc` and the live line's successes (less `outside`) at its first
/// success. Written once per slot by the writer that opened it, read like a seqlock: `epoch` is
/// 0 while the other two are written.
#[derive(Debug, Default)]
struct Mark {
    epoch: AtomicU64,
    acc: AtomicU64,
    successes: AtomicU64,
}

/// Bits of [`WindowedMean`]'s word that count samples; the sum in µs takes the other 40.
const COUNT_BITS: u32 = 24;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;

const SLOT_NS: u64 = SLOT.as_nanos() as u64;

// === impl Mark ===

impl Mark {
    fn write(&self, epoch: u64, acc: u64, successes: u64) {
        self.epoch.store(0, Relaxed);
        fence(Release);
        self.acc.store(acc, Relaxed);
        self.successes.store(successes, Relaxed);
        self.epoch.store(epoch, Release);
    }

    /// `(epoch, acc, successes)`, or `None` when unwritten or being rewritten.
    fn read(&self) -> Option<(u64, u64, u64)> {
        let epoch = self.epoch.load(Acquire);
        let (acc, successes) = (self.acc.load(Relaxed), self.successes.load(Relaxed));
        fence(Acquire);
        (epoch != 0 && self.epoch.load(Relaxed) == epoch).then_some((epoch, acc, successes))
    }
}

// === impl WindowedMean ===

impl WindowedMean {
    /// One success of `value_ns` at `now`; `live` has counted it already.
    #[inline]
    fn record(&self, now: Timestamp, value_ns: u64, live: &LiveStats) {
        self.add(now, value_ns.div_ceil(1_000), 1, live);
    }

    /// `count` samples summing to `sum_us` at `now` (wrapping into the word's fields).
    #[inline]
    fn add(&self, now: Timestamp, sum_us: u64, count: u64, live: &LiveStats) {
        let word = (sum_us << COUNT_BITS).wrapping_add(count);
        let now_ns = now.as_nanos();
        if now_ns < self.next_slot_ns.load(Relaxed) {
            self.acc.fetch_add(word, Relaxed);
        } else {
            self.open_slot(now_ns, word, live);
        }
    }

    /// The first success at or past the marked slot's end: open the slot of `now_ns` (unless a
    /// racing writer did) and mark where it starts.
    #[cold]
    fn open_slot(&self, now_ns: u64, word: u64, live: &LiveStats) {
        let epoch = now_ns / SLOT_NS + 1;
        let end = epoch.saturating_mul(SLOT_NS);
        let mut seen = self.next_slot_ns.load(Relaxed);
        while seen <= now_ns {
            match self
                .next_slot_ns
                .compare_exchange_weak(seen, end, Relaxed, Relaxed)
            {
                Ok(_) => {
                    let before = self.acc.fetch_add(word, Relaxed);
                    // The first slot starts from nothing: samples racing its opening count in
                    // it too (in a later slot they count in the slot before).
                    let (start, successes) = if seen == 0 {
                        (0, 0)
                    } else {
                        let live = live.successes().wrapping_sub(self.outside.load(Relaxed));
                        (before, live)
                    };
                    self.marks[(epoch % SLOTS as u64) as usize].write(epoch, start, successes);
                    return;
                }
                Err(now) => seen = now,
            }
        }
        // A racing writer opened this slot or a later one.
        self.acc.fetch_add(word, Relaxed);
    }

    /// `(sum_ns, count)` of the slots `window` reaches back from `now`.
    fn sum_at(&self, now: Timestamp, window: Duration, live: &LiveStats) -> (u64, u64) {
        let current = now.as_nanos() / SLOT_NS + 1;
        let span = duration_nanos(window)
            .div_ceil(SLOT_NS)
            .clamp(1, SLOTS as u64);
        let oldest = current.saturating_sub(span - 1).max(1);
        // The window starts at its oldest marked slot: a slot without a mark had no success.
        let Some((_, acc0, successes0)) = self
            .marks
            .iter()
            .filter_map(Mark::read)
            .filter(|&(epoch, ..)| epoch >= oldest)
            .min_by_key(|&(epoch, ..)| epoch)
        else {
            return (0, 0);
        };
        let delta = self.acc.load(Relaxed).wrapping_sub(acc0);
        let approx = live
            .successes()
            .wrapping_sub(self.outside.load(Relaxed))
            .wrapping_sub(successes0);
        let count = nearest_with_low_bits(approx, delta & COUNT_MASK);
        let sum_us = delta.wrapping_sub(count) >> COUNT_BITS;
        (sum_us.saturating_mul(1_000), count)
    }

    fn mean_at(&self, now: Timestamp, window: Duration, live: &LiveStats) -> Option<Duration> {
        match self.sum_at(now, window, live) {
            (_, 0) => None,
            (sum, n) => Some(Duration::from_nanos(sum / n)),
        }
    }
}

/// The count nearest `approx` whose low [`COUNT_BITS`] are `low` (never below zero).
fn nearest_with_low_bits(approx: u64, low: u64) -> u64 {
    let up = low.wrapping_sub(approx) & COUNT_MASK; // approx + up has the low bits
    let down = (1 << COUNT_BITS) - up; // and so does approx - down
    if up == 0 {
        approx
    } else if up <= down || approx < down {
        approx.wrapping_add(up)
    } else {
        approx - down
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    fn t(ms: u64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    #[test]
    fn outcomes_update_counters() {
        let s = EndpointStats::default();
        s.start();
        s.start();
        assert_eq!(s.in_flight(), 2);
        s.finish(t(0), t(10), Outcome::Failure(FailureKind::Connect));
        assert_eq!(
            (s.in_flight(), s.failures(), s.consecutive_failures()),
            (1, 1, 1)
        );
        assert_eq!(s.last_failure_at(), Some(t(10)));
        assert_eq!(s.failures_by_kind(), [1, 0, 0, 0]);
        s.finish(t(0), t(20), Outcome::Success);
        assert_eq!(
            (s.in_flight(), s.successes(), s.consecutive_failures()),
            (0, 1, 0)
        );
        s.finish(t(0), t(20), Outcome::Cancelled);
        assert_eq!((s.in_flight(), s.cancellations(), s.total()), (0, 1, 3));
    }

    #[test]
    fn windowed_mean_at_wall_clock_times() {
        // Epochs of today's wall clock are far above the 20-bit tags: they wrap, and still match.
        let s = EndpointStats::default();
        let now = Timestamp::from_millis(1_796_150_109_569);
        s.record(Duration::from_millis(400), now, Outcome::Success);
        let w = Duration::from_secs(30);
        assert_eq!(s.avg_response_at(now, w), Some(Duration::from_millis(400)));
        assert_eq!(s.window_sum_at(now, w), (1, 400_000_000));
    }

    #[test]
    fn windowed_mean_forgets_old_slots() {
        let s = EndpointStats::default();
        let w = Duration::from_secs(30);
        s.record(Duration::from_millis(10), t(1_000), Outcome::Success);
        s.record(Duration::from_millis(30), t(2_000), Outcome::Success);
        s.record(
            Duration::from_millis(999),
            t(2_000),
            Outcome::Failure(FailureKind::Server),
        );
        assert_eq!(
            s.avg_response_at(t(2_000), w),
            Some(Duration::from_millis(20))
        );
        // 29 s later the samples are still inside a 30 s window...
        assert_eq!(
            s.avg_response_at(t(29_000), w),
            Some(Duration::from_millis(20))
        );
        // ...and gone once the window has passed.
        assert_eq!(s.avg_response_at(t(40_000), w), None);
        // A slot reused a full turn later starts from zero.
        s.record(
            Duration::from_millis(50),
            t(1_000 + 60_000),
            Outcome::Success,
        );
        assert_eq!(
            s.avg_response_at(t(61_000), w),
            Some(Duration::from_millis(50))
        );
        assert_eq!(s.window_count_at(t(61_000), w), 1);
    }

    #[test]
    fn a_window_counts_beyond_the_words_count_bits() {
        // 2^24 + 3 successes in one slot: the word's count wraps, the live line's successes
        // recover it. Recorded through the window alone (the live line's count added in bulk),
        // as `record` would have done one by one.
        let s = EndpointStats::default();
        let n = (1u64 << COUNT_BITS) + 3;
        s.live.add_successes(1);
        s.window.record(t(1_000), 2_000, s.live);
        s.live.add_successes(n - 1);
        s.window.add(t(1_000), 2 * (n - 1), n - 1, s.live);
        let w = Duration::from_secs(10);
        assert_eq!(s.window_sum_at(t(1_000), w), (n, n * 2_000));
        assert_eq!(
            s.avg_response_at(t(1_000), w),
            Some(Duration::from_micros(2))
        );
    }

    #[test]
    fn window_latencies_are_whole_microseconds_rounded_up() {
        let s = EndpointStats::default();
        s.record(Duration::from_nanos(300), t(0), Outcome::Success);
        s.record(Duration::from_nanos(1_700), t(0), Outcome::Success);
        let w = Duration::from_secs(5);
        assert_eq!(s.window_sum_at(t(0), w), (2, 3_000));
        assert_eq!(
            s.avg_response_at(t(0), w),
            Some(Duration::from_nanos(1_500))
        );
    }

    #[test]
    fn seeded_successes_stay_out_of_the_window_but_for_their_mean() {
        // A seed of a million successes at 12 ms is one sample of 12 ms in the window; later
        // successes add to it, counted exactly though the live line holds a million more.
        let s = EndpointStats::default();
        s.seed(
            &StatsSeed {
                successes: 1_000_000,
                avg_response: Some(Duration::from_millis(12)),
                ..StatsSeed::default()
            },
            t(0),
        );
        s.record(Duration::from_millis(4), t(1), Outcome::Success);
        let w = Duration::from_secs(30);
        assert_eq!(s.window_sum_at(t(1), w), (2, 16_000_000));
        assert_eq!(s.successes(), 1_000_001);
        let seeded_without_mean = EndpointStats::default();
        seeded_without_mean.seed(
            &StatsSeed {
                successes: 1 << 30,
                ..StatsSeed::default()
            },
            t(0),
        );
        assert_eq!(seeded_without_mean.window_sum_at(t(0), w), (0, 0));
        seeded_without_mean.record(Duration::from_millis(4), t(0), Outcome::Success);
        assert_eq!(seeded_without_mean.window_sum_at(t(0), w), (1, 4_000_000));
    }

    #[test]
    fn a_late_sample_counts_in_the_open_slot() {
        let s = EndpointStats::default();
        s.record(Duration::from_millis(10), t(1_000), Outcome::Success);
        s.record(Duration::from_millis(30), t(7_000), Outcome::Success);
        // Recorded after the slot of 7 s opened, with a `now` from the slot before.
        s.record(Duration::from_millis(50), t(4_900), Outcome::Success);
        let slot = Duration::from_secs(5);
        assert_eq!(s.window_sum_at(t(7_000), slot), (2, 80_000_000));
        assert_eq!(
            s.window_sum_at(t(7_000), 2 * slot),
            (3, 90_000_000),
            "two slots hold all three"
        );
    }

    proptest::proptest! {
        #[test]
        fn the_count_is_recovered_from_an_approximation(
            count in 0u64..1 << 50,
            error in -(1i64 << 22)..1 << 22,
        ) {
            let approx = count.saturating_add_signed(error);
            proptest::prop_assert_eq!(nearest_with_low_bits(approx, count & COUNT_MASK), count);
        }
    }

    #[test]
    fn histogram_buckets_are_upper_bounds_and_skip_cancellations() {
        let s = EndpointStats::default();
        for (ms, outcome) in [
            (1, Outcome::Success), // exactly on a bound: that bucket
            (2, Outcome::Failure(FailureKind::Timeout)),
            (7, Outcome::Cancelled),
            (10_001, Outcome::Success),
        ] {
            s.record(Duration::from_millis(ms), t(0), outcome);
        }
        let h = s.latency_histogram();
        assert_eq!(h.counts[0], 1);
        assert_eq!(h.counts[1], 1);
        assert_eq!(h.counts[LATENCY_BUCKETS.len()], 1);
        assert_eq!((h.count(), h.sum), (3, Duration::from_millis(10_004)));
        assert_eq!(*h.cumulative().last().unwrap(), 3);
    }

    #[test]
    fn load_reports_and_their_runs() {
        let s = EndpointStats::default();
        assert_eq!(s.load_report(), None);
        s.report_load(t(1_000), 0.5, 100.0, f64::NAN);
        s.report_load(t(2_000), 0.6, 120.0, 2.0);
        let r = s.load_report().unwrap();
        assert_eq!(
            (r.utilization, r.qps, r.eps, r.at, r.since),
            (0.6, 120.0, 2.0, t(2_000), t(1_000))
        );
        s.report_load(t(2_000 + 181_000), 0.1, 10.0, 0.0);
        assert_eq!(
            s.load_report().unwrap().since,
            t(183_000),
            "a gap restarts the run"
        );
    }

    #[test]
    fn seed_loads_observations() {
        let s = EndpointStats::default();
        s.seed(
            &StatsSeed {
                in_flight: 4,
                avg_response: Some(Duration::from_millis(12)),
                ewma: Some(Duration::from_millis(30)),
                failures: 2,
                consecutive_failures: 2,
                ..StatsSeed::default()
            },
            t(5_000),
        );
        assert_eq!(s.in_flight(), 4);
        assert_eq!(
            s.avg_response_at(t(5_000), Duration::from_secs(30)),
            Some(Duration::from_millis(12))
        );
        assert_eq!(s.ewma_at(t(5_000)), Some(Duration::from_millis(30)));
        assert_eq!(s.last_failure_at(), Some(t(5_000)));
    }
}

#[cfg(all(test, not(lbkit_loom)))]
mod layout {
    use super::*;
    use std::mem::offset_of;

    // What a success writes or reads in `EndpointStats` sits together: the window's word and
    // slot end, the live line's address, the buckets (see the struct).
    #[test]
    fn a_success_touches_one_run_of_fields() {
        let acc = offset_of!(EndpointStats, window) + offset_of!(WindowedMean, acc);
        let next = offset_of!(EndpointStats, window) + offset_of!(WindowedMean, next_slot_ns);
        assert_eq!(next, acc + 8);
        assert_eq!(offset_of!(EndpointStats, live), next + 8);
        assert_eq!(offset_of!(EndpointStats, buckets), next + 16);
    }
}
