//! Two-thread contention measured with pinned threads and per-thread CPU time.
//!
//! On a 2-core machine a plain two-thread divan run can hide contention: if the other core is
//! busy (or a thread is descheduled), the two threads barely overlap. Here each thread is pinned
//! to its own core (`sched_setaffinity`), all threads start at a barrier, and each reports
//! wall-clock ns per pick, CPU ns per pick (`CLOCK_THREAD_CPUTIME_ID`, so time spent
//! descheduled does not count), and how much the threads' run windows overlapped.
//!
//! Output: one line per case, the median over the clean repetitions (no thread descheduled,
//! windows overlapping; see `CLEAN`) of the per-thread averages, or over all REPS repetitions
//! marked `NOISY` when fewer than 3 were clean.
//! Not divan: `cargo bench --bench contention`.

use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use lbkit_bench::{index_slice, snapshot, Weights};
use lbkit_core::{
    Availability, Balancer, FastRng, Outcome, PickContext, Picker, Snapshot, Strategy, Timestamp,
};
use lbkit_strategy::{
    Random, RoundRobin, SmoothWeightedRoundRobin, StickyRoundRobin, WeightedRandom,
};

const ITERS: u64 = 5_000_000;
const REPS: usize = 9;
/// A repetition is clean when every thread was on its CPU ≥ 95 % of its run and (two
/// threads) the run windows overlapped ≥ 95 %.
const CLEAN: f64 = 0.95;

fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside it; 0 = this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        let rc = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        assert_eq!(rc, 0, "sched_setaffinity failed");
    }
}

fn thread_cpu_ns() -> u64 {
    // SAFETY: clock_gettime writes a timespec we own.
    unsafe {
        let mut ts: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts);
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }
}

struct Run {
    wall_ns: f64,
    cpu_ns: f64,
    overlap: f64,
    /// Lowest CPU-time / wall-time ratio over the threads: below 1, a thread was descheduled.
    on_cpu: f64,
}

