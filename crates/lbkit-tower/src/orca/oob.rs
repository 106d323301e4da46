//! Out-of-band load reports: ORCA's `OpenRcaService`, streamed from every endpoint of a gRPC
//! [`Pool`] into its statistics, where `adaptive` weighs them.
//!
//! Per-call reports ([`record`](super::record)) come only with answers: an endpoint that gets no
//! calls, or serves long streams, reports nothing. Out of band, the client opens one
//! server-streaming call per endpoint, `/xds.service.orca.v3.OpenRcaService/StreamCoreMetrics`,
//! asking for a report every `interval`, and the server sends its `OrcaLoadReport` at that
//! pace (gRFC A51; `weighted_round_robin`'s `enable_oob_load_report`).
//!
//! * **One stream per endpoint**, over the endpoint's own client service (a tonic `Channel`:
//!   the same connection the calls use), opened when the endpoint appears in the pool and
//!   cancelled when it leaves or its address changes. The task that keeps them ends with the
//!   pool.
//! * **Reports** are checked as the per-call ones are (a number that is negative or not finite
//!   rejects the report) and recorded with [`OrcaReport::record`] at the pool's clock.
//! * **Failures**: a server without the service (`UNIMPLEMENTED`) is not asked again while the
//!   endpoint stays; any other error or an ended stream reopens it after a backoff that starts
//!   at `backoff_min` and doubles to `backoff_max` (gRPC's 1 s and 120 s), reset by a stream that
//!   delivered a report. A stream silent for `silence` (90 s) is taken for dead and opened
//!   again.
//!
//! ```no_run
//! use std::time::Duration;
//! use lbkit_core::{Endpoint, EndpointSpec};
//! use lbkit_tower::orca::oob::{self, OobConfig};
//! use lbkit_tower::{PoolBuilder, TryMake};
//!
//! # async fn doc() {
//! let pool = PoolBuilder::new(lbkit_strategy::Adaptive::default()).spawn_static(
//!     vec![EndpointSpec::new("127.0.0.1:50051"), EndpointSpec::new("127.0.0.1:50052")],
//!     TryMake(|ep: &Endpoint| {
//!         tonic::transport::Endpoint::from_shared(format!("http://{}", ep.address()))
//!             .map(|e| e.connect_lazy())
//!     }),
//! );
//! let reports = oob::watch(&pool, OobConfig { interval: Duration::from_secs(1), ..OobConfig::default() });
//! # let _ = reports.counts();
//! # }
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use http::uri::PathAndQuery;
use lbkit_core::{Clock, Endpoint, EndpointKey, Snapshot, Strategy, Timestamp};
use tokio::task::JoinHandle;
use tonic::client::GrpcService;
use tonic::{Code, Status};

use super::{OrcaReport, WireReport};
use crate::error::BoxError;
use crate::pool::{Pool, PoolInner};

/// The request body type of a stream's client service (tonic's), for building one without
/// depending on tonic (a hyper client for `lbkit proxy`).
pub type GrpcBody = tonic::body::Body;

/// The method every ORCA server serves.
pub const PATH: &str = "/xds.service.orca.v3.OpenRcaService/StreamCoreMetrics";

/// How often to ask for reports, and how to back off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OobConfig {
    /// The `report_interval` asked for (default 10 s, gRPC's `oob_reporting_period`). A server
    /// may send less often (gRPC servers enforce a minimum, 30 s unless configured).
    pub interval: Duration,
    /// First wait before a failed stream is opened again (1 s).
    pub backoff_min: Duration,
    /// Longest wait (120 s).
    pub backoff_max: Duration,
    /// A stream with no report for this long (and at least `interval`) is taken for dead and
    /// opened again: a peer that went away without a reset must not leave its endpoint without
    /// reports. Default 90 s: three times the 30 s that gRPC servers send at most, unless
    /// configured otherwise, whatever interval is asked for.
    pub silence: Duration,
}

impl Default for OobConfig {
    fn default() -> Self {
        OobConfig {
            interval: Duration::from_secs(10),
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(120),
            silence: Duration::from_secs(90),
        }
    }
}

/// `xds.service.orca.v3.OrcaLoadReportRequest`.
#[derive(Clone, PartialEq, prost::Message)]
struct ReportRequest {
    #[prost(message, optional, tag = "1")]
    report_interval: Option<ProtoDuration>,
    #[prost(string, repeated, tag = "2")]
    request_cost_names: Vec<String>,
}

