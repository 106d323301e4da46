//! Snapshot-wide policies: Envoy's panic threshold and slow start, and the health overlay
//! (outlier ejections, readmissions) a detector lays over a snapshot.

use std::collections::HashMap;
use std::time::Duration;

use crate::endpoint::EndpointKey;
use crate::time::Timestamp;

/// Envoy's default panic threshold: 50 %.
pub const DEFAULT_PANIC_THRESHOLD: f64 = 0.5;

/// How a snapshot turns endpoints into eligible endpoints and weights.
///
/// The default applies neither policy (Dubbo and Ribbon have neither); [`SnapshotPolicy::envoy`]
/// turns on Envoy's 50 % panic threshold.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SnapshotPolicy {
    /// **Panic threshold** (Envoy), a fraction in `[0, 1]`: when fewer than this share of the
    /// endpoints that carry weight are healthy and not ejected, the snapshot balances across all
    /// of them, down or ejected included, rather than overload the few that remain. `0` = off.
    /// Drained endpoints (weight 0) never count and are never picked.
    pub panic_threshold: f64,
    /// **Slow start** (Envoy) for newly added and readmitted endpoints.
    pub slow_start: Option<SlowStart>,
}

impl SnapshotPolicy {
    /// Envoy's defaults: panic below 50 % healthy, no slow start.
    pub fn envoy() -> Self {
        SnapshotPolicy {
            panic_threshold: DEFAULT_PANIC_THRESHOLD,
            slow_start: None,
        }
    }
}

/// Envoy's slow start: over `window` after an endpoint is added (or readmitted after an
/// ejection), its weight is `weight × max(min_weight_percent / 100, time_factor^(1/aggression))`
/// with `time_factor = max(elapsed, 1 ms) / window`.
///
/// It composes with Dubbo's warm-up by multiplication: warm-up follows the provider's own
/// registration time (its JVM warming up), slow start the time *this client* started sending to
/// it (its caches and connections warming up); a provider that is both new and freshly
/// readmitted gets the product of the two ramps, and each ramp ends at full weight.
///
/// ```
/// use lbkit_core::SlowStart;
/// use std::time::Duration;
/// let s = SlowStart::new(Duration::from_secs(60));
/// assert_eq!(s.factor(Duration::from_secs(30)), 0.5);
/// assert_eq!(s.factor(Duration::ZERO), 0.1, "never below min_weight_percent");
/// assert_eq!(s.factor(Duration::from_secs(90)), 1.0);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlowStart {
    /// Length of the ramp.
    pub window: Duration,
    /// Curve shape: 1.0 linear (Envoy's default), larger ramps faster early.
    pub aggression: f64,
    /// Floor of the factor, percent (Envoy's default 10).
    pub min_weight_percent: f64,
}

// === impl SlowStart ===

impl SlowStart {
    /// A linear ramp over `window` with Envoy's defaults (aggression 1.0, floor 10 %).
    pub fn new(window: Duration) -> Self {
        SlowStart {
            window,
            aggression: 1.0,
            min_weight_percent: 10.0,
        }
    }

    /// The weight factor after `elapsed` in the window, in `[min_weight_percent/100, 1]`.
    pub fn factor(&self, elapsed: Duration) -> f64 {
        if elapsed >= self.window || self.window.is_zero() {
            return 1.0;
        }
        let elapsed = elapsed.max(Duration::from_millis(1)).as_secs_f64();
        let time_factor = (elapsed / self.window.as_secs_f64()).min(1.0);
        let aggression = if self.aggression > 0.0 {
            self.aggression
        } else {
            1.0
        };
        let floor = (self.min_weight_percent / 100.0).clamp(0.0, 1.0);
        time_factor.powf(1.0 / aggression).max(floor).min(1.0)
    }

    /// `weight` scaled by the factor, at least 1 when `weight > 0`.
    pub fn apply(&self, weight: u32, elapsed: Duration) -> u32 {
        if weight == 0 {
            return 0;
        }
        let scaled = (f64::from(weight) * self.factor(elapsed)).ceil();
        (scaled as u32).clamp(1, weight)
    }
}

/// Health state laid over a snapshot by an outlier detector (or anything else that ejects).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HealthOverlay {
    /// Ejected endpoints and when their ejection ends.
    pub ejected: HashMap<EndpointKey, Timestamp>,
    /// Endpoints readmitted after an ejection, and when: slow start restarts there.
    pub readmitted: HashMap<EndpointKey, Timestamp>,
}
