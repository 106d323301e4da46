//! A counting global allocator, to prove that picks do not allocate.
//!
//! Install it in a test binary, then count what a closure allocates on this thread:
//!
//! ```
//! #[global_allocator]
//! static ALLOC: lbkit_testkit::alloc::CountingAlloc = lbkit_testkit::alloc::CountingAlloc;
//!
//! let (_, n) = lbkit_testkit::alloc::allocations_in(|| vec![1u8; 16]);
//! assert_eq!(n, 1);
//! let ((), n) = lbkit_testkit::alloc::allocations_in(|| { /* picks */ });
//! assert_eq!(n, 0);
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

/// The system allocator, counting allocations per thread.
#[derive(Debug, Clone, Copy, Default)]
pub struct CountingAlloc;

// The only unsafe in lbkit: a GlobalAlloc impl must be unsafe. It forwards to `System`.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        bump();
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        bump();
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

fn bump() {
    // `try_with`: the thread-local may be gone while a thread shuts down.
    let _ = COUNT.try_with(|c| c.set(c.get() + 1));
}

/// Run `f` and return its result with the number of allocations it made on this thread.
/// Counts only when [`CountingAlloc`] is the global allocator.
pub fn allocations_in<R>(f: impl FnOnce() -> R) -> (R, u64) {
    let before = COUNT.with(Cell::get);
    let r = f();
    (r, COUNT.with(Cell::get) - before)
}
