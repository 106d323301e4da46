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

/// `forwarded_headers` is obeyed alike by the HTTP/1.1 fast path and by hyper's engine (here
/// for an h2c client): a header left out goes on as the client sent it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_headers_left_out_go_on_as_sent_through_both_engines() {
    let a = Backend::start("a").await;
    for (setting, xff, forwarded) in [
        ("[]", "10.1.1.1", None),
        (r#"["x-forwarded-for"]"#, "10.1.1.1, 127.0.0.1", None),
        (
            r#"["Forwarded"]"#,
            "10.1.1.1",
            Some("for=127.0.0.1;proto=http;host="),
        ),
    ] {
        let extra = format!("forwarded_headers = {setting}");
        let proxy = start(&config_text(&[&a], "round-robin", &extra)).await;
        let at = proxy.listeners()[0];
        let sent = [("x-forwarded-for", "10.1.1.1")];
        let (status, _, fast) = get(&client(), at, "/x", &sent).await;
        assert_eq!(status, StatusCode::OK);
        let mut send = h2c_connection(at).await;
        let req = http::Request::get("http://svc.test/x")
            .header("x-forwarded-for", "10.1.1.1")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .expect("a request");
        let resp = h2c_call(&mut send, req).await;
        assert_eq!(resp.status(), StatusCode::OK);
        for (engine, seen) in [("the fast path", &fast), ("hyper's engine", resp.headers())] {
            assert_eq!(seen["x-seen-xff"], xff, "{setting}: {engine}");
            let fwd = seen.get("x-seen-forwarded").map(|v| v.to_str().unwrap());
            match forwarded {
                None => assert_eq!(fwd, None, "{setting}: {engine}"),
                Some(f) => assert!(
                    fwd.is_some_and(|v| v.starts_with(f)),
                    "{setting}: {engine}: {fwd:?}"
                ),
            }
        }
    }
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
    let dead = lbkit_testkit::refused_addr();
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

/// Client connections are kept even over the worker threads, whatever the kernel's
/// `SO_REUSEPORT` hash picks (few connections would otherwise split 3 + 1 or 4 + 0 over two
/// workers five times in eight): a worker serving more than the least loaded one hands a new
/// connection over, and the handed connections are served as any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_connections_are_kept_even_over_the_workers() {
    let a = Backend::start("a").await;
    let text = config_text(&[&a], "round-robin", "");
    let proxy = Proxy::start_workers(parse(&text), 2).await.unwrap();
    let addr = proxy.listeners()[0];
    let mut clients = Vec::new();
    for n in 1..=6 {
        // A client each, whose keep-alive connection stays open.
        let c = client();
        let (status, body, _) = get(&c, addr, "/", &[]).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "a"));
        clients.push(c);
        let loads = proxy.worker_connections();
        let (least, most) = (loads.iter().min(), loads.iter().max());
        assert_eq!(loads.iter().sum::<usize>(), n, "{loads:?}");
        assert!(
            most.zip(least).is_some_and(|(m, l)| m - l <= 1),
            "{loads:?}"
        );
    }
    for c in &clients {
        let (status, body, _) = get(c, addr, "/again", &[]).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "a"));
    }
    assert_eq!(proxy.worker_connections(), [3, 3]);
    let (_, metrics, _) = get(&client(), proxy.admin_addr(), "/metrics", &[]).await;
    for worker in ["1", "2"] {
        let line = format!("lbkit_proxy_worker_connections{{worker=\"{worker}\"}} 3\n");
        assert!(metrics.contains(&line), "{line} in {metrics}");
    }
    drop(clients);
    let closed = async {
        while proxy.worker_connections() != [0, 0] {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(WAIT, closed)
        .await
        .expect("every connection ended and left its worker");
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

/// An HTTP/2 (prior knowledge) client connection to `to`.
async fn h2c_connection<B>(to: std::net::SocketAddr) -> hyper::client::conn::http2::SendRequest<B>
where
    B: http_body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = TcpStream::connect(to).await.expect("connect");
    let (send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .expect("h2c");
    tokio::spawn(conn);
    send
}

/// Send `req` on `send` once the connection is ready; its answer's head, within [`WAIT`].
async fn h2c_call<B>(
    send: &mut hyper::client::conn::http2::SendRequest<B>,
    req: http::Request<B>,
) -> http::Response<hyper::body::Incoming>
where
    B: http_body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    send.ready().await.expect("the connection is open");
    tokio::time::timeout(WAIT, send.send_request(req))
        .await
        .unwrap_or_else(|_| panic!("answered within {WAIT:?}"))
        .expect("a response")
}

/// gRPC clients (tonic, grpc-go, Python's Dubbo) send request bodies without a length. Such a
/// body is kept (up to the replay bound) while the first attempt is sent, so a refused
/// connection is retried on another endpoint with the same bytes; and the calls after it on the
/// same client connection are not held up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_without_a_length_are_retried_after_a_refused_connection() {
    use http_body_util::StreamBody;
    use hyper::body::Frame;

    let refused = lbkit_testkit::refused_addr();
    posts_all_answered_past(refused, 9, |i| {
        let frames = vec![Ok::<_, std::convert::Infallible>(Frame::data(
            bytes::Bytes::from(format!("call {i}")),
        ))];
        StreamBody::new(futures_util::stream::iter(frames))
    })
    .await;
}

