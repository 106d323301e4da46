//! Issue 3: per-pick cost of lbkit's load-aware strategies at 10, 1 000 and 100 000 endpoints,
//! in the same process run as tower's p2c `Balance` over `PeakEwma` services.
//!
//! Every input (snapshot with statistics, picker, balancer, RNG, tower balancer with its calls in
//! flight) is built outside the timed closure. The lbkit snapshots hold one latency sample per
//! endpoint (peak EWMA and windowed mean), 1–3 calls in flight on every 7th endpoint and two load
//! reports per endpoint 60 s apart (`lbkit_bench::loaded_snapshot`); pickers are prepared at
//! `STATS_NOW` and pick at `PICK_NOW` = `STATS_NOW` + 500 ms.
//!
//! Groups:
//! * `pick`: bare `Picker::pick` (what the ≤ 30 ns target is about);
//! * `dispatch`: a whole call, for the like-for-like comparison with tower: lbkit
//!   `Balancer::pick` + `CallGuard::finish_at(Success)`, tower `poll_ready` + `call` + one poll
//!   of the (immediately ready) response future;
//! * `floor`: two random endpoints' in-flight counts read through the snapshot's endpoints, the
//!   memory traffic a p2c over lbkit's endpoint layout paid before the hot statistics moved to
//!   dense lines; `floor_live`: the same through `Snapshot::live`, what pickers read now.
//!
//! Every group fixes `sample_size = 10_000` (100 samples), as `pick.rs` does.

use std::convert::Infallible;
use std::future::{ready, Future, Ready};
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use divan::{black_box, Bencher};
use lbkit_bench::{in_flight_of, loaded_snapshot, Weights, N, PICK_NOW, STATS_NOW};
use lbkit_core::{
    Availability, Balancer, EndpointIdx, FastRng, Outcome, PickContext, Picker, Snapshot, Strategy,
};
use lbkit_strategy::{
    Adaptive, AdaptiveChoice, AdaptiveConfig, BestAvailable, LeastActive, LeastRequest, P2cEwma,
    P2cLeastLoaded, ShortestResponse,
};

fn main() {
    divan::main();
}

/// One pick per iteration at `PICK_NOW`, picker prepared at `STATS_NOW`, caller-owned RNG.
fn bench_pick<S: Strategy>(bencher: Bencher<'_, '_>, strategy: S, snap: Arc<Snapshot>) {
    let picker = strategy.prepare(&snap, STATS_NOW);
    let mut rng = FastRng::seed_from_u64(1);
    // Not timed: the picker must pick.
    assert!(picker
        .pick(&mut PickContext::new(PICK_NOW, &mut rng))
        .is_ok());
    bencher.bench_local(|| {
        let mut cx = PickContext::new(PICK_NOW, &mut rng);
        black_box(&picker).pick(&mut cx)
    });
}

/// Single thread, `pick` only.
#[divan::bench_group(sample_size = 10_000)]
mod pick {
    use super::*;

    /// Exact scan (n ≤ 16) or the less active of two weighted samples.
    #[divan::bench(args = N)]
    fn least_active(b: Bencher, n: usize) {
        bench_pick(b, LeastActive, loaded_snapshot(n, Weights::Uniform));
    }

    /// Equal weights: best of 2 random choices by in-flight.
    #[divan::bench(args = N)]
    fn least_request_equal(b: Bencher, n: usize) {
        bench_pick(
            b,
            LeastRequest::default(),
            loaded_snapshot(n, Weights::Uniform),
        );
    }

    /// Unequal (skewed) weights: alias-table draw accepted with probability 1/(in_flight+1).
    #[divan::bench(args = N)]
    fn least_request_unequal(b: Bencher, n: usize) {
        bench_pick(
            b,
            LeastRequest::default(),
            loaded_snapshot(n, Weights::Skewed),
        );
    }

