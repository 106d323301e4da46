//! lbkit as an xDS control plane: every service of an `lbkit xds` file — its endpoints from
//! a static list, a watched file or a ZooKeeper registry (Dubbo's layout with its override
//! and tag rules applied) — served over the Aggregated Discovery Service (state of the world
//! and incremental) to Envoy and to proxyless gRPC clients, as a Listener, a Cluster and a
//! ClusterLoadAssignment named after the service.
//!
//! - [`config`]: the file (`[xds]` and the proxy's `[service.NAME]` tables) and what of it
//!   cannot be expressed in xDS ([`XdsConfig::notes`]).
//! - [`resources`]: one service as xDS resources.
//! - [`cache`]: the served resources, versioned per resource.
//! - [`session`]: one ADS stream's protocol state (subscriptions, versions, nonces, NACKs);
//!   [`delta`]: the same for the incremental variant.
//! - [`server`]: the gRPC service and its metrics.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let config = lbkit_xds::XdsConfig::load("xds.toml".as_ref())?;
//! let running = lbkit_xds::start(config).await?;
//! println!("ADS on {}, /metrics on {}", running.ads(), running.admin());
//! # Ok(()) }
//! ```

pub mod cache;
pub mod config;
pub mod delta;
mod feed;
mod listener;
pub mod resources;
pub mod server;
pub mod session;
pub mod wire;

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::AggregatedDiscoveryService;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub use cache::Cache;
pub use config::XdsConfig;
pub use server::{Ads, Metrics};
pub use wire::AdsServer;

/// Why `lbkit xds` could not start.
#[derive(Debug, thiserror::Error)]
pub enum XdsError {
    /// A listener could not be bound.
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        /// `xds.bind` or `xds.admin`.
        what: &'static str,
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// A service's source could not start.
    #[error(transparent)]
    Source(#[from] lbkit_proxy::ProxyError),
}

/// A running `lbkit xds`: its listeners and tasks, stopped when dropped.
#[derive(Debug)]
pub struct Running {
    ads: SocketAddr,
    admin: SocketAddr,
    cache: Cache,
    metrics: Arc<Metrics>,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// Where the ADS listener is bound.
    pub fn ads(&self) -> SocketAddr {
        self.ads
    }

    /// Where `/metrics` is served.
    pub fn admin(&self) -> SocketAddr {
        self.admin
    }

    /// The served resources.
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// The counters.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Bind both listeners, start every service's source and control loop, and serve.
///
/// # Errors
/// [`XdsError`] when a listener cannot be bound or a source cannot start.
pub async fn start(config: XdsConfig) -> Result<Running, XdsError> {
    let bind = |what, addr| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|source| XdsError::Bind { what, addr, source })
    };
    let ads_listener = bind("xds.bind", config.xds.bind).await?;
    let admin_listener = bind("xds.admin", config.xds.admin).await?;
    let local = |l: &TcpListener, what, addr| {
        l.local_addr()
            .map_err(|source| XdsError::Bind { what, addr, source })
    };
    let ads = local(&ads_listener, "xds.bind", config.xds.bind)?;
    let admin = local(&admin_listener, "xds.admin", config.xds.admin)?;
    let cache = Cache::new();
    let metrics = Arc::new(Metrics::default());
    let mut tasks = Vec::new();
    for (name, svc) in &config.services {
        let routes = config.routes_of(name);
        tasks.extend(feed::spawn(name, svc, routes, &cache, &metrics)?);
    }
    let service =
        Ads::new(cache.clone(), metrics.clone()).into_service(config.xds.max_request_bytes);
    tasks.push(tokio::spawn(serve_ads(ads_listener, service)));
    tasks.push(tokio::spawn(serve_admin(admin_listener, metrics.clone())));
    Ok(Running {
        ads,
        admin,
        cache,
        metrics,
        tasks,
    })
}

/// The next connection; on an error (out of file descriptors) a pause of 50 ms, so that a
/// failing `accept` does not spin.
async fn accept(listener: &TcpListener) -> Option<(tokio::net::TcpStream, SocketAddr)> {
    match listener.accept().await {
        Ok(conn) => Some(conn),
        Err(e) => {
            tracing::warn!(error = %e, "xds: accept failed");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            None
        }
    }
}

/// Serve an ADS implementation over gRPC (HTTP/2 without TLS) on `listener`, until the task is
/// dropped: `lbkit xds`'s own, or a test's scripted control plane.
pub async fn serve_ads<T: AggregatedDiscoveryService>(
    listener: TcpListener,
    service: AdsServer<T>,
) {
    // The connections are this task's: dropping it (a `Running` dropped) ends them all.
    let mut connections = tokio::task::JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let Some((stream, peer)) = accept(&listener).await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service = hyper_util::service::TowerToHyperService::new(WithPeer {
            inner: service.clone(),
            info: tonic::transport::server::TcpConnectInfo {
                local_addr: stream.local_addr().ok(),
                remote_addr: Some(peer),
            },
        });
        connections.spawn(async move {
            // PINGs every 30 s: a client gone without a FIN (a dead host, a cut path) is
            // dropped within 10 s more, with its stream and its place in the client count.
            let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .timer(hyper_util::rt::TokioTimer::new())
                .keep_alive_interval(Some(std::time::Duration::from_secs(30)))
                .keep_alive_timeout(std::time::Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service);
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "xds: connection ended");
            }
        });
    }
}

/// A service that gives each request its connection's addresses, as tonic's own transport
/// does (`Request::remote_addr`): the streams' log lines name their peer.
#[derive(Clone)]
struct WithPeer<S> {
    inner: S,
    info: tonic::transport::server::TcpConnectInfo,
}

impl<S, B> tonic::codegen::Service<http::Request<B>> for WithPeer<S>
where
    S: tonic::codegen::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        request.extensions_mut().insert(self.info.clone());
        self.inner.call(request)
    }
}

/// `GET /metrics` (OpenMetrics text); anything else is 404.
async fn serve_admin(listener: TcpListener, metrics: Arc<Metrics>) {
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    let registry = Arc::new(registry);
    loop {
        let Some((stream, _)) = accept(&listener).await else {
            continue;
        };
        let registry = registry.clone();
        let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
            let registry = registry.clone();
            async move { Ok::<_, std::convert::Infallible>(admin_reply(&req, &registry)) }
        });
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            let _ = conn.await;
        });
    }
}

fn admin_reply(req: &Request<hyper::body::Incoming>, registry: &Registry) -> Response<Full<Bytes>> {
    let (status, body) = if req.uri().path() == "/metrics" {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, registry);
        (StatusCode::OK, out)
    } else {
        (
            StatusCode::NOT_FOUND,
            "not found: try /metrics\n".to_owned(),
        )
    };
    let mut reply = Response::new(Full::new(Bytes::from(body)));
    *reply.status_mut() = status;
    reply.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
    );
    reply
}