/// `google.protobuf.Duration`.
#[derive(Clone, Copy, PartialEq, prost::Message)]
struct ProtoDuration {
    #[prost(int64, tag = "1")]
    seconds: i64,
    #[prost(int32, tag = "2")]
    nanos: i32,
}

/// What the streams have done so far.
#[derive(Debug, Default)]
struct Counters {
    opened: AtomicU64,
    reports: AtomicU64,
    rejected: AtomicU64,
    unimplemented: AtomicU64,
    failed: AtomicU64,
}

/// Counts of a [`watch`]'s streams, as [`OobReports::counts`] reads them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OobCounts {
    /// Streams opened (reopenings included).
    pub opened: u64,
    /// Reports recorded.
    pub reports: u64,
    /// Reports rejected (a negative or non-finite number).
    pub rejected: u64,
    /// Endpoints that answered `UNIMPLEMENTED` (not asked again).
    pub unimplemented: u64,
    /// Streams that failed or ended otherwise (reopened after a backoff).
    pub failed: u64,
}

/// The running streams of a pool: read their counts; they stop with the pool.
#[derive(Clone, Debug)]
pub struct OobReports {
    counters: Arc<Counters>,
}

impl OobReports {
    /// The counts so far.
    pub fn counts(&self) -> OobCounts {
        let c = &self.counters;
        OobCounts {
            opened: c.opened.load(Relaxed),
            reports: c.reports.load(Relaxed),
            rejected: c.rejected.load(Relaxed),
            unimplemented: c.unimplemented.load(Relaxed),
            failed: c.failed.load(Relaxed),
        }
    }
}

/// A client service an ORCA stream can run over (a tonic `Channel`, hyper's client behind
/// [`SetOrigin`](crate::http::SetOrigin), any gRPC service).
pub trait OrcaClient:
    GrpcService<
        tonic::body::Body,
        Future: Send,
        ResponseBody: http_body::Body<Data = Bytes, Error: Into<BoxError> + Send> + Send + 'static,
    > + Clone
    + Send
    + Sync
    + 'static
{
}

impl<T> OrcaClient for T where
    T: GrpcService<
            tonic::body::Body,
            Future: Send,
            ResponseBody: http_body::Body<Data = Bytes, Error: Into<BoxError> + Send>
                              + Send
                              + 'static,
        > + Clone
        + Send
        + Sync
        + 'static
{
}

/// Where a stream's reports go: the endpoint's statistics in the current snapshot.
trait Sink: Send + Sync + 'static {
    /// The current endpoints and the time now; `None` once the owner is gone (streams stop).
    fn current(&self) -> Option<(Arc<Snapshot>, Timestamp)>;
}

/// A pool's snapshots.
struct PoolSink<Svc, S: Strategy>(Weak<PoolInner<Svc, S>>);

impl<Svc: Send + Sync + 'static, S: Strategy> Sink for PoolSink<Svc, S> {
    fn current(&self) -> Option<(Arc<Snapshot>, Timestamp)> {
        let pool = self.0.upgrade()?;
        let now = pool.balancer.clock().now();
        Some((pool.balancer.snapshot(), now))
    }
}

/// Any source of snapshots (a proxy service's balancer).
struct FnSink<F>(F, Clock);

impl<F> Sink for FnSink<F>
where
    F: Fn() -> Option<Arc<Snapshot>> + Send + Sync + 'static,
{
    fn current(&self) -> Option<(Arc<Snapshot>, Timestamp)> {
        Some(((self.0)()?, self.1.now()))
    }
}

/// Stream load reports from every endpoint of `pool` into its statistics, following the pool's
/// membership, until the pool is dropped.
///
/// # Panics
/// Outside a tokio runtime.
pub fn watch<Svc, S>(pool: &Pool<Svc, S>, config: OobConfig) -> OobReports
where
    Svc: OrcaClient,
    S: Strategy,
{
    let counters = Arc::new(Counters::default());
    let status = pool.inner.status.subscribe();
    let inner = Arc::downgrade(&pool.inner);
    let sink: Arc<dyn Sink> = Arc::new(PoolSink(inner.clone()));
    tokio::spawn(follow_pool(inner, status, sink, config, counters.clone()));
    OobReports { counters }
}

