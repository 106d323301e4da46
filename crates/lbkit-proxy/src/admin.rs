//! The admin API, on its own listener (127.0.0.1:9901 by default):
//!
//! | request | answer |
//! |---|---|
//! | `GET /healthz` | `ok` |
//! | `GET /endpoints` | JSON: per service, its strategy and each endpoint's address, weight, effective weight, eligible, healthy, ejected, in_flight, ewma_ms, requests, failures, the last load report (`load`: utilization, qps, eps, age_ms, flowing_ms; ORCA `endpoint-load-metrics` from the answers) the strategy's note on it (`strategy_note`: for `adaptive`, its share and where its weight comes from) and, while it asks to be left alone (`429`, `503` with `Retry-After`, `grpc-retry-pushback-ms`), the milliseconds left (`pushed_back_ms`, else null; picks pass it over meanwhile) |
//! | `GET /metrics` | OpenMetrics text (Prometheus reads it; every family with `# HELP` and `# TYPE`): per service `lbkit_proxy_requests_total`, `lbkit_proxy_failures_total`, `lbkit_proxy_in_flight`, `lbkit_proxy_request_duration_seconds`; the families a tower pool writes too (`lbkit_tower::telemetry`): retries and refused retries, discovery (snapshots published, source errors, empty pushes held), per endpoint calls, failures by kind, cancellations, in-flight, ejections, eligibility, call latency histogram; client connections open (`lbkit_proxy_client_connections`, upgraded tunnels included) and their limit; with several workers, the connections each serves (`lbkit_proxy_worker_connections{worker}`) |
//! | `PUT /services/{name}/strategy` | body `{"strategy": "p2c-ewma", "params": {"default_rtt_ms": 20}}`: switch at run time |
//! | `PUT /services/{name}/shadow` | the same body: run that strategy as a shadow beside the live one (it picks for every first attempt too, nothing is sent; it survives strategy switches, not reloads) |
//! | `GET /services/{name}/shadow` | JSON: the candidate, first attempts observed, disagreements (and how many it could not pick), and per endpoint the live and candidate counts and shares; 404 when no shadow runs. `/metrics` has the same as `lbkit_shadow_*` |
//! | `DELETE /services/{name}/shadow` | stop it |
//!
//! With `admin.token` set, every request needs `Authorization: Bearer TOKEN` (else 401; the
//! token is compared in constant time). Without a token the admin listener must bind a
//! loopback address, unless `admin.allow_unauthenticated = true` (the configuration is refused
//! otherwise, by `lbkit proxy --check` too).

use std::collections::BTreeMap;
use std::convert::Infallible;
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

use crate::hub::{accept, Hub};
use crate::service::Service;

/// Admin connections at once (the admin API serves operators and scrapers, not traffic).
const ADMIN_CONNECTIONS: usize = 64;
/// Largest admin request body.
const MAX_BODY: usize = 64 * 1024;

type AdminResponse = Response<Full<Bytes>>;

