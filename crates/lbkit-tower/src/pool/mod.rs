//! [`Pool`] and [`PoolBuilder`]: endpoints, their client services, and the task that keeps them
//! current.

mod discovery;
mod select;
mod services;

use std::collections::HashMap;
use std::fmt;
use std::hash::Hasher;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use futures_core::Stream;
use lbkit_core::{
    Availability, Balancer, BoxStrategy, Clock, Endpoint, EndpointKey, EndpointSpec, Snapshot,
    SnapshotPolicy, Strategy, Update,
};
use lbkit_health::OutlierConfig;
use tokio::sync::watch;

use crate::error::BoxError;
use crate::telemetry::{PoolCollector, PoolMetrics, PoolView};

pub(crate) use select::{PickInput, Selected};

/// Candidates a pick looks at before it settles for one whose service is not ready.
pub const DEFAULT_READINESS_PROBES: u32 = 4;

/// How often the pool task ticks (refresh of time-driven pickers, outlier detection). Short
/// enough for the 1 s warm-up refresh of lbkit-core, long enough to cost nothing.
pub const DEFAULT_TICK_INTERVAL: Duration = Duration::from_millis(250);

/// Makes the client service of one endpoint. Runs on the pool task, synchronously: connect
/// lazily (tonic's `connect_lazy`, a hyper-util client) rather than block.
///
/// Closures `FnMut(&Endpoint) -> Svc` implement it; wrap a fallible closure in [`TryMake`].
pub trait MakeEndpoint<Svc>: Send + 'static {
    /// The service for `endpoint`.
    ///
    /// # Errors
    /// When no service can be made (a malformed address): the endpoint is then left out of the
    /// published snapshot until the source sends it again.
    fn make(&mut self, endpoint: &Endpoint) -> Result<Svc, BoxError>;
}

impl<Svc, F> MakeEndpoint<Svc> for F
where
    F: FnMut(&Endpoint) -> Svc + Send + 'static,
{
    fn make(&mut self, endpoint: &Endpoint) -> Result<Svc, BoxError> {
        Ok(self(endpoint))
    }
}

/// A fallible maker: `FnMut(&Endpoint) -> Result<Svc, E>`.
#[derive(Clone, Debug)]
pub struct TryMake<F>(pub F);

impl<Svc, E, F> MakeEndpoint<Svc> for TryMake<F>
where
    F: FnMut(&Endpoint) -> Result<Svc, E> + Send + 'static,
    E: Into<BoxError> + 'static,
{
    fn make(&mut self, endpoint: &Endpoint) -> Result<Svc, BoxError> {
        (self.0)(endpoint).map_err(Into::into)
    }
}

/// What the pool task has done so far; watch it with [`Pool::status`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolStatus {
    /// Version of the last published snapshot.
    pub version: u64,
    /// Endpoints in it.
    pub endpoints: usize,
    /// Client services made so far.
    pub services_made: u64,
    /// Client services released (endpoint removed or readdressed).
    pub services_released: u64,
    /// `Err` items received from the discovery stream.
    pub source_errors: u64,
    /// The last of them, as text.
    pub last_error: Option<String>,
    /// Whether the discovery stream has ended.
    pub source_ended: bool,
    /// Updates held back by empty-push protection (they would have emptied the set; the last
    /// set kept serving).
    pub empty_held: u64,
    /// Endpoints whose removal mass-removal protection held back so far
    /// ([`PoolBuilder::removal_protection`]).
    pub removals_held: u64,
    /// Endpoints held now: removed by the source, served until confirmed gone.
    pub held: usize,
}

/// One endpoint's client service and metric handles. Immutable.
pub(crate) struct Entry<Svc> {
    pub(crate) key: EndpointKey,
    pub(crate) address: Arc<str>,
    pub(crate) svc: Svc,
}

pub(crate) use services::ServiceMap;

/// The map's keys are already uniform 64-bit hashes: pass them through.
#[derive(Default)]
pub(crate) struct KeyHashHasher(u64);

