//! # lbkit
//!
//! Client-side load balancing for Rust services: the strategies of Dubbo, Ribbon, nginx and
//! Envoy over an immutable endpoint snapshot with lock-free live statistics.
//!
//! This facade re-exports the core model ([`Balancer`], [`Snapshot`], [`Strategy`], …), the
//! built-in strategies ([`strategy`]), endpoint sources ([`discovery`]) and the service
//! configuration ([`config`]). The `lbkit` binary (`lbkit pick`) is built on the same API.
//!
//! ```
//! use std::sync::Arc;
//! use lbkit::{Balancer, Clock, EndpointSpec, FastRng, Outcome, PickContext, Snapshot};
//! use lbkit::strategy::SmoothWeightedRoundRobin;
//!
//! let clock = Clock::System;
//! let snapshot = Arc::new(Snapshot::from_specs(
//!     vec![EndpointSpec::new("10.0.0.1:8080").with_weight(3), EndpointSpec::new("10.0.0.2:8080")],
//!     clock.now(),
//! ));
//! let balancer = Balancer::new(SmoothWeightedRoundRobin::new(), snapshot, clock.now());
//! let mut rng = FastRng::from_entropy();
//!
//! let guard = balancer.pick(&mut PickContext::new(clock.now(), &mut rng))?;
//! let address = guard.endpoint().address(); // call it ...
//! # let _ = address;
//! guard.finish(Outcome::Success);
//! # Ok::<(), lbkit::PickError>(())
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

pub mod config;

pub use lbkit_core::*;

/// The built-in strategies (re-export of `lbkit-strategy`).
pub mod strategy {
    pub use lbkit_strategy::*;
}

/// Passive outlier detection (re-export of `lbkit-health`).
pub mod health {
    pub use lbkit_health::*;
}

/// Endpoint sources (re-export of `lbkit-discovery`).
pub mod discovery {
    pub use lbkit_discovery::*;
}
