//! A configured upstream service: its balancer (behind an `ArcSwap`, so the strategy can change
//! at run time), its pooled HTTP client, retry budget and metrics.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use lbkit_core::{
    Attempts, Availability, Balancer, BoxStrategy, CallGuard, CircuitBreaker, Classified, Clock,
    EndpointKey, FastRng, PickError, RetryBudget, Route, Snapshot, Stop, Timestamp,
};
use lbkit_discovery::ControllerMetrics;
use lbkit_strategy::catalog::{self, ParamError, Params};
use lbkit_tower::http::HttpTags;

use crate::body::ClientBody;
use crate::config;
use crate::h2c::H2Client;
use crate::metrics::ServiceMetrics;
use crate::upstream::Connector;
use crate::worker;

/// The body sent upstream: a replayable buffer (retries possible) or the client's stream.
pub type UpstreamBody = Either<Full<Bytes>, ClientBody>;

/// The pooled keep-alive client of one service (`upstream.rs`).
pub type UpstreamClient = Client<Connector, UpstreamBody>;

/// How long a retry budget remembers deposits (tower's and linkerd's default, 10 s).
const BUDGET_TTL: Duration = Duration::from_secs(10);

/// The balancer and the name of the strategy it runs, swapped together.
#[derive(Debug)]
pub struct Active {
    /// The strategy's name as configured or set through the admin API.
    pub strategy: String,
    /// The balancer.
    pub balancer: Balancer<BoxStrategy>,
}

/// One upstream service. Shared by every request to it (`Arc`); the request path only loads
/// `active` and touches atomics.
#[derive(Debug)]
pub struct Service {
    name: String,
    config: config::ServiceConfig,
    // Swapped by the admin API (strategy) and read per request; publishes come from the
    // service's control loop. `publish_lock` orders the two writers (never held across an
    // await); readers never take it.
    active: ArcSwap<Active>,
    #[allow(clippy::disallowed_types)] // orders two rare writers, off the request path
    publish_lock: std::sync::Mutex<()>,
    /// One pool per thread that calls upstreams (index `worker::index`: 0 for the calling
    /// runtime, whose tasks run health checks; 1..=N for worker threads), so a request and its
    /// upstream connection are served by the same thread.
    clients: Box<[UpstreamClient]>,
    /// For `h2c = true`: the HTTP/2 client of each such thread (`h2c.rs`), indexed the same.
    h2c: Box<[Arc<H2Client>]>,
    budget: RetryBudget,
    metrics: ServiceMetrics,
    clock: Clock,
    // Written by the service's task only; read by the admin API.
    ejections: ArcSwap<HashMap<EndpointKey, u64>>,
    // Set once by the service's task when its discovery controller starts; read by /metrics.
    discovery: std::sync::OnceLock<Arc<ControllerMetrics>>,
    /// Where requests carry their routing tag (`tags`), names prepared for HTTP/2's header maps.
    tags: HttpTags,
    /// Where requests carry the attributes subsets match on (`stages.subsets.headers`).
    attrs: lbkit_strategy::AttrHeaders,
    /// The trace recorder (`trace`), attached to every balancer the service builds.
    trace: Option<Arc<lbkit_trace::Recorder>>,
    /// `deadline_header`, its name prepared (validated with the configuration).
    deadline_header: Option<http::HeaderName>,
}

// === impl Service ===

impl Service {
    /// A service named `name` with `config`, with no endpoints until its source publishes, and
    /// one connection pool for each of `workers` worker threads (at least one).
    ///
    /// # Errors
    /// A strategy that does not build (the configuration was validated, so only when a caller
    /// skips validation).
    pub fn new(
        name: &str,
        config: &config::ServiceConfig,
        workers: usize,
    ) -> Result<Self, ParamError> {
        Service::with_trace(name, config, workers, None)
    }

