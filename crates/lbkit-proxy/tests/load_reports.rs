//! Load reports on the wire (issue 41): ORCA's `endpoint-load-metrics` in an answer's head or
//! trailers reaches the endpoint's statistics through both engines of the proxy, `/endpoints`
//! shows it, and `adaptive` sends clearly less traffic to the server that reports 0.9 than to
//! the one that reports 0.1.

mod common;

#[rustfmt::skip]
#[path = "../../lbkit-tower/tests/support/orca_gen.rs"]
mod orca_gen;

use std::collections::HashMap;
use std::net::SocketAddr;

use bytes::Bytes;
use common::{client, config_for, endpoint_json, get, h2c_client, serve_hyper, start, WAIT};
use http::{HeaderMap, Response, StatusCode};
use http_body_util::{BodyExt, Full};

/// `OrcaLoadReport { cpu_utilization: 0.1 }`, base64.
const CPU_01_BIN: &str = "CZqZmZmZmbk/";

/// A backend answering its `name` with `header: value` in the head, or in the trailers when
/// `trailer` (as gRPC servers send reports).
async fn reporting(
    name: &'static str,
    header: &'static str,
    value: &'static str,
    trailer: bool,
) -> SocketAddr {
    serve_hyper(move |_req| async move {
        let body = Full::new(Bytes::from(name));
        let mut resp = Response::builder().status(200);
        if !trailer {
            resp = resp.header(header, value);
        }
        let body = body.with_trailers(async move {
            trailer.then(|| {
                let mut t = HeaderMap::new();
                t.insert(header, value.parse().expect("value"));
                Ok(t)
            })
        });
        resp.body(body).expect("response")
    })
    .await
}

/// gRPC's schedule (`choice = "wrr"`): picks follow the reported weights whatever the latency,
/// so a backend that reports 0.9 keeps getting some calls (the default `p2c` choice would also
/// weigh the latency, which favours whichever backend answered first at this low load).
const ADAPTIVE: &str = "params = { blackout_ms = 0, period_ms = 20, choice = \"wrr\" }";

