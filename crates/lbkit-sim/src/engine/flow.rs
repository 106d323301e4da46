//! Requests and attempts: pick, queue, serve, answer, time out, fail over.

use lbkit_core::trace::TraceId;
use lbkit_core::{FailureKind, Outcome, PickContext, Timestamp, TriedSet};

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
        let clients = self.scenario.workload.clients;
        let c = self.next_client % clients;
        self.next_client = self.next_client.wrapping_add(1);
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
        let id = self.requests.insert(Request {
            client,
            start: self.now,
            key,
            tries: 0,
            tried: TriedSet::new(),
            trace: TraceId::UNDECIDED,
        });
        self.metrics.request_started(self.now);
        self.try_request(id);
    }

    /// Send one attempt of request `id`, or end it when nothing can be picked.
    fn try_request(&mut self, id: Id) {
        let now = self.now;
        let Some(req) = self.requests.get_mut(id) else {
            return;
        };
        req.tries += 1;
        let (client, key, tries) = (req.client, req.key, req.tries);
        let lb = &self.lbs[self.clients[client as usize].balancer];
        let no_tries = TriedSet::new();
        let tried = if tries > 1 { &req.tried } else { &no_tries };
        let mut cx = PickContext::new(Timestamp::from_nanos(now), &mut self.rng)
            .with_tried(tries - 1, tried)
            .with_trace(req.trace);
        if !self.keys.is_empty() {
            cx = cx.with_key(self.keys[key as usize].as_bytes());
        }
        let guard = match lb.balancer.pick(&mut cx) {
            Ok(g) => g,
            Err(_) => return self.end_request(id, End::Error),
        };
        let server = self.server_of(guard.endpoint());
        if self.scenario.workload.retries > 0 {
            if let Some(req) = self.requests.get_mut(id) {
                req.tried.insert(guard.endpoint());
                req.trace = guard.trace_id();
            }
        }
        let attempt = self.attempts.insert(Attempt {
            request: id,
            server,
            guard: Some(guard),
            awaited: true,
            on_server: false,
            failed: false,
            pause_mark: 0,
            service: 0,
        });
        let outstanding = self.servers[server as usize].outstanding();
        self.metrics.attempt(server as usize, outstanding + 1);
        if self.timeout > 0 {
            self.at(now + self.timeout, Ev::Timeout(attempt));
        }
        let s = &self.servers[server as usize];
        if s.crashed {
            self.fail_fast(attempt, REFUSED);
        } else if s.has_free_worker() {
            self.serve(attempt);
        } else if s.queue_full() {
            self.fail_fast(attempt, REJECTED);
        } else {
            self.set_on_server(attempt);
            self.servers[server as usize].waiting.push_back(attempt);
        }
        self.touched(server as usize);
    }

    fn set_on_server(&mut self, attempt: Id) {
        if let Some(a) = self.attempts.get_mut(attempt) {
            a.on_server = true;
        }
    }

    fn fail_fast(&mut self, attempt: Id, after: u64) {
        if let Some(a) = self.attempts.get_mut(attempt) {
            a.failed = true;
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
        a.failed = failed;
        a.pause_mark = s.pause_total;
        a.service = service;
        self.at(begin + service, Ev::Respond(attempt));
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
            if a.failed {
                s.errors += 1;
            }
            if let Some(next) = s.waiting.pop_front() {
                self.serve(next);
            }
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
        let (failed, request) = (a.failed, a.request);
        let outcome = if failed {
            Outcome::Failure(FailureKind::Server)
        } else {
            Outcome::Success
        };
        if let Some(g) = a.guard.take() {
            g.finish_at(outcome, Timestamp::from_nanos(now));
        }
        if !a.on_server {
            self.attempts.remove(attempt);
        }
        if failed {
            self.retry_or_end(request, End::Error);
        } else {
            self.end_request(request, End::Ok);
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
        if let Some(g) = a.guard.take() {
            g.finish_at(
                Outcome::Failure(FailureKind::Timeout),
                Timestamp::from_nanos(now),
            );
        }
        if !a.on_server {
            self.attempts.remove(attempt);
        }
        self.retry_or_end(request, End::Timeout);
    }

    fn retry_or_end(&mut self, request: Id, end: End) {
        let retries = self.scenario.workload.retries;
        match self.requests.get(request) {
            Some(r) if r.tries <= retries => self.try_request(request),
            Some(_) => self.end_request(request, end),
            None => {}
        }
    }

    fn end_request(&mut self, id: Id, end: End) {
        let Some(req) = self.requests.remove(id) else {
            return;
        };
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
