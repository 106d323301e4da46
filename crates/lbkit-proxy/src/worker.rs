//! Which of the proxy's threads this is: worker threads (`Proxy::start_workers`) are numbered
//! 1..=N, every other thread (the calling runtime's, which also runs health checks and
//! discovery) is 0. Per-thread resources — a service's upstream clients, its metric shards —
//! are indexed by it, so a request and everything it touches stay on one thread.

use std::cell::Cell;

thread_local! {
    static WORKER: Cell<usize> = const { Cell::new(0) };
}

/// The index of the calling thread: 1..=N on the proxy's worker threads, 0 elsewhere.
#[inline]
pub(crate) fn index() -> usize {
    WORKER.with(Cell::get)
}

/// Mark the calling thread as worker `index`.
pub(crate) fn set_index(index: usize) {
    WORKER.with(|w| w.set(index));
}
