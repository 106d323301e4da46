//! One call path: the tower layer and `lbkit proxy` (its HTTP/1.1 fast path, its hyper engine,
//! its TCP relay) follow lbkit-core's `Attempts`, so one fault script gives the same attempts,
//! the same answers and the same recorded outcomes through each of them; and one request with
//! one hash key picks the same endpoint through the library and through the sidecar.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{parse, WAIT};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use lbkit_core::{Endpoint, EndpointSpec};
use lbkit_proxy::Proxy;
use lbkit_strategy::catalog::{self, Params};
use lbkit_tower::http::{HttpRequests, SetOrigin, SourceAddr};
use lbkit_tower::{BalanceLayer, PoolBuilder, TryMake};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tower::{Layer, Service, ServiceExt};

// === the fault script ===

/// What the first endpoint does with a request.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    /// Nothing listens.
    Refused,
    /// Reads the request, closes without a byte of answer.
    ResetBeforeResponse,
    /// Answers 200 with a 200 000-byte length, sends 64 KiB of it, closes.
    ResetMidResponse,
    /// Answers 200 with a 10-byte length, sends 3 bytes of it, closes (a small answer, which
    /// the proxy reads whole before it answers).
    ResetSmallResponse,
    /// Reads the request and never answers.
    Hang,
    /// Answers with this status.
    Status(u16),
    /// Answers 200 with this `grpc-status` in the head (a trailers-only grpc-web answer).
    Grpc(u8),
}

/// What the client got.
#[derive(Clone, Debug, PartialEq)]
enum Answer {
    /// A whole answer: status and body.
    Whole(u16, String),
    /// An answer's head, then the connection broke before the body's end.
    Truncated(u16),
    /// No answer from an endpoint: the proxy's own 502/504, or the tower layer's error.
    Failed,
}

/// What one run through one driver showed.
#[derive(Debug, PartialEq)]
struct Run {
    /// Requests each endpoint (first, second) received.
    hits: (usize, usize),
    answer: Answer,
    /// Calls recorded per endpoint (first, second): (all, failures).
    recorded: ((u64, u64), (u64, u64)),
}

/// A raw HTTP/1.1 upstream that reads request heads and plays `fault` (or answers 200 "good"
/// when `fault` is `None`); counts the requests it read.
async fn upstream(fault: Option<Fault>) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let hits = Arc::new(AtomicUsize::new(0));
    let count = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let count = count.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    if !read_head(&mut stream, &mut buf).await {
                        return;
                    }
                    count.fetch_add(1, Ordering::SeqCst);
                    if !play(&mut stream, fault).await {
                        return;
                    }
                }
            });
        }
    });
    (addr, hits)
}

/// Read one request head (and drop it); `false` at EOF.
async fn read_head(stream: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            buf.drain(..end + 4);
            return true;
        }
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Answer one request as `fault` says; whether the connection stays usable.
async fn play(stream: &mut TcpStream, fault: Option<Fault>) -> bool {
    match fault {
        None => {
            let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\ngood";
            stream.write_all(ok).await.is_ok()
        }
        Some(Fault::Status(code)) => {
            let head = format!("HTTP/1.1 {code} Scripted\r\ncontent-length: 4\r\n\r\nfail");
            stream.write_all(head.as_bytes()).await.is_ok()
        }
        Some(Fault::Grpc(code)) => {
            let head =
                format!("HTTP/1.1 200 OK\r\ngrpc-status: {code}\r\ncontent-length: 4\r\n\r\nfail");
            stream.write_all(head.as_bytes()).await.is_ok()
        }
        Some(Fault::ResetBeforeResponse) | Some(Fault::Refused) => false,
        Some(Fault::ResetMidResponse) => {
            let head = b"HTTP/1.1 200 OK\r\ncontent-length: 200000\r\n\r\n";
            let _ = stream.write_all(head).await;
            let _ = stream.write_all(&[b'x'; 64 * 1024]).await;
            false
        }
        Some(Fault::ResetSmallResponse) => {
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc")
                .await;
            false
        }
        // A hung server: holds the connection, answers nothing (not a wait for a condition).
        Some(Fault::Hang) => std::future::pending().await,
    }
}

