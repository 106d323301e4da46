//! Real servers on 127.0.0.1 for the proxy's end-to-end tests.
#![allow(dead_code)] // each test file uses part of this

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper::Response;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use lbkit_proxy::{Config, Proxy};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Bound on any single wait in these tests.
pub const WAIT: Duration = Duration::from_secs(20);

/// An HTTP backend answering `NAME` to every request, echoing `x-forwarded-for` and
/// `forwarded` back as `x-seen-xff` / `x-seen-forwarded`, and `x-seen-connection` when a
/// `connection` header arrived. Dropping (or `kill`) closes the listener and every connection.
pub struct Backend {
    pub addr: SocketAddr,
    pub name: String,
    task: JoinHandle<()>,
}

impl Backend {
    pub async fn start(name: &str) -> Backend {
        Backend::start_on(name, SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    pub async fn start_on(name: &str, addr: SocketAddr) -> Backend {
        Backend::start_with(name, addr, Duration::ZERO).await
    }

    /// A backend that answers after `delay`.
    pub async fn start_slow(name: &str, delay: Duration) -> Backend {
        Backend::start_with(name, SocketAddr::from(([127, 0, 0, 1], 0)), delay).await
    }

    async fn start_with(name: &str, addr: SocketAddr, delay: Duration) -> Backend {
        let listener = TcpListener::bind(addr).await.expect("bind backend");
        let addr = listener.local_addr().expect("local addr");
        let body = Bytes::from(name.to_owned());
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let body = body.clone();
                conns.spawn(async move {
                    let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                        let body = body.clone();
                        async move {
                            if !delay.is_zero() {
                                // A deliberately slow backend (its service time), not a wait
                                // for a condition.
                                tokio::time::sleep(delay).await;
                            }
                            Ok::<_, Infallible>(answer(&req, body))
                        }
                    });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Backend {
            addr,
            name: name.to_owned(),
            task,
        }
    }

    /// Stop listening and close every connection, at once.
    pub fn kill(self) -> SocketAddr {
        self.task.abort();
        self.addr
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Size of the body served at `/big`: above the proxy's buffering bound, so it streams.
pub const BIG: usize = 100 * 1024;

fn answer(req: &Request<hyper::body::Incoming>, body: Bytes) -> Response<Full<Bytes>> {
    let body = if req.uri().path() == "/big" {
        Bytes::from(vec![b'x'; BIG])
    } else {
        body
    };
    let mut resp = Response::new(Full::new(body));
    // What named the target: `:authority` (HTTP/2; the URI's authority) and `Host`.
    if let Some(a) = req.uri().authority() {
        if let Ok(v) = http::HeaderValue::from_str(a.as_str()) {
            resp.headers_mut().insert("x-seen-authority", v);
        }
    }
    for (from, to) in [
        ("host", "x-seen-host"),
        ("x-forwarded-for", "x-seen-xff"),
        ("forwarded", "x-seen-forwarded"),
        ("connection", "x-seen-connection"),
        ("keep-alive", "x-seen-keep-alive"),
    ] {
        if let Some(v) = req.headers().get(from) {
            resp.headers_mut().insert(to, v.clone());
        }
    }
    if req.uri().path() == "/health" && req.headers().contains_key("x-never") {
        *resp.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    }
    resp
}

/// A test client (pooled keep-alive).
pub fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A client speaking HTTP/2 with prior knowledge (h2c): served by the proxy's hyper engine, not
/// its HTTP/1.1 fast path.
#[allow(dead_code)] // not every test binary speaks h2c
pub fn h2c_client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

/// GET `path` on `proxy` with extra headers; returns status, body and response headers.
pub async fn get(
    client: &Client<HttpConnector, Full<Bytes>>,
    proxy: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, String, http::HeaderMap) {
    let mut req = Request::get(format!("http://{proxy}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(Bytes::new())).expect("request");
    let resp = tokio::time::timeout(WAIT, client.request(req))
        .await
        .expect("response in time")
        .expect("response");
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    (
        parts.status,
        String::from_utf8_lossy(&body).into_owned(),
        parts.headers,
    )
}

/// A request to the admin API.
pub async fn admin(
    client: &Client<HttpConnector, Full<Bytes>>,
    proxy: &Proxy,
    method: &str,
    path: &str,
    body: &str,
) -> (StatusCode, String) {
    let req = Request::builder()
        .method(method)
        .uri(format!("http://{}{path}", proxy.admin_addr()))
        .body(Full::new(Bytes::from(body.to_owned())))
        .expect("request");
    let resp = client.request(req).await.expect("admin response");
    let status = resp.status();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// The value of the first sample of `name` (a family, or a family and its first label) in
/// the proxy's `/metrics`.
pub async fn sample(proxy: &Proxy, name: &str) -> f64 {
    let (status, text) = admin(&client(), proxy, "GET", "/metrics", "").await;
    assert_eq!(status, StatusCode::OK);
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ', ',']))
        .and_then(|l| l.rsplit_once(' '))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from {text}"))
}

/// A proxy config on free ports: one http listener, one route to service `svc` over
/// `backends`, with `extra` appended to the service table.
pub fn config_text(backends: &[&Backend], strategy: &str, extra: &str) -> String {
    let addrs: Vec<SocketAddr> = backends.iter().map(|b| b.addr).collect();
    config_for(&addrs, strategy, extra)
}

/// [`config_text`] for endpoints at `addrs`.
pub fn config_for(addrs: &[SocketAddr], strategy: &str, extra: &str) -> String {
    let eps: Vec<String> = addrs.iter().map(|a| format!("\"{a}\"")).collect();
    format!(
        r#"
[admin]
bind = "127.0.0.1:0"
[limits]
header_read_timeout_ms = 300
drain_timeout_ms = 2000
[[listener]]
bind = "127.0.0.1:0"
[[route]]
service = "svc"
timeout_ms = 5000
[service.svc]
endpoints = [{}]
strategy = "{strategy}"
{extra}
"#,
        eps.join(", ")
    )
}

/// The admin and listener tables of a test proxy, on free loopback ports.
pub const LISTENERS: &str =
    "[admin]\nbind = \"127.0.0.1:0\"\n[[listener]]\nbind = \"127.0.0.1:0\"\n";

pub fn parse(text: &str) -> Config {
    Config::parse(text, Path::new("test.toml")).expect("valid test config")
}

/// Start a proxy and wait until its service has `n` endpoints published (event: the first
/// request that is routed to a backend).
pub async fn start(text: &str) -> Proxy {
    // A test's runtime lives on its thread (the write gate is used on current-thread ones).
    Proxy::pin_runtime_thread();
    let proxy = Proxy::start(parse(text)).await.expect("proxy starts");
    let client = client();
    let addr = proxy.listeners()[0];
    tokio::time::timeout(WAIT, async {
        loop {
            if get(&client, addr, "/", &[]).await.0 == StatusCode::OK {
                break;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("endpoints published in time");
    proxy
}

/// A server on 127.0.0.1 that runs `serve` on each accepted connection (in its own task) and
/// counts the connections: for tests that check upstream connection reuse.
pub async fn counting_server<F, Fut>(serve: F) -> (SocketAddr, Arc<AtomicUsize>)
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve(stream));
        }
    });
    (addr, accepted)
}

/// A hyper server (HTTP/1.1, or HTTP/2 by its preface) on 127.0.0.1 answering each request
/// with `answer`.
pub async fn serve_hyper<F, Fut, B>(answer: F) -> SocketAddr
where
    F: Fn(Request<hyper::body::Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (addr, _) = counting_server(move |stream| {
        let answer = answer.clone();
        async move {
            let svc = service_fn(move |req| {
                let reply = answer(req);
                async move { Ok::<_, Infallible>(reply.await) }
            });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        }
    })
    .await;
    addr
}

/// A proxy started on `config`, once its service `svc` lists two endpoints or more (read from
/// `/endpoints`, so that no request reaches a backend before the test's own).
#[allow(dead_code)] // not every test binary starts a proxy this way
pub async fn published(config: &str) -> Proxy {
    Proxy::pin_runtime_thread();
    let proxy = Proxy::start(parse(config)).await.expect("proxy starts");
    let api = client();
    tokio::time::timeout(WAIT, async {
        loop {
            let (_, body) = admin(&api, &proxy, "GET", "/endpoints", "").await;
            let doc: serde_json::Value = serde_json::from_str(&body).expect("JSON");
            if doc["services"]["svc"]["endpoints"]
                .as_array()
                .is_some_and(|e| e.len() >= 2)
            {
                return;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("endpoints published in time");
    proxy
}

/// A backend answering `status` with `headers` after `delay`, echoing the deadline headers it
/// received (`x-seen-timeout`, `x-seen-grpc-timeout`), counting its requests.
#[allow(dead_code)] // not every test binary uses it
pub async fn scripted_backend(
    status: u16,
    headers: &'static [(&'static str, &'static str)],
    delay: Duration,
    name: &'static str,
) -> (SocketAddr, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let count = hits.clone();
    let addr = serve_hyper(move |req: Request<hyper::body::Incoming>| {
        let count = count.clone();
        async move {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(delay).await;
            let mut resp = http::Response::builder().status(status);
            for (k, v) in headers {
                resp = resp.header(*k, *v);
            }
            for (from, to) in [
                ("x-request-timeout", "x-seen-timeout"),
                ("grpc-timeout", "x-seen-grpc-timeout"),
            ] {
                if let Some(v) = req.headers().get(from) {
                    resp = resp.header(to, v.clone());
                }
            }
            resp.body(Full::new(Bytes::from(name))).expect("response")
        }
    })
    .await;
    (addr, hits)
}

/// What the admin API's `GET /endpoints` says of service `svc`'s endpoint at `addr`.
pub async fn endpoint_json(proxy: &Proxy, addr: SocketAddr) -> serde_json::Value {
    let (status, body) = admin(&client(), proxy, "GET", "/endpoints", "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let doc: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let eps = doc["services"]["svc"]["endpoints"]
        .as_array()
        .unwrap_or_else(|| panic!("endpoints of svc: {body}"));
    eps.iter()
        .find(|e| e["address"] == addr.to_string())
        .unwrap_or_else(|| panic!("{addr} listed: {body}"))
        .clone()
}

/// Send `raw` on a new connection (then half-close when `shut`) and read the answer until the
/// proxy closes.
pub async fn raw_exchange(to: std::net::SocketAddr, raw: &[u8], shut: bool) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(to).await.expect("connect");
    s.write_all(raw).await.expect("write");
    if shut {
        s.shutdown().await.expect("half-close");
    }
    let mut out = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut out))
        .await
        .expect("answered and closed in time")
        .expect("read");
    String::from_utf8_lossy(&out).into_owned()
}