impl Hasher for KeyHashHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Shared state of a pool. Written only by the pool task (services, publish); read by calls.
pub(crate) struct PoolInner<Svc, S: Strategy> {
    pub(crate) name: Arc<str>,
    pub(crate) balancer: Balancer<S>,
    pub(crate) services: ArcSwap<ServiceMap<Svc>>,
    pub(crate) probes: u32,
    pub(crate) metrics: Arc<PoolMetrics>,
    pub(crate) status: watch::Sender<PoolStatus>,
    /// Times each endpoint was ejected; written by the control loop.
    pub(crate) ejections: ArcSwap<HashMap<EndpointKey, u64>>,
    /// The control loop's counters.
    pub(crate) discovery: Arc<lbkit_discovery::ControllerMetrics>,
    /// The trace recorder, kept alive with the pool.
    pub(crate) trace: Option<Arc<lbkit_trace::Recorder>>,
}

impl<Svc: Send + Sync + 'static, S: Strategy> PoolView for PoolInner<Svc, S> {
    fn name(&self) -> &str {
        &self.name
    }
    fn snapshot(&self) -> Arc<Snapshot> {
        self.balancer.snapshot()
    }
    fn metrics(&self) -> &PoolMetrics {
        &self.metrics
    }
    fn ejections(&self) -> Arc<HashMap<EndpointKey, u64>> {
        self.ejections.load_full()
    }
    fn discovery(&self) -> Option<Arc<lbkit_discovery::ControllerMetrics>> {
        Some(self.discovery.clone())
    }
    fn services(&self) -> usize {
        self.services.load().len()
    }
    fn shadow(&self) -> Option<lbkit_core::shadow::ShadowReport> {
        let shadow = self.balancer.shadow()?;
        Some(shadow.report(&self.balancer.snapshot()))
    }
}

/// The endpoints, one client service per endpoint, and the [`Balancer`] that picks among them,
/// kept current by a background task that reads a discovery stream. Cheap to clone (one `Arc`);
/// built by [`PoolBuilder`], called through [`Balance`](crate::Balance) /
/// [`BalanceLayer`](crate::BalanceLayer).
///
/// * **Discovery.** Any `Stream<Item = Result<Update, E>>` feeds the pool (linkerd's
///   `Discover`) through lbkit-discovery's `Controller`, the control loop every lbkit user
///   runs: what is ready forms one batch and one snapshot; an `Err` item is counted and logged,
///   and the last good snapshot stays; an update that would empty the set is held back
///   (empty-push protection, [`PoolStatus::empty_held`]).
/// * **Endpoint services.** A [`MakeEndpoint`] makes one client service (a tonic `Channel`, a
///   hyper-util client bound to the address, anything `Clone`) when an endpoint appears or its
///   address changes, and the pool drops it when the endpoint goes. Services sit in an immutable
///   map, swapped whole (arc-swap) and keyed by the endpoint key's hash. A new service is in the
///   map before the snapshot naming it is published; a removed one leaves the map only after the
///   snapshot without it is published, so a pick always finds a service.
/// * **Ticks.** Every `tick_interval` the task re-prepares pickers that asked for it
///   ([`Balancer::tick`]) and, when configured, runs the passive outlier detector over the
///   statistics the calls record.
/// * **Readiness.** A pick whose service is not ready at once is passed over for another
///   endpoint; see [`Balance`](crate::Balance).
pub struct Pool<Svc, S: Strategy = BoxStrategy> {
    pub(crate) inner: Arc<PoolInner<Svc, S>>,
}

impl<Svc, S: Strategy> Clone for Pool<Svc, S> {
    fn clone(&self) -> Self {
        Pool {
            inner: self.inner.clone(),
        }
    }
}

// === impl Pool ===

