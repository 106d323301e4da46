//! Requests and attempts: pick, queue, serve, answer, time out, fail over.

use lbkit_core::{Attempts, CallGuard, Classified, HedgeTimer, Observed, Route, Timestamp};

use super::{Attempt, Engine, Ev, Request, REFUSED, REJECTED};
use crate::dist::exponential;
use crate::metrics::End;
use crate::scenario::{Pattern, WorkloadKind};
use crate::slab::Id;

impl Engine<'_> {
    pub(super) fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Arrival => self.arrival(),
            Ev::BurstToggle => self.burst_toggle(),
            Ev::ClientReady(c) => self.new_request(c),
            Ev::Respond(a) => self.respond(a),
            Ev::Timeout(a) => self.timeout(a),
            Ev::Hedge(r) => self.hedge(r),
            Ev::Stall(s) => self.stall(s as usize),
            Ev::Change(i) => self.change(i as usize),
            Ev::Join(s) => self.join(s as usize),
            Ev::Tick => self.tick(),
            Ev::Report => self.report(),
            Ev::Outlier => self.outlier(),
            Ev::Sample => self.sample(),
        }
    }

    fn arrival(&mut self) {
        if self.issued >= self.total {
            return;
        }
        // Each arrival comes from a client drawn at random: open arrivals of a fleet are
        // independent streams. (Dealing them out in turn kept the clients' round-robin
        // positions in lockstep: with 400 clients, 400 calls in a row went to one server.)
        let clients = self.scenario.workload.clients as usize;
        let c = self.rng.index(clients) as u32;
        self.new_request(c);
        if let Some(arrivals) = &self.arrivals {
            if let Some(&next) = arrivals.get(self.issued as usize) {
                if self.issued < self.total {
                    self.at(next.max(self.now), Ev::Arrival);
                }
            }
            return;
        }
        let w = &self.scenario.workload;
        if self.issued < self.total && (w.pattern == Pattern::Poisson || self.burst_on) {
            let rate = if w.pattern == Pattern::Bursty {
                // Same mean rate overall: arrivals only in on periods, faster then.
                w.rate * (w.burst_on_ms + w.burst_off_ms) / w.burst_on_ms
            } else {
                w.rate
            };
            let dt = exponential(&mut self.rng, 1e9 / rate) as u64;
            self.at(self.now + dt.max(1), Ev::Arrival);
        }
    }

    fn burst_toggle(&mut self) {
        let w = &self.scenario.workload;
        self.burst_on = !self.burst_on;
        let mean = if self.burst_on {
            w.burst_on_ms
        } else {
            w.burst_off_ms
        };
        let dt = exponential(&mut self.rng, mean * 1e6) as u64;
        if self.issued < self.total {
            self.at(self.now + dt.max(1), Ev::BurstToggle);
            if self.burst_on {
                self.at(self.now + 1, Ev::Arrival);
            }
        }
    }

    fn new_request(&mut self, client: u32) {
        if self.issued >= self.total {
            return;
        }
        self.issued += 1;
        let key = match (&self.zipf, self.keys.len()) {
            (_, 0) => 0,
            (Some(z), _) => z.sample(&mut self.rng) as u32,
            (None, n) => self.rng.index(n) as u32,
        };
        let lb = &self.lbs[self.clients[client as usize].balancer];
        let now = Timestamp::from_nanos(self.now);
        let mut attempts = Attempts::start(
            self.policy,
            &lb.budget,
            self.scenario.workload.idempotent,
            true,
            now,
        );
        let route = Route::key(self.keys.get(key as usize).map(|k| k.as_bytes()));
        let first = attempts.pick(&lb.balancer, now, route, &mut self.rng);
        let id = self.requests.insert(Request {
            client,
            start: self.now,
            key,
            attempts,
            open: [None, None],
        });
        self.metrics.request_started(self.now);
        match first {
            Ok(guard) => self.send(id, guard),
            Err(_) => self.end_request(id, End::Error),
        }
    }

    /// Send the attempt of request `id` that `guard` began.
    fn send(&mut self, id: Id, guard: CallGuard) {
        let now = self.now;
        let server = self.server_of(guard.endpoint());
        let limit = self
            .requests
            .get(id)
            .and_then(|r| r.attempts.timeout(Timestamp::from_nanos(now)));
        let attempt = self.attempts.insert(Attempt {
            request: id,
            server,
            guard: Some(guard),
            awaited: true,
            on_server: false,
            failure: None,
            pause_mark: 0,
            service: 0,
        });
        self.opened(id, attempt);
        let outstanding = self.servers[server as usize].outstanding();
        self.metrics.attempt(server as usize, outstanding + 1);
        if let Some(r) = self.requests.get(id) {
            let lb = self.clients[r.client as usize].balancer;
            self.metrics.connect(lb, server as usize);
        }
        if let Some(limit) = limit {
            let ns = u64::try_from(limit.as_nanos()).unwrap_or(u64::MAX);
            self.at(now.saturating_add(ns.max(1)), Ev::Timeout(attempt));
        }
        let s = &self.servers[server as usize];
        if s.crashed {
            self.fail_fast(attempt, REFUSED, Observed::ConnectFailed);
        } else if s.has_free_worker() {
            self.serve(attempt);
        } else if s.queue_full() {
            self.fail_fast(attempt, REJECTED, Observed::Status(503));
        } else {
            self.set_on_server(attempt);
            self.servers[server as usize].waiting.push_back(attempt);
        }
        self.touched(server as usize);
    }

    /// Note that request `id` waits for `attempt`; after its first attempt, schedule its hedge
    /// when this run hedges and the delay is known.
    fn opened(&mut self, id: Id, attempt: Id) {
        let Some(req) = self.requests.get_mut(id) else {
            return;
        };
        if let Some(slot) = req.open.iter_mut().find(|s| s.is_none()) {
            *slot = Some(attempt);
        }
        if req.attempts.begun() != 1 {
            return;
        }
        let lb = &self.lbs[self.clients[req.client as usize].balancer];
        if let Some(delay) = lb.hedge.as_ref().and_then(HedgeTimer::delay) {
            let ns = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
            self.at(self.now.saturating_add(ns.max(1)), Ev::Hedge(id));
        }
    }

    /// Request `id` no longer waits for `attempt`: whether it still waits for another one (a
    /// failure then is not the request's end: the other attempt may still answer).
    fn closed(&mut self, id: Id, attempt: Id) -> bool {
        let Some(req) = self.requests.get_mut(id) else {
            return false;
        };
        for slot in &mut req.open {
            if *slot == Some(attempt) {
                *slot = None;
            }
        }
        req.open.iter().any(Option::is_some)
    }

    /// The hedge of request `id`: a second attempt on an endpoint not tried yet, when its
    /// first has no answer yet and `Attempts` allows one (idempotent, attempts and budget left).
    fn hedge(&mut self, id: Id) {
        let now = self.now;
        let Some(req) = self.requests.get_mut(id) else {
            return;
        };
        if req.attempts.begun() != 1 || req.open.iter().flatten().count() != 1 {
            return;
        }
        let lb = &self.lbs[self.clients[req.client as usize].balancer];
        let route = Route::key(self.keys.get(req.key as usize).map(|k| k.as_bytes()));
        let at = Timestamp::from_nanos(now);
        if let Ok(guard) = req
            .attempts
            .hedge(&lb.budget, &lb.balancer, at, route, &mut self.rng)
        {
            self.send(id, guard);
        }
    }

    /// The request ended: the client no longer waits for its other attempt (a hedge that lost),
    /// which is cancelled — not its endpoint's failure.
    fn cancel_open(&mut self, open: [Option<Id>; 2]) {
        let at = Timestamp::from_nanos(self.now);
        for attempt in open.into_iter().flatten() {
            let Some(a) = self.attempts.get_mut(attempt) else {
                continue;
            };
            if !a.awaited {
                continue;
            }
            a.awaited = false;
            if let Some(g) = a.guard.take() {
                g.finish_at(lbkit_core::Outcome::Cancelled, at);
            }
            if !a.on_server {
                self.attempts.remove(attempt);
            }
        }
    }

    fn set_on_server(&mut self, attempt: Id) {
        if let Some(a) = self.attempts.get_mut(attempt) {
            a.on_server = true;
        }
    }

    fn fail_fast(&mut self, attempt: Id, after: u64, observed: Observed) {
        if let Some(a) = self.attempts.get_mut(attempt) {
            a.failure = Some(observed);
        }
        self.at(self.now + after, Ev::Respond(attempt));
    }

    /// Start serving `attempt` on its server (a worker is free).
    fn serve(&mut self, attempt: Id) {
        let now = self.now;
        let Some(a) = self.attempts.get_mut(attempt) else {
            return;
        };
        let s = &mut self.servers[a.server as usize];
        s.note_busy(now);
        s.serving.push(attempt);
        let service = s.service_time(&mut self.rng, now);
        let failed = s.draws_error(&mut self.rng);
        let begin = now.max(s.paused_until);
        a.on_server = true;
        a.failure = failed.then_some(Observed::Status(500));
        a.pause_mark = s.pause_total;
        a.service = service;
        self.at(begin + service, Ev::Respond(attempt));
    }

    /// Serve waiting calls on `server` while it has free workers (one freed, or more when its
    /// hidden load fell).
    pub(super) fn start_waiting(&mut self, server: usize) {
        while self.servers[server].has_free_worker() {
            let Some(next) = self.servers[server].waiting.pop_front() else {
                return;
            };
            self.serve(next);
        }
    }

    /// The server is done with `attempt` (or refused it); the client hears back unless it gave up.
    fn respond(&mut self, attempt: Id) {
        let now = self.now;
        let Some(a) = self.attempts.get_mut(attempt) else {
            return;
        };
        let server = a.server as usize;
        if a.on_server {
            // Pauses that began while it was served delay it by their length.
            let s = &self.servers[server];
            if s.pause_total > a.pause_mark {
                let delay = s.pause_total - a.pause_mark;
                a.pause_mark = s.pause_total;
                self.at(now + delay, Ev::Respond(attempt));
                return;
            }
            a.on_server = false;
            let s = &mut self.servers[server];
            s.note_busy(now);
            s.serving.retain(|&x| x != attempt);
            s.completions += 1;
            if a.failure.is_some() {
                s.errors += 1;
            }
            self.start_waiting(server);
            self.touched(server);
        }
        self.answer(attempt, now);
    }

    /// Deliver the outcome to the client and, when both sides are done, free the attempt.
    pub(super) fn answer(&mut self, attempt: Id, now: u64) {
        let Some(a) = self.attempts.get_mut(attempt) else {
            return;
        };
        if !a.awaited {
            if !a.on_server {
                self.attempts.remove(attempt);
            }
            return;
        }
        a.awaited = false;
        let request = a.request;
        let c = a.failure.unwrap_or(Observed::Status(200)).classify();
        if let Some(g) = a.guard.take() {
            g.finish_at(c.outcome, Timestamp::from_nanos(now));
        }
        if !a.on_server {
            self.attempts.remove(attempt);
        }
        let racing = self.closed(request, attempt);
        if !c.is_failure() {
            self.end_request(request, End::Ok);
        } else if !racing {
            self.retry_or_end(request, c, End::Error);
        }
    }

    fn timeout(&mut self, attempt: Id) {
        let now = self.now;
        let Some(a) = self.attempts.get_mut(attempt) else {
            return;
        };
        if !a.awaited {
            return;
        }
        a.awaited = false;
        let request = a.request;
        let c = Observed::Timeout.classify();
        if let Some(g) = a.guard.take() {
            g.finish_at(c.outcome, Timestamp::from_nanos(now));
        }
        if !a.on_server {
            self.attempts.remove(attempt);
        }
        if !self.closed(request, attempt) {
            self.retry_or_end(request, c, End::Timeout);
        }
    }

    /// After a failed attempt classified as `c`: the next attempt where [`Attempts`] allows
    /// one (an untried endpoint, attempts, budget and deadline left), else the end.
    fn retry_or_end(&mut self, request: Id, c: Classified, end: End) {
        let Some(req) = self.requests.get_mut(request) else {
            return;
        };
        let lb = &self.lbs[self.clients[req.client as usize].balancer];
        let route = Route::key(self.keys.get(req.key as usize).map(|k| k.as_bytes()));
        self.clock.1.set(Timestamp::from_nanos(self.now)); // what `retry` reads
        let next = req.attempts.retry(
            c,
            &lb.budget,
            &lb.balancer,
            &self.clock.0,
            route,
            &mut self.rng,
        );
        match next {
            Ok((guard, _)) => self.send(request, guard),
            Err(_) => self.end_request(request, end),
        }
    }

    fn end_request(&mut self, id: Id, end: End) {
        let Some(req) = self.requests.remove(id) else {
            return;
        };
        self.cancel_open(req.open);
        self.metrics.request_ended(req.start, self.now, end);
        self.done += 1;
        let w = &self.scenario.workload;
        if w.kind == WorkloadKind::Closed && self.issued < self.total {
            let think = if w.think_ms > 0.0 {
                exponential(&mut self.rng, w.think_ms * 1e6) as u64
            } else {
                0
            };
            self.at(self.now + think.max(1), Ev::ClientReady(req.client));
        }
    }
}
