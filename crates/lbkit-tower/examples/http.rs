//! A hyper HTTP client balancing over three local hyper servers: one fast, one slow, one that
//! answers 503.
//!
//! Each endpoint's service is the one shared hyper-util client behind [`SetOrigin`], which
//! points requests at that endpoint. The balance picks with `least-active` (Dubbo's
//! `LeastActiveLoadBalance`) and fails over GET requests (idempotent) that get a 503; the
//! response body is tracked, so each call ends when its body has been read.
//!
//! Run it with `cargo run -p lbkit-tower --example http`; the tests run [`run`] too.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use lbkit_core::{Endpoint, EndpointSpec};
use lbkit_strategy::catalog::{build, Params};
use lbkit_tower::http::SetOrigin;
use lbkit_tower::{BalanceLayer, BoxError, PoolBuilder, TryMake};
use tower::{Layer, Service, ServiceExt};

/// What the example saw.
#[derive(Debug, Default)]
pub struct Report {
    /// Requests each server received, by name.
    pub received: BTreeMap<&'static str, u32>,
    /// Responses the client got, by status code and body.
    pub responses: BTreeMap<(u16, String), u32>,
    /// Requests that failed at the client.
    pub failed: u32,
}

/// A server on 127.0.0.1 answering every request after `delay` with `status` and its name.
async fn serve(
    name: &'static str,
    status: u16,
    delay: Duration,
    hits: Arc<AtomicU32>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let hits = hits.clone();
            let svc = hyper::service::service_fn(move |_req: hyper::Request<Incoming>| {
                hits.fetch_add(1, Relaxed);
                async move {
                    tokio::time::sleep(delay).await;
                    let mut resp = hyper::Response::new(Full::new(Bytes::from(name)));
                    *resp.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or_default();
                    Ok::<_, Infallible>(resp)
                }
            });
            tokio::spawn(async move {
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                let _ = builder.serve_connection(TokioIo::new(stream), svc).await;
            });
        }
    });
    Ok((addr, task))
}

/// Start three servers, send `requests` GET requests through the balance, and report.
///
/// # Errors
/// When a server cannot bind a loopback port, or the strategy name is unknown.
pub async fn run(requests: u32) -> Result<Report, BoxError> {
    let servers = [
        ("fast", 200, Duration::ZERO),
        ("slow", 200, Duration::from_millis(30)),
        ("overloaded", 503, Duration::ZERO),
    ];
    let mut specs = Vec::new();
    let mut tasks = Vec::new();
    let mut hits = Vec::new();
    for (name, status, delay) in servers {
        let counter = Arc::new(AtomicU32::new(0));
        let (addr, task) = serve(name, status, delay, counter.clone()).await?;
        specs.push(EndpointSpec::new(addr.to_string()));
        tasks.push(task);
        hits.push((name, counter));
    }

    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let pool = PoolBuilder::new(build("least-active", Params::new())?)
        .name("web")
        .spawn_static(
            specs,
            TryMake(move |ep: &Endpoint| SetOrigin::http(client.clone(), ep.address())),
        );
    let balance = BalanceLayer::http()
        .failover(2)
        .timeout(Duration::from_secs(2))
        .layer(pool);

    let mut report = Report::default();
    let mut calls = Vec::new();
    for i in 0..requests {
        // Four requests at a time, so the least-active strategy sees concurrency.
        let mut svc = balance.clone();
        calls.push(async move {
            let req = http::Request::get(format!("/items/{i}")).body(Full::default())?;
            let resp = svc.ready().await?.call(req).await?;
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await?.to_bytes();
            Ok::<_, BoxError>((status, String::from_utf8_lossy(&body).into_owned()))
        });
        if calls.len() == 4 || i + 1 == requests {
            for result in futures_util::future::join_all(calls.drain(..)).await {
                match result {
                    Ok(key) => *report.responses.entry(key).or_default() += 1,
                    Err(_) => report.failed += 1,
                }
            }
        }
    }
    for task in tasks {
        task.abort();
    }
    for (name, counter) in hits {
        report.received.insert(name, counter.load(Relaxed));
    }
    Ok(report)
}

#[allow(dead_code)] // the tests call `run`
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let report = run(40).await?;
    println!("requests received by each server: {:?}", report.received);
    println!("responses (status, body): {:?}", report.responses);
    println!("requests failed: {}", report.failed);
    Ok(())
}
