//! Deadlines and pushback on the wire (issue 41), through both engines of the proxy (the
//! HTTP/1.1 fast path and hyper's engine behind the HTTP/2 server), against real hyper
//! upstreams on loopback:
//!
//! * the caller's deadline (`grpc-timeout`, the service's `deadline_header`) reaches the
//!   upstream cut to the time left; one that has passed is answered 504 (gRPC:
//!   `grpc-status: 4`) without an attempt; a slow upstream is not retried past it;
//! * a `429` with `Retry-After` takes its endpoint out of the picks for that long (`/endpoints`
//!   shows `pushed_back_ms`), and a `503` with `Retry-After` is retried elsewhere only after
//!   the wait.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use bytes::Bytes;
use common::{client, config_for, endpoint_json, h2c_client, start, WAIT};
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};

type TestClient = Client<HttpConnector, Full<Bytes>>;

/// The two ways into the proxy: HTTP/1.1 (its fast path) and HTTP/2 (hyper's engine).
fn engines() -> [(&'static str, TestClient); 2] {
    [("fast path", client()), ("hyper engine", h2c_client())]
}

/// Send `method` `path` with `headers` through `proxy`: status, body, headers.
async fn send(
    client: &TestClient,
    proxy: SocketAddr,
    method: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, String, HeaderMap) {
    let mut req = Request::builder()
        .method(method)
        .uri(format!("http://{proxy}/"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(Bytes::new())).expect("request");
    let resp = tokio::time::timeout(WAIT, client.request(req))
        .await
        .expect("answer in time")
        .expect("answer");
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    let text = String::from_utf8_lossy(&body).into_owned();
    (parts.status, text, parts.headers)
}

fn header(h: &HeaderMap, name: &str) -> Option<String> {
    h.get(name)
        .map(|v| v.to_str().expect("ascii").trim().to_owned())
}

const DEADLINE: &str = "deadline_header = \"x-request-timeout\"";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_callers_deadline_reaches_the_upstream_cut_to_what_is_left() {
    let (up, _) = common::scripted_backend(200, &[], Duration::ZERO, "up").await;
    let proxy = start(&config_for(&[up], "round-robin", DEADLINE)).await;
    let addr = proxy.listeners()[0];
    for (engine, client) in engines() {
        let (status, _, h) = send(&client, addr, "GET", &[("x-request-timeout", "800")]).await;
        assert_eq!(status, StatusCode::OK, "{engine}");
        let seen: u64 = header(&h, "x-seen-timeout").expect("sent").parse().unwrap();
        assert!((1..=800).contains(&seen), "{engine}: {seen} ms");
        // Without one, the upstream hears of none: the route's timeout is the proxy's own
        // limit, not a deadline for a stream the upstream sends.
        let (_, _, h) = send(&client, addr, "GET", &[]).await;
        assert_eq!(header(&h, "x-seen-timeout"), None, "{engine}");
    }
    // gRPC: grpc-timeout in, the time left out, over HTTP/2.
    let grpc = [
        ("content-type", "application/grpc"),
        ("grpc-timeout", "300m"),
    ];
    let (_, _, h) = send(&h2c_client(), addr, "POST", &grpc).await;
    let seen = header(&h, "x-seen-grpc-timeout").expect("grpc-timeout sent");
    let left = lbkit_core::signal::parse_grpc_timeout(seen.as_bytes()).expect("valid");
    assert!(
        left > Duration::ZERO && left <= Duration::from_millis(300),
        "{seen}"
    );
    // gRPC-web over HTTP/1.1: the same (hyper's engine serves it, not the fast path).
    let web = [
        ("content-type", "application/grpc-web+proto"),
        ("grpc-timeout", "300m"),
    ];
    let (_, _, h) = send(&client(), addr, "POST", &web).await;
    let seen = header(&h, "x-seen-grpc-timeout").expect("grpc-timeout sent");
    let left = lbkit_core::signal::parse_grpc_timeout(seen.as_bytes()).expect("valid");
    assert!(left <= Duration::from_millis(300), "{seen}");
    // And a passed deadline is DEADLINE_EXCEEDED, trailers-only.
    let passed = [
        ("content-type", "application/grpc-web+proto"),
        ("grpc-timeout", "0m"),
    ];
    let (status, _, h) = send(&client(), addr, "POST", &passed).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header(&h, "grpc-status").as_deref(), Some("4"));
    assert_eq!(
        header(&h, "content-type").as_deref(),
        Some("application/grpc-web")
    );
    let text = [
        ("content-type", "application/grpc-web-text"),
        ("grpc-timeout", "0m"),
    ];
    let (_, _, h) = send(&client(), addr, "POST", &text).await;
    assert_eq!(
        header(&h, "content-type").as_deref(),
        Some("application/grpc-web-text")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_that_has_passed_is_answered_without_an_attempt() {
    let (up, hits) = common::scripted_backend(200, &[], Duration::ZERO, "up").await;
    let proxy = start(&config_for(&[up], "round-robin", DEADLINE)).await;
    let addr = proxy.listeners()[0];
    let before = hits.load(SeqCst);
    for (engine, client) in engines() {
        let (status, body, _) = send(&client, addr, "GET", &[("x-request-timeout", "0")]).await;
        assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{engine}");
        assert_eq!(body, "deadline exceeded\n", "{engine}");
    }
    // A gRPC caller hears DEADLINE_EXCEEDED, trailers-only, as gRPC clients read it.
    let grpc = [("content-type", "application/grpc"), ("grpc-timeout", "0m")];
    let (status, body, h) = send(&h2c_client(), addr, "POST", &grpc).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header(&h, "grpc-status").as_deref(), Some("4"));
    assert_eq!(
        header(&h, "grpc-message").as_deref(),
        Some("deadline exceeded")
    );
    assert_eq!(
        header(&h, "content-type").as_deref(),
        Some("application/grpc")
    );
    assert!(body.is_empty());
    assert_eq!(hits.load(SeqCst), before, "no attempt was made");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_upstream_is_not_retried_past_the_callers_deadline() {
    let (slow, slow_hits) =
        common::scripted_backend(200, &[], Duration::from_secs(3), "slow").await;
    let (fast, _) = common::scripted_backend(200, &[], Duration::ZERO, "fast").await;
    let extra = format!("{DEADLINE}\nretries = 2");
    let proxy = start(&config_for(&[fast, slow], "round-robin", &extra)).await;
    let addr = proxy.listeners()[0];
    for (engine, client) in engines() {
        // Round robin reaches the slow one within two requests; that one answers 504 at the
        // caller's deadline, without a retry on the fast one.
        let mut timed_out = 0;
        for _ in 0..2 {
            let before = slow_hits.load(SeqCst);
            let t = tokio::time::Instant::now();
            let (status, body, _) =
                send(&client, addr, "GET", &[("x-request-timeout", "300")]).await;
            if slow_hits.load(SeqCst) > before {
                assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{engine}: {body}");
                assert!(t.elapsed() < Duration::from_secs(2), "{engine}");
                timed_out += 1;
            } else {
                assert_eq!(
                    (status, body.as_str()),
                    (StatusCode::OK, "fast"),
                    "{engine}"
                );
            }
        }
        assert_eq!(timed_out, 1, "{engine}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_with_retry_after_takes_its_endpoint_out_of_the_picks() {
    for (engine, client) in engines() {
        let (limited, limited_hits) =
            common::scripted_backend(429, &[("retry-after", "30")], Duration::ZERO, "limited")
                .await;
        let (ok, _) = common::scripted_backend(200, &[], Duration::ZERO, "ok").await;
        let proxy = common::published(&config_for(&[limited, ok], "round-robin", "")).await;
        let addr = proxy.listeners()[0];
        let mut answers = Vec::new();
        for _ in 0..12 {
            answers.push(send(&client, addr, "GET", &[]).await.0);
        }
        let limited_answers = answers
            .iter()
            .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
            .count();
        assert_eq!(limited_answers, 1, "{engine}: {answers:?}");
        assert_eq!(limited_hits.load(SeqCst), 1, "{engine}");
        let e = endpoint_json(&proxy, limited).await;
        let left = e["pushed_back_ms"].as_u64().expect("pushed back");
        assert!((1..=30_000).contains(&left), "{engine}: {e}");
        assert!(endpoint_json(&proxy, ok).await["pushed_back_ms"].is_null());
        proxy.shutdown(Duration::from_secs(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_waits_out_the_pushback_of_a_503() {
    for (engine, client) in engines() {
        let (busy, busy_hits) =
            common::scripted_backend(503, &[("retry-after", "1")], Duration::ZERO, "busy").await;
        let (ok, _) = common::scripted_backend(200, &[], Duration::ZERO, "ok").await;
        let proxy = common::published(&config_for(&[busy, ok], "round-robin", "retries = 2")).await;
        let addr = proxy.listeners()[0];
        // Round robin meets the busy one within two requests; that request is answered by
        // the other endpoint, after the second the busy one asked for.
        let mut waited = None;
        for _ in 0..2 {
            let before = busy_hits.load(SeqCst);
            let t = tokio::time::Instant::now();
            let (status, body, _) = send(&client, addr, "GET", &[]).await;
            assert_eq!((status, body.as_str()), (StatusCode::OK, "ok"), "{engine}");
            if busy_hits.load(SeqCst) > before {
                waited = Some(t.elapsed());
            }
        }
        let waited = waited.expect("the busy endpoint was met");
        assert!(waited >= Duration::from_secs(1), "{engine}: {waited:?}");
        proxy.shutdown(Duration::from_secs(1)).await;
    }
}

/// A raw HTTP/1.1 backend answering every request `200`, chunked, with
/// `grpc-retry-pushback-ms: 30000` in its trailers (as a gRPC-over-HTTP/1.1 server would send
/// it after its answer).
async fn pushing_back_in_trailers() -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (addr, _) = common::counting_server(|mut s| async move {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        while let Ok(n @ 1..) = s.read(&mut chunk).await {
            buf.extend_from_slice(&chunk[..n]);
            while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                buf.drain(..end + 4);
                let answer = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
                              4\r\nbusy\r\n0\r\ngrpc-retry-pushback-ms: 30000\r\n\r\n";
                if s.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    addr
}

// The fast path reads a pushback in a chunked answer's trailers (the hyper engine reads
// trailers through hyper): the answer is delivered, and its endpoint is passed over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pushback_in_chunked_trailers_passes_the_endpoint_over() {
    let pushing = pushing_back_in_trailers().await;
    let (ok, ok_hits) = common::scripted_backend(200, &[], Duration::ZERO, "ok").await;
    let proxy = common::published(&config_for(&[pushing, ok], "round-robin", "")).await;
    let addr = proxy.listeners()[0];
    let mut bodies = Vec::new();
    for _ in 0..6 {
        let (status, body, _) = send(&client(), addr, "GET", &[]).await;
        assert_eq!(status, StatusCode::OK);
        bodies.push(body);
    }
    assert_eq!(
        bodies.iter().filter(|b| *b == "busy").count(),
        1,
        "{bodies:?}"
    );
    assert_eq!(ok_hits.load(SeqCst), 5);
    let e = endpoint_json(&proxy, pushing).await;
    let left = e["pushed_back_ms"].as_u64().expect("pushed back");
    assert!((1..=30_000).contains(&left), "{e}");
    proxy.shutdown(Duration::from_secs(1)).await;
}
