//! HTTP/1.1 upgrades (WebSocket's handshake) through the proxy, against a raw upstream that
//! switches to an echo protocol: the 101 reaches the client, bytes flow both ways through the
//! tunnel, and closing one side closes the other. A declined upgrade is an ordinary answer.

mod common;

use std::net::SocketAddr;

use common::{admin, client, config_text, counting_server, start, Backend, WAIT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// A lenient upstream: a request with any `Upgrade` is switched to echoing bytes back — at
/// `/ws` to the protocol asked for, at `/other` to `h2c` whatever was asked; anything else gets
/// `ok` (keep-alive). Every request head it reads goes to `heads`.
async fn upstream() -> (SocketAddr, mpsc::UnboundedReceiver<String>) {
    let (tx, heads) = mpsc::unbounded_channel();
    let (addr, _) = counting_server(move |stream| serve(stream, tx.clone())).await;
    (addr, heads)
}

async fn serve(mut stream: TcpStream, heads: mpsc::UnboundedSender<String>) {
    let mut buf = Vec::new();
    loop {
        let Some(head) = read_head(&mut stream, &mut buf).await else {
            return;
        };
        let lower = head.to_ascii_lowercase();
        let path = lower.split(' ').nth(1).unwrap_or("").to_owned();
        let asked = lower
            .split("\r\n")
            .find_map(|l| l.strip_prefix("upgrade: "))
            .map(str::to_owned);
        let _ = heads.send(head);
        let to = match (path.as_str(), asked) {
            ("/ws", Some(p)) => Some(p),
            ("/other", Some(_)) => Some("h2c".to_owned()),
            _ => None,
        };
        if let Some(to) = to {
            let switch = format!(
                "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: {to}\r\n\r\n"
            );
            if stream.write_all(switch.as_bytes()).await.is_err()
                || stream.write_all(&buf).await.is_err()
            {
                return;
            }
            let mut chunk = [0u8; 4096];
            while let Ok(n @ 1..) = stream.read(&mut chunk).await {
                if stream.write_all(&chunk[..n]).await.is_err() {
                    return;
                }
            }
            return; // the client side closed: close ours
        }
        if stream
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            .await
            .is_err()
        {
            return;
        }
    }
}

/// Read one head (through the blank line) from `stream`, keeping what follows in `buf`.
async fn read_head(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<String> {
    loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..i + 4]).into_owned();
            buf.drain(..i + 4);
            return Some(head);
        }
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// `lbkit_proxy_client_connections` from `/metrics`.
async fn client_connections(proxy: &lbkit_proxy::Proxy) -> u64 {
    let (_, text) = admin(&client(), proxy, "GET", "/metrics", "").await;
    text.lines()
        .find_map(|l| l.strip_prefix("lbkit_proxy_client_connections "))
        .and_then(|v| v.parse().ok())
        .expect("lbkit_proxy_client_connections in /metrics")
}

