//! # lbkit-testkit
//!
//! Shared test helpers (a dev-dependency only): the [`conformance`] suite every strategy must
//! pass, built-in or user-defined; [`dist`] for chi-square distribution checks; [`alloc`], a
//! counting global allocator that proves picks do not allocate.
#![deny(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms)]

pub mod alloc;
pub mod conformance;
pub mod dist;

use std::sync::Arc;

use lbkit_core::{EndpointSpec, Snapshot, Timestamp};

/// A snapshot of `(address, weight)` pairs, all healthy, first seen at the epoch.
pub fn snapshot(endpoints: &[(&str, u32)]) -> Arc<Snapshot> {
    Arc::new(Snapshot::from_specs(
        endpoints
            .iter()
            .map(|&(a, w)| EndpointSpec::new(a).with_weight(w))
            .collect(),
        Timestamp::ZERO,
    ))
}