    /// [`new`](Self::new), recording into `trace` (the proxy opens it from `[service.NAME.trace]`
    /// and hands a reloaded service its predecessor's when the table is unchanged).
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn with_trace(
        name: &str,
        config: &config::ServiceConfig,
        workers: usize,
        trace: Option<Arc<lbkit_trace::Recorder>>,
    ) -> Result<Self, ParamError> {
        let clock = Clock::System;
        let strategy = build_strategy(config, &config.strategy, config.strategy_params())?;
        let balancer = balancer(
            strategy,
            Arc::new(Snapshot::new(0, Vec::new())),
            name,
            config,
            trace.as_deref(),
            &clock,
        );
        Ok(Service {
            name: name.to_owned(),
            active: ArcSwap::from_pointee(Active {
                strategy: config.strategy.clone(),
                balancer,
            }),
            publish_lock: Default::default(),
            clients: (0..=workers.max(1)).map(|_| client(config)).collect(),
            h2c: (0..=workers.max(1))
                .map(|_| {
                    H2Client::new(
                        Duration::from_millis(config.connect_timeout_ms),
                        config.upstream_idle(),
                    )
                })
                .collect(),
            budget: RetryBudget::new(
                BUDGET_TTL,
                config.retry_budget_min_per_sec,
                f64::from(config.retry_budget_percent) / 100.0,
            ),
            // One shard per thread that serves requests (the calling runtime and each worker).
            metrics: ServiceMetrics::with_shards(workers.max(1) + 1),
            clock,
            ejections: ArcSwap::default(),
            discovery: std::sync::OnceLock::new(),
            tags: HttpTags::new(config.tags.headers()),
            attrs: lbkit_strategy::AttrHeaders::new(config.stages.attr_headers()),
            deadline_header: config
                .deadline_header
                .as_deref()
                .and_then(|h| http::HeaderName::from_bytes(h.as_bytes()).ok()),
            config: config.clone(),
            trace,
        })
    }

    /// The request header carrying the caller's deadline in milliseconds, if configured.
    pub(crate) fn deadline_header(&self) -> Option<&http::HeaderName> {
        self.deadline_header.as_ref()
    }

    /// Run the strategy `name` with `params` as a shadow beside the live one (see
    /// `lbkit_core::shadow`), replacing a running shadow; it stays across strategy switches.
    ///
    /// # Errors
    /// An unknown strategy or a bad parameter.
    pub fn start_shadow(&self, name: &str, params: Params) -> Result<(), ParamError> {
        let label = std::iter::once(name.to_owned())
            .chain(params.pairs().map(|(k, v)| format!("{k}={v}")))
            .collect::<Vec<_>>()
            .join(":");
        let strategy = catalog::build(name, params)?;
        let _order = self.publish_lock.lock();
        self.active()
            .balancer
            .start_shadow(label.clone(), strategy, self.clock.now());
        tracing::info!(service = %self.name, candidate = %label, "shadow started");
        Ok(())
    }

    /// Stop the shadow; `false` when none ran.
    pub fn stop_shadow(&self) -> bool {
        let _order = self.publish_lock.lock();
        let active = self.active();
        let running = active.balancer.shadow().is_some();
        active.balancer.set_shadow(None, self.clock.now());
        running
    }

    /// What the running shadow saw, per endpoint of the current snapshot.
    pub fn shadow_report(&self) -> Option<lbkit_core::shadow::ShadowReport> {
        let active = self.active();
        let shadow = active.balancer.shadow()?;
        Some(shadow.report(&active.balancer.snapshot()))
    }