/// Wait (bounded) until the proxy has no client connection open.
async fn no_client_connections(proxy: &lbkit_proxy::Proxy) {
    tokio::time::timeout(WAIT, async {
        while client_connections(proxy).await != 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("client connections closed in time");
}

/// A proxy in front of `addr` that tunnels the test protocol `echo` (and WebSocket), with
/// `limits` lines added.
async fn proxy_with(addr: SocketAddr, limits: &str) -> (lbkit_proxy::Proxy, Backend) {
    let placeholder = Backend::start("unused").await;
    let text = config_text(&[&placeholder], "round-robin", "")
        .replace(&placeholder.addr.to_string(), &addr.to_string())
        .replace(
            "[limits]\n",
            &format!("[limits]\nupgrade_protocols = [\"echo\", \"websocket\"]\n{limits}\n"),
        );
    (start(&text).await, placeholder)
}

async fn proxy_for(addr: SocketAddr) -> (lbkit_proxy::Proxy, Backend) {
    proxy_with(addr, "").await
}

#[tokio::test]
async fn an_upgrade_becomes_a_tunnel_both_ways() {
    let (addr, mut heads) = upstream().await;
    let (proxy, _p) = proxy_for(addr).await;
    // The readiness probe's connection is gone: only the tunnel counts below.
    no_client_connections(&proxy).await;
    let (mut s, head, _) = head_of(
        &proxy,
        "GET /ws HTTP/1.1\r\nHost: chat\r\nConnection: keep-alive, Upgrade\r\nUpgrade: echo\r\nX-Token: 1\r\n\r\n",
    )
    .await;
    let lower = head.to_ascii_lowercase();
    assert!(lower.starts_with("http/1.1 101"), "{head}");
    assert!(lower.contains("\r\nupgrade: echo\r\n"), "{head}");
    assert!(lower.contains("\r\nconnection: upgrade\r\n"), "{head}");
    // What the upstream got: the upgrade asked for, the end-to-end headers, forwarding headers.
    let sent = last_head(&mut heads); // the readiness probe's GET / came first
    assert!(sent.starts_with("get /ws http/1.1"), "{sent}");
    assert!(sent.contains("\r\nupgrade: echo\r\n"), "{sent}");
    assert!(sent.contains("\r\nconnection: upgrade\r\n"), "{sent}");
    assert!(sent.contains("\r\nx-token: 1\r\n"), "{sent}");
    assert!(
        sent.contains("\r\nx-forwarded-for: 127.0.0.1\r\n"),
        "{sent}"
    );
    assert!(!sent.contains("keep-alive"), "{sent}");
    // Bytes both ways, in any sizes.
    for message in [&b"ping"[..], &[7u8; 100_000][..], b"last"] {
        s.write_all(message).await.expect("write");
        let mut back = vec![0u8; message.len()];
        tokio::time::timeout(WAIT, s.read_exact(&mut back))
            .await
            .expect("echo in time")
            .expect("echo");
        assert_eq!(back, message);
    }
    // The tunnel outlived hyper's connection and still holds the client's connection slot.
    assert_eq!(client_connections(&proxy).await, 1);
    // The client closes its side: the upstream closes, and so does the tunnel.
    s.shutdown().await.expect("shutdown");
    let mut rest = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut rest))
        .await
        .expect("tunnel closed in time")
        .expect("read");
    assert!(rest.is_empty());
    // The slot is given back when the tunnel ends.
    no_client_connections(&proxy).await;
    let (_, doc) = admin(&client(), &proxy, "GET", "/endpoints", "").await;
    let doc: serde_json::Value = serde_json::from_str(&doc).expect("json");
    let ep = &doc["services"]["svc"]["endpoints"][0];
    assert_eq!(ep["failures"].as_u64(), Some(0), "{doc}");
    assert_eq!(ep["in_flight"].as_u64(), Some(0), "{doc}");
}

