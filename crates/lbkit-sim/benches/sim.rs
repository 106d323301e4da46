//! Simulated requests per second of wall time: `cargo bench -p lbkit-sim`.
//!
//! Each iteration simulates `REQUESTS` client requests of the `throughput` scenario below (ten
//! exponential servers, open Poisson arrivals, no timeouts) with one strategy on one thread;
//! requests per second = REQUESTS / median time.

use lbkit_sim::{run, RunOptions, Scenario};

const REQUESTS: u64 = 200_000;

const SCENARIO: &str = r#"
name = "throughput"
[workload]
rate = 2000.0
clients = 4
balancer = "shared"
[[server]]
count = 10
concurrency = 4
service = { dist = "exponential", mean_ms = 10.0 }
"#;

fn main() {
    divan::main();
}

#[divan::bench(args = ["round-robin", "random", "weighted-round-robin", "least-active", "p2c-ewma"], sample_count = 5, sample_size = 1)]
fn simulate_200k_requests(strategy: &str) -> usize {
    let scenario = Scenario::parse(SCENARIO, "bench").expect("valid scenario");
    let opts = RunOptions {
        requests: Some(REQUESTS),
        strategies: vec![strategy.to_owned()],
        seed: Some(1),
        skip_oracle: true,
        ..RunOptions::default()
    };
    run(&scenario, &opts, &mut |_, _| {})
        .expect("runs")
        .results
        .len()
}
