//! Hedged requests ("The Tail at Scale", Dean and Barroso; gRPC's `hedgingPolicy`, Envoy's
//! `hedge_policy`, tower's `hedge`): when an idempotent call has no answer after a delay, a
//! second attempt goes to another endpoint; the first answer wins and the other attempt is
//! cancelled, which is not its endpoint's failure.
//!
//! The delay is fixed, or a quantile of the endpoint set's recent latencies
//! ([`HedgeDelay::Quantile`]: p95 hedges about one call in twenty). A [`HedgeTimer`] learns
//! the quantile from the endpoints' latency histograms: when its owner's control loop calls
//! [`HedgeTimer::refresh`], or, for drivers without one, at most every [`HEDGE_REFRESH`] by
//! the call of [`HedgeTimer::delay_at`] that finds it due (one compare-and-swap decides which;
//! every other call reads one atomic).
//!
//! A hedge is an attempt like a retry ([`Attempts::hedge`](crate::Attempts::hedge)): it goes
//! to an endpoint not tried yet, counts against the call's attempts, needs the request
//! idempotent and held for another send, time left before the deadline, and a withdrawal from
//! the retry budget — so hedging can never double the load: at most the budget's share of
//! calls is sent twice.

use std::time::Duration;

use crate::snapshot::Snapshot;
use crate::stats::LATENCY_BUCKETS;
use crate::sync::{AtomicU64, Ordering::Relaxed};
use crate::time::{duration_nanos, Timestamp};

/// Calls a quantile is learned from before it is used, and before it is learned again.
pub const HEDGE_MIN_SAMPLES: u64 = 200;

/// How often [`HedgeTimer::delay_at`] learns the quantile again.
pub const HEDGE_REFRESH: Duration = Duration::from_millis(100);

/// When a hedge is sent.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum HedgeDelay {
    /// After this long without an answer.
    Fixed(Duration),
    /// After the endpoint set's latency at this quantile (0.95: p95), learned from its recent
    /// calls, but never sooner than `min`. No hedge until enough calls were seen.
    Quantile {
        /// Within `0 < q < 1`.
        q: f64,
        /// The shortest delay.
        min: Duration,
    },
}

impl HedgeDelay {
    /// Parse `p95` (a quantile, in percent) or `20ms` / `1.5s` (a fixed delay).
    ///
    /// ```
    /// use std::time::Duration;
    /// use lbkit_core::HedgeDelay;
    /// assert_eq!(HedgeDelay::parse("20ms"), Some(HedgeDelay::Fixed(Duration::from_millis(20))));
    /// assert!(matches!(HedgeDelay::parse("p95"), Some(HedgeDelay::Quantile { .. })));
    /// assert_eq!(HedgeDelay::parse("p100"), None);
    /// ```
    pub fn parse(text: &str) -> Option<HedgeDelay> {
        let text = text.trim();
        if let Some(p) = text.strip_prefix('p') {
            let q = p.parse::<f64>().ok()? / 100.0;
            return (q > 0.0 && q < 1.0).then_some(HedgeDelay::Quantile {
                q,
                min: Duration::from_millis(1),
            });
        }
        let (n, scale) = if let Some(ms) = text.strip_suffix("ms") {
            (ms, 1e-3)
        } else {
            (text.strip_suffix('s')?, 1.0)
        };
        let secs = n.trim().parse::<f64>().ok()? * scale;
        // At least a millisecond: a zero delay would hedge every call at once.
        (secs.is_finite() && (1e-3..86_400.0).contains(&secs))
            .then(|| HedgeDelay::Fixed(Duration::from_secs_f64(secs)))
    }
}

/// [`HedgeDelay::parse`], with what it takes as the error: the one message every config
/// (the service config, `lbkit proxy`'s, a simulator scenario) gives.
///
/// ```
/// use lbkit_core::HedgeDelay;
/// assert!("p95".parse::<HedgeDelay>().is_ok());
/// assert_eq!(
///     "soon".parse::<HedgeDelay>().unwrap_err(),
///     "\"soon\": a quantile (p95) or a delay (20ms, 1.5s)"
/// );
/// ```
impl std::str::FromStr for HedgeDelay {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        HedgeDelay::parse(text)
            .ok_or_else(|| format!("{text:?}: a quantile (p95) or a delay (20ms, 1.5s)"))
    }
}

impl std::fmt::Display for HedgeDelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HedgeDelay::Fixed(d) => write!(f, "{}ms", d.as_secs_f64() * 1e3),
            HedgeDelay::Quantile { q, .. } => write!(f, "p{}", (q * 1e4).round() / 1e2),
        }
    }
}