/// `threads` pinned threads each run `ITERS` calls of `f`; per-thread averages, then the mean
/// over threads.
fn run<F: Fn(&mut FastRng) -> usize + Sync>(f: &F, threads: usize) -> Run {
    let barrier = Barrier::new(threads);
    #[allow(clippy::disallowed_methods)] // a benchmark measures wall-clock time
    let epoch = Instant::now();
    let results: Vec<(f64, f64, f64, f64)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || {
                    pin_to(t);
                    let mut rng = FastRng::seed_from_u64(t as u64 + 1);
                    barrier.wait();
                    let cpu0 = thread_cpu_ns();
                    let start = epoch.elapsed().as_nanos() as f64;
                    for _ in 0..ITERS {
                        black_box(f(&mut rng));
                    }
                    let end = epoch.elapsed().as_nanos() as f64;
                    let cpu = (thread_cpu_ns() - cpu0) as f64;
                    (start, end, cpu, 0.0)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread"))
            .collect()
    });
    let wall = results
        .iter()
        .map(|r| (r.1 - r.0) / ITERS as f64)
        .sum::<f64>()
        / threads as f64;
    let cpu = results.iter().map(|r| r.2 / ITERS as f64).sum::<f64>() / threads as f64;
    let lo_end = results.iter().map(|r| r.1).fold(f64::INFINITY, f64::min);
    let hi_start = results.iter().map(|r| r.0).fold(0.0, f64::max);
    let first = results.iter().map(|r| r.0).fold(f64::INFINITY, f64::min);
    let last = results.iter().map(|r| r.1).fold(0.0, f64::max);
    let overlap = ((lo_end - hi_start).max(0.0)) / (last - first);
    let on_cpu = results
        .iter()
        .map(|r| r.2 / (r.1 - r.0))
        .fold(f64::INFINITY, f64::min);
    Run {
        wall_ns: wall,
        cpu_ns: cpu,
        overlap,
        on_cpu,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn case<F: Fn(&mut FastRng) -> usize + Sync>(name: &str, n: usize, f: F) {
    for threads in [1, 2] {
        let all: Vec<Run> = (0..REPS).map(|_| run(&f, threads)).collect();
        // Prefer repetitions in which no thread was descheduled (shared, noisy machine).
        let clean: Vec<&Run> = all
            .iter()
            .filter(|r| r.on_cpu >= CLEAN && r.overlap >= CLEAN)
            .collect();
        let (runs, tag) = if clean.len() >= 3 {
            (clean, "")
        } else {
            (all.iter().collect(), "  NOISY")
        };
        let wall = median(runs.iter().map(|r| r.wall_ns).collect());
        let cpu = median(runs.iter().map(|r| r.cpu_ns).collect());
        let overlap = median(runs.iter().map(|r| r.overlap).collect());
        println!(
            "{name:<28} n={n:<7} threads={threads}  wall {wall:6.2} ns/pick  cpu {cpu:6.2} ns/pick  overlap {:5.1}%  clean {}/{REPS}{tag}",
            overlap * 100.0,
            if tag.is_empty() { runs.len() } else { 0 },
        );
    }
}

fn picker_case<S: Strategy>(name: &str, n: usize, strategy: S, snap: Arc<Snapshot>) {
    let picker = strategy.prepare(&snap, Timestamp::ZERO);
    case(name, n, |rng: &mut FastRng| {
        let mut cx = PickContext::new(Timestamp::ZERO, rng);
        black_box(&picker)
            .pick(&mut cx)
            .map_or(usize::MAX, |i| i.get())
    });
}

#[repr(align(128))]
struct Padded(AtomicUsize);

fn main() {
    // `cargo bench` passes `--bench`; any other argument filters cases by name.
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wanted = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));
    println!("# pinned threads (cpu 0, cpu 1), {ITERS} picks per thread, median of the clean ones of {REPS} repetitions");
    for n in [10, 1_000, 100_000] {
        if wanted("floor_atomic_mod") {
            let slice = index_slice(n);
            let counter = Padded(AtomicUsize::new(0));
            case("floor_atomic_mod", n, |_rng: &mut FastRng| {
                let c = black_box(&counter).0.fetch_add(1, Relaxed);
                black_box(&slice)[c % n] as usize
            });
        }
        if wanted("floor_atomic_then_u128_div") {
            // Diagnostic: the atomic floor followed by two dependent u128 divisions (the shape of
            // the weighted-round-robin golden-stride pick), to see whether work after a
            // contended fetch_add costs more than its single-thread time.
            let slice = index_slice(n);
            let counter = Padded(AtomicUsize::new(0));
            let total = black_box(49_999_999u128);
            case("floor_atomic_then_u128_div", n, |_rng: &mut FastRng| {
                let c = black_box(&counter).0.fetch_add(1, Relaxed) as u128;
                let point = (c % total) * 30_901_699 % total;
                let j = (point * n as u128 / total) as usize;
                black_box(&slice)[j] as usize
            });
        }
        if wanted("round_robin") {
            picker_case(
                "round_robin",
                n,
                RoundRobin::new(),
                snapshot(n, Weights::Uniform),
            );
        }
        if wanted("sticky_round_robin") {
            picker_case(
                "sticky_round_robin",
                n,
                StickyRoundRobin::new(3),
                snapshot(n, Weights::Uniform),
            );
        }
        if wanted("weighted_round_robin_skewed") {
            picker_case(
                "weighted_round_robin_skewed",
                n,
                SmoothWeightedRoundRobin::new(),
                snapshot(n, Weights::Skewed),
            );
        }
        if wanted("random") {
            picker_case("random", n, Random, snapshot(n, Weights::Uniform));
        }
        if wanted("balancer_random_finish") {
            // A whole call's bookkeeping: `Balancer::pick` + `CallGuard::finish_at(Success)`,
            // random picks, so what the threads share is the endpoints' statistics lines (at
            // n = 10 every call's line is another thread's too), not a strategy counter.
            let now = Timestamp::ZERO;
            let balancer = Balancer::new(Random, snapshot(n, Weights::Uniform), now)
                .with_availability(Availability::OFF);
            case("balancer_random_finish", n, |rng: &mut FastRng| {
                let mut cx = PickContext::new(now, rng);
                let guard = black_box(&balancer)
                    .pick(&mut cx)
                    .expect("endpoints are eligible");
                let i = guard.endpoint().address().len();
                guard.finish_at(Outcome::Success, now);
                i
            });
        }
        if wanted("weighted_random_skewed") {
            picker_case(
                "weighted_random_skewed",
                n,
                WeightedRandom,
                snapshot(n, Weights::Skewed),
            );
        }
    }
}
