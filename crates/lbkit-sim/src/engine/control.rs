//! Everything around the requests: membership and server changes, pauses, refresh ticks, load
//! reports, outlier detection, and samples for the plots.

use std::time::Duration;

use lbkit_core::{EndpointKey, EndpointSpec, Timestamp, Update};

use super::{Engine, Ev, TICK};
use crate::scenario::Action;

impl Engine<'_> {
    fn spec_of(&self, i: usize) -> EndpointSpec {
        let s = &self.servers[i];
        let mut spec = EndpointSpec::new(s.address.clone())
            .with_weight(s.weight)
            .with_healthy(!s.down);
        if let Some(z) = &s.zone {
            spec = spec.with_zone(z.clone());
        }
        if s.warmup_ms > 0 {
            spec = spec
                .with_registered_at(Timestamp::from_nanos(s.joined_at))
                .with_warmup(Duration::from_millis(s.warmup_ms));
        }
        spec
    }

    /// Send `update` to every balancer's control loop, and publish what it makes of it.
    fn publish(&mut self, update: Update) {
        let now = self.virtual_now();
        for lb in &mut self.lbs {
            if let Some(snap) = lb.controller.apply_batch(vec![update.clone()]) {
                lb.balancer.publish(snap, now);
            }
        }
    }

    /// The time now, also set on the clock the control loops and `Attempts` read.
    pub(super) fn virtual_now(&self) -> Timestamp {
        let now = Timestamp::from_nanos(self.now);
        self.clock.1.set(now);
        now
    }

    pub(super) fn join(&mut self, i: usize) {
        let s = &mut self.servers[i];
        s.member = true;
        s.joined_at = self.now;
        let spec = self.spec_of(i);
        self.publish(Update::Add(vec![spec]));
        self.touched(i);
    }

    pub(super) fn change(&mut self, index: usize) {
        let e = &self.scenario.events[index];
        let Some(i) = self.servers.iter().position(|s| s.name == e.server) else {
            return;
        };
        match e.action {
            Action::Slow => self.servers[i].slow = e.factor.unwrap_or(1.0),
            Action::Hidden => {
                self.servers[i].note_busy(self.now);
                self.servers[i].hidden = e.factor.unwrap_or(0.0);
                self.start_waiting(i);
            }
            Action::Weight => {
                self.servers[i].weight = e.weight.unwrap_or(self.servers[i].weight);
                if self.servers[i].member {
                    let spec = self.spec_of(i);
                    self.publish(Update::Add(vec![spec]));
                }
            }
            Action::Crash => self.crash(i),
            Action::Recover => self.servers[i].crashed = false,
            Action::Leave => {
                self.servers[i].member = false;
                let key = EndpointKey::from(self.servers[i].address.as_str());
                self.publish(Update::Remove(vec![key]));
            }
            Action::Join => self.join(i),
            Action::Down | Action::Up => self.mark(i, e.action == Action::Down),
        }
        self.touched(i);
    }

    /// Health checks mark the server down (it dies first) or up (it is back).
    fn mark(&mut self, i: usize, down: bool) {
        if down {
            self.crash(i);
        } else {
            self.servers[i].crashed = false;
        }
        self.servers[i].down = down;
        if self.servers[i].member {
            let spec = self.spec_of(i);
            self.publish(Update::Add(vec![spec]));
        }
    }

    /// The server dies: everything on it fails now (connection reset); it refuses new calls.
    fn crash(&mut self, i: usize) {
        let now = self.now;
        let s = &mut self.servers[i];
        s.crashed = true;
        s.note_busy(now);
        let lost: Vec<_> = s.serving.drain(..).chain(s.waiting.drain(..)).collect();
        self.touched(i);
        for attempt in lost {
            if let Some(a) = self.attempts.get_mut(attempt) {
                a.on_server = false;
                // A reset before any byte of the answer: retried when idempotent.
                a.failure = Some(lbkit_core::Observed::ResetBeforeResponse);
            }
            self.answer(attempt, now);
        }
    }

    pub(super) fn stall(&mut self, i: usize) {
        let now = self.now;
        self.servers[i].pause(now);
        self.touched(i);
        if let Some(dt) = self.servers[i].next_stall(&mut self.rng) {
            let next = self.servers[i].paused_until.max(now) + dt;
            self.at(next, Ev::Stall(i as u32));
        }
    }

    fn running(&self) -> bool {
        self.done < self.total
    }

    pub(super) fn tick(&mut self) {
        let now = self.virtual_now();
        for lb in &mut self.lbs {
            // Removals held by mass-removal protection end when confirmed or expired.
            if lb.controller.next_expiry().is_some_and(|at| at <= now) {
                if let Some(snap) = lb.controller.expire_held(now) {
                    lb.balancer.publish(snap, now);
                }
            }
            lb.balancer.tick(now);
            if let Some(h) = &lb.hedge {
                h.refresh(&lb.balancer.snapshot());
            }
        }
        if self.running() {
            self.at(self.now + TICK, Ev::Tick);
        }
    }

    /// The servers' load-report period, ns.
    pub(super) fn report_every(&self) -> u64 {
        (self.scenario.report_ms * 1e6) as u64
    }

    /// Servers report utilisation, qps and eps to every balancer (ORCA-style).
    pub(super) fn report(&mut self) {
        let now = Timestamp::from_nanos(self.now);
        let every = self.report_every();
        let reports: Vec<(EndpointKey, (f64, f64, f64))> = self
            .servers
            .iter_mut()
            // Members and servers held after they left (the balancers filter by what they serve).
            .filter(|s| !s.crashed)
            .map(|s| {
                (
                    EndpointKey::from(s.address.as_str()),
                    s.take_load_report(self.now, every),
                )
            })
            .collect();
        for lb in &self.lbs {
            let snap = lb.balancer.snapshot();
            for (key, (util, qps, eps)) in &reports {
                if let Some(i) = snap.find(key) {
                    snap.endpoint(i).stats().report_load(now, *util, *qps, *eps);
                }
            }
        }
        if self.running() {
            self.at(self.now + every, Ev::Report);
        }
    }

    pub(super) fn outlier(&mut self) {
        let now = self.virtual_now();
        let interval = self
            .scenario
            .workload
            .outlier_detection
            .then(|| lbkit_health::OutlierConfig::default().interval);
        for lb in &mut self.lbs {
            if let Some(snap) = lb.controller.tick_outliers(now) {
                lb.balancer.publish(snap, now);
            }
        }
        if let (Some(every), true) = (interval, self.running()) {
            self.at(self.now + every.as_nanos() as u64, Ev::Outlier);
        }
    }

    pub(super) fn sample(&mut self) {
        let q = self.servers[self.watch].outstanding();
        self.metrics.sample(self.now, q);
        if self.running() {
            self.at(self.now + self.sample_every, Ev::Sample);
        }
    }
}
