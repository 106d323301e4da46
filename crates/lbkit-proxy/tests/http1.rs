//! The HTTP/1.1 fast path against a scripted upstream that speaks raw HTTP/1: chunked answers
//! with trailers, close-delimited answers, 1xx before the answer, HEAD, small request bodies,
//! pipelined requests, and an upstream that closes every connection after one answer (stale
//! pooled connections must not fail requests or count against the endpoint).

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::{
    admin, client, config_text, counting_server, get, raw_exchange, start, Backend, LISTENERS, WAIT,
};
use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Size of the chunked answer at `/chunked`.
const CHUNKED: usize = 300 * 1024;

/// A raw HTTP/1.1 upstream. Paths: `/grpc-14` and `/grpc-5` (a grpc-web answer with only
/// that `grpc-status`, in the head), `/chunked` (300 KiB in 1 KiB chunks and a trailer),
/// `/close` (no length: ends when the connection closes), `/hints` (a 103 first), `/echo`
/// (the request body's length and first bytes back), `/endless` (a 1 GiB length, written until
/// the proxy stops taking it), anything else `ok` with a length. With
/// `one_shot`, every connection is closed after its first answer, without saying so.
async fn upstream(one_shot: bool) -> (SocketAddr, Arc<AtomicUsize>) {
    counting_server(move |stream| serve(stream, one_shot)).await
}

