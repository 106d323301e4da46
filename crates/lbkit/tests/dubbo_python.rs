//! Interop with the official Dubbo implementation for Python (`apache-dubbo`, in the tests'
//! virtual environment: `scripts/python.sh`): its providers register in a real ZooKeeper
//! (`LBKIT_ZK`) in Dubbo's layout and serve Triple (gRPC on HTTP/2); `lbkit watch --once` lists
//! them, and `lbkit proxy` (h2c upstreams, a load-aware strategy) calls them, also while one is
//! killed. Both variables unset: skipped locally, a failure in CI.

#[path = "faults/load.rs"]
#[allow(dead_code)] // the fault run's load and admin sampler; this test uses the sampler
mod load;
#[path = "faults/procs.rs"]
#[allow(dead_code)] // the fault run's process handling; this test uses part of it
mod procs;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use procs::{free_port, Proc, Proxy, WAIT};
use tokio::process::Command;
use tokio::sync::watch;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/dubbo_provider.py")
}

/// One Python provider of `service` on a free port, once it says it is exported.
async fn provider(python: &str, service: &str, zk: &str, name: &str, dir: &Path) -> (Proc, u16) {
    let port = free_port().expect("a port");
    let mut cmd = Command::new(python);
    cmd.arg(script())
        .args([service, &port.to_string(), zk, name]);
    let proc = Proc::spawn(name, cmd, &dir.join(format!("{name}.log"))).expect("start provider");
    proc.line("serving").await.expect("the provider starts");
    (proc, port)
}

/// A gRPC message: flag 0 (uncompressed), big-endian length, bytes.
fn grpc_frame(msg: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + msg.len());
    b.put_u8(0);
    b.put_u32(u32::try_from(msg.len()).expect("small"));
    b.put_slice(msg);
    b.freeze()
}

/// One unary call `/{service}/greet` through the proxy: the answer's message and grpc-status.
async fn greet(
    sender: &mut http2::SendRequest<Full<Bytes>>,
    service: &str,
    msg: &str,
) -> Result<(String, String), String> {
    let req = hyper::Request::post(format!("http://lbkit.test/{service}/greet"))
        .header("content-type", "application/grpc+proto")
        .header("te", "trailers")
        .body(Full::new(grpc_frame(msg.as_bytes())))
        .map_err(|e| e.to_string())?;
    sender.ready().await.map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status();
    let collected = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?;
    let grpc_status = collected
        .trailers()
        .and_then(|t| t.get("grpc-status"))
        .and_then(|v| v.to_str().ok())
        .unwrap_or("none")
        .to_owned();
    let mut body = collected.to_bytes();
    if status != 200 || body.len() < 5 {
        return Err(format!(
            "{status}, grpc-status {grpc_status}, {} bytes",
            body.len()
        ));
    }
    body.advance(1);
    let len = body.get_u32() as usize;
    let text = String::from_utf8_lossy(&body[..len.min(body.len())]).into_owned();
    Ok((text, grpc_status))
}

/// The proxy's admin API, read every 20 ms (the fault run's sampler) while the test runs.
struct Admin {
    latest: watch::Receiver<Option<load::View>>,
    _stop: watch::Sender<bool>,
}

impl Admin {
    fn watch(admin: std::net::SocketAddr) -> Admin {
        let (stop, rx) = watch::channel(false);
        let (tx, latest) = watch::channel(None);
        tokio::spawn(load::sample_admin(
            admin,
            "api".to_owned(),
            Duration::from_millis(20),
            tokio::time::Instant::now(),
            rx,
            tx,
        ));
        Admin {
            latest,
            _stop: stop,
        }
    }

    /// Wait (bounded) until the proxy serves exactly `n` endpoints; their addresses.
    async fn until_endpoints(&self, n: usize) -> Vec<String> {
        let mut rx = self.latest.clone();
        let seen = tokio::time::timeout(
            WAIT,
            rx.wait_for(|v| v.as_ref().is_some_and(|v| v.endpoints.len() == n)),
        )
        .await;
        match seen {
            Ok(Ok(v)) => v
                .iter()
                .flat_map(|v| v.endpoints.iter().map(|(a, _)| a.clone()))
                .collect(),
            _ => panic!(
                "the proxy never served {n} endpoints within {WAIT:?}: {:?}",
                self.latest.borrow().as_ref().map(|v| &v.endpoints)
            ),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_dubbo_providers_are_discovered_and_called_through_the_proxy() {
    let (Some(zk), Some(python)) = (lbkit_testkit::zookeeper(), lbkit_testkit::python()) else {
        return;
    };
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("dubbo-python-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a test directory");
    let service = format!("org.lbkit.interop{}.Greeter", std::process::id());
    let mut providers = Vec::new();
    for name in ["p0", "p1", "p2"] {
        providers.push(provider(&python, &service, &zk, name, &dir).await);
    }

    // `lbkit watch --once` reads their minimal registrations.
    let out = Command::new(env!("CARGO_BIN_EXE_lbkit"))
        .args(["watch", "--once", "--zk", &zk, "--interface", &service])
        .output()
        .await
        .expect("lbkit watch");
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{listed}");
    for (_, port) in &providers {
        assert!(listed.contains(&format!("127.0.0.1:{port}")), "{listed}");
    }

    // The proxy calls them over h2c (Python's strict `h2` refuses a Host beside :authority).
    let (listen, admin) = (free_port().expect("port"), free_port().expect("port"));
    let config = format!(
        r#"[admin]
bind = "127.0.0.1:{admin}"

[[listener]]
bind = "127.0.0.1:{listen}"

[[route]]
service = "api"

[service.api]
zookeeper = {{ zk = "{zk}", interface = "{service}" }}
strategy = "least-request"
h2c = true
retries = 2
"#
    );
    let path = dir.join("proxy.toml");
    std::fs::write(&path, config).expect("write the config");
    let mut proxy = Proxy::start(&path, &dir).await.expect("the proxy starts");
    let admin = Admin::watch(proxy.admin);
    admin.until_endpoints(3).await;
    let stream = tokio::net::TcpStream::connect(proxy.listen)
        .await
        .expect("connect");
    let (mut sender, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
        .await
        .expect("an h2c connection");
    tokio::spawn(conn);

    let mut answered: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..60 {
        let (text, status) = greet(&mut sender, &service, &format!("call {i}"))
            .await
            .unwrap_or_else(|e| panic!("call {i}: {e}; proxy log: {}", dir.display()));
        assert_eq!(status, "0", "grpc-status of {text:?}");
        let (who, rest) = text.split_once(": ").expect("NAME: message");
        assert_eq!(rest, format!("call {i}"));
        *answered.entry(who.to_owned()).or_default() += 1;
    }
    assert_eq!(answered.len(), 3, "every provider answered: {answered:?}");

    // One provider killed: no call fails (connect refused is retried), and once its session
    // ends its node goes and the proxy follows.
    providers[0].0.kill().await;
    let mut after: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..30 {
        let (text, status) = greet(&mut sender, &service, "after")
            .await
            .unwrap_or_else(|e| panic!("call {i} after the kill: {e}"));
        assert_eq!(status, "0");
        *after
            .entry(text.split(':').next().unwrap_or_default().to_owned())
            .or_default() += 1;
    }
    assert!(
        !after.contains_key("p0"),
        "a killed provider answered: {after:?}"
    );
    let left = admin.until_endpoints(2).await;
    assert!(
        !left.contains(&format!("127.0.0.1:{}", providers[0].1)),
        "{left:?}"
    );
    proxy.proc.stop().await;
    for (p, _) in &mut providers {
        p.stop().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}
