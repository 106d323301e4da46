//! The per-thread pool of idle upstream connections of the fast path.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::service::Service;

/// How often a request's take or give-back sweeps its thread's pool: drops expired connections
/// and those of services a reload removed.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// How often [`sweep_idle`] sweeps its thread's pool: an idle connection is closed at most this
/// long after its service's `upstream_idle_timeout_ms`, with or without requests (on the
/// threads a sweeper runs on).
const SWEEP_TICK: Duration = Duration::from_secs(1);

thread_local! {
    static POOL: RefCell<Pool> = RefCell::new(Pool::default());
}

/// The idle upstream connections of one thread. Each worker thread runs its own runtime, so a
/// connection is taken and given back on the thread (and runtime) that made it; on a
/// multi-threaded runtime a task may give it back on a sibling thread of the same runtime.
/// No lock: the `RefCell` is borrowed only between awaits.
#[derive(Default)]
struct Pool {
    services: Vec<ServicePool>,
    swept: Option<Instant>,
}

struct ServicePool {
    /// The owner; a dead one's connections go at the next sweep. Holding the `Weak` keeps the
    /// allocation, so its address identifies the service for as long as the entry lives.
    service: Weak<Service>,
    /// The service's `upstream_idle_timeout_ms`.
    idle_for: Duration,
    /// The service's `upstream_max_idle`: idle connections kept per address.
    max_idle: usize,
    idle: HashMap<Box<str>, Vec<(TcpStream, Instant)>>,
}

/// An idle connection to `address` for `service`, if this thread has one that is neither
/// expired nor closed by its peer (whose readiness, already known to the runtime, says so
/// without a system call).
pub(super) fn take(service: &Arc<Service>, address: &str, now: Instant) -> Option<TcpStream> {
    POOL.with(|pool| {
        let mut pool = pool.borrow_mut();
        pool.sweep_due(now);
        let entry = pool
            .services
            .iter_mut()
            .find(|s| std::ptr::eq(s.service.as_ptr(), Arc::as_ptr(service)))?;
        let idle_for = entry.idle_for;
        let idle = entry.idle.get_mut(address)?;
        while let Some((stream, since)) = idle.pop() {
            if now.saturating_duration_since(since) < idle_for
                && crate::upstream::still_open(&stream)
            {
                return Some(stream);
            }
        }
        None
    })
}

/// Give back a connection that finished its exchange cleanly.
pub(super) fn give_back(service: &Arc<Service>, address: &str, stream: TcpStream, now: Instant) {
    POOL.with(|pool| {
        let mut pool = pool.borrow_mut();
        pool.sweep_due(now);
        let i = match pool
            .services
            .iter()
            .position(|s| std::ptr::eq(s.service.as_ptr(), Arc::as_ptr(service)))
        {
            Some(i) => i,
            None => {
                pool.services.push(ServicePool {
                    service: Arc::downgrade(service),
                    idle_for: service.config().upstream_idle(),
                    max_idle: service.config().upstream_max_idle,
                    idle: HashMap::new(),
                });
                pool.services.len() - 1
            }
        };
        let entry = &mut pool.services[i];
        let (idle, max_idle) = (&mut entry.idle, entry.max_idle);
        let list = match idle.get_mut(address) {
            Some(list) => list,
            None => idle.entry(address.into()).or_default(),
        };
        if list.len() < max_idle {
            list.push((stream, now));
        }
    });
}

impl Pool {
    /// Sweep when the last sweep is `SWEEP_EVERY` old: on a thread without [`sweep_idle`] (a
    /// sibling thread of a multi-threaded calling runtime), the only sweeps.
    fn sweep_due(&mut self, now: Instant) {
        if self
            .swept
            .is_none_or(|t| now.saturating_duration_since(t) >= SWEEP_EVERY)
        {
            self.sweep(now);
        }
    }

    fn sweep(&mut self, now: Instant) {
        self.swept = Some(now);
        self.services.retain(|s| s.service.strong_count() > 0);
        for s in &mut self.services {
            let idle_for = s.idle_for;
            s.idle.retain(|_, list| {
                list.retain(|(_, since)| now.saturating_duration_since(*since) < idle_for);
                !list.is_empty()
            });
        }
        self.services.retain(|s| !s.idle.is_empty());
    }
}

/// Sweep this thread's pool every `SWEEP_TICK`, so idle upstream connections close on time even
/// when no request comes (a worker that stops proxying does not keep them). Runs on every
/// runtime that serves connections; on a current-thread runtime (each worker's, and `lbkit
/// proxy`'s) that is every pool. On a multi-threaded calling runtime it sweeps the thread it
/// runs on; the others' pools are swept by their requests (`SWEEP_EVERY`). Once `owner` (the
/// proxy's shared state) is gone, it ends when the pool is empty (the services are gone, or
/// their connections expired). It holds no shutdown receiver: the drain waits for those.
pub(crate) async fn sweep_idle<T>(owner: Weak<T>) {
    let mut tick = tokio::time::interval(SWEEP_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let empty = POOL.with(|pool| {
            let mut pool = pool.borrow_mut();
            pool.sweep(Instant::now());
            pool.services.is_empty()
        });
        if empty && owner.strong_count() == 0 {
            return;
        }
    }
}
