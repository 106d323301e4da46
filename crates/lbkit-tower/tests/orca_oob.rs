//! Out-of-band load reports (issue 41): real tonic servers serving ORCA's `OpenRcaService`
//! (generated from the xds protos, tests/codegen.rs) stream reports into a pool's statistics
//! through `orca::oob::watch`; `adaptive` weighs them; a server without the service is asked
//! once; a stream that ends or sends nonsense is handled; an endpoint that leaves has its stream
//! cancelled.

// Generated code, compared token by token with what the protos give (tests/codegen.rs):
// rustfmt must leave it as generated.
#[rustfmt::skip]
#[path = "support/orca_gen.rs"]
mod orca_gen;

#[rustfmt::skip]
#[path = "../examples/proto/echo.rs"]
#[allow(dead_code, unreachable_pub, missing_docs, clippy::all)]
mod echo;

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use lbkit_core::{Endpoint, EndpointKey, EndpointSpec, FastRng, PickContext, Picker, Update};
use lbkit_strategy::{Adaptive, AdaptiveConfig};
use lbkit_tower::orca::oob::{self, OobConfig, OobCounts};
use lbkit_tower::{Pool, PoolBuilder, TryMake};
use orca_gen::xds::data::orca::v3::OrcaLoadReport;
use orca_gen::xds::service::orca::v3::open_rca_service_server::{
    OpenRcaService, OpenRcaServiceServer,
};
use orca_gen::xds::service::orca::v3::OrcaLoadReportRequest;
use tokio::sync::{mpsc, oneshot};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// What a test server sends on each stream.
#[derive(Clone, Copy)]
enum Script {
    /// `cpu_utilization` every report interval, forever.
    Cpu(f64),
    /// One report with a negative utilisation, then one good one, then the stream ends.
    BadThenEnd,
    /// One report, then silence with the stream held open (a peer that vanished).
    OneThenSilent,
}

/// An ORCA server; counts the streams open now and the intervals asked for.
#[derive(Clone)]
struct Orca {
    script: Script,
    open: Arc<AtomicUsize>,
    asked_ms: mpsc::UnboundedSender<u64>,
}

/// Decrements the open-stream count when the server drops the stream (the client went).
struct Open(Arc<AtomicUsize>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

type Reports = Pin<Box<dyn Stream<Item = Result<OrcaLoadReport, Status>> + Send>>;

#[tonic::async_trait]
impl OpenRcaService for Orca {
    type StreamCoreMetricsStream = Reports;

    async fn stream_core_metrics(
        &self,
        request: Request<OrcaLoadReportRequest>,
    ) -> Result<Response<Reports>, Status> {
        let every = request
            .into_inner()
            .report_interval
            .map_or(Duration::ZERO, |d| {
                Duration::new(d.seconds as u64, d.nanos as u32)
            });
        let _ = self.asked_ms.send(every.as_millis() as u64);
        self.open.fetch_add(1, SeqCst);
        let guard = Open(self.open.clone());
        let report = |cpu| OrcaLoadReport {
            cpu_utilization: cpu,
            ..OrcaLoadReport::default()
        };
        let stream: Reports = match self.script {
            Script::Cpu(cpu) => {
                Box::pin(futures_util::stream::unfold(guard, move |g| async move {
                    tokio::time::sleep(every).await;
                    Some((Ok(report(cpu)), g))
                }))
            }
            Script::BadThenEnd => Box::pin(futures_util::stream::iter([
                Ok(report(-1.0)),
                Ok(report(0.5)),
            ])),
            Script::OneThenSilent => Box::pin(
                futures_util::stream::iter([Ok::<_, Status>(report(0.7))])
                    .chain(futures_util::stream::pending())
                    .map(move |r| {
                        let _ = &guard;
                        r
                    }),
            ),
        };
        Ok(Response::new(stream))
    }
}

struct Server {
    addr: SocketAddr,
    open: Arc<AtomicUsize>,
    asked_ms: mpsc::UnboundedReceiver<u64>,
    _stop: oneshot::Sender<()>,
}

/// Serve ORCA with `script` (or, with `None`, a server of another service only: every ORCA
/// call is `UNIMPLEMENTED`).
async fn serve(script: Option<Script>) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    let (stop, stopped) = oneshot::channel::<()>();
    let (tx, asked_ms) = mpsc::unbounded_channel();
    let open = Arc::new(AtomicUsize::new(0));
    let orca = Orca {
        script: script.unwrap_or(Script::Cpu(0.0)),
        open: open.clone(),
        asked_ms: tx,
    };
    let router = tonic::transport::Server::builder();
    let shutdown = async {
        let _ = stopped.await;
    };
    if script.is_some() {
        let svc = OpenRcaServiceServer::new(orca);
        tokio::spawn(router.serve_with_incoming_shutdown(svc, incoming, shutdown));
    } else {
        let health = tonic_health_like();
        tokio::spawn(router.serve_with_incoming_shutdown(health, incoming, shutdown));
    }
    Server {
        addr,
        open,
        asked_ms,
        _stop: stop,
    }
}