impl<Svc, S: Strategy> Pool<Svc, S> {
    /// The pool's name (the `pool` label of its metrics).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Follow this client's aperture coordinates as they change — from the registry's
    /// consumer nodes (`lbkit_discovery::zookeeper::ZkPeers::spawn(..).coordinates()`), say —
    /// setting each on the pool's stages, so an aperture configured without coordinates
    /// ([`PoolBuilder::stages`]) organises itself. The task ends when the sender goes or the
    /// pool is dropped; `None` values (not known yet) are passed over, so the last coordinates
    /// stay while the registry is unreachable.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn follow_coordinates(
        &self,
        mut coordinates: watch::Receiver<Option<lbkit_core::stage::Coordinates>>,
    ) -> tokio::task::JoinHandle<()>
    where
        Svc: Send + Sync + 'static,
    {
        let inner = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                let at = *coordinates.borrow_and_update();
                let Some(inner) = inner.upgrade() else { return };
                if let Some(at) = at {
                    let mut stages = (*inner.balancer.stages()).clone();
                    if let Some(a) = &mut stages.aperture {
                        if a.coordinates != Some(at) {
                            a.coordinates = Some(at);
                            let now = inner.balancer.clock().now();
                            inner.balancer.set_stages(stages, now);
                        }
                    }
                }
                drop(inner);
                if coordinates.changed().await.is_err() {
                    return;
                }
            }
        })
    }

    /// The balancer: current snapshot, strategy, statistics of every endpoint.
    pub fn balancer(&self) -> &Balancer<S> {
        &self.inner.balancer
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.inner.balancer.snapshot()
    }

    /// Run `strategy` as a shadow beside the pool's own (see `lbkit_core::shadow`): it picks for
    /// every first attempt too, nothing is sent, and [`shadow_report`](Self::shadow_report)
    /// and the `lbkit_shadow_*` metric families say how often it disagrees and where it would
    /// have sent the traffic. Replaces a running shadow.
    pub fn start_shadow(&self, label: impl Into<String>, strategy: BoxStrategy) {
        let now = self.inner.balancer.clock().now();
        self.inner.balancer.start_shadow(label, strategy, now);
    }

    /// Stop the shadow.
    pub fn stop_shadow(&self) {
        let now = self.inner.balancer.clock().now();
        self.inner.balancer.set_shadow(None, now);
    }

    /// What the running shadow saw, per endpoint of the current snapshot.
    pub fn shadow_report(&self) -> Option<lbkit_core::shadow::ShadowReport>
    where
        Svc: Send + Sync + 'static,
    {
        PoolView::shadow(&*self.inner)
    }

    /// The trace recorder, when the pool records one ([`PoolBuilder::trace`]).
    pub fn trace(&self) -> Option<&Arc<lbkit_trace::Recorder>> {
        self.inner.trace.as_ref()
    }

    /// What the pool task has done; wait on a condition with `wait_for` under a timeout.
    pub fn status(&self) -> watch::Receiver<PoolStatus> {
        self.inner.status.subscribe()
    }

    /// Whether a client service exists for `key`.
    pub fn has_service(&self, key: &EndpointKey) -> bool {
        let map = self.inner.services.load();
        let held = map.values().any(|e| &e.key == key);
        held
    }

    /// Number of client services held.
    pub fn service_count(&self) -> usize {
        self.inner.services.load().len()
    }

    /// The pool's metric families (the [`telemetry`](crate::telemetry) table), for a
    /// `prometheus_client` registry: read from the pool's atomics at each scrape.
    pub fn collector(&self) -> PoolCollector
    where
        Svc: Send + Sync + 'static,
    {
        PoolCollector(self.inner.clone())
    }
}

impl<Svc, S: Strategy> fmt::Debug for Pool<Svc, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("name", &self.inner.name)
            .field("strategy", &self.inner.balancer.strategy().name())
            .field("status", &*self.inner.status.borrow())
            .finish_non_exhaustive()
    }
}

/// Settings of a [`Pool`]. Every field has a default.
#[derive(Debug)]
pub struct PoolBuilder<S = BoxStrategy> {
    strategy: S,
    name: Arc<str>,
    clock: Clock,
    availability: Availability,
    probes: u32,
    tick: Duration,
    policy: SnapshotPolicy,
    outlier: Option<OutlierConfig>,
    removal: Option<lbkit_discovery::RemovalProtection>,
    #[cfg(feature = "health-checks")]
    health: Option<HealthChecks>,
    trace: Option<Arc<lbkit_trace::Recorder>>,
    shadow: Option<(String, BoxStrategy)>,
    stages: lbkit_core::stage::Stages,
}

/// Active checks of a pool: the probe and its thresholds.
#[cfg(feature = "health-checks")]
pub(crate) struct HealthChecks {
    pub(crate) probe: Box<dyn HealthProbe>,
    pub(crate) check: lbkit_health::active::ActiveCheck,
}