#[tokio::test]
async fn a_declined_upgrade_is_an_ordinary_answer() {
    let (addr, mut heads) = upstream().await;
    let (proxy, _p) = proxy_for(addr).await;
    let mut s = TcpStream::connect(proxy.listeners()[0])
        .await
        .expect("connect");
    // The upstream only switches at /ws; then the same connection carries a plain request.
    s.write_all(b"GET /chat HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
        .await
        .expect("write");
    let mut buf = Vec::new();
    for expected in ["get /chat ", "get /next "] {
        let head = tokio::time::timeout(WAIT, read_head(&mut s, &mut buf))
            .await
            .expect("answer in time")
            .expect("a head");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        while buf.len() < 2 {
            let mut chunk = [0u8; 64];
            let n = s.read(&mut chunk).await.expect("body");
            assert!(n > 0, "closed early");
            buf.extend_from_slice(&chunk[..n]);
        }
        assert_eq!(&buf[..2], b"ok");
        buf.drain(..2);
        let last = last_head(&mut heads);
        assert!(last.starts_with(expected), "{last}");
        s.write_all(b"GET /next HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("write");
    }
}

// A graceful shutdown waits for an open tunnel (bounded by the drain time), then closes it.
#[tokio::test]
async fn a_drain_waits_for_a_tunnel_then_closes_it() {
    let (addr, _heads) = upstream().await;
    let (proxy, _p) = proxy_for(addr).await;
    let (mut s, head, _) = head_of(
        &proxy,
        "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    s.write_all(b"hi").await.expect("write");
    let mut back = [0u8; 2];
    s.read_exact(&mut back).await.expect("echo");
    let drained = tokio::time::timeout(WAIT, proxy.shutdown(std::time::Duration::from_millis(200)))
        .await
        .expect("shutdown returns in time");
    assert!(!drained, "the open tunnel kept the drain waiting");
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(WAIT, s.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "tunnel closed after the drain");
}

/// Send `raw` on a new connection to the proxy and read one answer head; also the bytes read
/// past it.
async fn head_of(proxy: &lbkit_proxy::Proxy, raw: &str) -> (TcpStream, String, Vec<u8>) {
    let mut s = TcpStream::connect(proxy.listeners()[0])
        .await
        .expect("connect");
    s.write_all(raw.as_bytes()).await.expect("write");
    let mut buf = Vec::new();
    let head = tokio::time::timeout(WAIT, read_head(&mut s, &mut buf))
        .await
        .expect("answer in time")
        .expect("a head");
    (s, head, buf)
}

/// The last head the upstream read.
fn last_head(heads: &mut mpsc::UnboundedReceiver<String>) -> String {
    let mut last = String::new();
    while let Ok(h) = heads.try_recv() {
        last = h;
    }
    last.to_ascii_lowercase()
}

// Upgrades that must not become tunnels go upstream as plain requests, without `Upgrade` or
// h2c's settings, even to an upstream that would switch: h2c (HTTP/2 past routing and
// forwarding headers), a protocol not allowed, a POST, a body.
#[tokio::test]
async fn unsafe_upgrades_are_plain_requests() {
    let (addr, mut heads) = upstream().await;
    let (proxy, _p) = proxy_for(addr).await;
    for raw in [
        "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n",
        "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo, h2c\r\n\r\n",
        "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n",
        "POST /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\nContent-Length: 0\r\n\r\n",
        "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\nContent-Length: 3\r\n\r\nabc",
    ] {
        let (_s, head, _) = head_of(&proxy, raw).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{raw:?} -> {head}");
        let sent = last_head(&mut heads);
        assert!(!sent.contains("\r\nupgrade:"), "{sent}");
        assert!(!sent.contains("http2-settings"), "{sent}");
        assert!(!sent.contains("\r\nconnection: upgrade"), "{sent}");
    }
}

// A 101 to a protocol the client did not offer is refused: the client gets a 502, not a tunnel.
#[tokio::test]
async fn a_switch_to_another_protocol_is_refused() {
    let (addr, _heads) = upstream().await;
    let (proxy, _p) = proxy_for(addr).await;
    let (_s, head, _) = head_of(
        &proxy,
        "GET /other HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 502"), "{head}");
    let (_, doc) = admin(&client(), &proxy, "GET", "/endpoints", "").await;
    let doc: serde_json::Value = serde_json::from_str(&doc).expect("json");
    let ep = &doc["services"]["svc"]["endpoints"][0];
    assert_eq!(ep["failures"].as_u64(), Some(1), "{doc}");
}

// A tunnel without a byte either way for `tunnel_idle_timeout_ms` is closed, and its slot
// given back.
#[tokio::test]
async fn an_idle_tunnel_is_closed() {
    let (addr, _heads) = upstream().await;
    let (proxy, _p) = proxy_with(addr, "tunnel_idle_timeout_ms = 300").await;
    no_client_connections(&proxy).await;
    let (mut s, head, _) = head_of(
        &proxy,
        "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    s.write_all(b"hi").await.expect("write");
    let mut back = [0u8; 2];
    s.read_exact(&mut back).await.expect("echo");
    let started = tokio::time::Instant::now();
    let mut rest = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut rest))
        .await
        .expect("idle tunnel closed in time")
        .expect("closed cleanly");
    assert!(started.elapsed() >= std::time::Duration::from_millis(300));
    no_client_connections(&proxy).await;
}
