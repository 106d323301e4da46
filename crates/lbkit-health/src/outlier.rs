//! The outlier detector: consecutive failures, success-rate deviation and failure percentage,
//! with Envoy's ejection timing and cap.
//!
//! * **Origin**: Envoy outlier detection (`source/common/upstream/outlier_detection_impl.cc`,
//!   docs "Outlier detection"), gRPC A50 `outlier_detection`.
//! * **Rules**, evaluated every `interval` (default 10 s) over the calls finished since the
//!   previous tick:
//!   - *consecutive failures*: `consecutive_failures` (default 5) failures in a row;
//!   - *success rate*: among endpoints with at least `request_volume` (100) calls in the
//!     interval, when at least `minimum_hosts` (5) qualify, eject those whose success rate is
//!     below `mean − stdev_factor × stdev` (factor 1.9);
//!   - *failure percentage*: among endpoints with at least `request_volume` (50) calls, when at
//!     least `minimum_hosts` (5) qualify, eject those failing at least `threshold` % (85).
//! * **Timing**: an ejection lasts `base_ejection_time × times ejected` (30 s, 60 s, …), capped
//!   at `max_ejection_time` (300 s); every interval an endpoint spends serving lowers its count
//!   by one, as in Envoy. Readmission happens at the first tick after the time is served; the
//!   endpoint's run of consecutive failures is cleared and its slow start (if configured)
//!   restarts.
//! * **Cap**: at most `max_ejection_percent` (10 %) of the endpoints are ejected at once, but at
//!   least one.
//! * **Complexity**: O(n) per tick: one pass over the endpoints with one lookup each (a fast,
//!   randomly seeded hash), one over the tracks to forget those of endpoints gone; nothing on
//!   the pick path.
//! * **Differences from Envoy**: consecutive failures are checked at ticks, not at the failing
//!   call (Ribbon's circuit breaker in the availability filter reacts at once); Envoy's
//!   failure-percentage rule is off by default (`enforcing_failure_percentage: 0`), here it is on.

use std::collections::HashMap;
use std::time::Duration;

use lbkit_core::{EndpointKey, HealthOverlay, Snapshot, Timestamp};

/// Success-rate deviation rule (Envoy's defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SuccessRate {
    /// Eject below `mean − stdev_factor × stdev` (Envoy `success_rate_stdev_factor` 1900 / 1000).
    pub stdev_factor: f64,
    /// Endpoints that must qualify for the rule to run.
    pub minimum_hosts: usize,
    /// Calls in the interval for an endpoint to qualify.
    pub request_volume: u64,
}

impl Default for SuccessRate {
    fn default() -> Self {
        SuccessRate {
            stdev_factor: 1.9,
            minimum_hosts: 5,
            request_volume: 100,
        }
    }
}

/// Failure-percentage rule (Envoy's defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FailurePercentage {
    /// Eject at or above this failure percentage.
    pub threshold: f64,
    /// Endpoints that must qualify for the rule to run.
    pub minimum_hosts: usize,
    /// Calls in the interval for an endpoint to qualify.
    pub request_volume: u64,
}

impl Default for FailurePercentage {
    fn default() -> Self {
        FailurePercentage {
            threshold: 85.0,
            minimum_hosts: 5,
            request_volume: 50,
        }
    }
}

/// Detector settings; every default is Envoy's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OutlierConfig {
    /// Time between ticks (the owner drives [`OutlierDetector::tick`] at this period).
    pub interval: Duration,
    /// First ejection time; multiplied by the times ejected.
    pub base_ejection_time: Duration,
    /// Longest ejection.
    pub max_ejection_time: Duration,
    /// Most endpoints ejected at once, percent (at least one endpoint may always be ejected).
    pub max_ejection_percent: u32,
    /// Consecutive failures that eject (`None`: rule off).
    pub consecutive_failures: Option<u32>,
    /// Success-rate rule (`None`: off).
    pub success_rate: Option<SuccessRate>,
    /// Failure-percentage rule (`None`: off).
    pub failure_percentage: Option<FailurePercentage>,
}

impl Default for OutlierConfig {
    fn default() -> Self {
        OutlierConfig {
            interval: Duration::from_secs(10),
            base_ejection_time: Duration::from_secs(30),
            max_ejection_time: Duration::from_secs(300),
            max_ejection_percent: 10,
            consecutive_failures: Some(5),
            success_rate: Some(SuccessRate::default()),
            failure_percentage: Some(FailurePercentage::default()),
        }
    }
}

