//! The event loop: arrivals, picks through real [`Balancer`]s, server queues, responses,
//! timeouts and failover, membership changes, refresh and outlier ticks — in virtual time.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::Arc;

use std::time::Duration;

use lbkit_core::{
    AttemptPolicy, Attempts, Availability, Balancer, BoxStrategy, CallGuard, Clock, FastRng,
    HedgeDelay, HedgeTimer, ManualClock, Observed, RetryBudget, SnapshotPolicy, Timestamp, Update,
};
use lbkit_discovery::{Controller, ControllerConfig};
use lbkit_health::OutlierConfig;

use crate::dist::{exponential, Zipf};
use crate::metrics::{Collector, StrategyResult};
use crate::scenario::{BalancerMode, KeyDistribution, Pattern, Scenario, Workload, WorkloadKind};
use crate::server::Server;
use crate::slab::{Id, Slab};

mod control;
mod flow;

/// Period of balancer refresh ticks (warm-up, response-time and adaptive weights).
const TICK: u64 = 100_000_000;
/// A refused connection fails this fast.
const REFUSED: u64 = 1_000_000;
/// A full waiting room rejects this fast.
const REJECTED: u64 = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Arrival,
    BurstToggle,
    ClientReady(u32),
    Respond(Id),
    Timeout(Id),
    /// Hedge request `Id` if it is still waiting for its first attempt.
    Hedge(Id),
    Stall(u32),
    Change(u32),
    Join(u32),
    Tick,
    Report,
    Outlier,
    Sample,
}

/// The attempt policy of a scenario's workload: `retries` after the first attempt, each
/// attempt bounded by `timeout_ms`, all of them by `deadline_ms` (0: none).
fn attempt_policy(w: &crate::scenario::Workload) -> AttemptPolicy {
    let ms = |v: f64| (v > 0.0).then(|| Duration::from_nanos((v * 1e6) as u64));
    AttemptPolicy {
        retries: w.retries,
        per_try: ms(w.timeout_ms),
        overall: ms(w.deadline_ms),
    }
}

/// The balancers (one per client, or one shared by all) and the clients, each with the index
/// of its balancer.
fn balancers(
    scenario: &Scenario,
    make: &dyn Fn() -> BoxStrategy,
    record: Option<&lbkit_trace::Recorder>,
    clock: &Clock,
) -> (Vec<Lb>, Vec<Client>) {
    let w = &scenario.workload;
    let n_lbs = if w.balancer == BalancerMode::Shared {
        1
    } else {
        w.clients as usize
    };
    let lbs = (0..n_lbs)
        .map(|_| new_lb(scenario, make, record, clock))
        .collect();
    let clients = (0..w.clients)
        .map(|c| Client {
            balancer: c as usize % n_lbs,
        })
        .collect();
    (lbs, clients)
}

/// One client's balancer (or the shared one): the strategy from `make`, its retry budget, and
/// the control loop that publishes its endpoints, reading `clock` (virtual time).
fn new_lb(
    scenario: &Scenario,
    make: &dyn Fn() -> BoxStrategy,
    record: Option<&lbkit_trace::Recorder>,
    clock: &Clock,
) -> Lb {
    let w = &scenario.workload;
    let availability = if w.circuit_breaker {
        Availability::default()
    } else {
        Availability::OFF
    };
    let config = ControllerConfig {
        policy: SnapshotPolicy {
            panic_threshold: w.panic_threshold,
            slow_start: None,
        },
        outlier: w.outlier_detection.then(OutlierConfig::default),
        ..ControllerConfig::default()
    };
    let mut controller = Controller::new(config).with_clock(clock.clone());
    let snap = controller
        .apply_batch(vec![Update::Reset(Vec::new())])
        .expect("the first batch is published");
    let balancer = Balancer::new(make(), snap, Timestamp::ZERO).with_availability(availability);
    Lb {
        budget: RetryBudget::new(
            Duration::from_secs(10),
            w.retry_budget_min_per_sec,
            w.retry_budget_percent / 100.0,
        ),
        balancer: match record {
            Some(r) => r.attach(balancer, &scenario.name),
            None => balancer,
        },
        controller,
        hedge: None,
    }
}

