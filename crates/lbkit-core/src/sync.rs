//! The atomics of the state the loom models check (`tests/loom.rs`): loom's under
//! `RUSTFLAGS="--cfg lbkit_loom"`, std's otherwise. Not an API.

#[cfg(lbkit_loom)]
pub use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(lbkit_loom))]
pub use std::sync::atomic::{AtomicU64, Ordering};