/// Which rule ejected an endpoint.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum EjectionRule {
    /// This many failures in a row.
    ConsecutiveFailures(u32),
    /// Success rate (percent) below the threshold (percent).
    SuccessRate {
        /// The endpoint's success rate in the interval, percent.
        rate: f64,
        /// `mean − stdev_factor × stdev`, percent.
        threshold: f64,
    },
    /// Failure percentage at or above the threshold.
    FailurePercentage {
        /// The endpoint's failure percentage in the interval.
        percent: f64,
    },
}

/// An ejection in force.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ejection {
    /// When it ends.
    pub until: Timestamp,
    /// Why.
    pub rule: EjectionRule,
    /// Times this endpoint has been ejected (the multiplier of the ejection time).
    pub times: u32,
}

/// Readmit endpoint `e` when its time is served; lower its multiplier while it serves.
/// Whether it was readmitted.
fn readmit(
    track: &mut Track,
    overlay: &mut HealthOverlay,
    e: &lbkit_core::Endpoint,
    config: &OutlierConfig,
    now: Timestamp,
) -> bool {
    match track.ejection {
        Some(ej) if ej.until <= now => {
            track.ejection = None;
            overlay.ejected.remove(e.key());
            overlay.readmitted.insert(e.key().clone(), now);
            track.readmitted_at = Some(now);
            e.stats().clear_consecutive_failures();
            true
        }
        Some(_) => false,
        // Envoy: serving for a whole interval since the last readmission lowers the
        // multiplier by one.
        None => {
            let served = track
                .readmitted_at
                .is_none_or(|at| now.saturating_duration_since(at) >= config.interval);
            if served {
                track.times_ejected = track.times_ejected.saturating_sub(1);
            }
            false
        }
    }
}

/// A map with foldhash's fast hash (randomly seeded per map), as the snapshot's own maps.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

#[derive(Debug, Default, Clone, Copy)]
struct Track {
    /// The tick that last saw the endpoint in the snapshot (tracks not seen are forgotten).
    seen: u64,
    successes: u64,
    failures: u64,
    times_ejected: u32,
    ejection: Option<Ejection>,
    readmitted_at: Option<Timestamp>,
}

/// Ejects outliers by Envoy's rules. Owned by one task; `tick` it every `interval`.
#[derive(Debug)]
pub struct OutlierDetector {
    config: OutlierConfig,
    tracks: FastMap<EndpointKey, Track>,
    overlay: HealthOverlay,
    /// Ticks so far.
    ticks: u64,
}

// === impl OutlierDetector ===

impl OutlierDetector {
    /// A detector with `config`.
    pub fn new(config: OutlierConfig) -> Self {
        OutlierDetector {
            config,
            tracks: FastMap::default(),
            overlay: HealthOverlay::default(),
            ticks: 0,
        }
    }

    /// The settings.
    pub fn config(&self) -> &OutlierConfig {
        &self.config
    }

    /// The ejections and readmissions in force, for [`Snapshot::derive`].
    pub fn overlay(&self) -> &HealthOverlay {
        &self.overlay
    }

    /// The ejection of `key`, if it is ejected.
    pub fn ejection(&self, key: &EndpointKey) -> Option<&Ejection> {
        self.tracks.get(key)?.ejection.as_ref()
    }

    /// Evaluate the rules over the calls since the last tick. Returns whether any endpoint was
    /// ejected or readmitted (then build and publish a new snapshot).
    pub fn tick(&mut self, snapshot: &Snapshot, now: Timestamp) -> bool {
        self.ticks += 1;
        let mut changed = false;
        let mut volumes = Vec::with_capacity(snapshot.len());
        for e in snapshot.endpoints() {
            let track = self.tracks.entry(e.key().clone()).or_default();
            track.seen = self.ticks;
            changed |= readmit(track, &mut self.overlay, e, &self.config, now);
            let (s, f) = (e.stats().successes(), e.stats().failures());
            volumes.push((
                e.key().clone(),
                s.saturating_sub(track.successes),
                f.saturating_sub(track.failures),
            ));
            (track.successes, track.failures) = (s, f);
        }
        // Forget endpoints that left.
        let ticks = self.ticks;
        self.tracks.retain(|_, t| t.seen == ticks);
        let tracks = &self.tracks;
        self.overlay.ejected.retain(|k, _| tracks.contains_key(k));
        self.overlay
            .readmitted
            .retain(|k, _| tracks.contains_key(k));
        let candidates = self.candidates(snapshot, &volumes);
        let cap = (snapshot.len() * self.config.max_ejection_percent as usize / 100).max(1);
        for (key, rule) in candidates {
            if self.overlay.ejected.len() >= cap {
                break;
            }
            changed |= self.eject(key, rule, now);
        }
        changed
    }