    #[divan::bench(args = N)]
    fn p2c_least_loaded(b: Bencher, n: usize) {
        bench_pick(b, P2cLeastLoaded, loaded_snapshot(n, Weights::Uniform));
    }

    #[divan::bench(args = N)]
    fn p2c_ewma(b: Bencher, n: usize) {
        bench_pick(b, P2cEwma::default(), loaded_snapshot(n, Weights::Uniform));
    }

    /// Windowed mean × (in flight + 1); exact scan (n ≤ 16) or two weighted samples.
    #[divan::bench(args = N)]
    fn shortest_response(b: Bencher, n: usize) {
        bench_pick(
            b,
            ShortestResponse::default(),
            loaded_snapshot(n, Weights::Uniform),
        );
    }

    /// Breaker check + in-flight; exact scan (n ≤ 16) or two samples.
    #[divan::bench(args = N)]
    fn best_available(b: Bencher, n: usize) {
        bench_pick(
            b,
            BestAvailable::default(),
            loaded_snapshot(n, Weights::Uniform),
        );
    }

    /// Weights from the load reports (blackout passed), picked by two choices on peak EWMA ×
    /// in flight scaled by the weights (the default choice since issue 41).
    #[divan::bench(args = N)]
    fn adaptive(b: Bencher, n: usize) {
        bench_pick(b, Adaptive::default(), loaded_snapshot(n, Weights::Uniform));
    }

    /// The same weights scheduled by smooth weighted round robin (`choice = "wrr"`, gRPC's).
    #[divan::bench(args = N)]
    fn adaptive_wrr(b: Bencher, n: usize) {
        let wrr = AdaptiveConfig {
            choice: AdaptiveChoice::Wrr,
            ..AdaptiveConfig::default()
        };
        bench_pick(b, Adaptive::new(wrr), loaded_snapshot(n, Weights::Uniform));
    }
}

type Handler = fn(u32) -> Ready<Result<u32, Infallible>>;

fn echo(req: u32) -> Ready<Result<u32, Infallible>> {
    ready(Ok(req))
}

/// Calls in flight over all `n` endpoints of [`loaded_snapshot`] (Σ [`in_flight_of`]), so the
/// tower balancer carries as many unfinished calls as the lbkit snapshot.
fn total_in_flight(n: usize) -> usize {
    (0..n).map(|i| in_flight_of(i) as usize).sum()
}

/// A whole call through a balancer.
#[divan::bench_group(sample_size = 10_000)]
mod dispatch {
    use super::*;
    use tower::balance::p2c::Balance;
    use tower::discover::ServiceList;
    use tower::load::{CompleteOnResponse, PeakEwma, PendingRequests};
    use tower::{service_fn, Service};

    /// tower `p2c::Balance` over `ServiceList` of n `PeakEwma<service_fn(echo)>` (default RTT
    /// 30 ms and decay 10 s, lbkit's defaults). One iteration, as `pick.rs`'s `tower_p2c`:
    /// `poll_ready` (discover poll, two random indices, two `load()` = two `Mutex` locks, two
    /// `Instant::now` and two `exp`, the chosen service's `poll_ready`) + `call` (a `Handle` with
    /// `Instant::now` and an `Arc` clone) + one poll of the ready future (the handle's drop locks
    /// the estimate and records the RTT). Before timing: one dispatch that inserts all n
    /// services, then as many dispatched-but-unfinished calls as the lbkit snapshot has in
    /// flight (their futures are held, so their `Handle`s count as pending).
    #[divan::bench(args = N)]
    fn tower_p2c_peak_ewma(b: Bencher, n: usize) {
        let services = (0..n)
            .map(|_| {
                PeakEwma::new(
                    service_fn(echo as Handler),
                    Duration::from_millis(30),
                    Duration::from_secs(10).as_nanos() as f64,
                    CompleteOnResponse::default(),
                )
            })
            .collect();
        bench_tower(b, n, services);
    }