/// A scheduled event, ordered by time then by scheduling order (earliest first in the heap).
#[derive(Debug, PartialEq, Eq)]
struct Entry {
    /// `time << 64 | seq`: one comparison orders by time, ties by scheduling order.
    key: u128,
    ev: Ev,
}

impl Ord for Entry {
    fn cmp(&self, other: &Self) -> Ordering {
        other.key.cmp(&self.key) // reversed: BinaryHeap is a max-heap
    }
}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// A request: its attempts are decided by lbkit-core's [`Attempts`], the state machine the
/// tower layer and the proxy run (retries on untried endpoints only, the retry budget, the
/// idempotency rule, the per-attempt and overall deadlines, the trace id carried along).
struct Request {
    client: u32,
    start: u64,
    key: u32,
    attempts: Attempts,
    /// Its attempts the client still waits for (two while a hedge races the first).
    open: [Option<Id>; 2],
}

struct Attempt {
    request: Id,
    server: u32,
    guard: Option<CallGuard>,
    /// Still awaited by the client (not timed out, not answered).
    awaited: bool,
    /// Still on the server (waiting or served).
    on_server: bool,
    /// What went wrong, as a driver would see it (`None`: a good answer).
    failure: Option<Observed>,
    pause_mark: u64,
    service: u64,
}

struct Client {
    balancer: usize,
}

/// Server indices by endpoint key hash, sorted by hash.
type ByHash = Vec<(u64, u32)>;

/// The scenario's servers, named by `names`, and their indices by endpoint key hash.
fn servers_of(scenario: &Scenario, names: &[String]) -> Result<(Vec<Server>, ByHash), String> {
    let mut servers = Vec::new();
    for spec in &scenario.servers {
        for _ in 0..spec.count {
            let name = names[servers.len()].clone();
            servers.push(Server::new(spec, name, servers.len())?);
        }
    }
    let mut by_hash: Vec<(u64, u32)> = servers
        .iter()
        .enumerate()
        .map(|(i, s)| (lbkit_core::key_hash(s.address.as_bytes()), i as u32))
        .collect();
    by_hash.sort_unstable();
    Ok((servers, by_hash))
}

/// The server the report follows over time: the scenario's `watch`, else the slowest.
fn watched(scenario: &Scenario, names: &[String], servers: &[Server]) -> usize {
    match &scenario.watch {
        Some(name) => names.iter().position(|n| n == name).unwrap_or(0),
        None => (0..servers.len())
            .max_by(|&a, &b| {
                servers[a]
                    .nominal_mean()
                    .total_cmp(&servers[b].nominal_mean())
            })
            .unwrap_or(0),
    }
}

/// The workload's request keys (`key-0`, …) and, for Zipf-distributed keys, the sampler.
fn keys_of(w: &Workload) -> (Vec<String>, Option<Zipf>) {
    let keys = (0..w.key_count).map(|k| format!("key-{k}")).collect();
    let zipf = (w.key_count > 0 && w.key_distribution == KeyDistribution::Zipf)
        .then(|| Zipf::new(w.key_count, w.zipf_exponent));
    (keys, zipf)
}

/// About how long the run lasts in virtual ns (for the sampling period).
fn expected_ns(w: &Workload, arrivals: Option<&[u64]>, requests: u64) -> f64 {
    match (arrivals, w.kind) {
        (Some(a), _) => a.last().copied().unwrap_or(0) as f64 + 1e9,
        (None, WorkloadKind::Open) => requests as f64 / w.rate * 1e9,
        (None, WorkloadKind::Closed) => requests as f64 * 20e6 / f64::from(w.clients),
    }
}

struct Lb {
    balancer: Balancer<BoxStrategy>,
    /// The retry budget of this balancer's calls.
    budget: RetryBudget,
    /// The control loop every lbkit client runs (the tower pool's and the proxy's): the
    /// scenario's membership changes go through its rules (key order, empty-push and
    /// mass-removal protection), its outlier detection and snapshot policy, in virtual time.
    controller: Controller,
    /// When its requests are hedged (learned from its endpoints' latencies at each tick).
    hedge: Option<HedgeTimer>,
}

