//! Time as an input: [`Timestamp`] and the injectable [`Clock`].
//!
//! lbkit never reads the clock inside a strategy. The caller reads it once per call
//! ([`Clock::now`]) and passes the [`Timestamp`] down, which makes tests, the simulator and
//! `lbkit pick --now-ms` deterministic.
//!
//! A `Timestamp` counts nanoseconds on a *monotonic* timeline anchored to the Unix epoch once per
//! process: [`Clock::System`] reads the wall clock a single time, then advances with the OS
//! monotonic clock. Registration times stored by registries (Dubbo's `timestamp`, epoch
//! milliseconds) therefore compare directly with `now`, and a wall-clock step (NTP) never makes
//! time run backwards for the statistics.

use std::fmt;
use std::ops::{Add, Sub};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Nanoseconds since the Unix epoch on a monotonic timeline (virtual in the simulator).
///
/// ```
/// use lbkit_core::Timestamp;
/// use std::time::Duration;
/// let t = Timestamp::from_millis(1_500);
/// assert_eq!((t + Duration::from_millis(500)).as_millis(), 2_000);
/// assert_eq!(t.saturating_duration_since(Timestamp::from_millis(2_000)), Duration::ZERO);
/// ```
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(u64);

// === impl Timestamp ===

impl Timestamp {
    /// The epoch itself; also "never" for optional timestamps stored in atomics.
    pub const ZERO: Timestamp = Timestamp(0);

    /// A timestamp `nanos` nanoseconds after the epoch.
    pub const fn from_nanos(nanos: u64) -> Self {
        Timestamp(nanos)
    }

    /// A timestamp `millis` milliseconds after the epoch (saturating at the far future).
    pub const fn from_millis(millis: u64) -> Self {
        Timestamp(millis.saturating_mul(1_000_000))
    }

    /// Nanoseconds since the epoch.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Whole milliseconds since the epoch (rounded down), the unit registries use.
    pub const fn as_millis(self) -> u64 {
        self.0 / 1_000_000
    }

    /// Time elapsed from `earlier` to `self`, or zero when `earlier` is later.
    pub const fn saturating_duration_since(self, earlier: Timestamp) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    /// `self + d`, saturating at the far future.
    pub fn saturating_add(self, d: Duration) -> Self {
        Timestamp(self.0.saturating_add(duration_nanos(d)))
    }

    /// `self - d`, saturating at the epoch.
    pub fn saturating_sub(self, d: Duration) -> Self {
        Timestamp(self.0.saturating_sub(duration_nanos(d)))
    }
}

/// A duration in nanoseconds, saturating at `u64::MAX` (584 years).
pub(crate) fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Add<Duration> for Timestamp {
    type Output = Timestamp;
    fn add(self, d: Duration) -> Timestamp {
        self.saturating_add(d)
    }
}

impl Sub<Duration> for Timestamp {
    type Output = Timestamp;
    fn sub(self, d: Duration) -> Timestamp {
        self.saturating_sub(d)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{:09}s",
            self.0 / 1_000_000_000,
            self.0 % 1_000_000_000
        )
    }
}

/// Where time comes from. Cheap to clone.
///
/// * [`Clock::System`] reads the OS monotonic clock, anchored to the wall clock once per process.
/// * [`Clock::Manual`] is driven by tests and the simulator.
///
/// ```
/// use lbkit_core::{Clock, Timestamp};
/// use std::time::Duration;
/// let (clock, handle) = Clock::manual(Timestamp::from_millis(10));
/// handle.advance(Duration::from_millis(5));
/// assert_eq!(clock.now(), Timestamp::from_millis(15));
/// ```
#[derive(Clone, Debug, Default)]
pub enum Clock {
    /// The process's monotonic clock, anchored to the Unix epoch at first use.
    #[default]
    System,
    /// A clock that only moves when told to.
    Manual(Arc<ManualClock>),
}

// === impl Clock ===

impl Clock {
    /// A manual clock starting at `start`, and the handle that moves it.
    pub fn manual(start: Timestamp) -> (Clock, Arc<ManualClock>) {
        let handle = Arc::new(ManualClock::new(start));
        (Clock::Manual(handle.clone()), handle)
    }

    /// The current time. For [`Clock::System`] this is one read of the OS monotonic clock.
    #[inline]
    pub fn now(&self) -> Timestamp {
        match self {
            Clock::System => system_now(),
            Clock::Manual(m) => m.now(),
        }
    }
}

#[allow(clippy::disallowed_methods)] // the one place lbkit reads the OS clocks
fn system_now() -> Timestamp {
    static ANCHOR: OnceLock<(Instant, u64)> = OnceLock::new();
    let (base, base_unix_ns) = ANCHOR.get_or_init(|| {
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(duration_nanos)
            .unwrap_or(0);
        (Instant::now(), unix)
    });
    Timestamp(base_unix_ns.saturating_add(duration_nanos(base.elapsed())))
}

/// The moving part of [`Clock::Manual`]. Atomics, `Relaxed`: time is a plain value here.
#[derive(Debug, Default)]
pub struct ManualClock {
    nanos: AtomicU64,
}

// === impl ManualClock ===

impl ManualClock {
    /// A clock reading `start`.
    pub fn new(start: Timestamp) -> Self {
        ManualClock {
            nanos: AtomicU64::new(start.0),
        }
    }

    /// The time it reads.
    pub fn now(&self) -> Timestamp {
        Timestamp(self.nanos.load(Ordering::Relaxed))
    }

    /// Set the time (it may move backwards; statistics saturate).
    pub fn set(&self, t: Timestamp) {
        self.nanos.store(t.0, Ordering::Relaxed);
    }

    /// Move the time forward by `d`.
    pub fn advance(&self, d: Duration) {
        self.nanos.fetch_add(duration_nanos(d), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_is_monotonic_and_near_the_wall_clock() {
        let a = Clock::System.now();
        let b = Clock::System.now();
        assert!(b >= a);
        // 2020-01-01 in ms: the anchor reads the real wall clock.
        assert!(a.as_millis() > 1_577_836_800_000);
    }

    #[test]
    fn arithmetic_saturates() {
        let t = Timestamp::from_nanos(5);
        assert_eq!(t - Duration::from_secs(1), Timestamp::ZERO);
        assert_eq!(
            Timestamp::from_nanos(u64::MAX) + Duration::from_secs(1),
            Timestamp::from_nanos(u64::MAX)
        );
        assert_eq!(Timestamp::from_millis(u64::MAX).as_nanos(), u64::MAX);
    }
}