/// The hedge delay of one endpoint set: fixed, or learned from its calls' latencies.
///
/// Hedged requests ("The Tail at Scale"; gRPC's `hedgingPolicy`, Envoy's `hedge_policy`): when
/// an idempotent call has no answer after this delay, a second attempt goes to another endpoint
/// ([`Attempts::hedge`](crate::Attempts::hedge)), the first answer wins and the other attempt is
/// cancelled — not its endpoint's failure. A hedge is an attempt of the call and a withdrawal
/// from the retry budget, so hedging never sends more than the budget's share twice. A quantile
/// is learned from the endpoints' latency histograms by [`refresh`](Self::refresh) (a control
/// loop's tick) or lazily by [`delay_at`](Self::delay_at); a call reads it with one atomic load.
#[derive(Debug)]
pub struct HedgeTimer {
    delay: HedgeDelay,
    /// The learned delay in ns; 0 = not learned yet.
    learned_ns: AtomicU64,
    /// The set's calls per latency bucket when the quantile was last learned.
    seen: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    /// When [`delay_at`](Self::delay_at) last refreshed, ns.
    refreshed_ns: AtomicU64,
}

impl HedgeTimer {
    /// A timer for `delay`.
    pub fn new(delay: HedgeDelay) -> Self {
        HedgeTimer {
            delay,
            learned_ns: AtomicU64::new(0),
            seen: std::array::from_fn(|_| AtomicU64::new(0)),
            refreshed_ns: AtomicU64::new(0),
        }
    }

    /// [`delay`](Self::delay) at `now`, learning the quantile again from `snapshot` first when
    /// the last refresh is [`HEDGE_REFRESH`] old (the one call that claims it pays for it).
    pub fn delay_at(
        &self,
        now: Timestamp,
        snapshot: impl FnOnce() -> std::sync::Arc<Snapshot>,
    ) -> Option<Duration> {
        if matches!(self.delay, HedgeDelay::Quantile { .. }) {
            let last = self.refreshed_ns.load(Relaxed);
            let due = now.as_nanos().saturating_sub(last) >= duration_nanos(HEDGE_REFRESH);
            if due
                && self
                    .refreshed_ns
                    .compare_exchange(last, now.as_nanos(), Relaxed, Relaxed)
                    .is_ok()
            {
                self.refresh(&snapshot());
            }
        }
        self.delay()
    }

    /// The policy.
    pub fn policy(&self) -> HedgeDelay {
        self.delay
    }

    /// How long a call waits for its answer before it is hedged; `None` while a quantile has
    /// not been learned yet.
    #[inline]
    pub fn delay(&self) -> Option<Duration> {
        match self.delay {
            HedgeDelay::Fixed(d) => Some(d),
            HedgeDelay::Quantile { .. } => match self.learned_ns.load(Relaxed) {
                0 => None,
                ns => Some(Duration::from_nanos(ns)),
            },
        }
    }

    /// Learn the quantile again from the calls `snapshot`'s endpoints finished since it was
    /// last learned, once there are [`HEDGE_MIN_SAMPLES`] of them (interpolated within the
    /// latency buckets). Off the request path: a control loop's tick.
    pub fn refresh(&self, snapshot: &Snapshot) {
        let HedgeDelay::Quantile { q, min } = self.delay else {
            return;
        };
        let mut now = [0u64; LATENCY_BUCKETS.len() + 1];
        for e in snapshot.endpoints() {
            // Cancelled attempts count at the time they had run (censored): a hedge's beaten
            // first attempt is a slow call, and leaving it out would pull the quantile down,
            // which hedges more calls, which leaves more out.
            let finished = e.stats().latency_histogram().counts;
            let cancelled = e.stats().cancelled_counts();
            for ((sum, f), c) in now.iter_mut().zip(finished).zip(cancelled) {
                *sum = sum.saturating_add(f).saturating_add(c);
            }
        }
        let seen: [u64; LATENCY_BUCKETS.len() + 1] =
            std::array::from_fn(|i| self.seen[i].load(Relaxed));
        if now.iter().zip(&seen).any(|(n, s)| n < s) {
            // Endpoints left with their counts: start over from here.
            self.remember(&now);
            return;
        }
        let fresh: [u64; LATENCY_BUCKETS.len() + 1] = std::array::from_fn(|i| now[i] - seen[i]);
        if fresh.iter().sum::<u64>() < HEDGE_MIN_SAMPLES {
            return;
        }
        let at = quantile(&fresh, q).max(min);
        self.learned_ns.store(
            u64::try_from(at.as_nanos()).unwrap_or(u64::MAX).max(1),
            Relaxed,
        );
        self.remember(&now);
    }