/// One run of one strategy over one scenario.
pub(crate) struct Engine<'a> {
    scenario: &'a Scenario,
    now: u64,
    seq: u64,
    events: BinaryHeap<Entry>,
    rng: FastRng,
    servers: Vec<Server>,
    /// Server index by endpoint key hash, sorted by hash (binary search per attempt).
    by_hash: Vec<(u64, u32)>,
    lbs: Vec<Lb>,
    clients: Vec<Client>,
    requests: Slab<Request>,
    attempts: Slab<Attempt>,
    keys: Vec<String>,
    zipf: Option<Zipf>,
    next_arrival: Option<u64>,
    issued: u64,
    done: u64,
    total: u64,
    burst_on: bool,
    /// Every request's attempt policy (the scenario's retries, timeout and deadline).
    policy: AttemptPolicy,
    /// Hedging of this run (`NAME+hedge`): each balancer's timer.
    hedge: Option<HedgeDelay>,
    /// Virtual time as `Attempts` reads it, set before each decision.
    clock: (Clock, Arc<ManualClock>),
    watch: usize,
    sample_every: u64,
    oracle: Option<Arc<crate::oracle::Queues>>,
    /// Recorded arrival times to replay (ns from the start), instead of drawing them.
    pub(super) arrivals: Option<Box<[u64]>>,
    pub(crate) metrics: Collector,
}