/// A probe the pool can run (lbkit-health's `Probe`, boxed).
#[cfg(feature = "health-checks")]
pub(crate) trait HealthProbe: Send + Sync + 'static {
    fn run(
        self: Box<Self>,
        check: lbkit_health::active::ActiveCheck,
        current: Box<dyn Fn() -> Option<Arc<Snapshot>> + Send>,
        tx: tokio::sync::mpsc::Sender<(EndpointKey, bool)>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;
}

#[cfg(feature = "health-checks")]
impl<P: lbkit_health::active::Probe> HealthProbe for P {
    fn run(
        self: Box<Self>,
        check: lbkit_health::active::ActiveCheck,
        current: Box<dyn Fn() -> Option<Arc<Snapshot>> + Send>,
        tx: tokio::sync::mpsc::Sender<(EndpointKey, bool)>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        Box::pin(lbkit_health::active::run(*self, check, current, tx))
    }
}

#[cfg(feature = "health-checks")]
impl fmt::Debug for HealthChecks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HealthChecks")
            .field("check", &self.check)
            .finish_non_exhaustive()
    }
}

impl Default for PoolBuilder<BoxStrategy> {
    fn default() -> Self {
        PoolBuilder::new(BoxStrategy::new(lbkit_strategy::P2cEwma::default()))
    }
}

// === impl PoolBuilder ===

impl<S: Strategy> PoolBuilder<S> {
    /// A pool picking with `strategy` (the default builder uses `p2c-ewma`, tower's choice).
    ///
    /// Defaults: name `"default"`, the system clock, the core's [`Availability`] filter
    /// (Ribbon's circuit breaker: 3 failures in a row pass an endpoint over for 10–30 s),
    /// [`DEFAULT_READINESS_PROBES`], [`DEFAULT_TICK_INTERVAL`], no snapshot policy, no
    /// outlier detection, and the default mass-removal protection
    /// ([`lbkit_discovery::RemovalProtection`]).
    pub fn new(strategy: S) -> Self {
        PoolBuilder {
            strategy,
            name: Arc::from("default"),
            clock: Clock::System,
            availability: Availability::default(),
            probes: DEFAULT_READINESS_PROBES,
            tick: DEFAULT_TICK_INTERVAL,
            policy: SnapshotPolicy::default(),
            outlier: None,
            removal: Some(lbkit_discovery::RemovalProtection::default()),
            #[cfg(feature = "health-checks")]
            health: None,
            trace: None,
            shadow: None,
            stages: lbkit_core::stage::Stages::default(),
        }
    }

    /// Run `stages` in front of the strategy ([`lbkit_core::stage`]): metadata subsets,
    /// locality weights, an aperture (priority tiers run whenever the endpoints carry more than
    /// one priority). Requests carry their subset attributes through
    /// [`HttpRequests::attributes`](crate::http::HttpRequests::attributes).
    ///
    /// ```
    /// use lbkit_core::stage::{Stages, SubsetFallback, Subsets};
    /// use lbkit_tower::PoolBuilder;
    /// let builder = PoolBuilder::default().stages(Stages {
    ///     subsets: Some(Subsets::new(vec![vec!["version".into()]], SubsetFallback::Any)),
    ///     ..Stages::default()
    /// });
    /// # let _ = builder;
    /// ```
    pub fn stages(mut self, stages: lbkit_core::stage::Stages) -> Self {
        self.stages = stages;
        self
    }

    /// Start the pool with `strategy` running as a shadow, labelled `label` (see
    /// [`Pool::start_shadow`]).
    pub fn shadow(mut self, label: impl Into<String>, strategy: BoxStrategy) -> Self {
        self.shadow = Some((label.into(), strategy));
        self
    }

    /// Record a sampled trace of the pool's calls (every attempt of `config.sample_rate` of
    /// the requests, into `config.path`, within `config.max_bytes`: see lbkit-trace), for
    /// `lbkit sim --trace`. The trace's service name is the pool's [`name`](Self::name). The
    /// file is created now.
    ///
    /// # Errors
    /// An invalid config, or the file cannot be created.
    pub fn trace(self, config: &lbkit_trace::TraceConfig) -> Result<Self, lbkit_trace::TraceError> {
        let recorder = lbkit_trace::Recorder::open(config)?;
        Ok(self.trace_recorder(Arc::new(recorder)))
    }

    /// Record into `recorder`, shared with other pools (one file for several services).
    pub fn trace_recorder(mut self, recorder: Arc<lbkit_trace::Recorder>) -> Self {
        self.trace = Some(recorder);
        self
    }

