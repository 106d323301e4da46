//! Availability filtering usable with every strategy (Ribbon's `AvailabilityFilteringRule`).
//!
//! Endpoints marked down never reach a picker (they are not [eligible](crate::Snapshot::eligible)).
//! On top of that, the [`Balancer`](crate::Balancer) asks an [`Availability`] filter about each
//! candidate at pick time and passes over one that is
//! * behind a tripped **circuit breaker**: after `threshold` (3) consecutive failures, Ribbon
//!   trips the breaker for `min(2^(failures − threshold) × base, max)` = 10 s, 20 s, then 30 s
//!   from the last failure (`ServerStats.getCircuitBreakerBlackoutPeriod`); or
//! * at or above **`max_in_flight`** concurrent calls (Ribbon's `activeConnectionsLimit`,
//!   unlimited by default); or
//! * **pushed back**: it answered `429`, `503` with `Retry-After`, or `grpc-retry-pushback-ms`
//!   and the time it asked for has not passed ([`crate::signal`]; on by default).
//!
//! As in Ribbon, when every endpoint is filtered out the filter is ignored rather than failing
//! the call, and the re-pick loop is bounded (Ribbon tries 10 times, then falls back).

use std::time::Duration;

use crate::endpoint::Endpoint;
use crate::live::LiveStats;
use crate::time::Timestamp;

/// Ribbon's circuit breaker over consecutive failures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CircuitBreaker {
    /// Consecutive failures that trip it (Ribbon `connectionFailureCountThreshold`, default 3).
    pub threshold: u32,
    /// Blackout after exactly `threshold` failures, doubling per further failure
    /// (Ribbon `circuitTripTimeoutFactorSeconds`, default 10 s).
    pub base: Duration,
    /// Longest blackout (Ribbon `circuitTripMaxTimeoutSeconds`, default 30 s).
    pub max: Duration,
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        CircuitBreaker {
            threshold: 3,
            base: Duration::from_secs(10),
            max: Duration::from_secs(30),
        }
    }
}

// === impl CircuitBreaker ===

impl CircuitBreaker {
    /// Blackout period after `consecutive` failures (zero below the threshold).
    ///
    /// ```
    /// use lbkit_core::CircuitBreaker;
    /// use std::time::Duration;
    /// let b = CircuitBreaker::default();
    /// let secs: Vec<u64> = (2..=6).map(|n| b.blackout(n).as_secs()).collect();
    /// assert_eq!(secs, [0, 10, 20, 30, 30]);
    /// ```
    pub fn blackout(&self, consecutive: u32) -> Duration {
        if consecutive < self.threshold || self.threshold == 0 {
            return Duration::ZERO;
        }
        let doublings = (consecutive - self.threshold).min(16); // Ribbon caps the exponent at 16
        self.base.saturating_mul(1 << doublings).min(self.max)
    }

    /// Until when the breaker of `endpoint` is tripped, if it is at `now`.
    pub fn tripped_until(&self, endpoint: &Endpoint, now: Timestamp) -> Option<Timestamp> {
        self.tripped_until_live(endpoint.stats().live(), now)
    }

    /// [`tripped_until`](Self::tripped_until) from the endpoint's hot statistics line.
    #[inline]
    pub fn tripped_until_live(&self, stats: &LiveStats, now: Timestamp) -> Option<Timestamp> {
        let blackout = self.blackout(stats.consecutive_failures());
        if blackout.is_zero() {
            return None;
        }
        let until = stats.last_failure_at()?.saturating_add(blackout);
        (until > now).then_some(until)
    }
}

/// The pick-time filter. The default trips Ribbon's breaker and has no in-flight limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Availability {
    /// Pass over endpoints whose breaker is tripped (`None`: never).
    pub circuit_breaker: Option<CircuitBreaker>,
    /// Pass over endpoints with at least this many calls in flight (`None`: no limit).
    pub max_in_flight: Option<u32>,
    /// Pass over endpoints that pushed back until the time they asked for
    /// ([`EndpointStats::push_back`](crate::EndpointStats::push_back)).
    pub pushback: bool,
}

impl Default for Availability {
    fn default() -> Self {
        Availability {
            circuit_breaker: Some(CircuitBreaker::default()),
            max_in_flight: None,
            pushback: true,
        }
    }
}

/// Why an eligible endpoint is unavailable right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unavailable {
    /// The circuit breaker is tripped until this time.
    Tripped {
        /// When the blackout ends.
        until: Timestamp,
    },
    /// Too many calls in flight.
    Busy {
        /// Calls in flight.
        in_flight: u32,
        /// The limit.
        limit: u32,
    },
    /// The endpoint pushed back until this time.
    PushedBack {
        /// When the pushback ends.
        until: Timestamp,
    },
}