/// An h2c upstream that answers a stream with `GOAWAY` naming an earlier last stream (here
/// with an error code, `ENHANCE_YOUR_CALM`, as h2 sends when flooded) did not process it, so
/// even a POST goes on to the next endpoint instead of failing with 502.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_the_upstream_sent_goaway_for_goes_to_the_next_endpoint() {
    const ENHANCE_YOUR_CALM: u32 = 0xb;
    let going = lbkit_testkit::goaway_upstream(0, ENHANCE_YOUR_CALM).await;
    posts_all_answered_past(going, 6, |i| {
        http_body_util::Full::new(bytes::Bytes::from(format!("call {i}")))
    })
    .await;
}

/// `n` POSTs over one h2c client connection to a service of `bad` and two backends (h2c
/// upstreams, round robin, two retries), the i-th with body `body(i)`: each is answered 200.
async fn posts_all_answered_past<B>(bad: std::net::SocketAddr, n: usize, body: impl Fn(usize) -> B)
where
    B: http_body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    use http_body_util::BodyExt;

    let (a, b) = (Backend::start("a").await, Backend::start("b").await);
    let proxy = start(&config_for(
        &[bad, a.addr, b.addr],
        "round-robin",
        "h2c = true\nretries = 2",
    ))
    .await;
    let mut send = h2c_connection(proxy.listeners()[0]).await;
    let mut answered = HashMap::<String, usize>::new();
    for i in 0..n {
        let req = http::Request::post("http://svc.test/greet")
            .body(body(i))
            .expect("a request");
        let resp = h2c_call(&mut send, req).await;
        let status = resp.status();
        let body = resp.into_body().collect().await.expect("a body").to_bytes();
        let body = String::from_utf8_lossy(&body).into_owned();
        assert_eq!(status, StatusCode::OK, "call {i}: {body}");
        *answered.entry(body).or_default() += 1;
    }
    assert_eq!(answered.values().sum::<usize>(), n, "{answered:?}");
}

/// What an upload backend saw of a request to `/upload`.
#[derive(Debug, PartialEq)]
enum Upload {
    Started,
    /// Its body ended: whole (`true`) or reset (`false`).
    Ended(bool),
}

/// A backend that answers `ok`, telling `events` when a request to `/upload` starts and how
/// its body ends.
async fn upload_server(events: tokio::sync::mpsc::UnboundedSender<Upload>) -> std::net::SocketAddr {
    use http_body_util::{BodyExt, Full};
    serve_hyper(move |req: http::Request<hyper::body::Incoming>| {
        let events = events.clone();
        async move {
            if req.uri().path() == "/upload" {
                let _ = events.send(Upload::Started);
                let read = req.into_body().collect().await;
                let _ = events.send(Upload::Ended(read.is_ok()));
            }
            http::Response::new(Full::new(bytes::Bytes::from_static(b"ok")))
        }
    })
    .await
}

/// An upload to `/upload` of one chunk, then nothing more and no end.
fn endless_upload(
) -> http::Request<impl http_body::Body<Data = bytes::Bytes, Error = std::convert::Infallible>> {
    use http_body_util::StreamBody;
    use hyper::body::Frame;
    let first = futures_util::stream::iter([Ok(Frame::data(bytes::Bytes::from_static(b"part")))]);
    let body = StreamBody::new(futures_util::StreamExt::chain(
        first,
        futures_util::stream::pending(),
    ));
    http::Request::post("http://svc.test/upload")
        .body(body)
        .expect("a request")
}