/// Wait until `/endpoints` shows a load report of `utilization` for `addr`, and `adaptive`
/// weighs it.
async fn reported(
    proxy: &lbkit_proxy::Proxy,
    addr: SocketAddr,
    utilization: f64,
) -> serde_json::Value {
    tokio::time::timeout(WAIT, async {
        loop {
            let e = endpoint_json(proxy, addr).await;
            let weighed = e["strategy_note"]
                .as_str()
                .is_some_and(|n| n.contains("from its load report"));
            if e["load"]["utilization"].as_f64() == Some(utilization) && weighed {
                return e;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("a load report of {utilization} from {addr} in time"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_in_heads_reach_adaptive_through_the_fast_path() {
    let busy = reporting(
        "busy",
        "endpoint-load-metrics",
        "TEXT cpu_utilization=0.9",
        false,
    )
    .await;
    let idle = reporting("idle", "endpoint-load-metrics-bin", CPU_01_BIN, false).await;
    let proxy = start(&config_for(&[busy, idle], "adaptive", ADAPTIVE)).await;
    let addr = proxy.listeners()[0];
    let client = client();
    for _ in 0..4 {
        assert_eq!(get(&client, addr, "/", &[]).await.0, StatusCode::OK);
    }
    let e = reported(&proxy, busy, 0.9).await;
    assert_eq!(e["load"]["qps"], 0.0, "{e}");
    reported(&proxy, idle, 0.1).await;
    let mut answers: HashMap<String, u32> = HashMap::new();
    for _ in 0..200 {
        let (status, body, _) = get(&client, addr, "/", &[]).await;
        assert_eq!(status, StatusCode::OK);
        *answers.entry(body).or_default() += 1;
    }
    let (busy_n, idle_n) = (answers["busy"], answers["idle"]);
    assert!(idle_n >= 5 * busy_n, "idle {idle_n}, busy {busy_n}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_in_trailers_reach_the_endpoint_over_h2c() {
    let busy = reporting(
        "busy",
        "endpoint-load-metrics",
        "JSON {\"cpu_utilization\": 0.9}",
        true,
    )
    .await;
    let idle = reporting(
        "idle",
        "endpoint-load-metrics",
        &*Box::leak(format!("BIN {CPU_01_BIN}").into_boxed_str()),
        true,
    )
    .await;
    let extra = format!("{ADAPTIVE}\nh2c = true");
    let proxy = start(&config_for(&[busy, idle], "adaptive", &extra)).await;
    let addr = proxy.listeners()[0];
    let h2 = h2c_client();
    for _ in 0..4 {
        let req = http::Request::get(format!("http://{addr}/"))
            .body(Full::new(Bytes::new()))
            .expect("request");
        let resp = tokio::time::timeout(WAIT, h2.request(req))
            .await
            .expect("in time")
            .expect("answer");
        assert_eq!(resp.status(), StatusCode::OK);
        let body = resp.into_body().collect().await.expect("body");
        assert!(body.trailers().is_some(), "the trailers are relayed");
    }
    reported(&proxy, busy, 0.9).await;
    reported(&proxy, idle, 0.1).await;
}

/// A raw HTTP/1.1 backend answering every request chunked, with a load report of `value` in
/// its trailers (hyper sends trailers on HTTP/1.1 only to a client that asked with `TE`, a
/// header the proxy does not pass on).
async fn chunked_reporting(value: &'static str) -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (addr, _) = common::counting_server(move |mut s| async move {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let Ok(n) = s.read(&mut chunk).await else {
                return;
            };
            if n == 0 {
                return;
            }
            buf.extend_from_slice(&chunk[..n]);
            while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                buf.drain(..end + 4);
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\nbusy\r\n0\r\n\
                     endpoint-load-metrics: {value}\r\n\r\n"
                );
                if s.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_in_chunked_trailers_reach_the_endpoint_through_the_fast_path() {
    let busy = chunked_reporting("TEXT cpu_utilization=0.9").await;
    let proxy = start(&config_for(&[busy], "round-robin", "")).await;
    let addr = proxy.listeners()[0];
    let (status, body, _) = get(&client(), addr, "/", &[]).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "busy"));
    // Recorded before the client had the answer's last bytes.
    let e = endpoint_json(&proxy, busy).await;
    assert_eq!(e["load"]["utilization"], 0.9, "{e}");
}

/// An ORCA server (the service generated from the xds protos) reporting `cpu` every interval
/// its client asks for.
async fn orca_server(cpu: f64) -> SocketAddr {
    use orca_gen::xds::data::orca::v3::OrcaLoadReport;
    use orca_gen::xds::service::orca::v3::open_rca_service_server::{
        OpenRcaService, OpenRcaServiceServer,
    };
    use orca_gen::xds::service::orca::v3::OrcaLoadReportRequest;
    type Reports = std::pin::Pin<
        Box<dyn futures_util::Stream<Item = Result<OrcaLoadReport, tonic::Status>> + Send>,
    >;
    struct Orca(f64);
    #[tonic::async_trait]
    impl OpenRcaService for Orca {
        type StreamCoreMetricsStream = Reports;
        async fn stream_core_metrics(
            &self,
            request: tonic::Request<OrcaLoadReportRequest>,
        ) -> Result<tonic::Response<Reports>, tonic::Status> {
            let d = request.into_inner().report_interval.unwrap_or_default();
            let every = std::time::Duration::new(d.seconds as u64, d.nanos as u32);
            let report = OrcaLoadReport {
                cpu_utilization: self.0,
                ..OrcaLoadReport::default()
            };
            let stream = futures_util::stream::unfold((), move |()| {
                let report = report.clone();
                async move {
                    tokio::time::sleep(every).await;
                    Some((Ok(report), ()))
                }
            });
            Ok(tonic::Response::new(Box::pin(stream)))
        }
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    let server = tonic::transport::Server::builder()
        .serve_with_incoming(OpenRcaServiceServer::new(Orca(cpu)), incoming);
    tokio::spawn(server);
    addr
}

// `orca_oob_ms`: reports streamed out of band (OpenRcaService; these servers serve nothing
// else) reach the endpoints' statistics, and `adaptive` weighs them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_band_reports_reach_adaptive() {
    let (busy, idle) = (orca_server(0.9).await, orca_server(0.1).await);
    let extra = format!("{ADAPTIVE}\nh2c = true\norca_oob_ms = 20");
    let proxy = start(&config_for(&[busy, idle], "adaptive", &extra)).await;
    reported(&proxy, busy, 0.9).await;
    let e = reported(&proxy, idle, 0.1).await;
    assert!(
        e["load"]["age_ms"].as_u64().is_some_and(|age| age < 5_000),
        "{e}"
    );
    proxy.shutdown(std::time::Duration::from_secs(1)).await;
}
