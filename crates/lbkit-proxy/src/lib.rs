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
//! (behind an `ArcSwap`, so strategy switches and reloads never block a request) → a pooled
//! keep-alive upstream connection carries the request → the call's `CallGuard` finishes when the
//! upstream's answer has been read → retries go to endpoints not tried yet (see
//! [Forwarding](#forwarding)).
//!
//! Two engines serve HTTP listeners. Plain HTTP/1.1 requests (origin-form target, `Host`, no
//! body or a `Content-Length` body up to [`MAX_REPLAY_BODY`]) take the fast path (`h1/`): the
//! head is parsed in place with `httparse`, the rewritten request goes out on a connection from
//! the thread's own keep-alive pool, and the answer (any framing: length, chunked, until close)
//! is relayed as it arrives — all in the client connection's task, with no allocation and no
//! timer registration per request, as nginx does it. Everything else is handed over with the
//! bytes already read: HTTP/2 cleartext (prior knowledge) to the proxy's own HTTP/2 server on
//! the `h2` crate (`h2s/`: per-connection accounting of streams reset before their answer,
//! `GOAWAY ENHANCE_YOUR_CALM` past `max_premature_resets`, `max_requests_per_connection`, a
//! per-stream idle limit; its module docs have the table), and HTTP/1.0, `Upgrade`, `Expect`,
//! chunked or large request bodies, absolute-form targets, services that speak h2c upstream,
//! requests a route's `hedge` may race, and gRPC on HTTP/1.1 (gRPC-web: its `grpc-timeout` is
//! rewritten and its local answers are gRPC-shaped there) to hyper's HTTP/1 server. Every engine shares the call loop's rules, the balancer, the retry
//! budget, the call guards and the metrics. Services with `h2c = true` are called on the `h2`
//! crate's client directly (`h2c.rs`: one HTTP/2 connection per endpoint and thread, the
//! request sent from its own task), not through hyper's client, whose dispatch task, per-request
//! tasks and channels cost a quarter to a third of the proxy's CPU on unary gRPC.
//!
//! With [`Proxy::start_workers`], each worker thread has its own current-thread runtime,
//! listening sockets (`SO_REUSEPORT`) and upstream pools, as nginx's worker processes do; the
//! admin API, health checks, outlier detection and discovery run on the calling runtime. A
//! worker that accepts a connection while it serves more than the least loaded worker hands it
//! over before reading it, as HAProxy dispatches to its least loaded thread
//! ([`Proxy::worker_connections`]): the kernel's hash alone splits few connections unevenly.
//!
//! On a thread that drives its runtime for good (worker threads, `lbkit proxy`, or a caller
//! that says so with [`Proxy::pin_runtime_thread`]), the fast path's upstream writes of one
//! scheduler round go out grouped by upstream, so a backend wakes once for several requests.
//!
//! ## Forwarding
//! One call path: both HTTP engines (`forward.rs` for hyper, `h1/` for the fast path) and the
//! TCP relay (`tcp.rs`) drive lbkit-core's `Attempts`, the state machine the tower layer drives
//! too, through one decision after each attempt (`Service::retry`: `Attempts::retry` with the
//! service's budget and balancer, counted in its metrics). It decides what each result means (its module docs have the table): a connect failure
//! is retried for any method; a reset or malformed answer before any byte reached the client,
//! a timeout of one attempt (`per_try_timeout_ms`) while the route's `timeout_ms` has time
//! left, and a 5xx (504 recorded as a timeout) are retried when the request is idempotent; a
//! 429 and every other status are answers, neither charged nor retried; a client that goes
//! away is a cancellation. Each retry goes to an endpoint not tried yet, at most `retries`
//! times, while the service's `RetryBudget` allows (every request deposits once). On the fast
//! path, a pooled connection the upstream had already closed is not an attempt: the request is
//! sent once more on a new connection when it was not accepted or is idempotent.
//!
//! Signals on the wire (`lbkit_core::signal`): a caller's deadline (`grpc-timeout`, the
//! service's `deadline_header`) cuts the route's `timeout_ms`, each attempt tells the upstream
//! the time left (in the same headers), and a deadline that has passed is answered 504 — to gRPC
//! callers `grpc-status: 4` trailers-only, as every local answer to a gRPC request is a gRPC
//! status — with no attempt. A `429` or `503` with `Retry-After`, or `grpc-retry-pushback-ms`,
//! takes its endpoint out of the picks for the time asked (at most 60 s; `availability.pushback`)
//! and makes a retry wait it out. A route's `hedge` races an idempotent request's first attempt
//! with a second one on another endpoint after a delay (fixed, or the service's recent p95:
//! `forward.rs`'s `hedged`); HTTP/1.1 requests a hedge may race take hyper's engine. Load reports
//! (`endpoint-load-metrics`) are read from heads and trailers by both engines.
//!
//! The HTTP rules are written once: idempotent methods (`lbkit_core::http`), hash keys
//! (`lbkit_strategy::KeyExtractor` over the request target, headers and peer address; a
//! request is read as `lbkit_tower::http::HttpKeySource` reads it, so one key picks the same
//! endpoint through the library and through the proxy), and when a call ends
//! (`lbkit_tower::http::TrackBody`). One control loop keeps each service's endpoints:
//! lbkit-discovery's `Controller` with its source, lbkit-health's active checks, outlier
//! detection, empty-push protection and refresh ticks (`upkeep.rs`).
//!
//! ## Layout
//! Each module imports only from the ones below it (no cycles), from the top down:
//!
//! | layer | modules | what |
//! |---|---|---|
//! | process | `supervisor`, `server` | signals and reloads; binding, worker threads, accept loops, handing each connection to an engine |
//! | engines | `h1/` (fast path), `h2s/` (HTTP/2 server), `forward` + `tunnel` (hyper's HTTP/1 and the HTTP/2 server's requests), `tcp`, `admin` | the wire; each HTTP engine runs a request as route → `Envelope` → call loop |
//! | shared below the engines | `hub` (live state, connection slots and holds, accept), `request` (`Host` validation, path normalisation), `envelope` (a request's metrics from start to end, the answer to a failed call) | what every listener needs |
//! | services | `state` (routes, running services), `upkeep` (the control loop), `check`, `service` (balancer, clients, budget, `pick`/`retry`), `h2c` (the HTTP/2 upstream client), `upstream` (the HTTP/1.1 upstream client's connector and bounded pool), `exposition`, `metrics` | |
//! | base | `config`, `headers`, `body` (bodies both ways and their limits), `h2body` (HTTP/2 stream bodies both ways), `error`, `worker` | |
//!
//! `h1/` itself: `wire` (parsing and writing HTTP/1.1 in place), `pool` (the thread's idle
//! upstream connections), `buffers` (exchange buffers lent per request), `timer` (lazily
//! re-armed deadlines), `gate` (the write gate, with what it relies on in tokio's scheduler),
//! `rewind` (the stream hyper gets at a handover).
//!
//! An HTTP/1.1 upgrade (a GET without a body, `Connection: upgrade`, `Upgrade` naming only
//! protocols of `limits.upgrade_protocols`, default `websocket`; never `h2c`) goes to one
//! endpoint with both headers kept; on its `101 Switching Protocols` to a protocol the client
//! offered, the client and upstream connections become a byte tunnel. The handshake is the call
//! for the balancer's statistics; the tunnel keeps the client's `max_connections` slot, a drain
//! waits for it (bounded by `drain_timeout_ms`), and it ends when both directions have closed,
//! after `limits.tunnel_idle_timeout_ms` without a byte, or when the client stops reading (the
//! longest route timeout). Other upgrade requests, and all of them for services with
//! `h2c = true`, go upstream as plain requests.
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
mod envelope;
mod error;
mod exposition;
mod forward;
mod h1;
mod h2body;
mod h2c;
mod h2s;
mod headers;
mod hub;
mod idle;
pub mod metrics;
mod oob;
mod request;
mod server;
mod service;
mod state;
mod supervisor;
mod tcp;
mod tunnel;
mod upkeep;
mod upstream;
mod watchdog;

/// The parsers as the fuzz targets call them (`fuzz/`); not an API.
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::h1::fuzzing::*;
    pub use crate::request::admits;
}
mod worker;

pub use body::{BodyError, ClientBody, ProxyBody};
pub use check::probe as health_checks;
pub use config::Config;
pub use envelope::{MAX_BUFFERED_RESPONSE, MAX_REPLAY_BODY};
pub use error::{ConfigError, ProxyError};
pub use server::Proxy;
pub use service::{Active, Service, UpstreamBody, UpstreamClient};
pub use supervisor::{ReloadCount, Supervisor, RELOAD_DEBOUNCE};
pub use upkeep::{source_of, REFRESH_TICK};
pub use upstream::{ConnectError, Connector};
