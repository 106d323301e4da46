//! End-to-end: the proxy in front of real HTTP backends on loopback.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn counts(
    proxy: &lbkit_proxy::Proxy,
    n: usize,
    headers: &[(&str, &str)],
) -> HashMap<String, usize> {
    let client = client();
    let mut counts = HashMap::new();
    for _ in 0..n {
        let (status, body, _) = get(&client, proxy.listeners()[0], "/", headers).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        *counts.entry(body).or_default() += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_spreads_evenly() {
    let (a, b, c) = (
        Backend::start("a").await,
        Backend::start("b").await,
        Backend::start("c").await,
    );
    let proxy = start(&config_text(&[&a, &b, &c], "round-robin", "")).await;
    let got = counts(&proxy, 300, &[]).await;
    for name in ["a", "b", "c"] {
        // The readiness probe in `start` took one pick, so the counts may be off by one.
        assert!((99..=101).contains(&got[name]), "{got:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_round_robin_follows_weights() {
    let (a, b) = (Backend::start("a").await, Backend::start("b").await);
    let text = config_text(&[&a, &b], "weighted-round-robin", "")
        .replace(&format!("\"{}\"", b.addr), &format!("\"{}=300\"", b.addr));
    let proxy = start(&text).await;
    let got = counts(&proxy, 400, &[]).await;
    assert!(
        (99..=101).contains(&got["a"]) && (299..=301).contains(&got["b"]),
        "{got:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p2c_ewma_avoids_the_slow_endpoint() {
    let (a, b) = (Backend::start("a").await, Backend::start("b").await);
    let slow = Backend::start_slow("slow", Duration::from_millis(50)).await;
    let proxy = start(&config_text(&[&a, &b, &slow], "p2c-ewma", "")).await;
    let got = counts(&proxy, 300, &[]).await;
    assert_eq!(got.values().sum::<usize>(), 300);
    // A 50 ms backend (slower than the 30 ms cost of an unsampled one) next to sub-millisecond
    // ones: P2C over peak EWMA sends it < 5 %.
    assert!(got.get("slow").copied().unwrap_or(0) < 15, "{got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_key_pins_a_user_to_one_endpoint() {
    let (a, b, c) = (
        Backend::start("a").await,
        Backend::start("b").await,
        Backend::start("c").await,
    );
    let text = config_text(&[&a, &b, &c], "ketama", "").replace(
        "timeout_ms = 5000",
        "timeout_ms = 5000\nhash_key = \"header:x-user\"",
    );
    let proxy = start(&text).await;
    let mut owners = HashMap::new();
    for user in 0..40 {
        let user = format!("user-{user}");
        let got = counts(&proxy, 5, &[("x-user", &user)]).await;
        assert_eq!(got.len(), 1, "{user} moved: {got:?}");
        owners.insert(user, got.into_keys().next().unwrap_or_default());
    }
    let distinct: std::collections::HashSet<_> = owners.values().collect();
    assert!(distinct.len() >= 2, "{owners:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_headers_added_and_hop_by_hop_removed() {
    let a = Backend::start("a").await;
    let proxy = start(&config_text(&[&a], "round-robin", "")).await;
    let (status, _, headers) = get(
        &client(),
        proxy.listeners()[0],
        "/x",
        &[("x-forwarded-for", "10.1.1.1"), ("keep-alive", "timeout=5")],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["x-seen-xff"], "10.1.1.1, 127.0.0.1");
    let fwd = headers["x-seen-forwarded"].to_str().unwrap();
    assert!(fwd.starts_with("for=127.0.0.1;proto=http;host="), "{fwd}");
    assert!(!headers.contains_key("x-seen-keep-alive"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_hosts_get_404_and_absolute_targets_stay_inside() {
    let a = Backend::start("a").await;
    let text = config_text(&[&a], "round-robin", "").replace(
        "service = \"svc\"\ntimeout_ms",
        "host = \"api.test\"\nservice = \"svc\"\ntimeout_ms",
    );
    let proxy = Proxy::start(parse(&text)).await.unwrap();
    let addr = proxy.listeners()[0];
    let client = client();
    assert_eq!(
        get(&client, addr, "/", &[("host", "evil.test")]).await.0,
        StatusCode::NOT_FOUND
    );
    // An absolute-form target's authority wins over `Host` (RFC 9112 §3.2.2, as nginx does):
    // naming another host, it goes nowhere; naming the routed one, to its backend.
    for (target, want) in [
        ("http://evil.test/", "HTTP/1.1 404"),
        ("http://api.test/", "HTTP/1.1 200"),
    ] {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let raw = format!("GET {target} HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n");
        s.write_all(raw.as_bytes()).await.unwrap();
        let mut out = String::new();
        tokio::time::timeout(WAIT, s.read_to_string(&mut out))
            .await
            .unwrap()
            .unwrap();
        assert!(out.starts_with(want), "{target}: {out}");
    }
}

use lbkit_proxy::Proxy;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_are_cut_off() {
    let a = Backend::start("a").await;
    let proxy = start(&config_text(&[&a], "round-robin", "")).await;
    let mut s = TcpStream::connect(proxy.listeners()[0]).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let started = tokio::time::Instant::now();
    let mut buf = Vec::new();
    // header_read_timeout_ms = 300: the proxy closes the connection (maybe after a 408).
    let read = tokio::time::timeout(WAIT, s.read_to_end(&mut buf))
        .await
        .expect("cut off in time");
    assert!(
        read.is_err() || buf.is_empty() || buf.starts_with(b"HTTP/1.1 408"),
        "{buf:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_headers_are_refused() {
    let a = Backend::start("a").await;
    let text =
        config_text(&[&a], "round-robin", "").replace("[limits]", "[limits]\nmax_headers = 10");
    let proxy = start(&text).await;
    let mut s = TcpStream::connect(proxy.listeners()[0]).await.unwrap();
    let mut req = String::from("GET / HTTP/1.1\r\nHost: x\r\n");
    for i in 0..20 {
        req.push_str(&format!("x-h{i}: 1\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut buf))
        .await
        .expect("answered");
    assert!(
        buf.starts_with(b"HTTP/1.1 431"),
        "{}",
        String::from_utf8_lossy(&buf)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_clients_are_served() {
    let a = Backend::start("a").await;
    let proxy = start(&config_text(&[&a], "round-robin", "")).await;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let (status, body, _) = get(&client, proxy.listeners()[0], "/", &[]).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "a"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_listener_relays_and_skips_a_dead_endpoint() {
    let a = Backend::start("a").await;
    let dead = Backend::start("dead").await.kill();
    let text = format!(
        r#"
[admin]
bind = "127.0.0.1:0"
[[listener]]
bind = "127.0.0.1:0"
protocol = "tcp"
service = "svc"
[service.svc]
endpoints = ["{dead}", "{}"]
outlier_detection = {{ enabled = false }}
"#,
        a.addr
    );
    let proxy = Proxy::start(parse(&text)).await.unwrap();
    for _ in 0..4 {
        let mut s = TcpStream::connect(proxy.listeners()[0]).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        tokio::time::timeout(WAIT, s.read_to_string(&mut out))
            .await
            .unwrap()
            .unwrap();
        assert!(
            out.starts_with("HTTP/1.1 200") && out.ends_with('a'),
            "{out}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_stream_and_finish_their_calls() {
    let a = Backend::start("a").await;
    let proxy = start(&config_text(&[&a], "round-robin", "")).await;
    let client = client();
    for _ in 0..3 {
        let (status, body, _) = get(&client, proxy.listeners()[0], "/big", &[]).await;
        assert_eq!((status, body.len()), (StatusCode::OK, BIG));
    }
    let (_, doc) = admin(&client, &proxy, "GET", "/endpoints", "").await;
    let doc: serde_json::Value = serde_json::from_str(&doc).unwrap();
    let ep = &doc["services"]["svc"]["endpoints"][0];
    // The readiness probe plus three streamed calls, all finished (none left in flight).
    assert_eq!(
        (ep["requests"].as_u64(), ep["in_flight"].as_u64()),
        (Some(4), Some(0))
    );
    assert_eq!(ep["failures"].as_u64(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_threads_share_the_listener_and_drain_on_shutdown() {
    let (a, b) = (Backend::start("a").await, Backend::start("b").await);
    let text = config_text(&[&a, &b], "round-robin", "");
    let proxy = Proxy::start_workers(parse(&text), 3).await.unwrap();
    let addr = proxy.listeners()[0];
    let mut got = HashMap::<String, usize>::new();
    for _ in 0..12 {
        // A fresh connection each time, so the kernel spreads them over the workers.
        let (status, body, _) = get(&client(), addr, "/", &[]).await;
        assert_eq!(status, StatusCode::OK);
        *got.entry(body).or_default() += 1;
    }
    assert_eq!(got.values().sum::<usize>(), 12);
    assert!(got.len() == 2, "{got:?}");
    assert!(
        tokio::time::timeout(WAIT, proxy.shutdown(Duration::from_secs(2)))
            .await
            .unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_upstreams_are_spoken_to_in_http2() {
    let a = Backend::start("a").await;
    let proxy = start(&config_text(&[&a], "round-robin", "h2c = true")).await;
    let (status, body, headers) = get(&client(), proxy.listeners()[0], "/", &[]).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "a"));
    // RFC 9113 §8.3.1: no `Host` beside an `:authority` naming another entity (strict HTTP/2
    // stacks refuse such a request); the client's host goes in `Forwarded`.
    let seen = |h: &str| {
        headers
            .get(h)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    assert_eq!(seen("x-seen-authority"), Some(a.addr.to_string()));
    assert_eq!(seen("x-seen-host"), None, "a Host beside :authority");
    let forwarded = seen("x-seen-forwarded").unwrap_or_default();
    let host = proxy.listeners()[0].to_string();
    assert!(
        forwarded.contains(&format!("host=\"{host}\"")),
        "{forwarded}"
    );
}
