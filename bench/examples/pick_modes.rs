//! Round robin's `Balancer::pick` + `CallGuard::finish_at` in one long loop, then a control
//! loop of twelve relaxed read-modify-writes over as many 64-byte lines, each timed with
//! lbkit's `Clock::System` and printed in ns per iteration, with the page offsets (low 12 bits) of the first
//! endpoint's statistics, of a stack local and of the balancer. The pick is bimodal between
//! processes on this machine (about 30 or 45-50 ns at 10 endpoints) while the control is not;
//! this makes that visible without divan, and gives `perf record` one loop to sample
//! (BENCHMARKS.md, "Pick + finish on this session's machine").
//!
//! ```sh
//! cargo build --release --example pick_modes
//! for i in $(seq 10); do target/release/examples/pick_modes 10 20000000; done
//! perf record -e cpu-clock -F 4000 target/release/examples/pick_modes 10 40000000 pick-only
//! ```
//!
//! Arguments: endpoints (10), iterations (20 000 000), and any third argument to skip the
//! control loop.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use lbkit_bench::{snapshot, Weights};
use lbkit_core::{Availability, Balancer, Clock, FastRng, Outcome, PickContext, Timestamp};
use lbkit_strategy::RoundRobin;

/// One line of the control's counters.
#[repr(align(64))]
#[derive(Default)]
struct Line([AtomicU64; 8]);

fn arg(i: usize, default: u64) -> u64 {
    std::env::args().nth(i).map_or(default, |s| {
        s.parse().unwrap_or_else(|_| {
            eprintln!("pick_modes: argument {i} must be a number, not {s:?}");
            std::process::exit(2)
        })
    })
}

fn main() {
    let n = usize::try_from(arg(1, 10)).unwrap_or(10).max(1);
    let iters = arg(2, 20_000_000);
    let control = std::env::args().nth(3).is_none();

    let now = Timestamp::ZERO;
    let balancer = Balancer::new(RoundRobin::new(), snapshot(n, Weights::Uniform), now)
        .with_availability(Availability::OFF);
    let mut rng = FastRng::seed_from_u64(1);
    let clock = Clock::System;
    let started = clock.now();
    for _ in 0..iters {
        let mut cx = PickContext::new(now, &mut rng);
        let guard = black_box(&balancer)
            .pick(&mut cx)
            .expect("endpoints are eligible");
        guard.finish_at(Outcome::Success, now);
    }
    let pick = (clock.now().as_nanos() - started.as_nanos()) as f64 / iters as f64;

    let lines: Vec<Line> = (0..n).map(|_| Line::default()).collect();
    let counter = AtomicU64::new(0);
    let started = clock.now();
    for _ in 0..if control { iters } else { 0 } {
        let i = (counter.fetch_add(1, Relaxed) % n as u64) as usize;
        let line = &black_box(&lines)[i].0;
        for word in line {
            word.fetch_add(black_box(1), Relaxed);
        }
        line[0].fetch_sub(1, Relaxed);
        line[1].fetch_add(1, Relaxed);
        line[2].fetch_add(1, Relaxed);
    }
    let floor = (clock.now().as_nanos() - started.as_nanos()) as f64 / iters as f64;

    let stats = balancer.snapshot().endpoints()[0].stats() as *const _ as usize;
    let local = 0u8;
    let stack = black_box(&local) as *const u8 as usize;
    let at = &balancer as *const _ as usize;
    print!("pick + finish {pick:.1} ns");
    if control {
        print!("  control (12 read-modify-writes) {floor:.1} ns");
    }
    println!(
        "  offsets: stats {:#05x} stack {:#05x} balancer {:#05x}",
        stats & 0xfff,
        stack & 0xfff,
        at & 0xfff
    );
}
