//! # lbkit-health
//!
//! Health for lbkit's control loop: passive outlier detection (always) and active health
//! checks (feature `runtime`: [`active`], TCP connect or HTTP GET probes with rise/fall
//! thresholds, as HAProxy and pingora do them), whose results feed lbkit-discovery's
//! `Controller` in the tower `Pool` and in `lbkit proxy` alike.
//!
//! Passive outlier detection, kept apart from picking (Envoy's `DetectorHostMonitor`, gRPC's
//! `outlier_detection` balancer). [`OutlierDetector::tick`] is a pure function of the snapshot's
//! statistics and the time passed in: it ejects and readmits endpoints and returns the
//! [`HealthOverlay`](lbkit_core::HealthOverlay) from which the owner of the balancer builds the
//! next snapshot ([`Snapshot::derive`](lbkit_core::Snapshot::derive)).
//!
//! ```
//! use std::time::Duration;
//! use lbkit_core::*;
//! use lbkit_health::{OutlierConfig, OutlierDetector};
//!
//! let now = Timestamp::from_millis(1_000_000);
//! let snap = Snapshot::from_specs((0..10).map(|i| EndpointSpec::new(format!("10.0.0.{i}:80"))).collect(), now);
//! for _ in 0..5 {
//!     snap.endpoints()[3].stats().record(Duration::ZERO, now, Outcome::Failure(FailureKind::Server));
//! }
//! let mut detector = OutlierDetector::new(OutlierConfig::default());
//! assert!(detector.tick(&snap, now));
//! let next = snap.derive(snap.version() + 1, &SnapshotPolicy::envoy(), detector.overlay());
//! assert_eq!(next.eligible().len(), 9);
//! ```
#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms
)]
#![deny(clippy::disallowed_methods, clippy::disallowed_types)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

#[cfg(feature = "runtime")]
pub mod active;
mod outlier;

pub use outlier::{
    Ejection, EjectionRule, FailurePercentage, OutlierConfig, OutlierDetector, SuccessRate,
};