/// A client that goes away in the middle of a streamed upload lets go of the upstream's
/// stream too (h2c upstream): the upstream sees the request body reset rather than waiting for
/// the rest of it for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_mid_upload_resets_the_upstream_stream() {
    let (events, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let addr = upload_server(events).await;
    let proxy = start(&config_for(&[addr], "round-robin", "h2c = true")).await;
    let mut send = h2c_connection(proxy.listeners()[0]).await;
    send.ready().await.expect("the connection is open");
    let call = tokio::spawn(send.send_request(endless_upload()));
    let started = tokio::time::timeout(WAIT, seen.recv()).await;
    assert_eq!(started.expect("in time"), Some(Upload::Started));
    // The client gives up: its stream is reset.
    call.abort();
    let ended = tokio::time::timeout(WAIT, seen.recv()).await;
    assert_eq!(
        ended.expect("the upstream's stream ends in time"),
        Some(Upload::Ended(false))
    );
}

/// The same when the call gives up while the client is still there, uploading too slowly for
/// the route's timeout: the client is answered 408, and the upstream's stream is reset (the
/// proxy stops sending the client's body to it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_times_out_mid_upload_resets_the_upstream_stream() {
    let (events, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let addr = upload_server(events).await;
    let text = config_for(&[addr], "round-robin", "h2c = true");
    let proxy = start(&text.replace("timeout_ms = 5000", "timeout_ms = 300")).await;
    let mut send = h2c_connection(proxy.listeners()[0]).await;
    send.ready().await.expect("the connection is open");
    let call = tokio::spawn(send.send_request(endless_upload()));
    let started = tokio::time::timeout(WAIT, seen.recv()).await;
    assert_eq!(started.expect("in time"), Some(Upload::Started));
    let resp = tokio::time::timeout(WAIT, call)
        .await
        .expect("answered in time");
    let resp = resp.expect("the task").expect("an answer");
    assert_eq!(resp.status(), StatusCode::REQUEST_TIMEOUT);
    let ended = tokio::time::timeout(WAIT, seen.recv()).await;
    assert_eq!(
        ended.expect("the upstream's stream ends in time"),
        Some(Upload::Ended(false))
    );
}

/// A backend that reads each request's whole body and answers `status` with it.
async fn body_server(status: u16) -> std::net::SocketAddr {
    use http_body_util::{BodyExt, Full};
    serve_hyper(
        move |req: http::Request<hyper::body::Incoming>| async move {
            let body = req.into_body().collect().await.map(|b| b.to_bytes());
            let mut resp = http::Response::new(Full::new(body.unwrap_or_default()));
            *resp.status_mut() = StatusCode::from_u16(status).expect("a status");
            resp
        },
    )
    .await
}