    /// The trace recorder, when the service records one.
    pub fn trace(&self) -> Option<&Arc<lbkit_trace::Recorder>> {
        self.trace.as_ref()
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The configuration it was built from.
    pub fn config(&self) -> &config::ServiceConfig {
        &self.config
    }

    /// Where requests carry their routing tag.
    #[inline]
    pub fn tags(&self) -> &HttpTags {
        &self.tags
    }

    /// Where requests carry the attributes metadata subsets match on.
    #[inline]
    pub fn attrs(&self) -> &lbkit_strategy::AttrHeaders {
        &self.attrs
    }

    /// Replace the stages of the current balancer (an aperture's coordinates from the
    /// registry); a strategy switch keeps them.
    pub fn set_stages(&self, stages: lbkit_core::stage::Stages) {
        let _order = self.publish_lock.lock();
        self.active().balancer.set_stages(stages, self.clock.now());
    }

    /// The current balancer and strategy name.
    #[inline]
    pub fn active(&self) -> arc_swap::Guard<Arc<Active>> {
        self.active.load()
    }

    /// The upstream client of the calling worker thread.
    #[inline]
    pub fn client(&self) -> &UpstreamClient {
        &self.clients[worker::index() % self.clients.len()]
    }

    /// The h2c client of the calling worker thread (for services with `h2c = true`).
    #[inline]
    pub(crate) fn h2c(&self) -> &Arc<H2Client> {
        &self.h2c[worker::index() % self.h2c.len()]
    }

    /// The retry budget.
    pub fn budget(&self) -> &RetryBudget {
        &self.budget
    }

    /// The first attempt of a call: an endpoint picked at `now` by the current balancer.
    #[inline]
    pub(crate) fn pick(
        &self,
        attempts: &mut Attempts,
        now: Timestamp,
        route: Route<'_>,
        rng: &mut FastRng,
    ) -> Result<CallGuard, PickError> {
        attempts.pick(&self.active().balancer, now, route, rng)
    }

    /// After an attempt classified as `c`: the next attempt (`Attempts::retry` with this
    /// service's budget, balancer and clock), counted as a retry sent or refused by the budget.
    /// The one decision every proxy loop (both HTTP engines, the TCP relay) makes.
    #[inline]
    pub(crate) fn retry(
        &self,
        attempts: &mut Attempts,
        c: Classified,
        route: Route<'_>,
        rng: &mut FastRng,
    ) -> Result<(CallGuard, Timestamp), Stop> {
        let balancer = &self.active().balancer;
        let next = attempts.retry(c, &self.budget, balancer, &self.clock, route, rng);
        match next {
            Ok(_) => self.metrics.retried(),
            Err(Stop::BudgetExhausted) => self.metrics.retry_refused(),
            Err(_) => {}
        }
        next
    }

    /// A hedge of the call's open first attempt (`Attempts::hedge` with this service's
    /// budget and balancer at the service's clock), counted as a retry sent or refused.
    pub(crate) fn hedge(
        &self,
        attempts: &mut Attempts,
        route: Route<'_>,
        rng: &mut FastRng,
    ) -> Result<CallGuard, Stop> {
        let balancer = &self.active().balancer;
        let next = attempts.hedge(&self.budget, balancer, self.clock.now(), route, rng);
        match next {
            Ok(_) => {
                self.metrics.retried();
                self.metrics.hedged();
            }
            Err(Stop::BudgetExhausted) => self.metrics.retry_refused(),
            Err(_) => {}
        }
        next
    }

    /// Wait out the last answer's pushback (`Attempts::retry_wait`) before a retry, when a
    /// retry is allowed at all: a retry that honours `Retry-After` or `grpc-retry-pushback-ms`
    /// instead of hammering the next endpoint at once.
    ///
    /// It waits only when a retry may follow (allowed, and an endpoint not tried yet is
    /// eligible), then clears the pushback (`Attempts::waited`). `true` when it waited.
    pub(crate) async fn wait_pushback(&self, attempts: &mut Attempts, c: Classified) -> bool {
        let wait = attempts.retry_wait();
        if wait.is_zero() || attempts.may_retry(c, &self.clock).is_err() {
            return false;
        }
        let eligible = self.active().balancer.snapshot().eligible().len();
        if eligible <= attempts.tried().len() {
            return false;
        }
        tokio::time::sleep(wait).await;
        attempts.waited();
        true
    }

    /// Request counters.
    pub fn metrics(&self) -> &ServiceMetrics {
        &self.metrics
    }

    /// The clock of this service's guards.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The discovery controller's counters (snapshots published, source errors, empty pushes
    /// held back), once the service's task has started.
    pub fn discovery(&self) -> Option<&ControllerMetrics> {
        self.discovery.get().map(|m| &**m)
    }

    pub(crate) fn set_discovery(&self, metrics: Arc<ControllerMetrics>) {
        let _ = self.discovery.set(metrics);
    }

    /// Times each endpoint was ejected by outlier detection.
    pub fn ejections(&self) -> Arc<HashMap<EndpointKey, u64>> {
        self.ejections.load_full()
    }

    pub(crate) fn set_ejections(&self, counts: HashMap<EndpointKey, u64>) {
        self.ejections.store(Arc::new(counts));
    }

    /// Publish `snapshot` on the current balancer.
    pub fn publish(&self, snapshot: Arc<Snapshot>) {
        let _order = self.publish_lock.lock();
        self.active
            .load()
            .balancer
            .publish(snapshot, self.clock.now());
    }

    /// Switch to strategy `name` with `params`. Calls in flight keep their guards (and so their
    /// endpoints' statistics, which live in the snapshot's endpoints, not in the balancer).
    ///
    /// # Errors
    /// An unknown strategy or a bad parameter.
    pub async fn set_strategy(&self, name: &str, params: Params) -> Result<(), ParamError> {
        let strategy = build_strategy(&self.config, name, params)?;
        let _order = self.publish_lock.lock();
        let snapshot = self.active.load().balancer.snapshot();
        let balancer = balancer(
            strategy,
            snapshot,
            &self.name,
            &self.config,
            self.trace.as_deref(),
            &self.clock,
        );
        // The stages as they stand (an aperture's coordinates may have come from the registry).
        balancer.set_stages(
            (*self.active.load().balancer.stages()).clone(),
            self.clock.now(),
        );
        // A running shadow goes on observing beside the new strategy, its counters kept.
        balancer.set_shadow(self.active.load().balancer.shadow(), self.clock.now());
        self.active.store(Arc::new(Active {
            strategy: name.to_owned(),
            balancer,
        }));
        tracing::info!(service = %self.name, strategy = name, "strategy switched");
        Ok(())
    }
}

/// Strategy `name` with `params`, in zone preference when the service names its zone.
fn build_strategy(
    config: &config::ServiceConfig,
    name: &str,
    params: Params,
) -> Result<BoxStrategy, ParamError> {
    let strategy = catalog::build(name, params)?;
    Ok(match &config.zone {
        Some(zone) => BoxStrategy::new(lbkit_strategy::ZoneAware::new(strategy, zone.as_str())),
        None => strategy,
    })
}

fn balancer(
    strategy: BoxStrategy,
    snapshot: Arc<Snapshot>,
    name: &str,
    config: &config::ServiceConfig,
    trace: Option<&lbkit_trace::Recorder>,
    clock: &Clock,
) -> Balancer<BoxStrategy> {
    let availability = Availability {
        circuit_breaker: config
            .availability
            .circuit_breaker
            .then(CircuitBreaker::default),
        max_in_flight: (config.availability.max_in_flight > 0)
            .then_some(config.availability.max_in_flight),
        pushback: config.availability.pushback,
    };
    // Validated with the configuration; a stage table that does not build runs no stage.
    let stages = config.stages.build().unwrap_or_default();
    let balancer = Balancer::new(strategy, snapshot, clock.now())
        .with_availability(availability)
        .with_clock(clock.clone())
        .with_stages(stages, clock.now());
    match trace {
        Some(recorder) => recorder.attach(balancer, name),
        None => balancer,
    }
}

fn client(config: &config::ServiceConfig) -> UpstreamClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(Duration::from_millis(config.connect_timeout_ms)));
    let connector = Connector::new(connector, config.upstream_idle(), config.upstream_max_idle);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(config.upstream_idle())
        .pool_max_idle_per_host(config.upstream_max_idle)
        // `send(2)` of one flat buffer rather than `writev(2)` (see the server's builder).
        .http1_writev(false)
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .http2_only(config.h2c)
        .build(connector)
}
