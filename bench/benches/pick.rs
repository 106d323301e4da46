//! Per-pick cost of lbkit's strategies next to two floors and two reference crates, all in one
//! process run so the ratios compare like with like on a noisy machine.
//!
//! Every input (snapshot, picker, balancer, RNG, reference load balancer) is built outside the
//! timed closure; the closure is one pick (or one pick + finish, or one reference dispatch).
//!
//! Every group fixes `sample_size = 10_000` iterations per sample (100 samples): divan's
//! automatic sizing keeps a sample size of 1 whenever the very first, cold call takes more than
//! 100× the timer precision, which left several rows timing single 20 ns-quantised calls.
//! `--sample-size` on the command line still overrides it.

use std::cell::RefCell;
use std::convert::Infallible;
use std::future::{ready, Future, Ready};
use std::pin::pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use divan::{black_box, Bencher};
use lbkit_bench::{
    index_slice, snapshot, snapshot_with_response_times, xorshift_index, Weights, N, STATS_NOW,
};
use lbkit_core::{
    Availability, Balancer, FastRng, Outcome, PickContext, Picker, Snapshot, Strategy, Timestamp,
};
use lbkit_strategy::{
    Random, RoundRobin, SmoothWeightedRoundRobin, StickyRoundRobin, WeightedRandom,
    WeightedResponseTime,
};

fn main() {
    divan::main();
}

/// One pick per iteration with a caller-owned RNG (the intended use: one RNG per task).
fn bench_pick<S: Strategy>(
    bencher: Bencher<'_, '_>,
    strategy: S,
    snap: Arc<Snapshot>,
    now: Timestamp,
) {
    let picker = strategy.prepare(&snap, now);
    let mut rng = FastRng::seed_from_u64(1);
    bencher.bench_local(|| {
        let mut cx = PickContext::new(now, &mut rng);
        black_box(&picker).pick(&mut cx)
    });
}

/// Single thread, `pick` only (no balancer, no availability filter).
#[divan::bench_group(sample_size = 10_000)]
mod pick {
    use super::*;

    #[divan::bench(args = N)]
    fn random(b: Bencher, n: usize) {
        bench_pick(b, Random, snapshot(n, Weights::Uniform), Timestamp::ZERO);
    }

    #[divan::bench(args = N)]
    fn round_robin(b: Bencher, n: usize) {
        bench_pick(
            b,
            RoundRobin::new(),
            snapshot(n, Weights::Uniform),
            Timestamp::ZERO,
        );
    }

    #[divan::bench(args = N)]
    fn sticky_round_robin(b: Bencher, n: usize) {
        bench_pick(
            b,
            StickyRoundRobin::new(3),
            snapshot(n, Weights::Uniform),
            Timestamp::ZERO,
        );
    }

    #[divan::bench(args = N)]
    fn weighted_random_uniform(b: Bencher, n: usize) {
        bench_pick(
            b,
            WeightedRandom,
            snapshot(n, Weights::Uniform),
            Timestamp::ZERO,
        );
    }

    #[divan::bench(args = N)]
    fn weighted_random_skewed(b: Bencher, n: usize) {
        bench_pick(
            b,
            WeightedRandom,
            snapshot(n, Weights::Skewed),
            Timestamp::ZERO,
        );
    }

    #[divan::bench(args = N)]
    fn weighted_round_robin_uniform(b: Bencher, n: usize) {
        bench_pick(
            b,
            SmoothWeightedRoundRobin::new(),
            snapshot(n, Weights::Uniform),
            Timestamp::ZERO,
        );
    }

    #[divan::bench(args = N)]
    fn weighted_round_robin_skewed(b: Bencher, n: usize) {
        bench_pick(
            b,
            SmoothWeightedRoundRobin::new(),
            snapshot(n, Weights::Skewed),
            Timestamp::ZERO,
        );
    }

    /// No statistics recorded: the strategy's round-robin fallback.
    #[divan::bench(args = N)]
    fn weighted_response_time_no_stats(b: Bencher, n: usize) {
        bench_pick(
            b,
            WeightedResponseTime::default(),
            snapshot(n, Weights::Uniform),
            Timestamp::ZERO,
        );
    }