/// A streamed upload the first attempts read (a refused connection, then a 503 from an endpoint
/// that read it whole) reaches the third endpoint byte for byte; one larger than the replay
/// bound is not sent again once read, and its 503 is relayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_upload_is_sent_again_byte_for_byte_and_only_within_the_bound() {
    use http_body_util::{BodyExt, StreamBody};
    use hyper::body::Frame;

    let refused = lbkit_testkit::refused_addr();
    let (failing, echo) = (body_server(503).await, body_server(200).await);
    let proxy = start(&config_for(
        &[refused, failing, echo],
        "round-robin",
        "h2c = true\nretries = 2",
    ))
    .await;
    let mut send = h2c_connection(proxy.listeners()[0]).await;
    // With `length`, the request announces its length: one within the bound is read whole
    // before the first attempt, from however many frames it comes in.
    let mut call = async |chunks: Vec<Vec<u8>>, length: bool| {
        let total: usize = chunks.iter().map(Vec::len).sum();
        let frames: Vec<_> = chunks
            .into_iter()
            .map(|c| Ok::<_, std::convert::Infallible>(Frame::data(bytes::Bytes::from(c))))
            .collect();
        let mut req = http::Request::put("http://svc.test/upload");
        if length {
            req = req.header(http::header::CONTENT_LENGTH, total);
        }
        let req = req
            .body(StreamBody::new(futures_util::stream::iter(frames)))
            .expect("a request");
        let resp = h2c_call(&mut send, req).await;
        let status = resp.status();
        (
            status,
            resp.into_body().collect().await.expect("a body").to_bytes(),
        )
    };
    for i in 0..6u8 {
        let chunks = vec![vec![i; 1000], vec![b'-'; 10], vec![i + 1; 20_000]];
        let whole: Vec<u8> = chunks.concat();
        let (status, body) = call(chunks, i >= 3).await;
        // Whichever endpoint round robin starts at, the echo answers last or first.
        assert_eq!(status, StatusCode::OK, "call {i}");
        assert_eq!(
            body.as_ref(),
            whole.as_slice(),
            "call {i}: the bytes the echo got"
        );
    }
    // 80 KB > the 64 KiB bound: once read, nothing is kept, so the 503 of the endpoint that read
    // it is the answer; a refused connection read none of it, so that is still retried.
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let (status, body) = call(vec![vec![b'x'; 40_000], vec![b'y'; 40_000]], false).await;
        if status == StatusCode::OK {
            assert_eq!(body.len(), 80_000);
        }
        statuses.push(status.as_u16());
    }
    // Round robin over three endpoints: some call reaches the failing one.
    assert!(statuses.contains(&503), "{statuses:?}");
    assert!(
        !statuses.contains(&502),
        "a refusal is retried: {statuses:?}"
    );
}

// A static list is served from the first request: the proxy publishes it when the service
// starts, not when its control loop first runs (on this one-thread runtime, that is only after
// the test yields). A request that came first used to find no endpoints (503, or a TCP
// connection closed unanswered: `tcp_listener_relays_and_skips_a_dead_endpoint` was flaky).
#[tokio::test(flavor = "current_thread")]
async fn a_static_list_is_served_before_the_control_loop_runs() {
    let addrs: Vec<std::net::SocketAddr> = vec![
        "127.0.0.1:9".parse().unwrap(),
        "127.0.0.1:10".parse().unwrap(),
    ];
    let proxy = Proxy::start(parse(&config_for(&addrs, "round-robin", "")))
        .await
        .unwrap();
    let service = proxy.service("svc").expect("the service runs");
    // No await between the start and this look.
    assert_eq!(service.active().balancer.snapshot().len(), 2);
}

/// How a [`grpc_server`] answers every call.
#[derive(Clone, Copy)]
enum GrpcAnswer {
    /// A trailers-only answer (HTTP 200, `grpc-status` in the head, no body), as servers that
    /// refuse a call send it.
    TrailersOnly(u8),
    /// The message `hello` with its length, then this `grpc-status` and an `x-checksum` in the
    /// trailers.
    Message(u8),
}

/// A gRPC backend on h2c answering every call with `answer`.
async fn grpc_server(answer: GrpcAnswer) -> std::net::SocketAddr {
    use http_body_util::{Either, Empty, StreamBody};
    use hyper::body::Frame;
    serve_hyper(
        move |_req: http::Request<hyper::body::Incoming>| async move {
            let resp =
                http::Response::builder().header(http::header::CONTENT_TYPE, "application/grpc");
            let (resp, body) = match answer {
                GrpcAnswer::TrailersOnly(code) => (
                    resp.header("grpc-status", code.to_string()),
                    Either::Left(Empty::<bytes::Bytes>::new()),
                ),
                GrpcAnswer::Message(code) => {
                    let mut trailers = http::HeaderMap::new();
                    trailers.insert("grpc-status", http::HeaderValue::from(u16::from(code)));
                    trailers.insert("x-checksum", http::HeaderValue::from_static("5"));
                    let frames = vec![
                        Ok::<_, std::convert::Infallible>(Frame::data(bytes::Bytes::from_static(
                            b"hello",
                        ))),
                        Ok(Frame::trailers(trailers)),
                    ];
                    (
                        resp.header(http::header::CONTENT_LENGTH, 5),
                        Either::Right(StreamBody::new(futures_util::stream::iter(frames))),
                    )
                }
            };
            resp.body(body).expect("an answer")
        },
    )
    .await
}

