//! The admin API, on its own listener (127.0.0.1:9901 by default):
//!
//! | request | answer |
//! |---|---|
//! | `GET /healthz` | `ok` |
//! | `GET /endpoints` | JSON: per service, its strategy and each endpoint's address, weight, effective weight, eligible, healthy, ejected, in_flight, ewma_ms, requests, failures |
//! | `GET /metrics` | Prometheus text: per service requests, failures, retries, in-flight, latency histogram, discovery (snapshots published, source errors, empty pushes held); per endpoint requests, failures, in-flight, ejections, eligibility, call latency histogram; client connections open (`lbkit_proxy_client_connections`, upgraded tunnels included) and their limit |
//! | `PUT /services/{name}/strategy` | body `{"strategy": "p2c-ewma", "params": {"default_rtt_ms": 20}}`: switch at run time |
//!
//! With `admin.token` set, every request needs `Authorization: Bearer TOKEN` (else 401).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde::Deserialize;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use crate::metrics::{escape, render_histogram};
use crate::server::{accept, Shared};
use crate::service::Service;

/// Admin connections at once (the admin API serves operators and scrapers, not traffic).
const ADMIN_CONNECTIONS: usize = 64;
/// Largest admin request body.
const MAX_BODY: usize = 64 * 1024;

type AdminResponse = Response<Full<Bytes>>;

/// Serve the admin API until shutdown.
pub(crate) async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    let conns = Arc::new(Semaphore::new(ADMIN_CONNECTIONS));
    let builder = auto::Builder::new(TokioExecutor::new()).http1_only();
    while let Some((stream, _peer, permit)) = accept(&listener, &conns, &mut shutdown).await {
        let shared = shared.clone();
        let svc = service_fn(move |req| {
            let shared = shared.clone();
            async move { Ok::<_, Infallible>(handle(&shared, req).await) }
        });
        let conn = builder
            .serve_connection(TokioIo::new(stream), svc)
            .into_owned();
        tokio::spawn(async move {
            let _permit = permit;
            let _ = conn.await;
        });
    }
}

async fn handle(shared: &Shared, req: Request<Incoming>) -> AdminResponse {
    let state = shared.state.load_full();
    if let Some(token) = &state.config.admin.token {
        let expected = format!("Bearer {token}");
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .map(|v| v.as_bytes());
        if given != Some(expected.as_bytes()) {
            return text(StatusCode::UNAUTHORIZED, "missing or wrong bearer token\n");
        }
    }
    let path = req.uri().path().to_owned();
    match (req.method().clone(), path.as_str()) {
        (Method::GET, "/healthz") => text(StatusCode::OK, "ok\n"),
        (Method::GET, "/endpoints") => {
            let body = endpoints_json(
                state
                    .services
                    .iter()
                    .map(|(n, r)| (n.as_str(), &*r.service)),
            );
            reply(StatusCode::OK, "application/json", body.to_string())
        }
        (Method::GET, "/metrics") => {
            let mut body = metrics_text(
                state
                    .services
                    .iter()
                    .map(|(n, r)| (n.as_str(), &*r.service)),
            );
            let (open, max) = shared.client_connections();
            let _ = write!(
                body,
                "# TYPE lbkit_proxy_client_connections gauge\nlbkit_proxy_client_connections {open}\n\
                 # TYPE lbkit_proxy_client_connections_max gauge\nlbkit_proxy_client_connections_max {max}\n"
            );
            reply(StatusCode::OK, "text/plain; version=0.0.4", body)
        }
        (Method::PUT, p) => match p
            .strip_prefix("/services/")
            .and_then(|r| r.strip_suffix("/strategy"))
        {
            Some(name) => match state.service(name) {
                Some(service) => set_strategy(service, req).await,
                None => text(StatusCode::NOT_FOUND, "no such service\n"),
            },
            None => text(StatusCode::NOT_FOUND, "not found\n"),
        },
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

/// The body of `PUT /services/{name}/strategy`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StrategyChange {
    strategy: String,
    #[serde(default)]
    params: BTreeMap<String, serde_json::Value>,
}

async fn set_strategy(service: &Service, req: Request<Incoming>) -> AdminResponse {
    let Ok(body) = Limited::new(req.into_body(), MAX_BODY).collect().await else {
        return text(StatusCode::BAD_REQUEST, "unreadable body\n");
    };
    let change: StrategyChange = match serde_json::from_slice(&body.to_bytes()) {
        Ok(c) => c,
        Err(e) => return text(StatusCode::BAD_REQUEST, &format!("bad JSON: {e}\n")),
    };
    let params = lbkit_strategy::catalog::Params::from_pairs(change.params.iter().map(|(k, v)| {
        let text = match v {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        (k.clone(), text)
    }));
    match service.set_strategy(&change.strategy, params).await {
        Ok(()) => text(StatusCode::OK, "ok\n"),
        Err(e) => text(StatusCode::BAD_REQUEST, &format!("{e}\n")),
    }
}

/// The `/endpoints` document.
pub(crate) fn endpoints_json<'a>(
    services: impl Iterator<Item = (&'a str, &'a Service)>,
) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for (name, service) in services {
        let active = service.active();
        let snapshot = active.balancer.snapshot();
        let now = service.clock().now();
        let endpoints: Vec<_> = snapshot
            .endpoints()
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let idx = lbkit_core::EndpointIdx::new(i);
                json!({
                    "address": e.address(),
                    "weight": e.weight(),
                    "effective_weight": snapshot.effective_weight(idx, now),
                    "eligible": snapshot.is_eligible(idx),
                    "healthy": e.is_healthy(),
                    "ejected": snapshot.ejected_until(idx).is_some(),
                    "in_flight": e.stats().in_flight(),
                    "ewma_ms": e.stats().ewma_at(now).map(|d| d.as_secs_f64() * 1e3),
                    "requests": e.stats().total(),
                    "failures": e.stats().failures(),
                })
            })
            .collect();
        out.insert(
            name.to_owned(),
            json!({ "strategy": active.strategy, "endpoints": endpoints }),
        );
    }
    json!({ "services": out })
}