/// A gRPC server without ORCA: the generated server of another service (echo).
fn tonic_health_like() -> impl tower::Service<
    http::Request<tonic::body::Body>,
    Response = http::Response<tonic::body::Body>,
    Error = std::convert::Infallible,
    Future = impl Send,
> + tonic::server::NamedService
       + Clone
       + Send
       + Sync
       + 'static {
    #[derive(Clone, Copy)]
    struct Silent;
    #[tonic::async_trait]
    impl echo::echo_server::Echo for Silent {
        async fn say(
            &self,
            _: Request<echo::SayRequest>,
        ) -> Result<Response<echo::SayReply>, Status> {
            Err(Status::unavailable("not in this test"))
        }
        type RepeatStream = futures_util::stream::Empty<Result<echo::SayReply, Status>>;
        async fn repeat(
            &self,
            _: Request<echo::RepeatRequest>,
        ) -> Result<Response<Self::RepeatStream>, Status> {
            Err(Status::unavailable("not in this test"))
        }
    }
    echo::echo_server::EchoServer::new(Silent)
}

fn channel(ep: &Endpoint) -> Result<Channel, tonic::transport::Error> {
    tonic::transport::Endpoint::from_shared(format!("http://{}", ep.address()))
        .map(|e| e.connect_lazy())
}

/// Reports count at once and weights follow every 10 ms.
fn adaptive() -> Adaptive {
    Adaptive::new(AdaptiveConfig {
        blackout: Duration::ZERO,
        period: Duration::from_millis(10),
        ..AdaptiveConfig::default()
    })
}

const FAST: OobConfig = OobConfig {
    interval: Duration::from_millis(20),
    backoff_min: Duration::from_millis(10),
    backoff_max: Duration::from_millis(40),
    silence: Duration::from_millis(200),
};

