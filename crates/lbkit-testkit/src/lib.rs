//! # lbkit-testkit
//!
//! Shared test helpers (a dev-dependency only): the [`conformance`] suite every strategy must
//! pass, built-in or user-defined; [`dist`] for chi-square distribution checks; [`alloc`], a
//! counting global allocator that proves picks do not allocate; [`zk_shim`], faults in front
//! of a real ZooKeeper (a server older than 3.6, cut connections).
#![deny(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms)]

pub mod alloc;
pub mod conformance;
pub mod dist;
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