/// The `/metrics` document.
pub(crate) fn metrics_text<'a>(services: impl Iterator<Item = (&'a str, &'a Service)>) -> String {
    let mut out = String::new();
    out.push_str(
        "# TYPE lbkit_proxy_requests_total counter\n# TYPE lbkit_proxy_failures_total counter\n",
    );
    out.push_str("# TYPE lbkit_proxy_retries_total counter\n# TYPE lbkit_proxy_retries_refused_total counter\n");
    out.push_str("# TYPE lbkit_proxy_in_flight gauge\n# TYPE lbkit_proxy_request_duration_seconds histogram\n");
    out.push_str("# TYPE lbkit_proxy_endpoint_requests_total counter\n# TYPE lbkit_proxy_endpoint_failures_total counter\n");
    out.push_str("# TYPE lbkit_proxy_endpoint_in_flight gauge\n# TYPE lbkit_proxy_endpoint_ejections_total counter\n");
    out.push_str("# TYPE lbkit_proxy_endpoint_eligible gauge\n");
    out.push_str("# TYPE lbkit_proxy_endpoint_call_duration_seconds histogram\n");
    out.push_str("# TYPE lbkit_proxy_discovery_published_total counter\n# TYPE lbkit_proxy_discovery_source_errors_total counter\n");
    out.push_str("# TYPE lbkit_proxy_discovery_empty_held_total counter\n");
    for (name, service) in services {
        service.metrics().render(name, &mut out);
        if let Some(d) = service.discovery() {
            let l = format!("service=\"{}\"", escape(name));
            for (metric, value) in [
                ("published", d.published()),
                ("source_errors", d.source_errors()),
                ("empty_held", d.empty_held()),
            ] {
                let _ = writeln!(out, "lbkit_proxy_discovery_{metric}_total{{{l}}} {value}");
            }
        }
        let snapshot = service.active().balancer.snapshot();
        let ejections = service.ejections();
        for (i, e) in snapshot.endpoints().iter().enumerate() {
            let l = format!(
                "service=\"{}\",endpoint=\"{}\"",
                escape(name),
                escape(e.address())
            );
            let s = e.stats();
            let _ = writeln!(
                out,
                "lbkit_proxy_endpoint_requests_total{{{l}}} {}",
                s.total()
            );
            let _ = writeln!(
                out,
                "lbkit_proxy_endpoint_failures_total{{{l}}} {}",
                s.failures()
            );
            let _ = writeln!(
                out,
                "lbkit_proxy_endpoint_in_flight{{{l}}} {}",
                s.in_flight()
            );
            let ej = ejections.get(e.key()).copied().unwrap_or(0);
            let _ = writeln!(out, "lbkit_proxy_endpoint_ejections_total{{{l}}} {ej}");
            let eligible = u8::from(snapshot.is_eligible(lbkit_core::EndpointIdx::new(i)));
            let _ = writeln!(out, "lbkit_proxy_endpoint_eligible{{{l}}} {eligible}");
            // Every attempt that finished, success or failure.
            let name = "lbkit_proxy_endpoint_call_duration_seconds";
            render_histogram(&mut out, name, &l, &s.latency_histogram());
        }
    }
    out
}

fn text(status: StatusCode, body: &str) -> AdminResponse {
    reply(status, "text/plain; charset=utf-8", body.to_owned())
}

fn reply(status: StatusCode, content_type: &'static str, body: String) -> AdminResponse {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    resp
}
