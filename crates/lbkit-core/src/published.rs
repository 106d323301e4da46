//! [`Published`]: state replaced whole by one writer and read by every call, with [`Cached`]
//! copies that see a replacement with one atomic load.
//!
//! Every store gives the value a new id, unique in the process, stored after the value
//! (Release). A reader holding a [`Cached`] copy loads the id (Acquire) and reloads the value
//! only when the id differs from its own: the value the id names, or a later one, whose own id
//! the next read sees. A copy used with another cell than its own sees a different id and
//! reloads, so mixing them up costs a reload, never a wrong value.
//!
//! A plain [`load`](Published::load) costs arc-swap's debt slot (two locked instructions and a
//! thread-local lookup); a [`cached`](Published::cached) read one load and a compare. The copy
//! keeps its value alive until its next read after a replacement: hold one per long-lived
//! reader (a worker, a tower service), not one per call.

use std::fmt;
use std::sync::Arc;

use crate::sync::{ArcCell, AtomicU64, Ordering};

/// A value replaced whole ([`store`](Self::store)) and read by many, each store with a new id.
///
/// ```
/// use std::sync::Arc;
/// use lbkit_core::Published;
///
/// let config = Published::new("v1");
/// let mut copy = config.cache();
/// assert_eq!(**config.cached(&mut copy), "v1");
/// config.store(Arc::new("v2"));
/// assert_eq!(**config.cached(&mut copy), "v2"); // one load saw the change
/// ```
pub struct Published<T> {
    cell: ArcCell<T>,
    /// The id of the value in `cell`, stored after it.
    id: AtomicU64,
}

/// A reader's copy of a [`Published`] value; see [`Published::cached`].
pub struct Cached<T> {
    id: u64,
    value: Arc<T>,
}

// === impl Published ===

impl<T> Published<T> {
    /// A cell holding `value`.
    pub fn new(value: T) -> Self {
        Published {
            cell: ArcCell::from_pointee(value),
            id: AtomicU64::new(next_id()),
        }
    }

    /// The current value, borrowed for the moment (arc-swap's `load`): do not hold it across
    /// an `.await` or for long.
    #[inline]
    pub fn load(&self) -> impl std::ops::Deref<Target = Arc<T>> + '_ {
        self.cell.load()
    }

    /// The current value.
    pub fn load_full(&self) -> Arc<T> {
        self.cell.load_full()
    }

    /// Replace the value.
    pub fn store(&self, value: Arc<T>) {
        self.cell.store(value);
        self.announce();
    }

    /// Replace the value with `new` if it is still `current`; whether it did.
    pub fn compare_and_swap(&self, current: &Arc<T>, new: Arc<T>) -> bool {
        let before = self.cell.compare_and_swap(current, new);
        let swapped = Arc::ptr_eq(&before, current);
        if swapped {
            self.announce();
        }
        swapped
    }

    /// Give the value just stored a new id. Release, after the store: a reader that sees the
    /// id loads that value or a later one (the loom model `a_cache_follows_a_publish` fails
    /// with the two stores swapped).
    fn announce(&self) {
        self.id.store(next_id(), Ordering::Release);
    }

    /// A copy of the current value for [`cached`](Self::cached).
    pub fn cache(&self) -> Cached<T> {
        let id = self.id.load(Ordering::Acquire);
        Cached {
            id,
            value: self.cell.load_full(),
        }
    }

    /// The current value through `copy`: one atomic load, and a reload only when the value
    /// was replaced since `copy` last looked (or `copy` is another cell's).
    #[inline]
    pub fn cached<'c>(&self, copy: &'c mut Cached<T>) -> &'c Arc<T> {
        let id = self.id.load(Ordering::Acquire);
        if id != copy.id {
            self.reload(copy, id);
        }
        &copy.value
    }

    #[cold]
    #[inline(never)]
    fn reload(&self, copy: &mut Cached<T>, id: u64) {
        // Loaded after `id` (Acquire): the value `id` names, or a later one.
        copy.value = self.cell.load_full();
        copy.id = id;
    }
}

impl<T: fmt::Debug> fmt::Debug for Published<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Published").field(&**self.load()).finish()
    }
}

// === impl Cached ===

impl<T> Cached<T> {
    /// The value held (as of the last [`Published::cached`] read).
    pub fn get(&self) -> &Arc<T> {
        &self.value
    }
}

impl<T> Clone for Cached<T> {
    fn clone(&self) -> Self {
        Cached {
            id: self.id,
            value: self.value.clone(),
        }
    }
}

impl<T> fmt::Debug for Cached<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cached")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// A new id, unique in the process. Not a loom atomic: an id counter, part of no model's
/// ordering.
fn next_id() -> u64 {
    static IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

#[cfg(all(test, not(lbkit_loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_copy_is_reloaded_only_after_a_store() {
        let p = Published::new(1);
        let mut copy = p.cache();
        let first = p.cached(&mut copy).clone();
        assert!(
            Arc::ptr_eq(&first, p.cached(&mut copy)),
            "no store, no reload"
        );
        p.store(Arc::new(2));
        assert_eq!(**p.cached(&mut copy), 2);
        assert!(Arc::ptr_eq(copy.get(), &p.load_full()));
    }

    #[test]
    fn a_swap_is_announced_only_when_it_happens() {
        let p = Published::new(1);
        let mut copy = p.cache();
        let stale = Arc::new(0);
        assert!(!p.compare_and_swap(&stale, Arc::new(3)));
        assert_eq!(**p.cached(&mut copy), 1, "no swap: the value stays");
        let current = p.load_full();
        assert!(p.compare_and_swap(&current, Arc::new(4)));
        assert_eq!(**p.cached(&mut copy), 4);
    }

    #[test]
    fn another_cells_copy_is_refilled() {
        let a = Published::new("a");
        let b = Published::new("b");
        let mut copy = b.cache();
        assert_eq!(**a.cached(&mut copy), "a");
        assert_eq!(**b.cached(&mut copy), "b");
    }
}