    fn remember(&self, counts: &[u64; LATENCY_BUCKETS.len() + 1]) {
        for (s, &c) in self.seen.iter().zip(counts) {
            s.store(c, Relaxed);
        }
    }
}

/// The `q` quantile of calls counted per bucket of [`LATENCY_BUCKETS`] (the last: above them),
/// interpolated linearly within its bucket.
fn quantile(counts: &[u64; LATENCY_BUCKETS.len() + 1], q: f64) -> Duration {
    let total: u64 = counts.iter().sum();
    let target = q * total as f64;
    let mut below = 0.0;
    for (i, &c) in counts.iter().enumerate() {
        let c = c as f64;
        if below + c >= target && c > 0.0 {
            let lo = if i == 0 {
                Duration::ZERO
            } else {
                LATENCY_BUCKETS[i - 1]
            };
            let Some(&hi) = LATENCY_BUCKETS.get(i) else {
                return lo;
            };
            let frac = ((target - below) / c).clamp(0.0, 1.0);
            return lo + (hi - lo).mul_f64(frac);
        }
        below += c;
    }
    LATENCY_BUCKETS[LATENCY_BUCKETS.len() - 1]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EndpointSpec, Outcome, Timestamp};

    #[test]
    fn the_quantile_is_learned_from_recent_calls_only() {
        let snap = Snapshot::from_specs(
            vec![EndpointSpec::new("a:1"), EndpointSpec::new("b:1")],
            Timestamp::ZERO,
        );
        let timer = HedgeTimer::new(HedgeDelay::Quantile {
            q: 0.9,
            min: Duration::from_millis(1),
        });
        let record = |ms: u64, n: usize| {
            for i in 0..n {
                let e = &snap.endpoints()[i % 2];
                e.stats()
                    .record(Duration::from_millis(ms), Timestamp::ZERO, Outcome::Success);
            }
        };
        record(7, 150);
        timer.refresh(&snap);
        assert_eq!(timer.delay(), None, "too few calls yet");
        record(7, 100); // 250 calls in (5, 10] ms: p90 at 9.5 ms
        timer.refresh(&snap);
        let d = timer.delay().unwrap();
        assert!((d.as_secs_f64() * 1e3 - 9.5).abs() < 0.01, "{d:?}");
        // The next window: slower calls in (25, 50] ms.
        record(40, 300);
        timer.refresh(&snap);
        let d = timer.delay().unwrap();
        assert!(
            d > Duration::from_millis(25) && d <= Duration::from_millis(50),
            "{d:?}"
        );
        assert_eq!(
            HedgeTimer::new(HedgeDelay::Fixed(Duration::from_millis(3))).delay(),
            Some(Duration::from_millis(3))
        );
    }

    // 900 calls answered in (2.5, 5] ms and 100 first attempts that hedges beat, cancelled
    // after 150 ms: the slow ones stay in the tail. Without them p95 would be under 5 ms,
    // hedging every call slower than that, whose cancellations would then be left out too.
    #[test]
    fn attempts_a_hedge_beat_count_at_the_time_they_had_run() {
        let snap = Snapshot::from_specs(vec![EndpointSpec::new("a:1")], Timestamp::ZERO);
        let timer = HedgeTimer::new(HedgeDelay::parse("p95").unwrap());
        let stats = snap.endpoints()[0].stats();
        for (ms, outcome, n) in [(4, Outcome::Success, 900), (150, Outcome::Cancelled, 100)] {
            for _ in 0..n {
                stats.record(Duration::from_millis(ms), Timestamp::ZERO, outcome);
            }
        }
        timer.refresh(&snap);
        let d = timer.delay().unwrap();
        // p95: half-way through the (100, 250] ms bucket's 100 calls.
        assert!((d.as_secs_f64() * 1e3 - 175.0).abs() < 0.01, "{d:?}");
        assert_eq!(
            stats.latency_histogram().count(),
            900,
            "not a finished call"
        );
    }

    #[test]
    fn delays_parse_and_print() {
        for text in ["p95", "20ms", "1.5s"] {
            let d = HedgeDelay::parse(text).unwrap();
            assert_eq!(HedgeDelay::parse(&d.to_string()), Some(d), "{text}");
        }
        for bad in [
            "", "p0", "p100", "-3ms", "ms", "fast", "1e9s", "1e-300s", "0.5ms",
        ] {
            assert_eq!(HedgeDelay::parse(bad), None, "{bad}");
        }
    }
}