    /// One recorded response time per endpoint (0.5–10.5 ms), prepared at that time: the
    /// weighted (alias-table) path.
    #[divan::bench(args = N)]
    fn weighted_response_time_with_stats(b: Bencher, n: usize) {
        bench_pick(
            b,
            WeightedResponseTime::default(),
            snapshot_with_response_times(n),
            STATS_NOW,
        );
    }
}

/// What any strategy of the kind must at least pay.
#[divan::bench_group(sample_size = 10_000)]
mod floor {
    use super::*;

    /// Cache-line aligned, like lbkit's `CachePadded` counter.
    #[repr(align(128))]
    pub(crate) struct Padded(pub(crate) AtomicUsize);

    /// Shared `AtomicUsize::fetch_add(1, Relaxed) % n`, then a read of a `[u32]` of length n.
    #[divan::bench(args = N)]
    fn atomic_mod(b: Bencher, n: usize) {
        let slice = index_slice(n);
        let counter = Padded(AtomicUsize::new(0));
        b.bench_local(|| {
            let c = black_box(&counter).0.fetch_add(1, Relaxed);
            black_box(&slice)[c % n]
        });
    }

    /// Thread-local xorshift64, multiply-shift to `0..n`, then a read of a `[u32]` of length n.
    #[divan::bench(args = N)]
    fn xorshift_tls(b: Bencher, n: usize) {
        let slice = index_slice(n);
        b.bench_local(|| black_box(&slice)[xorshift_index(black_box(n))]);
    }

    /// Context only: the caller-owned `FastRng::index` lbkit's random strategies use (wyrand,
    /// unbiased range), then a read of a `[u32]` of length n.
    #[divan::bench(args = N)]
    fn fastrng_local(b: Bencher, n: usize) {
        let slice = index_slice(n);
        let mut rng = FastRng::seed_from_u64(1);
        b.bench_local(|| black_box(&slice)[rng.index(black_box(n))]);
    }
}

/// Reference crates, same process run.
#[divan::bench_group(sample_size = 10_000)]
mod reference {
    use super::*;
    use pingora_load_balancing::{selection, LoadBalancer};

    /// Pingora's `Weighted` selector indexes backends with a `u16`: `build` asserts at most
    /// 65 535 backends, so 100 000 cannot be measured and 65 535 stands in for it.
    const PINGORA_N: [usize; 3] = [10, 1_000, 65_535];

    fn pingora<S>(n: usize) -> LoadBalancer<S>
    where
        S: pingora_load_balancing::selection::BackendSelection + 'static,
        S::Iter: pingora_load_balancing::selection::BackendIter,
    {
        let addrs: Vec<String> = (0..n).map(|i| format!("127.0.0.1:{}", i + 1)).collect();
        LoadBalancer::try_from_iter(addrs.iter().map(String::as_str)).expect("static backends")
    }

    /// `LoadBalancer<RoundRobin>::select(b"", 256)`; the returned `Backend` clone is dropped
    /// inside the timed closure (its drop is part of a real call's cost).
    #[divan::bench(args = PINGORA_N)]
    fn pingora_round_robin(b: Bencher, n: usize) {
        let lb = pingora::<selection::RoundRobin>(n);
        b.bench_local(|| lb.select(black_box(b""), 256).map(|be| be.weight));
    }

    /// `LoadBalancer<Random>::select(b"", 256)` (rand's thread-local RNG).
    #[divan::bench(args = PINGORA_N)]
    fn pingora_random(b: Bencher, n: usize) {
        let lb = pingora::<selection::Random>(n);
        b.bench_local(|| lb.select(black_box(b""), 256).map(|be| be.weight));
    }

    type Handler = fn(u32) -> Ready<Result<u32, Infallible>>;

    fn echo(req: u32) -> Ready<Result<u32, Infallible>> {
        ready(Ok(req))
    }