async fn serve(mut stream: TcpStream, one_shot: bool) {
    let mut buf = Vec::new();
    loop {
        let (path, body, used) = loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut req = httparse::Request::new(&mut headers);
            if let Ok(httparse::Status::Complete(n)) = req.parse(&buf) {
                let len: usize = req
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                    .and_then(|h| std::str::from_utf8(h.value).ok()?.parse().ok())
                    .unwrap_or(0);
                if buf.len() >= n + len {
                    let path = match req.method {
                        // A HEAD answer has no body: answer as `/head`.
                        Some("HEAD") => "/head".to_owned(),
                        _ => req.path.unwrap_or("/").to_owned(),
                    };
                    break (path, buf[n..n + len].to_vec(), n + len);
                }
            }
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        buf.drain(..used);
        let mut out = Vec::new();
        match path.as_str() {
            "/chunked" => {
                out.extend_from_slice(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: x-sum\r\n\r\n");
                for i in 0..CHUNKED / 1024 {
                    out.extend_from_slice(b"400;n=1\r\n");
                    out.extend(std::iter::repeat_n(b'a' + (i % 26) as u8, 1024));
                    out.extend_from_slice(b"\r\n");
                }
                out.extend_from_slice(b"0\r\nx-sum: 300\r\n\r\n");
            }
            "/close" => {
                out.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil close");
                let _ = stream.write_all(&out).await;
                return;
            }
            "/hints" => out.extend_from_slice(
                b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhints",
            ),
            "/echo" => {
                let text = format!("{} {}", body.len(), String::from_utf8_lossy(&body[..body.len().min(8)]));
                out.extend_from_slice(format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{text}", text.len()).as_bytes());
            }
            "/head" => out.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"),
            "/grpc-14" | "/grpc-5" => {
                let code = &path[6..];
                out.extend_from_slice(format!("HTTP/1.1 200 OK\r\nContent-Type: application/grpc-web\r\nGrpc-Status: {code}\r\nContent-Length: 0\r\n\r\n").as_bytes());
            }
            "/endless" => {
                let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", 1u64 << 30);
                let piece = vec![b'e'; 64 * 1024];
                if stream.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                // Blocks once the buffers between here and the client are full.
                while stream.write_all(&piece).await.is_ok() {}
                return;
            }
            _ => out.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
        }
        if stream.write_all(&out).await.is_err() || one_shot {
            return;
        }
    }
}

/// A proxy in front of `addr` (through `config_text`'s placeholder).
async fn proxy_for(addr: SocketAddr) -> (lbkit_proxy::Proxy, Backend) {
    let placeholder = Backend::start("unused").await;
    let text = config_text(&[&placeholder], "round-robin", "")
        .replace(&placeholder.addr.to_string(), &addr.to_string());
    (start(&text).await, placeholder)
}

/// Send `raw` on a new connection and read until the proxy closes it.
async fn exchange(proxy: SocketAddr, raw: &[u8]) -> String {
    raw_exchange(proxy, raw, false).await
}

// One thread, so one pool of upstream connections: the count below is exact.
#[tokio::test]
async fn answers_of_every_framing_are_relayed() {
    let (addr, accepted) = upstream(false).await;
    let (proxy, _p) = proxy_for(addr).await;
    let front = proxy.listeners()[0];
    let c = client();
    // Chunked, relayed as it came: the client decodes 300 KiB.
    let (status, body, headers) = get(&c, front, "/chunked", &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body.len(), CHUNKED);
    assert!(body.starts_with('a') && body.ends_with((b'a' + (299 % 26) as u8) as char));
    assert_eq!(headers["transfer-encoding"], "chunked");
    // The 103 is dropped, the 200 after it relayed.
    assert_eq!(get(&c, front, "/hints", &[]).await.1, "hints");
    // Close-delimited: the client connection closes after it.
    let out = exchange(front, b"GET /close HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
    assert!(
        out.to_ascii_lowercase().contains("connection: close\r\n"),
        "{out}"
    );
    assert!(out.ends_with("\r\n\r\nuntil close"), "{out}");
    // HEAD: a length, no body; the connection stays usable (the next answer follows).
    let out = exchange(
        front,
        b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(
        out.starts_with("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nHTTP/1.1 200 OK"),
        "{out}"
    );
    assert!(out.ends_with("\r\n\r\nok"), "{out}");
    // A small body goes up whole, on a pooled connection (the client connection is new).
    let out = exchange(
        front,
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\nConnection: close\r\n\r\nhello world",
    )
    .await;
    assert!(out.ends_with("\r\n\r\n11 hello wo"), "{out}");
    // Sequential exchanges share one pooled upstream connection; the close-delimited answer
    // needed its own.
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_are_answered_in_order() {
    let (addr, _) = upstream(false).await;
    let (proxy, _p) = proxy_for(addr).await;
    let out = exchange(
        proxy.listeners()[0],
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabcGET /hints HTTP/1.1\r\nHost: x\r\n\r\n\
          GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    let answers: Vec<&str> = out.split("HTTP/1.1 200 OK").skip(1).collect();
    assert_eq!(answers.len(), 3, "{out}");
    assert!(
        answers[0].ends_with("3 abc") && answers[1].ends_with("hints"),
        "{out}"
    );
    assert!(answers[2].ends_with("ok"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_the_upstream_closed_are_not_failures() {
    let (addr, accepted) = upstream(true).await;
    let (proxy, _p) = proxy_for(addr).await;
    let front = proxy.listeners()[0];
    let c = client();
    for _ in 0..20 {
        let (status, body, _) = get(&c, front, "/", &[]).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "ok"));
    }
    assert!(accepted.load(Ordering::SeqCst) >= 20);
    let (_, doc) = admin(&c, &proxy, "GET", "/endpoints", "").await;
    let doc: serde_json::Value = serde_json::from_str(&doc).expect("json");
    let ep = &doc["services"]["svc"]["endpoints"][0];
    assert_eq!(ep["failures"].as_u64(), Some(0), "{doc}");
    assert_eq!(ep["in_flight"].as_u64(), Some(0), "{doc}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_idle_keep_alive_connections_at_once() {
    let (addr, _) = upstream(false).await;
    let (proxy, _p) = proxy_for(addr).await;
    let mut s = TcpStream::connect(proxy.listeners()[0])
        .await
        .expect("connect");
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let mut answer = [0u8; 40];
    let n = tokio::time::timeout(WAIT, s.read(&mut answer))
        .await
        .expect("answered in time")
        .expect("read");
    assert!(answer[..n].starts_with(b"HTTP/1.1 200 OK"));
    // The connection is idle and kept alive; shutdown closes it rather than waiting out the
    // 20 s drain bound.
    let started = tokio::time::Instant::now();
    let drained = proxy.shutdown(std::time::Duration::from_secs(20)).await;
    assert!(drained && started.elapsed() < std::time::Duration::from_secs(5));
    let mut rest = Vec::new();
    let read = tokio::time::timeout(WAIT, s.read_to_end(&mut rest)).await;
    assert!(matches!(read, Ok(Ok(0))), "{read:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_header_cannot_smuggle_a_request() {
    let (addr, _) = upstream(false).await;
    let (proxy, _p) = proxy_for(addr).await;
    let front = proxy.listeners()[0];
    // `Connection: content-length` asks a proxy to drop the length but not the body: relayed
    // naively, the body would reach the upstream as a second request (and its answer would go
    // to the next client). The whole body must stay the POST's body.
    let smuggled = "GET /hints HTTP/1.1\r\nHost: x\r\n\r\n";
    let raw = format!(
        "POST /echo HTTP/1.1\r\nHost: x\r\nConnection: content-length\r\nContent-Length: {}\r\n\r\n{smuggled}",
        smuggled.len()
    );
    let mut s = TcpStream::connect(front).await.expect("connect");
    s.write_all(raw.as_bytes()).await.expect("write");
    let mut answer = vec![0u8; 1024];
    let n = tokio::time::timeout(WAIT, s.read(&mut answer))
        .await
        .expect("answered in time")
        .expect("read");
    let answer = String::from_utf8_lossy(&answer[..n]).into_owned();
    let expected = format!("{} GET /hin", smuggled.len());
    assert!(answer.ends_with(&expected), "{answer}");
    // Later clients get their own answers.
    let c = client();
    for _ in 0..5 {
        assert_eq!(get(&c, front, "/", &[]).await.1, "ok");
    }
}

// Idle upstream connections close after the service's `upstream_idle_timeout_ms` although no
// request comes to sweep the pool: on the calling runtime (1 worker) and on worker threads.
#[tokio::test]
async fn idle_upstream_connections_close_on_time_without_traffic() {
    for workers in [1, 2] {
        let (closed_tx, mut closed) = tokio::sync::mpsc::unbounded_channel();
        let (addr, accepted) = counting_server(move |stream| {
            let closed = closed_tx.clone();
            async move {
                serve(stream, false).await; // until the proxy closes the connection
                let _ = closed.send(());
            }
        })
        .await;
        let placeholder = Backend::start("unused").await;
        let text = config_text(
            &[&placeholder],
            "round-robin",
            "upstream_idle_timeout_ms = 300",
        )
        .replace(&placeholder.addr.to_string(), &addr.to_string());
        let proxy = lbkit_proxy::Proxy::start_workers(common::parse(&text), workers)
            .await
            .expect("proxy starts");
        let (c, front) = (client(), proxy.listeners()[0]);
        tokio::time::timeout(WAIT, async {
            while get(&c, front, "/", &[]).await.0 != StatusCode::OK {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("served in time");
        let opened = accepted.load(Ordering::SeqCst);
        assert!(opened >= 1, "{workers} workers");
        tokio::time::timeout(WAIT, async {
            for _ in 0..opened {
                closed.recv().await.expect("server alive");
            }
        })
        .await
        .expect("idle upstream connections closed in time");
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            opened,
            "no new connection meanwhile"
        );
        drop(proxy);
    }
}

// A client that stops reading a streamed answer is cut off after the route's timeout (per
// write, nginx's `send_timeout`): its connection and the upstream's are closed, and the
// endpoint is not charged with a failure. On the fast path (HTTP/1.1) and on hyper's (an
// HTTP/1.0 request is handed over).
#[tokio::test]
async fn a_client_that_stops_reading_is_cut_off_without_blaming_the_endpoint() {
    for version in ["1.1", "1.0"] {
        stalled_client(version).await;
    }
}

async fn stalled_client(version: &str) {
    let (closed_tx, mut closed) = tokio::sync::mpsc::unbounded_channel();
    let (addr, _) = counting_server(move |stream| {
        let closed = closed_tx.clone();
        async move {
            serve(stream, false).await; // `/endless` returns once its writes fail
            let _ = closed.send(());
        }
    })
    .await;
    let (proxy, _p) = {
        let placeholder = Backend::start("unused").await;
        let text = config_text(&[&placeholder], "round-robin", "")
            .replace(&placeholder.addr.to_string(), &addr.to_string())
            .replace("timeout_ms = 5000", "timeout_ms = 400");
        (start(&text).await, placeholder)
    };
    // A small receive buffer: the proxy's writes block soon after the client stops reading.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    let mut s = socket.connect(proxy.listeners()[0]).await.expect("connect");
    let request = format!("GET /endless HTTP/{version}\r\nHost: x\r\n\r\n");
    s.write_all(request.as_bytes()).await.expect("write");
    let mut first = [0u8; 1024];
    let n = tokio::time::timeout(WAIT, s.read(&mut first))
        .await
        .expect("answer begins in time")
        .expect("read");
    let answer = String::from_utf8_lossy(&first[..n]);
    assert!(
        answer.starts_with(&format!("HTTP/{version} 200")),
        "{answer}"
    );
    // Stop reading. The upstream connection is closed (its writes fail) ...
    tokio::time::timeout(WAIT, closed.recv())
        .await
        .expect("upstream connection closed in time")
        .expect("server alive");
    // ... and so is the client's: what is buffered drains, then EOF or a reset.
    let drained = tokio::time::timeout(WAIT, async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(
        drained.is_ok(),
        "HTTP/{version}: client connection closed by the proxy"
    );
    let (_, doc) = admin(&client(), &proxy, "GET", "/endpoints", "").await;
    let doc: serde_json::Value = serde_json::from_str(&doc).expect("json");
    let ep = &doc["services"]["svc"]["endpoints"][0];
    assert_eq!(ep["failures"].as_u64(), Some(0), "{doc}");
    assert_eq!(ep["in_flight"].as_u64(), Some(0), "{doc}");
}

/// The status code of an answer `exchange` read.
fn status_of(answer: &str) -> &str {
    answer.split(' ').nth(1).unwrap_or("")
}

// RFC 9112 §3.2: an HTTP/1.1 request without exactly one valid `Host` is answered 400 and
// reaches no backend; HTTP/1.0 may omit it (issue 15: such requests were forwarded).
#[tokio::test]
async fn a_missing_repeated_or_invalid_host_is_a_400_that_no_backend_sees() {
    let (addr, accepted) = upstream(false).await;
    let (proxy, _placeholder) = proxy_for(addr).await;
    let before = accepted.load(Ordering::SeqCst);
    let to = proxy.listeners()[0];
    for raw in [
        "GET / HTTP/1.1\r\nConnection: close\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\nConnection: close\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a b\r\nConnection: close\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a/b\r\nConnection: close\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a:80x\r\nConnection: close\r\n\r\n",
        "GET / HTTP/1.0\r\nHost: a@b\r\n\r\n",
        // Not the Host, but the same rule of one answer from both engines: a target byte
        // that `httparse` takes and hyper's `Uri` does not (found by the h1_differential fuzz
        // target; the fast path forwarded it).
        "GET /public/.>/secret HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    ] {
        let answer = exchange(to, raw.as_bytes()).await;
        assert_eq!(status_of(&answer), "400", "{raw:?}: {answer}");
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        before,
        "no backend saw them"
    );
    let answer = exchange(to, b"GET / HTTP/1.0\r\n\r\n").await;
    assert_eq!(status_of(&answer), "200", "{answer}");
}

// Routing uses the normalised path (`request.rs`): dot segments, their percent-encoded forms
// and repeated slashes cannot reach another route's backend; encoded slashes are refused.
#[tokio::test]
async fn routes_match_the_normalised_path() {
    let (public, secret) = (
        Backend::start("public").await,
        Backend::start("secret").await,
    );
    let text = format!(
        r#"{LISTENERS}
[[route]]
path_prefix = "/public/"
service = "public"
[[route]]
path_prefix = "/"
service = "secret"
[service.public]
endpoints = ["{}"]
[service.secret]
endpoints = ["{}"]
"#,
        public.addr, secret.addr
    );
    let proxy = start(&text).await;
    let to = proxy.listeners()[0];
    let get = |path: &str| format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    for (path, want) in [
        ("/public/x", "public"),
        ("/public/./x", "public"),
        ("//public//x", "public"),
        ("/public/%78", "public"),
        ("/public/../secret", "secret"),
        ("/public/%2e%2e/secret", "secret"),
        ("/public/%2E%2E/secret?q=1", "secret"),
        ("/public/.%2e/secret", "secret"),
    ] {
        let answer = exchange(to, get(path).as_bytes()).await;
        assert!(
            status_of(&answer) == "200" && answer.ends_with(want),
            "{path}: {answer}"
        );
    }
    for path in [
        "/public/..%2Fsecret",
        "/public/%2e%2e%5Csecret",
        "/../secret",
        "/public/%zz",
    ] {
        let answer = exchange(to, get(path).as_bytes()).await;
        assert_eq!(status_of(&answer), "400", "{path}: {answer}");
    }
}

// The fast path's two client timers: between the requests of a kept-alive connection
// `idle_timeout_ms` runs; from a head's first byte (and on a new connection) the head limit.
// Each case uses a long other limit, so the connection closing within `WAIT` shows which ran.
#[tokio::test]
async fn kept_alive_connections_wait_under_the_idle_limit_and_heads_under_the_head_limit() {
    let a = Backend::start("a").await;
    for (head_ms, idle_ms, after_first) in [
        // Idle after one request: closed by the idle limit.
        (60_000, 200, &b""[..]),
        // A partial head after one request: closed by the head limit from its first byte.
        (200, 60_000, &b"GET / HT"[..]),
    ] {
        let text = config_text(&[&a], "round-robin", "").replace(
            "header_read_timeout_ms = 300",
            &format!("header_read_timeout_ms = {head_ms}\nidle_timeout_ms = {idle_ms}"),
        );
        let proxy = start(&text).await;
        let mut s = TcpStream::connect(proxy.listeners()[0])
            .await
            .expect("connect");
        s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .expect("write");
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(WAIT, s.read(&mut buf))
            .await
            .expect("answered")
            .expect("read");
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);
        s.write_all(after_first).await.expect("write");
        let mut rest = Vec::new();
        let read = tokio::time::timeout(WAIT, s.read_to_end(&mut rest))
            .await
            .unwrap_or_else(|_| panic!("head {head_ms} ms, idle {idle_ms} ms: closed in time"));
        assert!(read.is_ok(), "{read:?}");
    }
}

/// A grpc-web answer over HTTP/1.1 that fails in its head (`grpc-status: 14`, trailers-only) is
/// the endpoint's failure on the fast path too, as on hyper's path and in the tower layer; an
/// application's code (`5`, `NOT_FOUND`) is an answer. Both are relayed as they came.
#[tokio::test]
async fn a_grpc_status_in_the_head_is_classified_on_the_fast_path_too() {
    let (addr, _) = upstream(false).await;
    let (proxy, _p) = proxy_for(addr).await;
    let front = proxy.listeners()[0];
    let c = client();
    // The failures recorded once no call is in flight (a call ends just after its last byte
    // leaves for the client).
    let failures = async || {
        tokio::time::timeout(WAIT, async {
            loop {
                let e = common::endpoint_json(&proxy, addr).await;
                if e["in_flight"].as_u64() == Some(0) {
                    return e["failures"].as_u64();
                }
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the calls end in time")
    };
    let before = failures().await.expect("failures");
    for (path, failed) in [("/grpc-14", 1), ("/grpc-5", 0), ("/grpc-14", 1)] {
        let at = failures().await.expect("failures");
        let (status, body, headers) = get(&c, front, path, &[]).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, ""), "{path}");
        assert_eq!(headers["grpc-status"], &path[6..], "{path}");
        assert_eq!(failures().await, Some(at + failed), "{path}");
    }
    assert_eq!(failures().await, Some(before + 2));
}