/// Wait (at most 10 s) until `ok` holds.
async fn until(mut ok: impl FnMut() -> bool) {
    tokio::time::timeout(Duration::from_secs(10), async {
        while !ok() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("in time");
}

fn utilization(pool: &Pool<Channel, Adaptive>, addr: SocketAddr) -> Option<f64> {
    let snap = pool.snapshot();
    let i = snap.find(&EndpointKey::from(addr.to_string().as_str()))?;
    Some(snap.endpoint(i).stats().load_report()?.utilization)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_stream_into_the_pool_and_adaptive_weighs_them() {
    let (mut busy, mut idle) = (
        serve(Some(Script::Cpu(0.9))).await,
        serve(Some(Script::Cpu(0.1))).await,
    );
    let specs = [busy.addr, idle.addr].map(|a| EndpointSpec::new(a.to_string()));
    let pool = PoolBuilder::new(adaptive()).spawn_static(specs.to_vec(), TryMake(channel));
    let reports = oob::watch(&pool, FAST);
    until(|| {
        utilization(&pool, busy.addr) == Some(0.9) && utilization(&pool, idle.addr) == Some(0.1)
    })
    .await;
    assert_eq!(
        busy.asked_ms.recv().await,
        Some(20),
        "the interval asked for"
    );
    assert_eq!(idle.asked_ms.recv().await, Some(20));
    // The weights are re-prepared on the pool's tick; wait for one that weighs both.
    let note = |a: SocketAddr| {
        let current = pool.balancer().current();
        let key = EndpointKey::from(a.to_string().as_str());
        let i = current.snapshot().find(&key).unwrap();
        current.picker().explain(i, pool.balancer().clock().now())
    };
    until(|| note(busy.addr).is_some_and(|n| n.contains("from its load report"))).await;
    let mut rng = FastRng::seed_from_u64(1);
    let mut to_idle = 0;
    for _ in 0..200 {
        let now = pool.balancer().clock().now();
        let guard = pool
            .balancer()
            .pick(&mut PickContext::new(now, &mut rng))
            .unwrap();
        to_idle += u32::from(guard.endpoint().address() == idle.addr.to_string());
    }
    assert!(to_idle >= 190, "{to_idle} of 200 picks to the idle server");
    let c = reports.counts();
    assert!(c.reports >= 2 && c.opened == 2 && c.failed == 0, "{c:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_orca_is_asked_once_and_bad_reports_are_rejected() {
    let plain = serve(None).await;
    let flaky = serve(Some(Script::BadThenEnd)).await;
    let specs = [plain.addr, flaky.addr].map(|a| EndpointSpec::new(a.to_string()));
    let pool = PoolBuilder::new(adaptive()).spawn_static(specs.to_vec(), TryMake(channel));
    let reports = oob::watch(&pool, FAST);
    // The flaky server's stream ends after each pair of reports and is opened again after the
    // backoff: three rounds, each one report rejected and one recorded.
    until(|| {
        let c = reports.counts();
        c.opened >= 4 && c.rejected >= 3 && c.unimplemented >= 1
    })
    .await;
    let c: OobCounts = reports.counts();
    assert_eq!(c.unimplemented, 1, "{c:?}");
    assert!(c.reports >= 2 && c.failed >= 2, "{c:?}");
    assert_eq!(utilization(&pool, flaky.addr), Some(0.5));
    assert_eq!(utilization(&pool, plain.addr), None);
    // UNIMPLEMENTED is final: the plain server is not asked again.
    let opened = c.opened;
    until(|| reports.counts().opened >= opened + 2).await;
    assert_eq!(reports.counts().unimplemented, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_ends_when_its_endpoint_leaves_and_all_end_with_the_pool() {
    let (a, b) = (
        serve(Some(Script::Cpu(0.3))).await,
        serve(Some(Script::Cpu(0.4))).await,
    );
    let (tx, rx) = mpsc::unbounded_channel::<Result<Update, std::convert::Infallible>>();
    let spec = |s: &Server| EndpointSpec::new(s.addr.to_string());
    tx.send(Ok(Update::Reset(vec![spec(&a), spec(&b)])))
        .unwrap();
    let source =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|u| (u, rx)) });
    let pool = PoolBuilder::new(adaptive())
        .removal_protection(None)
        .spawn(source, TryMake(channel));
    let _reports = oob::watch(&pool, FAST);
    until(|| a.open.load(SeqCst) == 1 && b.open.load(SeqCst) == 1).await;
    tx.send(Ok(Update::Reset(vec![spec(&a)]))).unwrap();
    until(|| b.open.load(SeqCst) == 0).await;
    assert_eq!(a.open.load(SeqCst), 1, "the other stream stays");
    drop(pool);
    until(|| a.open.load(SeqCst) == 0).await;
}

// Without a pool (as `lbkit proxy` calls it): the snapshots a balancer publishes, a client
// service made per endpoint, streams following joins and leaves within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_snapshot_source_can_be_followed() {
    use lbkit_core::{Balancer, Clock, Snapshot, SnapshotBuilder};
    let (a, b) = (
        serve(Some(Script::Cpu(0.3))).await,
        serve(Some(Script::Cpu(0.4))).await,
    );
    let clock = Clock::System;
    let spec = |s: &Server| EndpointSpec::new(s.addr.to_string());
    let mut builder = SnapshotBuilder::new();
    let both = builder.apply(Update::Reset(vec![spec(&a), spec(&b)]), clock.now());
    let balancer = Arc::new(Balancer::new(adaptive(), both.clone(), clock.now()));
    let weak = Arc::downgrade(&balancer);
    let current = move || weak.upgrade().map(|b| b.snapshot());
    let make = |ep: &Endpoint| channel(ep).map_err(Into::into);
    let (reports, _task) = oob::watch_endpoints(current, clock.clone(), make, FAST);
    let util = |snap: &Snapshot, s: &Server| {
        let i = snap.find(&EndpointKey::from(s.addr.to_string().as_str()))?;
        Some(snap.endpoint(i).stats().load_report()?.utilization)
    };
    until(|| util(&both, &a) == Some(0.3) && util(&both, &b) == Some(0.4)).await;
    // b leaves: its stream is cancelled; a's stays.
    let only_a = builder.apply(Update::Reset(vec![spec(&a)]), clock.now());
    balancer.publish(only_a, clock.now());
    until(|| b.open.load(SeqCst) == 0).await;
    assert_eq!(a.open.load(SeqCst), 1);
    assert!(reports.counts().reports >= 2);
    // The source gone, every stream ends.
    drop(balancer);
    until(|| a.open.load(SeqCst) == 0).await;
}

// A stream that goes silent with its connection open is taken for dead after `silence` and
// opened again, so an endpoint whose peer vanished without a reset is asked anew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_stream_is_opened_again() {
    let quiet = serve(Some(Script::OneThenSilent)).await;
    let specs = vec![EndpointSpec::new(quiet.addr.to_string())];
    let pool = PoolBuilder::new(adaptive()).spawn_static(specs, TryMake(channel));
    let reports = oob::watch(&pool, FAST);
    until(|| reports.counts().opened >= 3).await;
    let c = reports.counts();
    assert!(c.reports >= 2 && c.failed >= 2, "{c:?}");
    assert_eq!(utilization(&pool, quiet.addr), Some(0.7));
}