    /// tower `p2c::Balance` over n always-ready `service_fn`s wrapped in
    /// `PendingRequests` (load = requests in flight). One iteration = `poll_ready` (discover
    /// poll, pending promotion, two random indices, two `load()` reads, the chosen service's
    /// `poll_ready`) + `call` + one poll of the returned, immediately ready future (which
    /// releases the in-flight handle). No runtime: a no-op waker; nothing ever pends.
    #[divan::bench(args = N)]
    fn tower_p2c(b: Bencher, n: usize) {
        use tower::balance::p2c::Balance;
        use tower::discover::ServiceList;
        use tower::load::{CompleteOnResponse, PendingRequests};
        use tower::{service_fn, Service};

        let services: Vec<_> = (0..n)
            .map(|_| {
                PendingRequests::new(service_fn(echo as Handler), CompleteOnResponse::default())
            })
            .collect();
        let mut balance: Balance<_, u32> = Balance::new(ServiceList::new(services));
        let mut cx = Context::from_waker(Waker::noop());
        let mut dispatch = move || -> u32 {
            match balance.poll_ready(&mut cx) {
                Poll::Ready(Ok(())) => {}
                _ => unreachable!("all services are always ready"),
            }
            let fut = pin!(balance.call(black_box(7)));
            match fut.poll(&mut cx) {
                Poll::Ready(Ok(v)) => v,
                _ => unreachable!("the echo future is immediately ready"),
            }
        };
        // First dispatch: discovery inserts and readies all n services (not timed).
        assert_eq!(dispatch(), 7);
        b.bench_local(dispatch);
    }
}

/// One and two threads on the same picker. Samples of 10⁶ picks (5–25 ms): divan starts the
/// threads of a sample at a barrier, and with short samples the two threads' timed windows
/// barely overlap on a 2-core VM (wake-up latency), which hides contention.
/// Each thread owns its RNG (a thread-local, reached
/// through a `RefCell` in both the 1- and 2-thread runs, so the rows compare with each other;
/// compare the `pick` group only with the 1-thread rows here with that in mind).
#[divan::bench_group(sample_size = 1_000_000)]
mod threads {
    use super::*;

    static SEED: AtomicU64 = AtomicU64::new(1);

    thread_local! {
        static RNG: RefCell<FastRng> = RefCell::new(FastRng::seed_from_u64(SEED.fetch_add(1, Relaxed)));
    }

    fn bench_shared<S: Strategy>(b: Bencher<'_, '_>, strategy: S, snap: Arc<Snapshot>) {
        let picker = strategy.prepare(&snap, Timestamp::ZERO);
        b.bench(|| {
            RNG.with(|r| {
                let mut rng = r.borrow_mut();
                let mut cx = PickContext::new(Timestamp::ZERO, &mut rng);
                black_box(&picker).pick(&mut cx)
            })
        });
    }

    #[divan::bench(args = N, threads = [1, 2])]
    fn round_robin(b: Bencher, n: usize) {
        bench_shared(b, RoundRobin::new(), snapshot(n, Weights::Uniform));
    }

    #[divan::bench(args = N, threads = [1, 2])]
    fn sticky_round_robin(b: Bencher, n: usize) {
        bench_shared(b, StickyRoundRobin::new(3), snapshot(n, Weights::Uniform));
    }

    #[divan::bench(args = N, threads = [1, 2])]
    fn weighted_round_robin_skewed(b: Bencher, n: usize) {
        bench_shared(
            b,
            SmoothWeightedRoundRobin::new(),
            snapshot(n, Weights::Skewed),
        );
    }

    #[divan::bench(args = N, threads = [1, 2])]
    fn random(b: Bencher, n: usize) {
        bench_shared(b, Random, snapshot(n, Weights::Uniform));
    }

    #[divan::bench(args = N, threads = [1, 2])]
    fn weighted_random_skewed(b: Bencher, n: usize) {
        bench_shared(b, WeightedRandom, snapshot(n, Weights::Skewed));
    }

    /// The atomic floor with a counter shared by both threads.
    #[divan::bench(args = N, threads = [1, 2])]
    fn floor_atomic_mod(b: Bencher, n: usize) {
        let slice = index_slice(n);
        let counter = super::floor::Padded(AtomicUsize::new(0));
        b.bench(|| {
            let c = black_box(&counter).0.fetch_add(1, Relaxed);
            black_box(&slice)[c % n]
        });
    }
}

/// `Balancer::pick` + `CallGuard::finish_at(Success)`: ArcSwap load, select (with or without the
/// availability filter), endpoint clone, in-flight increment, then the outcome recorded into the
/// endpoint's statistics.
#[divan::bench_group(sample_size = 10_000)]
mod balancer {
    use super::*;

    const BN: [usize; 2] = [10, 100_000];