impl<'a> Engine<'a> {
    pub(crate) fn new(
        scenario: &'a Scenario,
        make: &dyn Fn() -> BoxStrategy,
        oracle: Option<Arc<crate::oracle::Queues>>,
        record: Option<&lbkit_trace::Recorder>,
        requests: u64,
        seed: u64,
    ) -> Result<Engine<'a>, String> {
        let names = scenario.server_names();
        let (servers, by_hash) = servers_of(scenario, &names)?;
        let w = &scenario.workload;
        let clock = Clock::manual(Timestamp::ZERO);
        let (lbs, clients) = balancers(scenario, make, record, &clock.0);
        let n_lbs = lbs.len();
        let watch = watched(scenario, &names, &servers);
        let (keys, zipf) = keys_of(w);
        let arrivals = w
            .arrivals
            .as_ref()
            .map(|file| crate::dist::read_arrivals(file))
            .transpose()?;
        let requests = arrivals
            .as_ref()
            .map_or(requests, |a| requests.min(a.len() as u64));
        let expected_ns = expected_ns(w, arrivals.as_deref(), requests);
        Ok(Engine {
            scenario,
            now: 0,
            seq: 0,
            events: BinaryHeap::new(),
            rng: FastRng::seed_from_u64(seed),
            metrics: Collector::new(servers.len(), n_lbs),
            servers,
            by_hash,
            lbs,
            clients,
            requests: Slab::default(),
            attempts: Slab::default(),
            keys,
            zipf,
            next_arrival: None,
            issued: 0,
            done: 0,
            total: requests,
            burst_on: true,
            policy: attempt_policy(w),
            hedge: None,
            clock,
            watch,
            sample_every: ((expected_ns / 200.0) as u64).max(1_000_000),
            oracle,
            arrivals,
        })
    }

    /// Hedge every request whose first attempt has no answer after `delay` (`None`: never).
    pub(crate) fn with_hedge(mut self, delay: Option<HedgeDelay>) -> Self {
        self.hedge = delay;
        for lb in &mut self.lbs {
            lb.hedge = delay.map(HedgeTimer::new);
        }
        self
    }

    /// Run the scenario's stages in every client's balancer, with `aperture` (a label's
    /// `+aperture=N` or `+subset=N`) over them; an aperture without coordinates takes each
    /// client's own place, and random ones shuffle with `seed` mixed with the client's index.
    pub(crate) fn with_stages(
        mut self,
        aperture: Option<(lbkit_core::stage::ApertureMode, u32)>,
        seed: u64,
    ) -> Self {
        use lbkit_core::stage::{Aperture, Coordinates};
        let Ok(base) = self.scenario.stages.build() else {
            return self; // validated with the scenario
        };
        if base.is_default() && aperture.is_none() {
            return self;
        }
        let count = u32::try_from(self.lbs.len()).unwrap_or(u32::MAX);
        for (i, lb) in self.lbs.iter_mut().enumerate() {
            let mut stages = base.clone();
            if let Some((mode, size)) = aperture {
                stages.aperture = Some(Aperture {
                    size,
                    mode,
                    coordinates: None,
                    seed,
                });
            }
            if let Some(a) = &mut stages.aperture {
                let index = u32::try_from(i).unwrap_or(u32::MAX);
                a.coordinates = a.coordinates.or(Some(Coordinates { index, count }));
                a.seed = seed;
            }
            lb.balancer.set_stages(stages, Timestamp::ZERO);
        }
        self
    }

    /// The server behind an endpoint.
    #[inline]
    fn server_of(&self, endpoint: &lbkit_core::Endpoint) -> u32 {
        let h = endpoint.key_hash();
        let i = self.by_hash.partition_point(|&(k, _)| k < h);
        self.by_hash[i].1
    }

    /// The index of the server whose queue is plotted.
    pub(crate) fn watched(&self) -> usize {
        self.watch
    }

    /// Tell the oracle the expected delay of `server` after a change on it.
    pub(super) fn touched(&self, server: usize) {
        if let Some(q) = &self.oracle {
            let delay = self.servers[server].expected_delay(self.now);
            q.delay[server].store(delay, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The addresses of the servers, in order.
    pub(crate) fn addresses(scenario: &Scenario) -> Vec<String> {
        (0..scenario.server_names().len())
            .map(Server::address_of)
            .collect()
    }

    fn at(&mut self, t: u64, ev: Ev) {
        if ev == Ev::Arrival {
            // Open-loop arrivals come one at a time: kept beside the heap, merged in `next`.
            self.next_arrival = Some(self.next_arrival.map_or(t, |a| a.min(t)));
            return;
        }
        self.seq += 1;
        self.events.push(Entry {
            key: u128::from(t) << 64 | u128::from(self.seq),
            ev,
        });
    }

    /// Run to the end; `progress` hears the number of requests finished now and then.
    pub(crate) fn run(mut self, label: String, progress: &mut dyn FnMut(u64)) -> StrategyResult {
        self.start();
        let step = (self.total / 100).max(1);
        let mut reported = 0;
        while let Some((t, ev)) = self.next() {
            self.now = t;
            self.handle(ev);
            let done = self.finished();
            if done >= reported + step {
                reported = done;
                progress(done);
            }
            if done == self.total {
                break;
            }
        }
        let names = self.scenario.server_names();
        let peak = self.requests.capacity();
        self.metrics.finish(label, &names, peak)
    }

    /// The next event: the earlier of the pending arrival and the heap's top (arrivals first on
    /// a tie, as they were scheduled before anything they cause).
    fn next(&mut self) -> Option<(u64, Ev)> {
        let heap_t = self.events.peek().map(|e| (e.key >> 64) as u64);
        match (self.next_arrival, heap_t) {
            (Some(a), h) if h.is_none_or(|h| a <= h) => {
                self.next_arrival = None;
                Some((a, Ev::Arrival))
            }
            _ => self.events.pop().map(|e| ((e.key >> 64) as u64, e.ev)),
        }
    }

    fn finished(&self) -> u64 {
        self.done
    }

    fn start(&mut self) {
        for i in 0..self.servers.len() {
            let at = self.servers[i].join_at;
            self.at(at, Ev::Join(i as u32));
            if let Some(dt) = self.servers[i].next_stall(&mut self.rng) {
                self.at(at + dt, Ev::Stall(i as u32));
            }
        }
        for (i, e) in self.scenario.events.iter().enumerate() {
            self.at((e.at_ms * 1e6) as u64, Ev::Change(i as u32));
        }
        let w = &self.scenario.workload;
        match w.kind {
            WorkloadKind::Open if self.arrivals.is_some() => {
                let first = self.arrivals.as_ref().and_then(|a| a.first()).copied();
                self.at(first.unwrap_or(0).max(1), Ev::Arrival);
            }
            WorkloadKind::Open => {
                self.at(1, Ev::Arrival);
                if w.pattern == Pattern::Bursty {
                    let on = exponential(&mut self.rng, w.burst_on_ms * 1e6) as u64;
                    self.at(on.max(1), Ev::BurstToggle);
                }
            }
            WorkloadKind::Closed => {
                for c in 0..w.clients {
                    let jitter = self.rng.below(1_000_000);
                    self.at(1 + jitter, Ev::ClientReady(c));
                }
            }
        }
        self.at(TICK, Ev::Tick);
        self.at(self.report_every(), Ev::Report);
        self.at(10_000_000_000, Ev::Outlier);
        self.at(self.sample_every, Ev::Sample);
    }
}
