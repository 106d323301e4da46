//! # lbkit-proxy
//!
//! lbkit as a sidecar, for services in other languages and for ops teams: an HTTP/1.1 and
//! HTTP/2-cleartext reverse proxy and a TCP (L4) relay that balance with lbkit's strategies,
//! configured in one TOML file ([`config`]), with active health checks, passive outlier
//! detection, retries under a budget, an admin API with Prometheus metrics ([`mod@admin`]),
//! run-time strategy switches, reloads and graceful shutdown. The `lbkit proxy` command runs it.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::path::Path;
//! use std::time::Duration;
//! use lbkit_proxy::{Config, Proxy, Supervisor};
//!
//! let path = Path::new("proxy.toml");
//! let config = Config::load(path)?;
//! let drain = config.drain_timeout();
//! let proxy = Proxy::start(config).await?;
//! // Serves until SIGTERM/SIGINT; reloads on SIGHUP and when the file changes.
//! Supervisor::new(proxy, path, drain).run(std::future::pending()).await?;
//! # Ok(()) }
//! ```
//!
//! Data flow per HTTP request: route by host and path prefix → the service's `Balancer` picks
//! (behind an `ArcSwap`, so strategy switches and reloads never block a request) → the pooled
//! keep-alive client forwards → the call's `CallGuard` finishes at the end of the response body
//! → retries go to endpoints not tried yet (see [Forwarding](#forwarding)).
//!
//! With [`Proxy::start_workers`], each worker thread has its own current-thread runtime,
//! listening sockets (`SO_REUSEPORT`) and upstream pools, as nginx's worker processes do; the
//! admin API, health checks, outlier detection and discovery run on the calling runtime.
//!
//! ## Forwarding
//! The call loop lives in one small module (`forward.rs`): pick, send, finish the guard, retry
//! idempotent requests on another endpoint under a `TpsBudget`. It is kept apart so it can move
//! onto `lbkit-tower`'s balance layer once that lands.
#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms
)]
#![deny(clippy::disallowed_methods, clippy::disallowed_types)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod admin;
mod body;
mod check;
pub mod config;
mod error;
mod forward;
mod h1;
mod headers;
pub mod metrics;
mod server;
mod service;
mod state;
mod supervisor;
mod tcp;
mod upkeep;

pub use body::ProxyBody;
pub use config::Config;
pub use error::{ConfigError, ProxyError};
pub use forward::{MAX_BUFFERED_RESPONSE, MAX_REPLAY_BODY};
pub use server::Proxy;
pub use service::{Active, Service, UpstreamBody, UpstreamClient};
pub use supervisor::{ReloadCount, Supervisor, RELOAD_DEBOUNCE};
pub use upkeep::REFRESH_TICK;