/// Serve the admin API until shutdown.
pub(crate) async fn serve(
    listener: TcpListener,
    hub: Arc<Hub>,
    mut shutdown: watch::Receiver<bool>,
) {
    let conns = Arc::new(Semaphore::new(ADMIN_CONNECTIONS));
    // A connection that sends no complete head within `limits.header_read_timeout_ms` (idle
    // keep-alive connections too) is closed: idle clients cannot hold the admin API's
    // connection slots, so `/healthz` keeps answering liveness probes.
    let header_timeout = {
        let limits = &hub.state.load().config.limits;
        std::time::Duration::from_millis(limits.header_read_timeout_ms)
    };
    let mut builder = auto::Builder::new(TokioExecutor::new()).http1_only();
    builder
        .http1()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(header_timeout);
    while let Some((stream, _peer, permit)) = accept(&listener, &conns, &mut shutdown).await {
        let hub = hub.clone();
        let svc = service_fn(move |req| {
            let hub = hub.clone();
            async move { Ok::<_, Infallible>(handle(&hub, req).await) }
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

/// Whether `given` (an `Authorization` value) is `Bearer TOKEN`, compared in constant time:
/// how long the comparison takes says nothing about how much of the token was right.
fn bearer_matches(given: Option<&[u8]>, token: &str) -> bool {
    use subtle::ConstantTimeEq;
    let Some(given) = given.and_then(|g| g.strip_prefix(b"Bearer ")) else {
        return false;
    };
    bool::from(given.ct_eq(token.as_bytes()))
}

async fn handle(hub: &Hub, req: Request<Incoming>) -> AdminResponse {
    let state = hub.state.load_full();
    if let Some(token) = &state.config.admin.token {
        let given = req.headers().get(header::AUTHORIZATION);
        if !bearer_matches(given.map(|v| v.as_bytes()), token) {
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
            let services = state.services.iter().map(|(n, r)| (n.as_str(), &r.service));
            let (open, per_worker) = (hub.client_connections(), hub.worker_connections());
            let defences = hub.defences.read();
            let body = crate::exposition::document(services, open, per_worker, defences);
            reply(StatusCode::OK, crate::exposition::CONTENT_TYPE, body)
        }
        (method, p) => {
            let Some((name, what)) = p
                .strip_prefix("/services/")
                .and_then(|r| r.rsplit_once('/'))
            else {
                return text(StatusCode::NOT_FOUND, "not found\n");
            };
            let Some(service) = state.service(name) else {
                return text(StatusCode::NOT_FOUND, "no such service\n");
            };
            match (method, what) {
                (Method::PUT, "strategy") => set_strategy(service, req, false).await,
                (Method::PUT, "shadow") => set_strategy(service, req, true).await,
                (Method::GET, "shadow") => match service.shadow_report() {
                    Some(r) => reply(
                        StatusCode::OK,
                        "application/json",
                        shadow_json(&r).to_string(),
                    ),
                    None => text(StatusCode::NOT_FOUND, "no shadow runs\n"),
                },
                (Method::DELETE, "shadow") => {
                    if service.stop_shadow() {
                        text(StatusCode::OK, "ok\n")
                    } else {
                        text(StatusCode::NOT_FOUND, "no shadow runs\n")
                    }
                }
                _ => text(StatusCode::NOT_FOUND, "not found\n"),
            }
        }
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

/// `PUT /services/{name}/strategy`, or with `shadow` `PUT /services/{name}/shadow`.
async fn set_strategy(service: &Service, req: Request<Incoming>, shadow: bool) -> AdminResponse {
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
    let done = if shadow {
        service.start_shadow(&change.strategy, params)
    } else {
        service.set_strategy(&change.strategy, params).await
    };
    match done {
        Ok(()) => text(StatusCode::OK, "ok\n"),
        Err(e) => text(StatusCode::BAD_REQUEST, &format!("{e}\n")),
    }
}

/// The `GET /services/{name}/shadow` document.
fn shadow_json(r: &lbkit_core::shadow::ShadowReport) -> serde_json::Value {
    let endpoints: Vec<_> = r
        .endpoints
        .iter()
        .map(|e| {
            json!({
                "address": e.address,
                "live": e.live,
                "candidate": e.candidate,
                "live_share": e.live_share,
                "candidate_share": e.candidate_share,
            })
        })
        .collect();
    json!({
        "candidate": r.candidate,
        "picks": r.picks,
        "disagreements": r.disagreements,
        "disagreement_rate": if r.picks == 0 { 0.0 } else { r.disagreements as f64 / r.picks as f64 },
        "unpicked": r.unpicked,
        "endpoints": endpoints,
    })
}

/// The `/endpoints` document.
pub(crate) fn endpoints_json<'a>(
    services: impl Iterator<Item = (&'a str, &'a Service)>,
) -> serde_json::Value {
    let out: serde_json::Map<String, serde_json::Value> = services
        .map(|(name, service)| (name.to_owned(), service_json(service)))
        .collect();
    json!({ "services": out })
}

/// One service in `/endpoints`: its strategy, stages, aperture and endpoints.
fn service_json(service: &Service) -> serde_json::Value {
    let active = service.active();
    let prepared = active.balancer.current();
    let now = service.clock().now();
    let endpoints: Vec<_> = (0..prepared.snapshot().len())
        .map(|i| endpoint_json(&prepared, lbkit_core::EndpointIdx::new(i), now))
        .collect();
    // What the stages do for a request without tag or attributes: its subset (the
    // fallback's), tier loads, zone shares, aperture.
    let stages = match prepared.stage_report(None, &[]) {
        Ok(Some(r)) => lbkit_discovery::stages::report_json(&r),
        Ok(None) => serde_json::Value::Null,
        Err(e) => json!({ "error": e.to_string() }),
    };
    let aperture = active.balancer.stages().aperture.map(|a| {
        json!({
            "size": a.size,
            "mode": a.mode.to_string(),
            "client_index": a.coordinates.map(|c| c.index),
            "client_count": a.coordinates.map(|c| c.count),
        })
    });
    json!({
        "strategy": active.strategy,
        "stages": stages,
        "aperture": aperture,
        "endpoints": endpoints,
    })
}

/// One endpoint in `/endpoints`.
fn endpoint_json<P: lbkit_core::Picker>(
    prepared: &lbkit_core::Prepared<P>,
    idx: lbkit_core::EndpointIdx,
    now: lbkit_core::Timestamp,
) -> serde_json::Value {
    let snapshot = prepared.snapshot();
    let e = snapshot.endpoint(idx);
    // The registry's override rules that changed it (`RULE sets k=v; …`), if any.
    let rules = lbkit_discovery::governance::applied_rules(e.metadata());
    // Its tags (own `dubbo.tag`, the registry's tag rule), for tag routing.
    let tags = lbkit_discovery::governance::tag::describe_tags(e.metadata());
    json!({
        "address": e.address(),
        "priority": e.priority(),
        "zone": e.zone(),
        "rules": rules,
        "tags": tags,
        "weight": e.weight(),
        "effective_weight": snapshot.effective_weight(idx, now),
        "eligible": snapshot.is_eligible(idx),
        "healthy": e.is_healthy(),
        "ejected": snapshot.ejected_until(idx).is_some(),
        "in_flight": e.stats().in_flight(),
        "ewma_ms": e.stats().ewma_at(now).map(|d| d.as_secs_f64() * 1e3),
        "requests": e.stats().total(),
        "failures": e.stats().failures(),
        "load": e.stats().load_report().map(|l| json!({
            "utilization": l.utilization,
            "qps": l.qps,
            "eps": l.eps,
            "age_ms": now.saturating_duration_since(l.at).as_millis() as u64,
            "flowing_ms": now.saturating_duration_since(l.since).as_millis() as u64,
        })),
        "strategy_note": e.is_eligible().then(|| prepared.picker().explain(idx, now)).flatten(),
        "pushed_back_ms": e.stats().pushed_back_until(now)
            .map(|until| until.saturating_duration_since(now).as_millis() as u64),
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_bearer_token_passes() {
        let token = "s3cret";
        assert!(bearer_matches(Some(b"Bearer s3cret"), token));
        for given in [
            &b"Bearer s3cre"[..],
            b"Bearer s3cret ",
            b"Bearer S3cret",
            b"bearer s3cret",
            b"s3cret",
            b"Bearer ",
        ] {
            assert!(!bearer_matches(Some(given), token), "{given:?}");
        }
        assert!(!bearer_matches(None, token));
    }
}