    /// Endpoints that break a rule, worst first within each rule, not already ejected.
    fn candidates(
        &self,
        snapshot: &Snapshot,
        volumes: &[(EndpointKey, u64, u64)],
    ) -> Vec<(EndpointKey, EjectionRule)> {
        let ejected = |k: &EndpointKey| self.overlay.ejected.contains_key(k);
        let mut out: Vec<(EndpointKey, EjectionRule)> = Vec::new();
        if let Some(limit) = self.config.consecutive_failures {
            for e in snapshot.endpoints() {
                let n = e.stats().consecutive_failures();
                if n >= limit && !ejected(e.key()) {
                    out.push((e.key().clone(), EjectionRule::ConsecutiveFailures(n)));
                }
            }
        }
        if let Some(rule) = self.config.success_rate {
            out.extend(
                success_rate(&rule, volumes)
                    .into_iter()
                    .filter(|(k, _)| !ejected(k)),
            );
        }
        if let Some(rule) = self.config.failure_percentage {
            out.extend(
                failure_percentage(&rule, volumes)
                    .into_iter()
                    .filter(|(k, _)| !ejected(k)),
            );
        }
        let mut seen = std::collections::HashSet::new();
        out.retain(|(k, _)| seen.insert(k.clone()));
        out
    }

    fn eject(&mut self, key: EndpointKey, rule: EjectionRule, now: Timestamp) -> bool {
        let track = self.tracks.entry(key.clone()).or_default();
        track.times_ejected = track.times_ejected.saturating_add(1);
        let time = self
            .config
            .base_ejection_time
            .saturating_mul(track.times_ejected)
            .min(
                self.config
                    .max_ejection_time
                    .max(self.config.base_ejection_time),
            );
        let until = now.saturating_add(time);
        track.ejection = Some(Ejection {
            until,
            rule,
            times: track.times_ejected,
        });
        self.overlay.readmitted.remove(&key);
        self.overlay.ejected.insert(key, until);
        true
    }
}

fn success_rate(
    rule: &SuccessRate,
    volumes: &[(EndpointKey, u64, u64)],
) -> Vec<(EndpointKey, EjectionRule)> {
    let rates: Vec<(&EndpointKey, f64)> = volumes
        .iter()
        .filter(|(_, s, f)| s + f >= rule.request_volume.max(1))
        .map(|(k, s, f)| (k, *s as f64 * 100.0 / (s + f) as f64))
        .collect();
    if rates.len() < rule.minimum_hosts.max(1) {
        return Vec::new();
    }
    let mean = rates.iter().map(|(_, r)| r).sum::<f64>() / rates.len() as f64;
    let var = rates.iter().map(|(_, r)| (r - mean).powi(2)).sum::<f64>() / rates.len() as f64;
    let threshold = mean - rule.stdev_factor * var.sqrt();
    let mut out: Vec<_> = rates
        .into_iter()
        .filter(|&(_, r)| r < threshold)
        .map(|(k, rate)| (k.clone(), EjectionRule::SuccessRate { rate, threshold }))
        .collect();
    out.sort_by(|a, b| rate_of(&a.1).total_cmp(&rate_of(&b.1)));
    out
}

fn rate_of(rule: &EjectionRule) -> f64 {
    match rule {
        EjectionRule::SuccessRate { rate, .. } => *rate,
        EjectionRule::FailurePercentage { percent } => 100.0 - percent,
        EjectionRule::ConsecutiveFailures(_) => 0.0,
    }
}

fn failure_percentage(
    rule: &FailurePercentage,
    volumes: &[(EndpointKey, u64, u64)],
) -> Vec<(EndpointKey, EjectionRule)> {
    let qualified: Vec<(&EndpointKey, f64)> = volumes
        .iter()
        .filter(|(_, s, f)| s + f >= rule.request_volume.max(1))
        .map(|(k, s, f)| (k, *f as f64 * 100.0 / (s + f) as f64))
        .collect();
    if qualified.len() < rule.minimum_hosts.max(1) {
        return Vec::new();
    }
    let mut out: Vec<_> = qualified
        .into_iter()
        .filter(|&(_, p)| p >= rule.threshold)
        .map(|(k, percent)| (k.clone(), EjectionRule::FailurePercentage { percent }))
        .collect();
    out.sort_by(|a, b| rate_of(&a.1).total_cmp(&rate_of(&b.1)));
    out
}

#[cfg(test)]
mod tests;