// === impl Availability ===

impl Availability {
    /// No filtering at all.
    pub const OFF: Availability = Availability {
        circuit_breaker: None,
        max_in_flight: None,
        pushback: false,
    };

    /// Whether `endpoint` may be picked at `now`.
    #[inline]
    pub fn admits(&self, endpoint: &Endpoint, now: Timestamp) -> bool {
        self.check(endpoint, now).is_none()
    }

    /// Why `endpoint` is filtered out at `now`, or `None` when it is available.
    pub fn check(&self, endpoint: &Endpoint, now: Timestamp) -> Option<Unavailable> {
        self.check_live(endpoint.stats().live(), now)
    }

    /// [`check`](Self::check) from the endpoint's hot statistics line
    /// ([`Snapshot::live`](crate::Snapshot::live)): what a pick uses, reading one cache line.
    #[inline]
    pub fn check_live(&self, stats: &LiveStats, now: Timestamp) -> Option<Unavailable> {
        if let Some(limit) = self.max_in_flight {
            let in_flight = stats.in_flight();
            if in_flight >= limit {
                return Some(Unavailable::Busy { in_flight, limit });
            }
        }
        if self.pushback {
            if let Some(until) = stats.pushed_back_until(now) {
                return Some(Unavailable::PushedBack { until });
            }
        }
        let breaker = self.circuit_breaker.as_ref()?;
        breaker
            .tripped_until_live(stats, now)
            .map(|until| Unavailable::Tripped { until })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EndpointSpec, EndpointStats, FailureKind, Outcome};

    #[test]
    fn a_pushback_passes_the_endpoint_over_until_it_ends() {
        let e = Endpoint::new(
            EndpointSpec::new("a:1"),
            Arc::new(EndpointStats::default()),
            Timestamp::ZERO,
        );
        e.stats()
            .push_back(Timestamp::from_millis(1_000), Duration::from_secs(2));
        let until = Timestamp::from_millis(3_000);
        let f = Availability::default();
        assert_eq!(
            f.check(&e, Timestamp::from_millis(2_999)),
            Some(Unavailable::PushedBack { until })
        );
        assert!(f.admits(&e, until));
        assert!(Availability::OFF.admits(&e, Timestamp::from_millis(2_000)));
    }
    use std::sync::Arc;

    #[test]
    fn breaker_trips_backs_off_and_resets() {
        let e = Endpoint::new(
            EndpointSpec::new("a:1"),
            Arc::new(EndpointStats::default()),
            Timestamp::ZERO,
        );
        let f = Availability::default();
        let fail = |ms| {
            e.stats().record(
                Duration::ZERO,
                Timestamp::from_millis(ms),
                Outcome::Failure(FailureKind::Connect),
            )
        };
        fail(1_000);
        fail(1_000);
        assert!(
            f.admits(&e, Timestamp::from_millis(1_000)),
            "2 failures: still closed"
        );
        fail(1_000);
        assert_eq!(
            f.check(&e, Timestamp::from_millis(1_000)),
            Some(Unavailable::Tripped {
                until: Timestamp::from_millis(11_000)
            })
        );
        assert!(
            f.admits(&e, Timestamp::from_millis(11_000)),
            "blackout served"
        );
        fail(11_000); // 4th: 20 s
        assert!(!f.admits(&e, Timestamp::from_millis(30_999)));
        assert!(f.admits(&e, Timestamp::from_millis(31_000)));
        e.stats().record(
            Duration::ZERO,
            Timestamp::from_millis(31_000),
            Outcome::Success,
        );
        fail(31_000);
        assert!(
            f.admits(&e, Timestamp::from_millis(31_000)),
            "a success resets the count"
        );
    }

    #[test]
    fn in_flight_limit() {
        let e = Endpoint::new(
            EndpointSpec::new("a:1"),
            Arc::new(EndpointStats::default()),
            Timestamp::ZERO,
        );
        let f = Availability {
            circuit_breaker: None,
            max_in_flight: Some(2),
            pushback: false,
        };
        e.stats().start();
        assert!(f.admits(&e, Timestamp::ZERO));
        e.stats().start();
        assert_eq!(
            f.check(&e, Timestamp::ZERO),
            Some(Unavailable::Busy {
                in_flight: 2,
                limit: 2
            })
        );
    }
}