    /// The same over `PendingRequests` (load = requests in flight): `pick.rs`'s `tower_p2c`,
    /// repeated in this run for context, with the same held calls in flight.
    #[divan::bench(args = N)]
    fn tower_p2c_pending_requests(b: Bencher, n: usize) {
        let services = (0..n)
            .map(|_| {
                PendingRequests::new(service_fn(echo as Handler), CompleteOnResponse::default())
            })
            .collect();
        bench_tower(b, n, services);
    }

    /// One tower p2c dispatch per iteration over `services`, after as many held calls as the
    /// lbkit snapshot of `n` endpoints has in flight.
    fn bench_tower<S>(b: Bencher<'_, '_>, n: usize, services: Vec<S>)
    where
        S: tower::Service<u32, Response = u32> + tower::load::Load,
        S::Error: Into<tower::BoxError>,
        S::Metric: std::fmt::Debug,
    {
        let mut balance: Balance<_, u32> = Balance::new(ServiceList::new(services));
        let mut cx = Context::from_waker(Waker::noop());
        let ready =
            |balance: &mut Balance<_, u32>, cx: &mut Context<'_>| match balance.poll_ready(cx) {
                Poll::Ready(Ok(())) => {}
                _ => unreachable!("all services are always ready"),
            };
        ready(&mut balance, &mut cx);
        let in_flight: Vec<_> = (0..total_in_flight(n))
            .map(|_| {
                ready(&mut balance, &mut cx);
                balance.call(7)
            })
            .collect();
        let mut dispatch = move || -> u32 {
            ready(&mut balance, &mut cx);
            let fut = pin!(balance.call(black_box(7)));
            match fut.poll(&mut cx) {
                Poll::Ready(Ok(v)) => v,
                _ => unreachable!("the echo future is immediately ready"),
            }
        };
        assert_eq!(dispatch(), 7);
        b.bench_local(dispatch);
        drop(in_flight);
    }

    /// lbkit `Balancer::pick` + `CallGuard::finish_at(Success, PICK_NOW)`, default availability
    /// (circuit breaker on): ArcSwap load, availability check, the strategy's pick, endpoint
    /// clone, in-flight increment; then in-flight decrement, outcome, windowed mean and peak
    /// EWMA updated. Balancer prepared at `STATS_NOW`.
    fn bench_balancer<S: Strategy>(b: Bencher<'_, '_>, strategy: S, n: usize) {
        let balancer = Balancer::new(strategy, loaded_snapshot(n, Weights::Uniform), STATS_NOW)
            .with_availability(Availability::default());
        let mut rng = FastRng::seed_from_u64(1);
        b.bench_local(|| {
            let mut cx = PickContext::new(PICK_NOW, &mut rng);
            let guard = black_box(&balancer)
                .pick(&mut cx)
                .expect("endpoints are eligible");
            guard.finish_at(Outcome::Success, PICK_NOW);
        });
    }

    #[divan::bench(args = N)]
    fn lbkit_balancer_p2c_ewma(b: Bencher, n: usize) {
        bench_balancer(b, P2cEwma::default(), n);
    }

    #[divan::bench(args = N)]
    fn lbkit_balancer_p2c_least_loaded(b: Bencher, n: usize) {
        bench_balancer(b, P2cLeastLoaded, n);
    }
}

/// One floor iteration: two caller-owned `FastRng::index(n)` draws, `cost` of both (the second
/// first), the cheaper index returned. No distinctness.
fn bench_floor<C: PartialOrd>(
    b: Bencher<'_, '_>,
    n: usize,
    cost: impl Fn(&Snapshot, EndpointIdx) -> C,
) {
    let snap = loaded_snapshot(n, Weights::Uniform);
    let mut rng = FastRng::seed_from_u64(1);
    b.bench_local(|| {
        let s = black_box(&snap);
        let (i, j) = (
            EndpointIdx::new(rng.index(n)),
            EndpointIdx::new(rng.index(n)),
        );
        if cost(s, j) < cost(s, i) {
            j
        } else {
            i
        }
    });
}

