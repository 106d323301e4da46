//! # lbkit-core
//!
//! The small, slow-changing heart of lbkit: the endpoint model, immutable snapshots, lock-free
//! live statistics, the [`Strategy`]/[`Picker`] traits and the [`Balancer`] that publishes a
//! snapshot and its prepared picker in one atomic swap. No I/O, no async runtime.
//!
//! A user-defined strategy needs only this crate.
//!
//! ```
//! use std::sync::Arc;
//! use lbkit_core::*;
//!
//! /// Always the first eligible endpoint.
//! struct First;
//! struct FirstPicker(EndpointIdx);
//! impl Picker for FirstPicker {
//!     fn pick(&self, _: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> { Ok(self.0) }
//! }
//! impl Strategy for First {
//!     type Picker = FirstPicker;
//!     fn name(&self) -> &str { "first" }
//!     fn prepare(&self, snap: &Arc<Snapshot>, _now: Timestamp) -> FirstPicker {
//!         FirstPicker(snap.eligible().first().copied().unwrap_or(EndpointIdx::new(0)))
//!     }
//! }
//!
//! let clock = Clock::System;
//! let snap = Arc::new(Snapshot::from_specs(
//!     vec![EndpointSpec::new("10.0.0.1:80"), EndpointSpec::new("10.0.0.2:80")],
//!     clock.now(),
//! ));
//! let balancer = Balancer::new(First, snap, clock.now());
//! let mut rng = FastRng::seed_from_u64(42);
//! let now = clock.now(); // the one clock read of this call
//! let guard = balancer.pick(&mut PickContext::new(now, &mut rng)).unwrap();
//! // ... call guard.endpoint().address() ...
//! guard.finish(Outcome::Success);
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

mod attempt;
mod availability;
mod balancer;
mod budget;
pub mod diff;
mod endpoint;
mod error;
mod hash;
mod hedge;
pub mod http;
mod live;
mod policy;
mod rng;
pub mod route;
pub mod shadow;
pub mod signal;
mod snapshot;
pub mod stage;
mod stats;
mod strategy;
#[doc(hidden)]
pub mod sync;
mod tagged;
mod time;
pub mod trace;
mod trace_id;

pub use attempt::{
    classify_answer, status_failure, AttemptPolicy, Attempts, Budget, CallPolicy, Classified, Next,
    Observed, RetryWhen, Stop, MAX_RETRIES,
};
pub use availability::{Availability, CircuitBreaker, Unavailable};
pub use balancer::{Balancer, CallGuard, Prepared, MAX_PROBES, WARMUP_REFRESH};
pub use budget::RetryBudget;
pub use endpoint::{
    warmup_weight, weight_gcd, Endpoint, EndpointKey, EndpointSpec, Metadata, DEFAULT_WARMUP,
    DEFAULT_WEIGHT,
};
pub use error::PickError;
pub use hash::key_hash;
pub use hedge::{HedgeDelay, HedgeTimer, HEDGE_MIN_SAMPLES, HEDGE_REFRESH};
pub use live::{exp_small, LiveStats};
pub use policy::{HealthOverlay, SlowStart, SnapshotPolicy, DEFAULT_PANIC_THRESHOLD};
pub use rng::FastRng;
pub use route::{RequestTag, RequestTagBuf, Route, Routed, RoutedSet};
pub use snapshot::{EndpointIdx, Endpoints, EndpointsIter, Snapshot, SnapshotBuilder, Update};
pub use stats::{
    EndpointStats, FailureKind, LatencyHistogram, LoadReport, Outcome, StatsSeed,
    DEFAULT_EWMA_DECAY, LATENCY_BUCKETS, LOAD_REPORT_GAP, SLOT, SLOTS,
};
pub use strategy::{BoxStrategy, PickContext, Picker, Strategy, TriedSet};
pub use time::{Clock, ManualClock, Timestamp};