    fn bench_balancer<S: Strategy>(
        b: Bencher<'_, '_>,
        strategy: S,
        snap: Arc<Snapshot>,
        availability: Availability,
    ) {
        let now = Timestamp::ZERO;
        let balancer = Balancer::new(strategy, snap, now).with_availability(availability);
        let mut rng = FastRng::seed_from_u64(1);
        b.bench_local(|| {
            let mut cx = PickContext::new(now, &mut rng);
            let guard = black_box(&balancer)
                .pick(&mut cx)
                .expect("endpoints are eligible");
            guard.finish_at(Outcome::Success, now);
        });
    }

    #[divan::bench(args = BN)]
    fn round_robin_filter_off(b: Bencher, n: usize) {
        bench_balancer(
            b,
            RoundRobin::new(),
            snapshot(n, Weights::Uniform),
            Availability::OFF,
        );
    }

    /// One endpoint's 64-byte line of counters in the two floors below (`window` is only the
    /// designed floor's).
    #[derive(Default)]
    #[repr(align(64))]
    struct Line {
        in_flight: AtomicU64,
        successes: AtomicU64,
        success_nanos: AtomicU64,
        bucket: AtomicU64,
        window: AtomicU64,
        ewma: AtomicU64,
    }

    impl Line {
        fn many(n: usize) -> Vec<Arc<Line>> {
            (0..n).map(|_| Arc::default()).collect()
        }

        /// The call in flight, then its success counted: the five read-modify-writes both
        /// floors do on the line.
        #[inline(always)]
        fn call_and_count(&self) {
            self.in_flight.fetch_add(1, Relaxed);
            // ... the call ...
            self.in_flight.fetch_sub(1, Relaxed);
            self.successes.fetch_add(1, Relaxed);
            self.success_nanos.fetch_add(black_box(1_000), Relaxed);
            self.bucket.fetch_add(1, Relaxed);
        }
    }

    /// The floor of a round-robin pick and its successful outcome: the atomic read-modify-writes
    /// no implementation can skip, on the same kind of layout (a padded shared counter; per
    /// endpoint, a reference count keeping its statistics alive while the call is out and one
    /// 64-byte line of counters). Eight: the strategy's counter; the reference count up and
    /// down; calls in flight up and down; successes, their latency sum and the latency
    /// histogram's bucket; plus the peak EWMA's store (a plain store when uncontended).
    #[divan::bench(args = BN)]
    fn floor_pick_and_outcome(b: Bencher, n: usize) {
        let lines = Line::many(n);
        let counter = super::floor::Padded(AtomicUsize::new(0));
        b.bench_local(|| {
            let i = black_box(&counter).0.fetch_add(1, Relaxed) % n;
            let line = black_box(&lines)[i].clone();
            line.call_and_count();
            line.ewma.store(black_box(1_000), Relaxed);
            drop(line);
        });
    }

    /// [`floor_pick_and_outcome`] plus the four locked instructions lbkit's design adds: the
    /// `ArcSwap` load of the balancer's state and its guard's release (arc-swap's debt slot,
    /// taken and paid back), the windowed mean's one-word `fetch_add`, and the peak EWMA's
    /// compare-and-swap in place of the floor's store (a lost update could be a lost peak). Twelve
    /// in all, with no other work: what `round_robin_filter_off` costs beyond this is code, not
    /// atomics.
    #[divan::bench(args = BN)]
    fn floor_pick_and_outcome_as_designed(b: Bencher, n: usize) {
        let state = arc_swap::ArcSwap::from_pointee((
            super::floor::Padded(AtomicUsize::new(0)),
            Line::many(n),
        ));
        b.bench_local(|| {
            let line = {
                let current = black_box(&state).load();
                let (counter, lines) = &**current;
                let i = counter.0.fetch_add(1, Relaxed) % n;
                lines[i].clone()
            };
            line.call_and_count();
            line.window.fetch_add(black_box((1 << 24) + 1), Relaxed);
            let seen = line.ewma.load(Relaxed);
            let next = (f64::from_bits(seen) * 0.5 + 500.0).to_bits();
            let _ = line
                .ewma
                .compare_exchange(seen, black_box(next), Relaxed, Relaxed);
            drop(line);
        });
    }

    #[divan::bench(args = BN)]
    fn round_robin_breaker_on(b: Bencher, n: usize) {
        bench_balancer(
            b,
            RoundRobin::new(),
            snapshot(n, Weights::Uniform),
            Availability::default(),
        );
    }

    #[divan::bench(args = BN)]
    fn weighted_random_skewed_filter_off(b: Bencher, n: usize) {
        bench_balancer(
            b,
            WeightedRandom,
            snapshot(n, Weights::Skewed),
            Availability::OFF,
        );
    }

