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
//!   delivered a report.
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
use lbkit_core::{EndpointKey, Strategy};
use tokio::task::JoinHandle;
use tonic::client::GrpcService;
use tonic::{Code, Status};

use super::{OrcaReport, WireReport};
use crate::error::BoxError;
use crate::pool::{Entry, Pool, PoolInner};

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
}

impl Default for OobConfig {
    fn default() -> Self {
        OobConfig {
            interval: Duration::from_secs(10),
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(120),
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

/// Stream load reports from every endpoint of `pool` into its statistics, following the pool's
/// membership, until the pool is dropped.
///
/// # Panics
/// Outside a tokio runtime.
pub fn watch<Svc, S>(pool: &Pool<Svc, S>, config: OobConfig) -> OobReports
where
    Svc: GrpcService<tonic::body::Body> + Clone + Send + Sync + 'static,
    Svc::Future: Send,
    Svc::ResponseBody: http_body::Body<Data = Bytes> + Send + 'static,
    <Svc::ResponseBody as http_body::Body>::Error: Into<BoxError> + Send,
    S: Strategy,
{
    let counters = Arc::new(Counters::default());
    let status = pool.inner.status.subscribe();
    let inner = Arc::downgrade(&pool.inner);
    tokio::spawn(follow(inner, status, config, counters.clone()));
    OobReports { counters }
}

/// A stream task per endpoint service, reconciled with the pool's services at every publish.
async fn follow<Svc, S>(
    inner: Weak<PoolInner<Svc, S>>,
    mut status: tokio::sync::watch::Receiver<crate::pool::PoolStatus>,
    config: OobConfig,
    counters: Arc<Counters>,
) where
    Svc: GrpcService<tonic::body::Body> + Clone + Send + Sync + 'static,
    Svc::Future: Send,
    Svc::ResponseBody: http_body::Body<Data = Bytes> + Send + 'static,
    <Svc::ResponseBody as http_body::Body>::Error: Into<BoxError> + Send,
    S: Strategy,
{
    let mut running: HashMap<u64, (Arc<Entry<Svc>>, AbortOnDrop)> = HashMap::new();
    loop {
        let Some(pool) = inner.upgrade() else { break };
        let services = pool.services.load_full();
        drop(pool);
        running.retain(|h, (entry, _)| services.get(h).is_some_and(|e| Arc::ptr_eq(e, entry)));
        for (h, entry) in services.iter() {
            if running.contains_key(h) {
                continue;
            }
            let task = tokio::spawn(stream_endpoint(
                inner.clone(),
                entry.key.clone(),
                entry.svc.clone(),
                config,
                counters.clone(),
            ));
            running.insert(*h, (entry.clone(), AbortOnDrop(task)));
        }
        if status.changed().await.is_err() {
            break;
        }
    }
}

/// Aborts its task when dropped (the endpoint left, or the pool is gone).
#[derive(Debug)]
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Keep one endpoint's stream open: reopen after a backoff, stop at `UNIMPLEMENTED`.
async fn stream_endpoint<Svc, S>(
    inner: Weak<PoolInner<Svc, S>>,
    key: EndpointKey,
    svc: Svc,
    config: OobConfig,
    counters: Arc<Counters>,
) where
    Svc: GrpcService<tonic::body::Body> + Clone + Send + Sync + 'static,
    Svc::Future: Send,
    Svc::ResponseBody: http_body::Body<Data = Bytes> + Send + 'static,
    <Svc::ResponseBody as http_body::Body>::Error: Into<BoxError> + Send,
    S: Strategy,
{
    let mut backoff = config.backoff_min;
    loop {
        counters.opened.fetch_add(1, Relaxed);
        let mut received = 0u64;
        let ended = stream_once(&inner, &key, svc.clone(), &config, &counters, &mut received).await;
        if inner.strong_count() == 0 {
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
            backoff = config.backoff_min;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(config.backoff_max);
    }
}

/// One stream: open it, record every report until it ends.
async fn stream_once<Svc, S>(
    inner: &Weak<PoolInner<Svc, S>>,
    key: &EndpointKey,
    svc: Svc,
    config: &OobConfig,
    counters: &Counters,
    received: &mut u64,
) -> Result<(), Status>
where
    Svc: GrpcService<tonic::body::Body> + Clone + Send + Sync + 'static,
    Svc::Future: Send,
    Svc::ResponseBody: http_body::Body<Data = Bytes> + Send + 'static,
    <Svc::ResponseBody as http_body::Body>::Error: Into<BoxError> + Send,
    S: Strategy,
{
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
    while let Some(wire) = stream.message().await? {
        *received += 1;
        let Some(pool) = inner.upgrade() else {
            return Ok(());
        };
        match OrcaReport::from_wire(wire) {
            Ok(report) => {
                let snapshot = pool.balancer.snapshot();
                if let Some(i) = snapshot.find(key) {
                    report.record(snapshot.endpoint(i).stats(), pool.balancer.clock().now());
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