    /// Pick with `strategy` instead (e.g. one from `lbkit_strategy::catalog::build`).
    pub fn strategy<S2: Strategy>(self, strategy: S2) -> PoolBuilder<S2> {
        PoolBuilder {
            strategy,
            name: self.name,
            clock: self.clock,
            availability: self.availability,
            probes: self.probes,
            tick: self.tick,
            policy: self.policy,
            outlier: self.outlier,
            removal: self.removal,
            #[cfg(feature = "health-checks")]
            health: self.health,
            trace: self.trace,
            shadow: self.shadow,
            stages: self.stages,
        }
    }

    /// Name the pool (the `pool` label of its metrics, the `pool` field of its spans).
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.name = name.into();
        self
    }

    /// Read time from `clock` (tests: a manual clock).
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Use `availability` as the pick-time filter ([`Availability::OFF`]: none).
    pub fn availability(mut self, availability: Availability) -> Self {
        self.availability = availability;
        self
    }

    /// Look at up to `probes` candidates (at least 1) before waiting on one that is not ready.
    pub fn readiness_probes(mut self, probes: u32) -> Self {
        self.probes = probes.max(1);
        self
    }

    /// Tick every `interval` (at least 1 ms).
    pub fn tick_interval(mut self, interval: Duration) -> Self {
        self.tick = interval.max(Duration::from_millis(1));
        self
    }

    /// Build snapshots under `policy` (panic threshold, slow start).
    pub fn snapshot_policy(mut self, policy: SnapshotPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Mass-removal protection: when the set shrinks by more than a share of its size within a
    /// window, its removals are held until each endpoint is confirmed gone (see
    /// [`lbkit_discovery::RemovalProtection`]); `None` turns it off. Default on, with its
    /// defaults (a shrink by more than half within 10 s; served at most 120 s unconfirmed).
    pub fn removal_protection(
        mut self,
        config: Option<lbkit_discovery::RemovalProtection>,
    ) -> Self {
        self.removal = config;
        self
    }

    /// Eject outliers with lbkit-health's detector, ticked every `config.interval`.
    pub fn outlier_detection(mut self, config: OutlierConfig) -> Self {
        self.outlier = Some(config);
        self
    }

    /// Probe every endpoint with `probe` (lbkit-health's [`TcpProbe`](lbkit_health::active::TcpProbe),
    /// [`HttpProbe`](lbkit_health::active::HttpProbe), or your own, e.g. a gRPC health check)
    /// under `check`'s interval, timeout and rise/fall thresholds: an endpoint that fails
    /// `fall` probes in a row is taken out until `rise` probes in a row pass — the same checks
    /// `lbkit proxy` runs (feature `health-checks`).
    #[cfg(feature = "health-checks")]
    pub fn health_check<P: lbkit_health::active::Probe>(
        mut self,
        probe: P,
        check: lbkit_health::active::ActiveCheck,
    ) -> Self {
        self.health = Some(HealthChecks {
            probe: Box::new(probe),
            check,
        });
        self
    }

    /// Start the pool on `source`, making services with `make`.
    ///
    /// Updates that are ready at once (a static list, a channel with queued items) are applied
    /// before this returns; the rest by a task spawned on the current tokio runtime, which ends
    /// when the last clone of the pool is dropped.
    ///
    /// # Panics
    /// Outside a tokio runtime (like `tokio::spawn`).
    pub fn spawn<Svc, St, E, M>(self, source: St, make: M) -> Pool<Svc, S>
    where
        Svc: Send + Sync + 'static,
        St: Stream<Item = Result<Update, E>> + Send + 'static,
        E: Into<BoxError> + 'static,
        M: MakeEndpoint<Svc>,
    {
        discovery::start(self, source, make)
    }

    /// Start the pool on a fixed list of endpoints (see [`spawn`](Self::spawn)).
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn_static<Svc, M>(self, endpoints: Vec<EndpointSpec>, make: M) -> Pool<Svc, S>
    where
        Svc: Send + Sync + 'static,
        M: MakeEndpoint<Svc>,
    {
        let once = futures_util::stream::iter([Ok::<_, std::convert::Infallible>(Update::Reset(
            endpoints,
        ))]);
        self.spawn(once, make)
    }
}