    #[divan::bench(args = BN)]
    fn weighted_random_skewed_breaker_on(b: Bencher, n: usize) {
        bench_balancer(
            b,
            WeightedRandom,
            snapshot(n, Weights::Skewed),
            Availability::default(),
        );
    }
}

/// Tag routing (`lbkit_core::route`) on the full balancer path: round robin pick + finish over
/// a snapshot without tags, and over one where every tenth endpoint carries `dubbo.tag=gray`,
/// for an untagged request (the untagged set) and a `gray` one (the tag's set).
#[divan::bench_group(sample_size = 10_000)]
mod tags {
    use super::*;
    use lbkit_bench::address;
    use lbkit_core::{EndpointSpec, RequestTag};

    const BN: [usize; 2] = [10, 100_000];

    fn tagged(n: usize) -> Arc<Snapshot> {
        let specs = (0..n)
            .map(|i| {
                let s = EndpointSpec::new(address(i));
                if i % 10 == 0 {
                    s.with_meta("dubbo.tag", "gray")
                } else {
                    s
                }
            })
            .collect();
        Arc::new(Snapshot::from_specs(specs, Timestamp::ZERO))
    }

    fn bench_tag(b: Bencher<'_, '_>, snap: Arc<Snapshot>, tag: Option<RequestTag<'static>>) {
        let now = Timestamp::ZERO;
        let balancer =
            Balancer::new(RoundRobin::new(), snap, now).with_availability(Availability::OFF);
        let mut rng = FastRng::seed_from_u64(1);
        b.bench_local(|| {
            let mut cx = PickContext::new(now, &mut rng);
            cx.tag = black_box(tag);
            let guard = black_box(&balancer)
                .pick(&mut cx)
                .expect("endpoints are eligible");
            guard.finish_at(Outcome::Success, now);
        });
    }

    #[divan::bench(args = BN)]
    fn no_tags_in_snapshot(b: Bencher, n: usize) {
        bench_tag(b, snapshot(n, Weights::Uniform), None);
    }

    #[divan::bench(args = BN)]
    fn untagged_request(b: Bencher, n: usize) {
        bench_tag(b, tagged(n), None);
    }

    #[divan::bench(args = BN)]
    fn gray_request(b: Bencher, n: usize) {
        bench_tag(b, tagged(n), Some(RequestTag::new(b"gray")));
    }
}

/// Issue 17: what recording a trace adds to the pick a user pays for (round robin, pick +
/// finish), with nothing sampled, 1 % and every request, into a real recorder and file.
mod trace {
    use super::*;
    use lbkit_trace::{Recorder, TraceConfig};

    fn bench_trace(b: Bencher<'_, '_>, rate: Option<f64>) {
        let now = Timestamp::ZERO;
        let dir = std::env::temp_dir().join(format!("lbkit-bench-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let recorder = rate.map(|r| {
            let config = TraceConfig::new(dir.join("bench.lbkt"))
                .with_sample_rate(r)
                .with_max_bytes(64 << 20);
            Recorder::open(&config).expect("trace file")
        });
        let balancer = Balancer::new(RoundRobin::new(), snapshot(10, Weights::Uniform), now)
            .with_availability(Availability::OFF);
        let balancer = match &recorder {
            Some(r) => r.attach(balancer, "bench"),
            None => balancer,
        };
        let mut rng = FastRng::seed_from_u64(1);
        b.bench_local(|| {
            let guard = black_box(&balancer)
                .pick(&mut PickContext::new(now, &mut rng))
                .expect("endpoints are eligible");
            guard.finish_at(Outcome::Success, now);
        });
        if let Some(r) = &recorder {
            r.flush();
            let s = r.stats();
            eprintln!(
                "trace: {} written, {} dropped (queue full)",
                s.written, s.dropped
            );
        }
    }

    #[divan::bench(sample_count = 100, sample_size = 3200)]
    fn no_tracer(b: Bencher) {
        bench_trace(b, None);
    }

    #[divan::bench(sample_count = 100, sample_size = 3200)]
    fn sample_1_percent(b: Bencher) {
        bench_trace(b, Some(0.01));
    }

    #[divan::bench(sample_count = 100, sample_size = 3200)]
    fn sample_every_request(b: Bencher) {
        bench_trace(b, Some(1.0));
    }
}