/// A trailers-only `UNAVAILABLE` is the endpoint's failure, recorded as the tower layer's
/// `HttpResponses` records it (not a success because its HTTP status is 200), and relayed as it
/// came; a small answer with a length keeps its trailers on the way to the client, and a failing
/// `grpc-status` among them is a failure too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_failures_in_the_head_count_and_small_answers_keep_their_trailers() {
    use http_body_util::{BodyExt, Empty};

    let unavailable = grpc_server(GrpcAnswer::TrailersOnly(14)).await;
    let ok = grpc_server(GrpcAnswer::Message(0)).await;
    let failing = grpc_server(GrpcAnswer::Message(14)).await;
    let endpoints = [unavailable, ok, failing];
    let proxy = start(&config_for(&endpoints, "round-robin", "h2c = true")).await;
    let mut send = h2c_connection(proxy.listeners()[0]).await;
    let mut answers = HashMap::<&str, usize>::new();
    for i in 0..6 {
        let req = http::Request::post("http://svc.test/echo.Echo/Say")
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header(http::header::TE, "trailers")
            .body(Empty::<bytes::Bytes>::new())
            .expect("a request");
        let resp = h2c_call(&mut send, req).await;
        assert_eq!(resp.status(), StatusCode::OK, "call {i}");
        let head_code = resp.headers().get("grpc-status").cloned();
        let collected = tokio::time::timeout(WAIT, resp.into_body().collect())
            .await
            .expect("a body in time")
            .expect("a body");
        let trailers = collected.trailers().cloned();
        let body = collected.to_bytes();
        let seen = match head_code {
            Some(code) => {
                assert_eq!(code, "14", "call {i}");
                assert!(body.is_empty(), "call {i}: {body:?}");
                "trailers only"
            }
            None => {
                assert_eq!(body.as_ref(), b"hello", "call {i}");
                let trailers = trailers.unwrap_or_else(|| panic!("call {i}: trailers lost"));
                assert_eq!(trailers["x-checksum"], "5", "call {i}");
                if trailers["grpc-status"] == "0" {
                    "ok"
                } else {
                    "failed in the trailers"
                }
            }
        };
        *answers.entry(seen).or_default() += 1;
    }
    assert_eq!(answers.len(), 3, "round robin over the three: {answers:?}");
    assert!(answers.values().all(|&n| n == 2), "{answers:?}");
    let recorded = async |addr| {
        let e = endpoint_json(&proxy, addr).await;
        (e["requests"].as_u64(), e["failures"].as_u64(), e)
    };
    // Every call they answered (the start-up probe's too) is a failure; none of the other's.
    for failed in [unavailable, failing] {
        let (requests, failures, e) = recorded(failed).await;
        assert!(requests >= Some(2), "{e}");
        assert_eq!(
            failures, requests,
            "a failing grpc-status is a failure: {e}"
        );
    }
    let (requests, failures, e) = recorded(ok).await;
    assert!(requests >= Some(2), "{e}");
    assert_eq!(failures, Some(0), "{e}");
}

/// An HTTP/2 client connection drains on shutdown: the proxy sends a graceful `GOAWAY`, the
/// call in flight is answered, then the connection closes and the shutdown ends in time. The
/// connection's streams are served by its own task, so this also checks that a stream still in
/// flight when the drain starts is served to its end.
#[tokio::test]
async fn an_http2_connection_drains_on_shutdown() {
    // Slow enough that the call is surely still in flight when the drain starts, however
    // loaded the machine: the polls below see it within the 2 s.
    let slow = Backend::start_slow("slow", Duration::from_secs(2)).await;
    let proxy = start(&config_text(&[&slow], "round-robin", "")).await;
    let addr = proxy.listeners()[0];
    let h2 = h2c_client();
    let call = {
        let h2 = h2.clone();
        tokio::spawn(async move { get(&h2, addr, "/", &[]).await })
    };
    // Wait (bounded) until the call is in flight at the endpoint.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let ep = endpoint_json(&proxy, slow.addr).await;
        if ep["in_flight"].as_u64() == Some(1) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the call never started"
        );
        tokio::task::yield_now().await;
    }
    let drained = tokio::time::timeout(WAIT, proxy.shutdown(Duration::from_secs(5)))
        .await
        .expect("shutdown in time");
    let (status, body, _) = call.await.unwrap();
    assert_eq!((status, body.as_str()), (StatusCode::OK, "slow"));
    assert!(drained, "the HTTP/2 connection closed within the drain");
}
