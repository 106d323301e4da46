//! The server model: workers, a waiting room, slowness, pauses, errors, crashes, cold start.

use std::collections::VecDeque;

use lbkit_core::FastRng;

use crate::dist::{exponential, ServiceTime};
use crate::scenario::ServerSpec;
use crate::slab::Id;

/// One simulated server. Times in nanoseconds of virtual time.
#[derive(Debug)]
pub(crate) struct Server {
    pub(crate) name: String,
    pub(crate) address: String,
    pub(crate) weight: u32,
    pub(crate) zone: Option<String>,
    service: ServiceTime,
    concurrency: u32,
    queue_cap: usize,
    pub(crate) slow: f64,
    /// Share of the server's workers held by work the clients cannot see.
    pub(crate) hidden: f64,
    error_rate: f64,
    stall_every: f64,
    stall_len: f64,
    cold_factor: f64,
    cold_len: f64,
    pub(crate) warmup_ms: u64,
    pub(crate) join_at: u64,
    /// In the endpoint set.
    pub(crate) member: bool,
    pub(crate) crashed: bool,
    /// Marked down by its health checks (`down` event): in the set, not healthy.
    pub(crate) down: bool,
    pub(crate) joined_at: u64,
    /// Attempts being served, and waiting.
    pub(crate) serving: Vec<Id>,
    pub(crate) waiting: VecDeque<Id>,
    /// Paused until this time (GC-like stall).
    pub(crate) paused_until: u64,
    /// Sum of every pause so far (a served attempt is delayed by the pauses since its start).
    pub(crate) pause_total: u64,
    // Load-report accounting over the current report period.
    busy_since: u64,
    busy_area: f64,
    pub(crate) completions: u64,
    pub(crate) errors: u64,
}

impl Server {
    pub(crate) fn new(spec: &ServerSpec, name: String, index: usize) -> Result<Server, String> {
        let service = ServiceTime::new(&spec.service)?;
        // Recorded latencies by load hold the server's queueing already: serve every call.
        let concurrency = if service.by_load() {
            u32::MAX
        } else {
            spec.concurrency
        };
        Ok(Server {
            address: Server::address_of(index),
            name,
            weight: spec.weight,
            zone: spec.zone.clone(),
            service,
            concurrency,
            queue_cap: spec.queue as usize,
            slow: spec.slow_factor,
            hidden: spec.hidden_load,
            error_rate: spec.error_rate,
            stall_every: spec.stall_every_ms * 1e6,
            stall_len: spec.stall_ms * 1e6,
            cold_factor: spec.cold_factor,
            cold_len: spec.cold_ms * 1e6,
            warmup_ms: spec.warmup_ms as u64,
            join_at: (spec.join_ms * 1e6) as u64,
            member: false,
            crashed: false,
            down: false,
            joined_at: 0,
            serving: Vec::new(),
            waiting: VecDeque::new(),
            paused_until: 0,
            pause_total: 0,
            busy_since: 0,
            busy_area: 0.0,
            completions: 0,
            errors: 0,
        })
    }

    /// The address of the `index`-th server.
    pub(crate) fn address_of(index: usize) -> String {
        format!("10.0.{}.{}:20880", index / 250, index % 250 + 1)
    }

    /// Mean time a call takes at full load, scaled by the slow factor and by the workers the
    /// hidden load leaves (to find "the slowest").
    pub(crate) fn nominal_mean(&self) -> f64 {
        let workers = f64::from(self.workers().min(self.concurrency));
        self.service.mean() * self.slow * f64::from(self.concurrency) / workers
    }

    /// Calls on the server: served plus waiting.
    pub(crate) fn outstanding(&self) -> usize {
        self.serving.len() + self.waiting.len()
    }

    pub(crate) fn has_free_worker(&self) -> bool {
        (self.serving.len() as u32) < self.workers()
    }

    pub(crate) fn queue_full(&self) -> bool {
        self.waiting.len() >= self.queue_cap
    }

    /// Draw the service time of an attempt starting at `now`.
    pub(crate) fn service_time(&self, rng: &mut FastRng, now: u64) -> u64 {
        // The calls on the server besides this one (already counted among those served).
        let load = u32::try_from(self.outstanding().saturating_sub(1)).unwrap_or(u32::MAX);
        (self.service.sample_at(rng, load) * self.speed(now)).max(1.0) as u64
    }

    /// What service times are multiplied by at `now`: the slow factor and the cold start.
    fn speed(&self, now: u64) -> f64 {
        self.slow * self.cold(now)
    }

    /// Workers left to the clients' calls: those the hidden work does not hold (at least one).
    fn workers(&self) -> u32 {
        if self.concurrency == u32::MAX || self.hidden <= 0.0 {
            return self.concurrency;
        }
        let held = (f64::from(self.concurrency) * self.hidden).round() as u32;
        self.concurrency.saturating_sub(held).max(1)
    }

    /// The cold-start multiplier at `now`.
    fn cold(&self, now: u64) -> f64 {
        if self.cold_len > 0.0 {
            let age = now.saturating_sub(self.joined_at) as f64;
            1.0 + (self.cold_factor - 1.0) * (1.0 - age / self.cold_len).max(0.0)
        } else {
            1.0
        }
    }

    /// Expected time for a call arriving at `now` to be served, ns (the oracle's view; see
    /// `oracle.rs`): `m + max(0, q + 1 - c) * m / c` plus the rest of a pause, where `m` is the
    /// current mean service time. `u64::MAX` for a crashed server or a full waiting room.
    pub(crate) fn expected_delay(&self, now: u64) -> u64 {
        if self.crashed || (!self.has_free_worker() && self.queue_full()) {
            return u64::MAX;
        }
        let m = self.service.mean() * self.speed(now);
        let c = f64::from(self.workers());
        let ahead = (self.outstanding() as f64 + 1.0 - c).max(0.0);
        let pause = self.paused_until.saturating_sub(now) as f64;
        (m + ahead * m / c + pause).min(u64::MAX as f64 / 2.0) as u64
    }

    pub(crate) fn draws_error(&self, rng: &mut FastRng) -> bool {
        self.error_rate > 0.0 && rng.unit_f64() < self.error_rate
    }

    /// Time to the next pause, if the server stalls.
    pub(crate) fn next_stall(&self, rng: &mut FastRng) -> Option<u64> {
        (self.stall_every > 0.0 && self.stall_len > 0.0)
            .then(|| exponential(rng, self.stall_every).max(1.0) as u64)
    }

    /// Start a pause at `now`.
    pub(crate) fn pause(&mut self, now: u64) {
        let len = self.stall_len as u64;
        self.paused_until = self.paused_until.max(now) + len;
        self.pause_total += len;
    }

    /// Account busy workers before their number changes.
    pub(crate) fn note_busy(&mut self, now: u64) {
        self.busy_area += self.serving.len() as f64 * now.saturating_sub(self.busy_since) as f64;
        self.busy_since = now;
    }

    /// Utilisation, qps and eps over the period that ends at `now`, and start a new period.
    pub(crate) fn take_load_report(&mut self, now: u64, period: u64) -> (f64, f64, f64) {
        self.note_busy(now);
        let secs = period as f64 / 1e9;
        // The workers the hidden work holds are busy whatever the clients send.
        let held = f64::from(self.concurrency - self.workers().min(self.concurrency));
        let busy = self.busy_area / period as f64 + held;
        let util = (busy / f64::from(self.concurrency)).min(1.0);
        let report = (
            util,
            self.completions as f64 / secs,
            self.errors as f64 / secs,
        );
        self.busy_area = 0.0;
        self.completions = 0;
        self.errors = 0;
        report
    }
}