/// Stream load reports from every endpoint of the snapshots `current` returns (checked for
/// joins and leaves every [`FOLLOW_EVERY`]), over a client service `make` makes per endpoint,
/// into the endpoints' statistics at `clock`'s time — until `current` returns `None`. For
/// callers without a [`Pool`], such as `lbkit proxy`'s services. An endpoint whose service
/// cannot be made is left without a stream. Aborting the task returned stops every stream.
///
/// # Panics
/// Outside a tokio runtime.
pub fn watch_endpoints<Svc, C, M>(
    current: C,
    clock: Clock,
    make: M,
    config: OobConfig,
) -> (OobReports, JoinHandle<()>)
where
    Svc: OrcaClient,
    C: Fn() -> Option<Arc<Snapshot>> + Send + Sync + 'static,
    M: FnMut(&Endpoint) -> Result<Svc, BoxError> + Send + 'static,
{
    let counters = Arc::new(Counters::default());
    let sink = Arc::new(FnSink(current, clock));
    let task = tokio::spawn(follow_snapshots(sink, make, config, counters.clone()));
    (OobReports { counters }, task)
}

/// The shortest wait before a stream is opened again, whatever the config says.
pub const MIN_BACKOFF: Duration = Duration::from_millis(10);

/// How often [`watch_endpoints`] looks for joins and leaves.
pub const FOLLOW_EVERY: Duration = Duration::from_secs(1);

/// What makes an endpoint's stream the same one: its address and, in a pool, its client
/// service's entry (an endpoint removed and added again gets a new client, and a new stream).
type Identity = (Arc<str>, usize);

/// The streams of one owner, by endpoint: reconciled with its current endpoints.
struct Streams<Svc> {
    running: HashMap<EndpointKey, (Identity, AbortOnDrop)>,
    sink: Arc<dyn Sink>,
    config: OobConfig,
    counters: Arc<Counters>,
    _svc: std::marker::PhantomData<fn() -> Svc>,
}

impl<Svc: OrcaClient> Streams<Svc> {
    fn new(sink: Arc<dyn Sink>, config: OobConfig, counters: Arc<Counters>) -> Self {
        Streams {
            running: HashMap::new(),
            sink,
            config,
            counters,
            _svc: std::marker::PhantomData,
        }
    }

    /// Keep a stream for each `(key, address, instance)` of `endpoints` (another address or
    /// instance is a new stream), made with `make` when it is new; cancel the others.
    fn reconcile<'e>(
        &mut self,
        endpoints: impl Iterator<Item = (&'e EndpointKey, &'e str, usize)>,
        mut make: impl FnMut(&EndpointKey) -> Option<Svc>,
    ) {
        let mut keep = HashMap::new();
        for (key, address, instance) in endpoints {
            match self.running.remove(key) {
                Some(entry) if *entry.0 .0 == *address && entry.0 .1 == instance => {
                    keep.insert(key.clone(), entry);
                }
                _ => {
                    let Some(svc) = make(key) else { continue };
                    let task = tokio::spawn(stream_endpoint(
                        self.sink.clone(),
                        key.clone(),
                        svc,
                        self.config,
                        self.counters.clone(),
                    ));
                    let id = (Arc::from(address), instance);
                    keep.insert(key.clone(), (id, AbortOnDrop(task)));
                }
            }
        }
        // What is left in `running` is cancelled as it drops.
        self.running = keep;
    }
}

/// A stream task per endpoint service of a pool, reconciled at every publish.
async fn follow_pool<Svc, S>(
    inner: Weak<PoolInner<Svc, S>>,
    mut status: tokio::sync::watch::Receiver<crate::pool::PoolStatus>,
    sink: Arc<dyn Sink>,
    config: OobConfig,
    counters: Arc<Counters>,
) where
    Svc: OrcaClient,
    S: Strategy,
{
    let mut streams = Streams::<Svc>::new(sink, config, counters);
    loop {
        let Some(pool) = inner.upgrade() else { break };
        let services = pool.services.load_full();
        drop(pool);
        let by_key: HashMap<&EndpointKey, &Svc> =
            services.values().map(|e| (&e.key, &e.svc)).collect();
        let endpoints = services
            .values()
            .map(|e| (&e.key, &*e.address, Arc::as_ptr(e) as usize));
        streams.reconcile(endpoints, |key| by_key.get(key).map(|svc| (*svc).clone()));
        if status.changed().await.is_err() {
            break;
        }
    }
}

