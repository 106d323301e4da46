//! Instruction counts under callgrind, a second opinion that does not depend on the machine's
//! load: `icount CASE N ITERS` builds the same inputs as `benches/load.rs`, `benches/hash.rs`
//! and `benches/outlier.rs`, then runs CASE `ITERS` times. Run it twice under
//! `valgrind --tool=callgrind` with ITERS = S and 2·S: the difference of the two totals over S
//! is the instruction count of one iteration (setup cancels out). For `tick`, count with
//! `--toggle-collect='*OutlierDetector*tick*'` instead and divide by ITERS.
//!
//! ```sh
//! cargo build --release --example icount
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/examples/icount p2c_ewma 1000 100000
//! ```

use std::convert::Infallible;
use std::future::{ready, Future, Ready};
use std::hint::black_box;
use std::net::SocketAddr;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use lbkit_bench::{
    address, in_flight_of, loaded_snapshot, request_keys, snapshot, snapshot_with_weight, Weights,
    KEYS, PICK_NOW, STATS_NOW,
};
use lbkit_core::{
    Availability, Balancer, FailureKind, FastRng, Outcome, PickContext, Picker, Strategy, Timestamp,
};
use lbkit_strategy::{
    Adaptive, BalanceFactor, BestAvailable, ConsistentHash, Ketama, LeastActive, LeastRequest,
    Maglev, P2cEwma, P2cLeastLoaded, Rendezvous, ShortestResponse,
};

fn load_pick<S: Strategy>(s: S, w: Weights, n: usize, iters: u64) {
    let snap = loaded_snapshot(n, w);
    let picker = s.prepare(&snap, STATS_NOW);
    let mut rng = FastRng::seed_from_u64(1);
    for _ in 0..iters {
        let mut cx = PickContext::new(PICK_NOW, &mut rng);
        let _ = black_box(black_box(&picker).pick(&mut cx));
    }
}

fn keyed<S: Strategy>(s: S, snap: std::sync::Arc<lbkit_core::Snapshot>, iters: u64) {
    let picker = s.prepare(&snap, Timestamp::ZERO);
    let keys = request_keys(KEYS, 7);
    let mut rng = FastRng::seed_from_u64(1);
    for k in 0..iters as usize {
        let mut cx = PickContext::new(Timestamp::ZERO, &mut rng);
        cx.key = Some(keys[k & (KEYS - 1)].as_bytes());
        let _ = black_box(black_box(&picker).pick(&mut cx));
    }
}

type Handler = fn(u32) -> Ready<Result<u32, Infallible>>;

fn echo(req: u32) -> Ready<Result<u32, Infallible>> {
    ready(Ok(req))
}

fn tower_peak_ewma(n: usize, iters: u64) {
    use tower::balance::p2c::Balance;
    use tower::discover::ServiceList;
    use tower::load::{CompleteOnResponse, PeakEwma};
    use tower::{service_fn, Service};
    let services: Vec<_> = (0..n)
        .map(|_| {
            PeakEwma::new(
                service_fn(echo as Handler),
                Duration::from_millis(30),
                Duration::from_secs(10).as_nanos() as f64,
                CompleteOnResponse::default(),
            )
        })
        .collect();
    let mut balance: Balance<_, u32> = Balance::new(ServiceList::new(services));
    let mut cx = Context::from_waker(Waker::noop());
    let mut ready = |balance: &mut Balance<_, u32>| {
        assert!(matches!(balance.poll_ready(&mut cx), Poll::Ready(Ok(()))));
    };
    ready(&mut balance);
    let total: usize = (0..n).map(|i| in_flight_of(i) as usize).sum();
    let held: Vec<_> = (0..total)
        .map(|_| {
            ready(&mut balance);
            balance.call(7)
        })
        .collect();
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..iters {
        assert!(matches!(balance.poll_ready(&mut cx), Poll::Ready(Ok(()))));
        let fut = pin!(balance.call(black_box(7)));
        assert!(matches!(fut.poll(&mut cx), Poll::Ready(Ok(7))));
    }
    drop(held);
}

fn balancer<S: Strategy>(s: S, n: usize, iters: u64) {
    let b = Balancer::new(s, loaded_snapshot(n, Weights::Uniform), STATS_NOW)
        .with_availability(Availability::default());
    let mut rng = FastRng::seed_from_u64(1);
    for _ in 0..iters {
        let mut cx = PickContext::new(PICK_NOW, &mut rng);
        let g = black_box(&b).pick(&mut cx).expect("eligible");
        g.finish_at(Outcome::Success, PICK_NOW);
    }
}

