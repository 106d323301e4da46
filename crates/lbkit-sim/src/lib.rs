//! # lbkit-sim
//!
//! A discrete-event simulator that runs the **production pickers** of lbkit — the same
//! [`Balancer`](lbkit_core::Balancer) and strategies a service uses, never a second
//! implementation — against simulated servers in virtual time: one thread, no sleeping,
//! deterministic for a seed.
//!
//! A [`Scenario`] describes servers (service-time distributions, concurrency and a waiting room,
//! slowness, pauses, errors, crashes, cold starts, membership changes) and a workload (open
//! Poisson or bursty arrivals, or closed loops with think time; keys uniform or Zipf; timeouts
//! and failover retries). [`run`] simulates it once per strategy and returns a [`Report`] with
//! throughput, latency percentiles, error and timeout rates, each server's share and largest
//! queue, and the best-known baseline `oracle-sed` (shortest expected delay with true queues and
//! service rates).
//!
//! Every simulated request runs lbkit-core's [`Attempts`](lbkit_core::Attempts) — the state
//! machine of the tower layer and of the proxy: retries only on endpoints not tried yet, the
//! retry budget (the proxy's default unless the scenario says otherwise), the idempotency rule,
//! the per-attempt and overall deadlines — and every membership change goes through the
//! [`Controller`](lbkit_discovery::Controller) those clients run (key order, empty-push and
//! mass-removal protection, outlier detection), with virtual time on its clock. So a result
//! with retries on is what an lbkit client would do.
//!
//! ```
//! use lbkit_sim::{run, RunOptions, Scenario};
//! let scenario = Scenario::named("slow-provider").unwrap();
//! let options = RunOptions { requests: Some(5_000), strategies: vec!["round-robin".into(), "p2c-ewma".into()], ..RunOptions::default() };
//! let report = run(&scenario, &options, &mut |_, _| {}).unwrap();
//! let share = |i: usize| report.results[i].servers[9].share;
//! assert!(share(1) < share(0), "p2c-ewma sends less to the slow provider than round robin");
//! ```
#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms
)]
#![deny(clippy::disallowed_methods, clippy::disallowed_types)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod dist;
mod engine;
mod error;
pub mod fit;
pub mod html;
mod label;
mod metrics;
mod oracle;
pub mod plot;
mod report;
mod scenario;
mod server;
mod slab;
pub mod tune;

pub use error::SimError;
pub use metrics::{Little, Series, ServerResult, StrategyResult};
pub use report::{run, Report, RunOptions, ORACLE};
pub use scenario::{
    Action, BalancerMode, EventSpec, KeyDistribution, Pattern, Scenario, ServerSpec, ServiceSpec,
    Workload, WorkloadKind, MAX_CLIENTS, MAX_CLIENT_ENDPOINTS, MAX_EVENTS, MAX_KEYS, MAX_REQUESTS,
    MAX_SERVERS,
};