/// What a p2c pick over lbkit's endpoint layout must at least pay.
#[divan::bench_group(sample_size = 10_000)]
mod floor {
    use super::*;

    /// `snapshot.endpoint(i).stats().in_flight()` for both (slice of `Endpoint` →
    /// `Arc<EndpointInner>` → `Arc<EndpointStats>` → atomic load).
    #[divan::bench(args = N)]
    fn two_in_flight_reads(b: Bencher, n: usize) {
        bench_floor(b, n, |s, k| s.endpoint(k).stats().in_flight());
    }

    /// The same reads plus the windowed mean of both (`avg_response_at` over 30 s: the 12
    /// slots' epochs, then sums and counts of the live ones, one `u64` division), the inputs of
    /// `shortest-response`'s estimate before it kept per-prepare offsets.
    #[divan::bench(args = N)]
    fn two_window_reads(b: Bencher, n: usize) {
        let window = Duration::from_secs(30);
        bench_floor(b, n, |s, k| {
            let st = s.endpoint(k).stats();
            let avg = st
                .avg_response_at(PICK_NOW, window)
                .map_or(0.0, |d| d.as_nanos() as f64);
            avg * (f64::from(st.in_flight()) + 1.0)
        });
    }

    /// The same reads plus the peak-EWMA projection of both (`ewma_ns_at`: two atomic loads and
    /// one `exp` each).
    #[divan::bench(args = N)]
    fn two_ewma_reads(b: Bencher, n: usize) {
        bench_floor(b, n, |s, k| {
            let st = s.endpoint(k).stats();
            st.ewma_ns_at(PICK_NOW).unwrap_or(3e7) * (f64::from(st.in_flight()) + 1.0)
        });
    }
}

/// The same floors over the dense hot lines (`Snapshot::live`): what the pickers read since the
/// statistics were split (one array of line references, one 64-byte line per candidate).
#[divan::bench_group(sample_size = 10_000)]
mod floor_live {
    use super::*;

    /// `snapshot.live(i).in_flight()` for both.
    #[divan::bench(args = N)]
    fn two_in_flight_reads(b: Bencher, n: usize) {
        bench_floor(b, n, |s, k| s.live(k).in_flight());
    }

    /// In-flight and the peak-EWMA projection of both from their lines.
    #[divan::bench(args = N)]
    fn two_ewma_reads(b: Bencher, n: usize) {
        bench_floor(b, n, |s, k| {
            let l = s.live(k);
            l.ewma_ns_at(PICK_NOW).unwrap_or(3e7) * (f64::from(l.in_flight()) + 1.0)
        });
    }
}

/// `Adaptive::prepare` over the loaded snapshot at `STATS_NOW`: the weight computation from the
/// load reports and the smooth-weighted-round-robin schedule. A balancer re-runs it every
/// `period` (1 s by default, `Strategy::refresh_interval`) through `Balancer::tick`. Medians of
/// 30 single calls; the picker is dropped by divan outside the timing.
mod prepare {
    use super::*;

    #[divan::bench(args = N, sample_count = 30)]
    fn adaptive(b: Bencher, n: usize) {
        let snap = loaded_snapshot(n, Weights::Uniform);
        let strategy = Adaptive::default();
        b.bench_local(|| black_box(&strategy).prepare(black_box(&snap), STATS_NOW));
    }

    /// For comparison: the O(n) prepare of the two-sample strategies (`Candidates::new`).
    #[divan::bench(args = N, sample_count = 30)]
    fn least_active(b: Bencher, n: usize) {
        let snap = loaded_snapshot(n, Weights::Uniform);
        b.bench_local(|| black_box(&LeastActive).prepare(black_box(&snap), STATS_NOW));
    }
}
