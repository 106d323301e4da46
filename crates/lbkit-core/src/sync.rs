//! The synchronisation of the state the loom models check (`tests/loom.rs`): loom's under
//! `RUSTFLAGS="--cfg lbkit_loom"`, std's (and arc-swap's) otherwise. `Arc` is the endpoint's
//! own (its last drop gives the statistics' slab line back, so loom must see its ordering).
//! Not an API.

#[cfg(lbkit_loom)]
pub use loom::sync::{
    atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering},
    Arc,
};
#[cfg(not(lbkit_loom))]
pub use std::sync::{
    atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering},
    Arc,
};

/// The balancer's published state: arc-swap's `ArcSwap`, a lock-free atomic `Arc`.
#[cfg(not(lbkit_loom))]
pub type ArcCell<T> = arc_swap::ArcSwap<T>;

/// Under loom, a stand-in with arc-swap's contract — `load`, `store` and `compare_and_swap`
/// are linearizable, a loaded value stays alive while it is held — built on loom's mutex
/// (arc-swap's own atomics are not loom-aware). The models check lbkit's use of that contract:
/// guards taken from a replaced state, a refresh racing a publish.
#[cfg(lbkit_loom)]
#[derive(Debug)]
pub struct ArcCell<T>(loom::sync::Mutex<std::sync::Arc<T>>);

#[cfg(lbkit_loom)]
impl<T> ArcCell<T> {
    /// A cell holding `value`.
    pub fn from_pointee(value: T) -> Self {
        ArcCell(loom::sync::Mutex::new(std::sync::Arc::new(value)))
    }

    fn lock(&self) -> loom::sync::MutexGuard<'_, std::sync::Arc<T>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The current value (arc-swap's `load`: a guard that derefs to the `Arc`).
    pub fn load(&self) -> Loaded<T> {
        Loaded(self.load_full())
    }

    /// The current value.
    pub fn load_full(&self) -> std::sync::Arc<T> {
        self.lock().clone()
    }

    /// Replace the value.
    pub fn store(&self, value: std::sync::Arc<T>) {
        *self.lock() = value;
    }

    /// Replace the value with `new` if it is still `current`; the value before, either way.
    pub fn compare_and_swap(
        &self,
        current: &std::sync::Arc<T>,
        new: std::sync::Arc<T>,
    ) -> std::sync::Arc<T> {
        let mut held = self.lock();
        let before = held.clone();
        if std::sync::Arc::ptr_eq(&before, current) {
            *held = new;
        }
        before
    }
}

/// What [`ArcCell::load`] returns under loom.
#[cfg(lbkit_loom)]
#[derive(Debug)]
pub struct Loaded<T>(std::sync::Arc<T>);

#[cfg(lbkit_loom)]
impl<T> std::ops::Deref for Loaded<T> {
    type Target = std::sync::Arc<T>;
    fn deref(&self) -> &std::sync::Arc<T> {
        &self.0
    }
}
