//! # lbkit-tower
//!
//! lbkit in the call path: a tower [`Service`](tower::Service) that picks an endpoint per
//! request with any lbkit strategy, calls that endpoint's client service (a tonic `Channel`, a
//! hyper-util client, anything `Clone`), and feeds latency and outcome back into the statistics
//! the load-aware strategies read — the place Dubbo's cluster layer holds in a Java consumer.
//!
//! * [`Pool`] ([`PoolBuilder`]): endpoints from any discovery stream of
//!   `Result<Update, E>`, one client service per endpoint made by a [`MakeEndpoint`] when it
//!   appears and dropped when it goes, and the [`Balancer`](lbkit_core::Balancer). A background
//!   task applies updates in batches and ticks the balancer.
//! * [`Balance`] ([`BalanceLayer`]): per request, a pick with readiness pass-over, one of
//!   Dubbo's cluster modes ([`Mode`]: failover, failfast, failsafe, failback, forking,
//!   broadcast), a per-attempt timeout, and a retry budget (lock-free [`AtomicBudget`]; any
//!   tower `Budget` fits).
//! * [`RequestPolicy`] / [`ResponsePolicy`]: hash keys, idempotency and replay of requests;
//!   classification of responses and errors and when a call ends ([`Completion`]). The
//!   [`http`] module has them for HTTP and gRPC, with body completion tracking.
//! * Errors are [`BoxError`]s holding an [`Error`] that names the endpoint; [`is_caused_by`]
//!   looks through the chain.
//! * Observability: a `tracing` span per attempt (`pool`, `strategy`, `endpoint`, `attempt`)
//!   and per-endpoint and per-pool metric families through `prometheus-client`, read from the
//!   pool's atomics at scrape time ([`Pool::collector`]; the same names `lbkit proxy` writes;
//!   [`telemetry`] module
//!   docs list them).
//!
//! ```no_run
//! use std::time::Duration;
//! use lbkit_core::{Endpoint, EndpointSpec};
//! use lbkit_tower::{BalanceLayer, PoolBuilder, TryMake};
//! use lbkit_tower::http::SetOrigin;
//! use tower::{Layer, ServiceExt};
//!
//! # async fn doc() -> Result<(), lbkit_tower::BoxError> {
//! let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
//!     .build_http::<http_body_util::Full<bytes::Bytes>>();
//! let pool = PoolBuilder::default().name("users").spawn_static(
//!     vec![EndpointSpec::new("127.0.0.1:8081"), EndpointSpec::new("127.0.0.1:8082")],
//!     TryMake(move |ep: &Endpoint| SetOrigin::http(client.clone(), ep.address())),
//! );
//! let users = BalanceLayer::http().failover(2).timeout(Duration::from_secs(1)).layer(pool);
//! let req = http::Request::get("/users/7").body(http_body_util::Full::default())?;
//! let resp = users.oneshot(req).await?;
//! # Ok(()) }
//! ```
//!
//! # Features
//! * `http` (default): the [`http`] module.
//! * `tonic` (default): `tonic::Status` errors classified by gRPC code; with `http`,
//!   out-of-band ORCA load reports from every endpoint of a gRPC pool ([`orca::oob`]).
#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms
)]
#![deny(clippy::disallowed_methods, clippy::disallowed_types)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod balance;
mod completion;
mod error;
pub mod policy;
mod pool;
pub mod telemetry;

#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "http")]
pub mod orca;

pub use balance::{
    default_budget, AtomicBudget, Balance, BalanceLayer, FailbackConfig, Fallback, Mode,
    NoFallback, ResponseFuture,
};
pub use completion::Completion;
pub use error::{find_cause, is_caused_by, kind_name, BoxError, Error, ErrorKind};
/// Sampled call traces ([`PoolBuilder::trace`]): the recorder, its config and the reader.
pub use lbkit_trace as trace;
pub use policy::{
    AnyResponse, CloneRequests, KeyedRequests, NoReplay, RequestPolicy, ResponsePolicy,
};
pub use pool::{
    MakeEndpoint, Pool, PoolBuilder, PoolStatus, TryMake, DEFAULT_READINESS_PROBES,
    DEFAULT_TICK_INTERVAL,
};