fn outlier_ticks(n: usize, ticks: u64) {
    use lbkit_health::{OutlierConfig, OutlierDetector};
    let snap = snapshot(n, Weights::Uniform);
    let mut det = OutlierDetector::new(OutlierConfig::default());
    let mut now = Timestamp::from_millis(1_000_000);
    // Same traffic as benches/outlier.rs; 3 untimed ticks, then `ticks` counted ones.
    for t in 0..3 + ticks {
        now = now.saturating_add(Duration::from_secs(10));
        let at = now.saturating_sub(Duration::from_secs(5));
        for (i, e) in snap.endpoints().iter().enumerate() {
            if det.ejection(e.key()).is_some() {
                continue;
            }
            let fails = if i % 97 == 3 {
                108
            } else if i % 13 == 0 {
                6
            } else {
                (i % 3) as u64
            };
            for j in 0..120u64 {
                let fail = (j * fails / 120) != ((j + 1) * fails / 120);
                let o = if fail {
                    Outcome::Failure(FailureKind::Server)
                } else {
                    Outcome::Success
                };
                e.stats().record(Duration::from_millis(2), at, o);
            }
        }
        let _ = t;
        black_box(det.tick(&snap, now));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (case, n, iters) = (
        args.get(1).map(String::as_str).unwrap_or("help"),
        args.get(2)
            .and_then(|s| s.parse::<usize>().ok())
            .unwrap_or(1000),
        args.get(3)
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(100_000),
    );
    let f = || BalanceFactor::new(1.25).expect("valid");
    let keys = request_keys(KEYS, 7);
    match case {
        "least_active" => load_pick(LeastActive, Weights::Uniform, n, iters),
        "least_request_equal" => load_pick(LeastRequest::default(), Weights::Uniform, n, iters),
        "least_request_unequal" => load_pick(LeastRequest::default(), Weights::Skewed, n, iters),
        "p2c_least_loaded" => load_pick(P2cLeastLoaded, Weights::Uniform, n, iters),
        "p2c_ewma" => load_pick(P2cEwma::default(), Weights::Uniform, n, iters),
        "shortest_response" => load_pick(ShortestResponse::default(), Weights::Uniform, n, iters),
        "best_available" => load_pick(BestAvailable::default(), Weights::Uniform, n, iters),
        "adaptive" => load_pick(Adaptive::default(), Weights::Uniform, n, iters),
        "balancer_p2c_ewma" => balancer(P2cEwma::default(), n, iters),
        "tower_p2c_peak_ewma" => tower_peak_ewma(n, iters),
        "consistent_hash" => keyed(ConsistentHash::new(), snapshot(n, Weights::Uniform), iters),
        "ketama_w1" => keyed(Ketama::new(), snapshot_with_weight(n, 1), iters),
        "ketama_w1_bounded" => keyed(
            Ketama::new().with_balance_factor(f()),
            snapshot_with_weight(n, 1),
            iters,
        ),
        "ketama_w100" => keyed(Ketama::new(), snapshot(n, Weights::Uniform), iters),
        "maglev" => keyed(Maglev::new(), snapshot(n, Weights::Uniform), iters),
        "maglev_bounded" => keyed(
            Maglev::new().with_balance_factor(f()),
            snapshot(n, Weights::Uniform),
            iters,
        ),
        "rendezvous" => keyed(Rendezvous::new(), snapshot(n, Weights::Uniform), iters),
        "pingora_ketama" => {
            let buckets: Vec<_> = (0..n)
                .map(|i| {
                    pingora_ketama::Bucket::new(address(i).parse::<SocketAddr>().expect("addr"), 1)
                })
                .collect();
            let ring = pingora_ketama::Continuum::new(&buckets);
            for k in 0..iters as usize {
                black_box(black_box(&ring).node(keys[k & (KEYS - 1)].as_bytes()));
            }
        }
        "pingora_consistent" => {
            use pingora_load_balancing::{selection, LoadBalancer};
            let addrs: Vec<String> = (0..n).map(address).collect();
            let lb: LoadBalancer<selection::Consistent> =
                LoadBalancer::try_from_iter(addrs.iter().map(String::as_str)).expect("static");
            for k in 0..iters as usize {
                black_box(
                    lb.select(black_box(keys[k & (KEYS - 1)].as_bytes()), 256)
                        .map(|b| b.weight),
                );
            }
        }
        "md5" => {
            use md5::{Digest, Md5};
            for k in 0..iters as usize {
                let d: [u8; 16] = Md5::digest(black_box(keys[k & (KEYS - 1)].as_bytes())).into();
                black_box(d);
            }
        }
        "tick" => outlier_ticks(n, iters),
        _ => eprintln!("usage: icount CASE N ITERS (see the source for the cases)"),
    }
}