/// The first endpoint for `fault`, and the second one (always good).
async fn endpoints(
    fault: Fault,
) -> (
    (SocketAddr, Arc<AtomicUsize>),
    (SocketAddr, Arc<AtomicUsize>),
) {
    let first = if fault == Fault::Refused {
        (lbkit_testkit::refused_addr(), Arc::new(AtomicUsize::new(0)))
    } else {
        upstream(Some(fault)).await
    };
    (first, upstream(None).await)
}

/// Per-attempt and overall limits every driver gets.
const PER_TRY_MS: u64 = 300;
const OVERALL_MS: u64 = 5_000;

/// The proxy over `first, second` (round robin from the first, two retries).
async fn proxy_over(first: SocketAddr, second: SocketAddr, tcp: bool) -> Proxy {
    Proxy::pin_runtime_thread();
    let tcp_listener = if tcp {
        "[[listener]]\nbind = \"127.0.0.1:0\"\nprotocol = \"tcp\"\nservice = \"svc\"\n"
    } else {
        ""
    };
    let text = format!(
        r#"
[admin]
bind = "127.0.0.1:0"
[[listener]]
bind = "127.0.0.1:0"
{tcp_listener}
[[route]]
service = "svc"
timeout_ms = {OVERALL_MS}
per_try_timeout_ms = {PER_TRY_MS}
[service.svc]
endpoints = ["{first}", "{second}"]
strategy = "round-robin"
retries = 2
"#
    );
    let proxy = Proxy::start(parse(&text)).await.expect("proxy starts");
    // Wait for the endpoints to be published (the admin API's view), without a request.
    let client = common::client();
    tokio::time::timeout(WAIT, async {
        loop {
            let (_, body) = common::admin(&client, &proxy, "GET", "/endpoints", "").await;
            let doc: serde_json::Value = serde_json::from_str(&body).expect("json");
            if doc["services"]["svc"]["endpoints"].as_array().map(Vec::len) == Some(2) {
                break;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("endpoints published");
    proxy
}

/// (all, failures) per endpoint as the proxy's admin API reports them.
async fn proxy_recorded(
    proxy: &Proxy,
    first: SocketAddr,
    second: SocketAddr,
) -> ((u64, u64), (u64, u64)) {
    let of = async |addr: SocketAddr| {
        let e = common::endpoint_json(proxy, addr).await;
        (
            e["requests"].as_u64().expect("requests"),
            e["failures"].as_u64().expect("failures"),
        )
    };
    (of(first).await, of(second).await)
}

/// Send `method /script` over a raw connection as HTTP/`version` (1.1 takes the fast path, 1.0
/// goes to hyper) and read the answer to the end or the break.
async fn raw_request(to: SocketAddr, method: &str, version: &str) -> Answer {
    raw_request_with(to, method, version, "").await
}

async fn raw_request_with(to: SocketAddr, method: &str, version: &str, body: &str) -> Answer {
    let mut stream = TcpStream::connect(to).await.expect("connect");
    let req = format!(
        "{method} /script HTTP/{version}\r\nhost: t\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(req.as_bytes()).await.expect("write");
    let mut got = Vec::new();
    let _ = tokio::time::timeout(WAIT, stream.read_to_end(&mut got))
        .await
        .expect("answer in time");
    parse_answer(&got)
}

fn parse_answer(got: &[u8]) -> Answer {
    let text = String::from_utf8_lossy(got);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        panic!("no answer head: {text:?}");
    };
    let code: u16 = head[9..12].parse().expect("status");
    let length = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse::<usize>().ok())
            .flatten()
    });
    let from_proxy = body.starts_with("upstream failed")
        || body.starts_with("upstream timed out")
        || body.starts_with("deadline exceeded");
    match length {
        Some(n) if body.len() < n => Answer::Truncated(code),
        _ if from_proxy && (code == 502 || code == 504) => Answer::Failed,
        _ => Answer::Whole(code, body.to_owned()),
    }
}

/// The fault script through the proxy's HTTP/1.1 fast path (`1.1`) or hyper engine (`1.0`).
async fn through_proxy(fault: Fault, method: &str, version: &str) -> Run {
    let ((first, hits1), (second, hits2)) = endpoints(fault).await;
    let proxy = proxy_over(first, second, false).await;
    let answer = raw_request(proxy.listeners()[0], method, version).await;
    let recorded = proxy_recorded(&proxy, first, second).await;
    Run {
        hits: (hits1.load(Ordering::SeqCst), hits2.load(Ordering::SeqCst)),
        answer,
        recorded,
    }
}

/// The fault script through `lbkit-tower` over hyper-util's client.
async fn through_tower(fault: Fault, method: &str) -> Run {
    let ((first, hits1), (second, hits2)) = endpoints(fault).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let pool = PoolBuilder::new(lbkit_strategy::RoundRobin::new())
        .availability(lbkit_core::Availability::OFF)
        .spawn_static(
            vec![
                EndpointSpec::new(first.to_string()),
                EndpointSpec::new(second.to_string()),
            ],
            TryMake(move |ep: &Endpoint| SetOrigin::http(client.clone(), ep.address())),
        );
    let mut svc = BalanceLayer::http()
        .failover(2)
        .timeout(Duration::from_millis(PER_TRY_MS))
        .deadline(Duration::from_millis(OVERALL_MS))
        .layer(pool.clone());
    let req = http::Request::builder()
        .method(method)
        .uri("/script")
        .body(Full::new(Bytes::new()))
        .expect("request");
    let answer = tokio::time::timeout(WAIT, async {
        match svc.ready().await.expect("ready").call(req).await {
            Err(_) => Answer::Failed,
            Ok(resp) => {
                let status = resp.status().as_u16();
                match resp.into_body().collect().await {
                    Ok(b) => Answer::Whole(status, String::from_utf8_lossy(&b.to_bytes()).into()),
                    Err(_) => Answer::Truncated(status),
                }
            }
        }
    })
    .await
    .expect("answer in time");
    let snapshot = pool.snapshot();
    let of = |addr: SocketAddr| {
        let i = snapshot.find(&addr.to_string().into()).expect("endpoint");
        let s = snapshot.endpoint(i).stats();
        (s.total(), s.failures())
    };
    Run {
        hits: (hits1.load(Ordering::SeqCst), hits2.load(Ordering::SeqCst)),
        answer,
        recorded: (of(first), of(second)),
    }
}

fn good() -> Answer {
    Answer::Whole(200, "good".into())
}

/// The script: a fault, a method, and what every driver must show.
fn script() -> Vec<(Fault, &'static str, Run)> {
    let run = |hits, answer, recorded| Run {
        hits,
        answer,
        recorded,
    };
    vec![
        // Nothing was sent: any method goes to the next endpoint.
        (
            Fault::Refused,
            "POST",
            run((0, 1), good(), ((1, 1), (1, 0))),
        ),
        // Reached the server: retried only when idempotent.
        (
            Fault::ResetBeforeResponse,
            "GET",
            run((1, 1), good(), ((1, 1), (1, 0))),
        ),
        (
            Fault::ResetBeforeResponse,
            "POST",
            run((1, 0), Answer::Failed, ((1, 1), (0, 0))),
        ),
        // Part of the answer reached the client: never retried.
        (
            Fault::ResetMidResponse,
            "GET",
            run((1, 0), Answer::Truncated(200), ((1, 1), (0, 0))),
        ),
        // The per-attempt timeout, well inside the overall one.
        (Fault::Hang, "GET", run((1, 1), good(), ((1, 1), (1, 0)))),
        (
            Fault::Status(503),
            "GET",
            run((1, 1), good(), ((1, 1), (1, 0))),
        ),
        (
            Fault::Status(503),
            "POST",
            run((1, 0), Answer::Whole(503, "fail".into()), ((1, 1), (0, 0))),
        ),
        (
            Fault::Status(504),
            "GET",
            run((1, 1), good(), ((1, 1), (1, 0))),
        ),
        // An answer, possibly to the client's own rate: not charged, not retried.
        (
            Fault::Status(429),
            "GET",
            run((1, 0), Answer::Whole(429, "fail".into()), ((1, 0), (0, 0))),
        ),
        // A gRPC failure in the head of an HTTP 200 (UNAVAILABLE) is a failure, as a 503 is;
        // an application's code (NOT_FOUND) is an answer.
        (
            Fault::Grpc(14),
            "GET",
            run((1, 1), good(), ((1, 1), (1, 0))),
        ),
        (
            Fault::Grpc(14),
            "POST",
            run((1, 0), Answer::Whole(200, "fail".into()), ((1, 1), (0, 0))),
        ),
        (
            Fault::Grpc(5),
            "GET",
            run((1, 0), Answer::Whole(200, "fail".into()), ((1, 0), (0, 0))),
        ),
    ]
}

#[tokio::test]
async fn one_fault_script_gives_the_same_attempts_answers_and_outcomes_through_every_driver() {
    for (fault, method, want) in script() {
        let tower = through_tower(fault, method).await;
        assert_eq!(tower, want, "tower: {fault:?} {method}");
        let fast = through_proxy(fault, method, "1.1").await;
        assert_eq!(fast, want, "proxy fast path: {fault:?} {method}");
        let hyper = through_proxy(fault, method, "1.0").await;
        assert_eq!(hyper, want, "proxy hyper engine: {fault:?} {method}");
    }
}

// A small answer (a length of at most 16 KiB) that breaks before its end: both engines of
// the proxy read it whole before answering, so nothing reached the client and it is a reset
// before the response, retried when idempotent (the hyper engine answered 502 instead). The
// tower layer hands the head to its caller and cannot take it back: it is not in the script.
#[tokio::test]
async fn a_small_answer_that_breaks_is_retried_by_both_engines_when_idempotent() {
    let run = |hits, answer, recorded| Run {
        hits,
        answer,
        recorded,
    };
    let cases = [
        ("GET", run((1, 1), good(), ((1, 1), (1, 0)))),
        ("POST", run((1, 0), Answer::Failed, ((1, 1), (0, 0)))),
    ];
    for (method, want) in cases {
        let fast = through_proxy(Fault::ResetSmallResponse, method, "1.1").await;
        assert_eq!(fast, want, "proxy fast path: {method}");
        let hyper = through_proxy(Fault::ResetSmallResponse, method, "1.0").await;
        assert_eq!(hyper, want, "proxy hyper engine: {method}");
    }
}

// A POST with a small body whose first endpoint refuses the connection: nothing reached it,
// so both engines retry it on the next endpoint with the body (hyper's engine used to stream
// a non-idempotent body, so it could not, and answered 502).
#[tokio::test]
async fn a_small_post_body_is_replayed_after_a_refused_connection_by_both_engines() {
    for version in ["1.1", "1.0"] {
        let ((first, hits1), (second, hits2)) = endpoints(Fault::Refused).await;
        let proxy = proxy_over(first, second, false).await;
        let answer = raw_request_with(proxy.listeners()[0], "POST", version, "hello").await;
        let hits = (hits1.load(Ordering::SeqCst), hits2.load(Ordering::SeqCst));
        assert_eq!((hits, answer), ((0, 1), good()), "HTTP/{version}");
    }
}

#[tokio::test]
async fn the_tcp_relay_moves_a_refused_connection_on_like_the_http_engines() {
    let ((first, _), (second, hits)) = endpoints(Fault::Refused).await;
    let proxy = proxy_over(first, second, true).await;
    // The upstream keeps the connection: read the whole answer, then close it.
    let mut stream = TcpStream::connect(proxy.listeners()[1])
        .await
        .expect("connect");
    let req = "POST /script HTTP/1.1\r\nhost: t\r\ncontent-length: 0\r\n\r\n";
    stream.write_all(req.as_bytes()).await.expect("write");
    let mut got = Vec::new();
    tokio::time::timeout(WAIT, async {
        while !got.ends_with(b"good") {
            let mut chunk = [0u8; 1024];
            let n = stream.read(&mut chunk).await.expect("read");
            assert!(n > 0, "closed early: {got:?}");
            got.extend_from_slice(&chunk[..n]);
        }
    })
    .await
    .expect("answer in time");
    drop(stream);
    assert_eq!(parse_answer(&got), good());
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    // The relayed connection's call ends when it closes: wait for that event.
    let recorded = tokio::time::timeout(WAIT, async {
        loop {
            let r = proxy_recorded(&proxy, first, second).await;
            if r.1 .0 == 1 {
                return r;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("relay call recorded");
    assert_eq!(recorded, ((1, 1), (1, 0)));
}

// === one key, one endpoint ===

/// Every hash strategy of the catalog.
const HASH_STRATEGIES: [&str; 4] = ["consistent-hash", "ketama", "maglev", "rendezvous"];

/// Key sources and the request variants that exercise them.
const KEYS: [&str; 6] = [
    "header:x-user",
    "cookie:sid",
    "path",
    "uri",
    "query:id",
    "source-ip",
];

/// Request `i` for the key kind at `k`: a path (with a query) and headers.
fn variant(k: usize, i: usize) -> (String, Vec<(&'static str, String)>) {
    let path = format!("/k{k}/item-{}?id={}&page={i}", i % 7, i * 13);
    let headers = vec![
        ("x-user", format!("user-{i}")),
        ("cookie", format!("theme=dark; sid=s{}", i * 31)),
    ];
    (path, headers)
}

/// Backends named `b0..b4`, answering their name.
async fn named_backends() -> Vec<common::Backend> {
    let mut out = Vec::new();
    for i in 0..5 {
        out.push(common::Backend::start(&format!("b{i}")).await);
    }
    out
}

#[tokio::test]
async fn one_request_with_one_key_picks_the_same_endpoint_through_tower_and_the_proxy() {
    let backends = named_backends().await;
    let addrs: Vec<String> = backends.iter().map(|b| b.addr.to_string()).collect();
    let list = addrs
        .iter()
        .map(|a| format!("\"{a}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let mut text =
        String::from("[admin]\nbind = \"127.0.0.1:0\"\n[[listener]]\nbind = \"127.0.0.1:0\"\n");
    for (s, strategy) in HASH_STRATEGIES.iter().enumerate() {
        for (k, key) in KEYS.iter().enumerate() {
            text += &format!("[[route]]\npath_prefix = \"/s{s}/k{k}/\"\nservice = \"s{s}\"\nhash_key = \"{key}\"\n");
        }
        text += &format!("[service.s{s}]\nendpoints = [{list}]\nstrategy = \"{strategy}\"\n");
    }
    Proxy::pin_runtime_thread();
    let proxy = Proxy::start(parse(&text)).await.expect("proxy");
    let at = proxy.listeners()[0];
    let http1 = common::client();
    let h2c = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    for (s, strategy) in HASH_STRATEGIES.iter().enumerate() {
        let built = catalog::build(strategy, Params::default()).expect("strategy");
        let specs = addrs.iter().map(EndpointSpec::new).collect();
        let c = client.clone();
        let pool = PoolBuilder::new(built).spawn_static(
            specs,
            TryMake(move |ep: &Endpoint| SetOrigin::http(c.clone(), ep.address())),
        );
        for (k, key) in KEYS.iter().enumerate() {
            let mut tower = BalanceLayer::http()
                .requests(HttpRequests::new().hash_key(key.parse().expect("key")))
                .layer(pool.clone());
            let mut seen = std::collections::BTreeSet::new();
            for i in 0..16 {
                let (path, headers) = variant(k, i);
                let path = format!("/s{s}{path}");
                let (_, fast, _) = common::get(&http1, at, &path, &as_refs(&headers)).await;
                let hyper = h2c_get(&h2c, at, &path, &headers).await;
                let mut req = http::Request::get(&path);
                for (n, v) in &headers {
                    req = req.header(*n, v);
                }
                let mut req = req.body(Full::new(Bytes::new())).expect("request");
                req.extensions_mut()
                    .insert(SourceAddr([127, 0, 0, 1].into()));
                let resp =
                    tokio::time::timeout(WAIT, tower.ready().await.expect("ready").call(req))
                        .await
                        .expect("in time")
                        .expect("tower answer");
                let lib = resp.into_body().collect().await.expect("body").to_bytes();
                let lib = String::from_utf8_lossy(&lib).into_owned();
                assert_eq!(fast, lib, "{strategy} {key} {path}: fast path vs tower");
                assert_eq!(hyper, lib, "{strategy} {key} {path}: hyper engine vs tower");
                seen.insert(lib);
            }
            if *key != "source-ip" {
                assert!(
                    seen.len() >= 2,
                    "{strategy} {key}: the keys spread ({seen:?})"
                );
            }
        }
    }
}

fn as_refs<'a>(headers: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    headers.iter().map(|(n, v)| (*n, v.as_str())).collect()
}

/// GET over h2c (prior knowledge): served by the proxy's hyper engine.
async fn h2c_get(
    client: &Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    at: SocketAddr,
    path: &str,
    headers: &[(&'static str, String)],
) -> String {
    let mut req = http::Request::get(format!("http://{at}{path}"));
    for (n, v) in headers {
        req = req.header(*n, v);
    }
    let req = req.body(Full::new(Bytes::new())).expect("request");
    let resp = tokio::time::timeout(WAIT, client.request(req))
        .await
        .expect("in time")
        .expect("h2c answer");
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    String::from_utf8_lossy(&body).into_owned()
}