/// A stream task per endpoint of the current snapshot, reconciled every [`FOLLOW_EVERY`].
async fn follow_snapshots<Svc, M>(
    sink: Arc<dyn Sink>,
    mut make: M,
    config: OobConfig,
    counters: Arc<Counters>,
) where
    Svc: OrcaClient,
    M: FnMut(&Endpoint) -> Result<Svc, BoxError> + Send + 'static,
{
    let mut streams = Streams::<Svc>::new(sink.clone(), config, counters);
    let mut version = None;
    while let Some((snapshot, _)) = sink.current() {
        if version != Some(snapshot.version()) {
            version = Some(snapshot.version());
            let endpoints = snapshot
                .endpoints()
                .iter()
                .map(|e| (e.key(), e.address(), 0));
            streams.reconcile(endpoints, |key| {
                let e = snapshot.endpoint(snapshot.find(key)?);
                make(e)
                    .map_err(|err| tracing::warn!(endpoint = %key, error = %err, "no ORCA client"))
                    .ok()
            });
        }
        tokio::time::sleep(FOLLOW_EVERY).await;
    }
}

/// Aborts its task when dropped (the endpoint left, or the owner is gone).
#[derive(Debug)]
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Keep one endpoint's stream open: reopen after a backoff, stop at `UNIMPLEMENTED`.
async fn stream_endpoint<Svc: OrcaClient>(
    sink: Arc<dyn Sink>,
    key: EndpointKey,
    svc: Svc,
    config: OobConfig,
    counters: Arc<Counters>,
) {
    // A zero or huge backoff from a hand-made config: no hot loop, no overflow.
    let floor = config.backoff_min.max(MIN_BACKOFF);
    let ceiling = config.backoff_max.max(floor);
    let mut backoff = floor;
    loop {
        counters.opened.fetch_add(1, Relaxed);
        let mut received = 0u64;
        let ended = stream_once(&*sink, &key, svc.clone(), &config, &counters, &mut received).await;
        if sink.current().is_none() {
            return;
        }
        match ended {
            Err(s) if s.code() == Code::Unimplemented => {
                counters.unimplemented.fetch_add(1, Relaxed);
                tracing::info!(endpoint = %key, "no OpenRcaService: out-of-band load reports off for this endpoint");
                return;
            }
            Err(s) => tracing::debug!(endpoint = %key, status = %s, "ORCA stream failed"),
            Ok(()) => tracing::debug!(endpoint = %key, "ORCA stream ended"),
        }
        counters.failed.fetch_add(1, Relaxed);
        if received > 0 {
            backoff = floor;
        }
        tokio::time::sleep(backoff).await;
        backoff = backoff.saturating_mul(2).min(ceiling);
    }
}

/// One stream: open it, record every report until it ends.
async fn stream_once<Svc: OrcaClient>(
    sink: &dyn Sink,
    key: &EndpointKey,
    svc: Svc,
    config: &OobConfig,
    counters: &Counters,
    received: &mut u64,
) -> Result<(), Status> {
    let mut grpc = tonic::client::Grpc::new(svc);
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(e.into().to_string()))?;
    let interval = ProtoDuration {
        seconds: i64::try_from(config.interval.as_secs()).unwrap_or(i64::MAX),
        nanos: config.interval.subsec_nanos() as i32,
    };
    let request = ReportRequest {
        report_interval: Some(interval),
        request_cost_names: Vec::new(),
    };
    let codec = tonic_prost::ProstCodec::<ReportRequest, WireReport>::default();
    let path = PathAndQuery::from_static(PATH);
    let mut stream = grpc
        .server_streaming(tonic::Request::new(request), path, codec)
        .await?
        .into_inner();
    let silent = config.silence.max(config.interval);
    loop {
        let next = tokio::time::timeout(silent, stream.message()).await;
        let Ok(next) = next else {
            return Err(Status::unavailable(format!("no report for {silent:?}")));
        };
        let Some(wire) = next? else { break };
        *received += 1;
        let Some((snapshot, now)) = sink.current() else {
            return Ok(());
        };
        match OrcaReport::from_wire(wire) {
            Ok(report) => {
                if let Some(i) = snapshot.find(key) {
                    report.record(snapshot.endpoint(i).stats(), now);
                    counters.reports.fetch_add(1, Relaxed);
                }
            }
            Err(e) => {
                counters.rejected.fetch_add(1, Relaxed);
                tracing::debug!(endpoint = %key, error = %e, "ORCA report rejected");
            }
        }
    }
    Ok(())
}
