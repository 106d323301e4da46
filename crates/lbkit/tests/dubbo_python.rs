//! Interop with the official Dubbo implementation for Python (`apache-dubbo`, in the tests'
//! virtual environment: `scripts/python.sh`), over a real ZooKeeper (`LBKIT_ZK`):
//!
//! * Python providers register in Dubbo's layout and serve Triple (gRPC on HTTP/2):
//!   `lbkit watch --once` lists them; `lbkit proxy` (h2c upstreams, a load-aware strategy)
//!   calls them, for a hand-made HTTP/2 client and for an `apache-dubbo` consumer, also while
//!   one is killed; a tonic client behind `lbkit-tower` (ZooKeeper discovery, peak EWMA)
//!   calls them, keeps a slow one's share small, and loses no call when one is killed.
//! * Rust tonic servers registered by `lbkit register` and by the library's
//!   [`ZkRegistration`] are discovered and called by an `apache-dubbo` consumer, and an
//!   independent ZooKeeper client (kazoo) checks the exact nodes they write.
//!
//! Both variables unset: skipped locally, a failure in CI.

#[path = "faults/load.rs"]
#[allow(dead_code)] // the fault run's load and admin sampler; this test uses the sampler
mod load;
#[path = "faults/procs.rs"]
#[allow(dead_code)] // the fault run's process handling; this test uses part of it
mod procs;

#[path = "../../lbkit-tower/examples/echo_server.rs"]
#[allow(dead_code)] // its `main` is the example's
mod echo_server;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::uri::PathAndQuery;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use lbkit_core::Endpoint;
use lbkit_discovery::zookeeper::{
    Layout, Provider, ServicePath, ZkConfig, ZkRegistration, ZkSource,
};
use lbkit_strategy::catalog::{build, Params};
use lbkit_tower::http::{BufferRequestLayer, Idempotent};
use lbkit_tower::{BalanceLayer, BoxError, PoolBuilder, TryMake};
use procs::{free_port, Proc, Proxy, WAIT};
use tokio::process::Command;
use tokio::sync::{oneshot, watch};
use tonic::Status;
use tower::ServiceBuilder;

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts")
        .join(name)
}

/// A fresh directory for one test's logs and files.
fn test_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a test directory");
    dir
}

/// One Python provider of `service` on a free port, once it says it is exported; it answers
/// after `delay_ms`.
async fn provider(
    python: &str,
    service: &str,
    zk: &str,
    (name, delay_ms): (&str, u32),
    dir: &Path,
) -> (Proc, u16) {
    let port = free_port().expect("a port");
    let mut cmd = Command::new(python);
    cmd.arg(script("dubbo_provider.py")).args([
        service,
        &port.to_string(),
        zk,
        name,
        &delay_ms.to_string(),
    ]);
    let proc = Proc::spawn(name, cmd, &dir.join(format!("{name}.log"))).expect("start provider");
    proc.line("serving").await.expect("the provider starts");
    (proc, port)
}

/// Python providers of `service`, one per `(name, delay_ms)`, each once it is exported.
async fn providers(
    python: &str,
    service: &str,
    zk: &str,
    who: &[(&str, u32)],
    dir: &Path,
) -> Vec<(Proc, u16)> {
    let mut started = Vec::new();
    for &one in who {
        started.push(provider(python, service, zk, one, dir).await);
    }
    started
}

/// Run a Python script to completion (bounded; its stderr goes to `dir/log`): whether it
/// succeeded, and its stdout lines.
async fn run_python(python: &str, args: &[&str], dir: &Path, log: &str) -> (bool, Vec<String>) {
    let run = Command::new(python).args(args).kill_on_drop(true).output();
    let out = tokio::time::timeout(WAIT, run)
        .await
        .unwrap_or_else(|_| panic!("{args:?} ended within {WAIT:?}"))
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    std::fs::write(dir.join(log), &out.stderr).expect("write the log");
    let lines = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    (out.status.success(), lines)
}

/// Calls made by an `apache-dubbo` consumer (`scripts/dubbo_consumer.py ARGS`): how many
/// each server answered (the text before `: ` in each reply). Any failed call fails the test.
async fn python_consumer(python: &str, args: &[&str], dir: &Path) -> BTreeMap<String, usize> {
    let script = script("dubbo_consumer.py");
    let mut all = vec![script.to_str().expect("a UTF-8 path")];
    all.extend_from_slice(args);
    let (ok, lines) = run_python(python, &all, dir, "consumer.log").await;
    let mut by = BTreeMap::new();
    for line in &lines {
        let who = line
            .strip_prefix("ok ")
            .and_then(|reply| reply.split_once(": "))
            .map(|(who, _)| who.to_owned());
        match who {
            Some(who) => *by.entry(who).or_default() += 1,
            None => panic!("the Python consumer failed a call: {line}; all: {lines:?}"),
        }
    }
    assert!(
        ok,
        "the Python consumer failed ({}): {lines:?}",
        dir.join("consumer.log").display()
    );
    by
}

/// The children of `path` as kazoo sees them (`scripts/zk_nodes.py`), one JSON object each.
async fn kazoo_nodes(python: &str, zk: &str, path: &str, dir: &Path) -> Vec<serde_json::Value> {
    let script = script("zk_nodes.py");
    let args = [script.to_str().expect("a UTF-8 path"), zk, path];
    let (ok, lines) = run_python(python, &args, dir, "zk_nodes.log").await;
    assert!(ok, "zk_nodes.py {path} failed: {lines:?}");
    lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
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

/// `lbkit proxy` with one h2c service `api` (`zookeeper = ZOOKEEPER` and `service_lines`),
/// once it serves `endpoints` endpoints; its admin view, and an h2c connection to it.
async fn h2c_proxy(
    zookeeper: &str,
    service_lines: &str,
    endpoints: usize,
    dir: &Path,
) -> (Proxy, Admin, http2::SendRequest<Full<Bytes>>) {
    let (listen, admin) = (free_port().expect("port"), free_port().expect("port"));
    let config = format!(
        "[admin]\nbind = \"127.0.0.1:{admin}\"\n\n[[listener]]\nbind = \"127.0.0.1:{listen}\"\n\n\
         [[route]]\nservice = \"api\"\n\n[service.api]\nzookeeper = {zookeeper}\nh2c = true\n{service_lines}\n"
    );
    let path = dir.join("proxy.toml");
    std::fs::write(&path, config).expect("write the config");
    let proxy = Proxy::start(&path, dir).await.expect("the proxy starts");
    let admin = Admin::watch(proxy.admin);
    admin.until_endpoints(endpoints).await;
    let stream = tokio::net::TcpStream::connect(proxy.listen)
        .await
        .expect("connect");
    let (sender, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
        .await
        .expect("an h2c connection");
    tokio::spawn(conn);
    (proxy, admin, sender)
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

    /// Wait (bounded) until the proxy's view of its endpoints satisfies `pred`; that view.
    async fn until(&self, what: &str, pred: impl Fn(&load::View) -> bool) -> load::View {
        let mut rx = self.latest.clone();
        let seen = tokio::time::timeout(WAIT, rx.wait_for(|v| v.as_ref().is_some_and(&pred))).await;
        match seen {
            Ok(Ok(v)) => v
                .clone()
                .unwrap_or_else(|| unreachable!("checked by the predicate")),
            _ => panic!(
                "the proxy never showed {what} within {WAIT:?}: {:?}",
                self.latest.borrow().as_ref().map(|v| &v.weights)
            ),
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
    let dir = test_dir("dubbo-python");
    let service = format!("org.lbkit.interop{}.Greeter", std::process::id());
    let mut providers = providers(
        &python,
        &service,
        &zk,
        &[("p0", 0), ("p1", 0), ("p2", 0)],
        &dir,
    )
    .await;

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
    let zookeeper = format!(r#"{{ zk = "{zk}", interface = "{service}" }}"#);
    let service_lines = "strategy = \"least-request\"\nretries = 2";
    let (mut proxy, admin, mut sender) = h2c_proxy(&zookeeper, service_lines, 3, &dir).await;

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

    // An `apache-dubbo` consumer pointed at the proxy's listener: every call answered, by
    // more than one provider (the proxy balances requests, not connections).
    let url = format!("tri://{}", proxy.listen);
    let by = python_consumer(
        &python,
        &[
            "--url",
            &url,
            "--service",
            &service,
            "--method",
            "greet",
            "--calls",
            "30",
        ],
        &dir,
    )
    .await;
    assert_eq!(by.values().sum::<usize>(), 30, "{by:?}");
    assert!(by.len() >= 2, "one connection, several providers: {by:?}");

    // One provider killed: no call fails (connect refused is retried), and once its session
    // ends its node goes and the proxy follows.
    providers[0].0.kill().await;
    let mut after: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..30 {
        let t0 = tokio::time::Instant::now();
        let (text, status) = greet(&mut sender, &service, "after")
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "call {i} after the kill: {e} after {:?}; the proxy's endpoints: {:?}",
                    t0.elapsed(),
                    admin.latest.borrow().as_ref().map(|v| &v.endpoints)
                )
            });
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

/// gRPC messages as they are: bytes in, bytes out (the Python provider's `greet` has no
/// serialisation).
#[derive(Clone, Copy, Debug, Default)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// One idempotent unary `greet` through a tonic client: the reply's text.
async fn tonic_greet<T>(
    grpc: &mut tonic::client::Grpc<T>,
    path: &PathAndQuery,
    msg: &str,
) -> Result<String, Status>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<BoxError>,
    T::ResponseBody: http_body::Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<BoxError> + Send,
{
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(e.into().to_string()))?;
    let mut request = tonic::Request::new(Bytes::copy_from_slice(msg.as_bytes()));
    request.extensions_mut().insert(Idempotent);
    let reply = grpc.unary(request, path.clone(), RawCodec).await?;
    Ok(String::from_utf8_lossy(&reply.into_inner()).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tonic_client_behind_lbkit_tower_balances_python_providers() {
    let (Some(zk), Some(python)) = (lbkit_testkit::zookeeper(), lbkit_testkit::python()) else {
        return;
    };
    let dir = test_dir("dubbo-tower");
    let service = format!("org.lbkit.interop{}.Tower", std::process::id());
    let mut providers = providers(
        &python,
        &service,
        &zk,
        &[("fast0", 0), ("fast1", 0), ("slow", 60)],
        &dir,
    )
    .await;

    // ZooKeeper discovery → a pool of lazily connected tonic channels → peak EWMA with
    // failover, exactly as an application would build it.
    let path = ServicePath::new("dubbo", &service, Layout::Dubbo).expect("a service path");
    let (updates, _zk_status) = ZkSource::new(ZkConfig::new(zk.clone()), path).spawn();
    let make = TryMake(|ep: &Endpoint| {
        let channel = tonic::transport::Channel::from_shared(format!("http://{}", ep.address()))?
            .connect_lazy();
        Ok::<_, BoxError>(tower::ServiceExt::map_request(
            channel,
            |r: http::Request<Full<Bytes>>| r.map(tonic::body::Body::new),
        ))
    });
    let strategy = build("p2c-ewma", Params::new()).expect("p2c-ewma");
    let pool = PoolBuilder::new(strategy)
        .name("greeter")
        .spawn(updates, make);
    let status = pool.status();
    let until_endpoints = |n: usize| {
        let mut status = status.clone();
        async move {
            let seen = tokio::time::timeout(WAIT, status.wait_for(|s| s.endpoints == n))
                .await
                .is_ok_and(|r| r.is_ok());
            assert!(
                seen,
                "the pool never had {n} endpoints within {WAIT:?}: {:?}",
                *status.borrow()
            );
        }
    };
    until_endpoints(3).await;
    let stack = ServiceBuilder::new()
        .layer(BufferRequestLayer::default())
        .layer(
            BalanceLayer::http()
                .failover(2)
                .timeout(Duration::from_secs(5)),
        )
        .service(pool.clone());
    let mut grpc = tonic::client::Grpc::new(stack);
    let greet = PathAndQuery::try_from(format!("/{service}/greet")).expect("a gRPC path");

    let mut answered: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..90 {
        let text = tonic_greet(&mut grpc, &greet, &format!("call {i}"))
            .await
            .unwrap_or_else(|e| panic!("call {i}: {e}"));
        let (who, rest) = text.split_once(": ").expect("NAME: message");
        assert_eq!(rest, format!("call {i}"));
        *answered.entry(who.to_owned()).or_default() += 1;
    }
    // Peak EWMA: the provider 60 ms slower gets less than either fast one.
    let share = |who: &str| answered.get(who).copied().unwrap_or(0);
    assert!(
        share("fast0") > 0
            && share("fast1") > 0
            && share("slow") < share("fast0").min(share("fast1")),
        "{answered:?}"
    );

    // One fast provider killed: its node stays until its session times out, so calls still
    // pick it; failover retries them elsewhere and none fails.
    providers[0].0.kill().await;
    let mut after: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..30 {
        let text = tonic_greet(&mut grpc, &greet, "after")
            .await
            .unwrap_or_else(|e| panic!("call {i} after the kill: {e}"));
        *after
            .entry(text.split(':').next().unwrap_or_default().to_owned())
            .or_default() += 1;
    }
    assert!(
        !after.contains_key("fast0"),
        "a killed provider answered: {after:?}"
    );
    until_endpoints(2).await;
    for (p, _) in &mut providers {
        p.stop().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// lbkit-tower's `echo_server` example as `name` on a free loopback port; it stops when the
/// sender fires or is dropped.
async fn echo_server(name: &'static str) -> (SocketAddr, oneshot::Sender<()>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let addr = echo_server::serve(any, name, stopped)
        .await
        .expect("a loopback port");
    (addr, stop)
}

/// `lbkit register` for the `echo.Echo` Triple service under `root`, with `more` arguments.
fn register_echo(zk: &str, root: &str, more: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lbkit"));
    cmd.args(["register", "--zk", zk, "--root", root])
        .args(["--interface", "echo.Echo", "--protocol", "tri"])
        .args(more);
    cmd
}

/// What Java Dubbo and the Python registry read from a provider node lbkit wrote.
fn check_provider_node(node: &serde_json::Value, addr: SocketAddr, weight: &str, app: &str) {
    let name = node["name"].as_str().expect("a name");
    // Java's URLEncoder: letters, digits and `.-*_` stay; everything else is %XX, upper-case.
    let mut chars = name.chars();
    while let Some(c) = chars.next() {
        if c == '%' {
            let hex: String = chars.by_ref().take(2).collect();
            assert!(
                hex.len() == 2
                    && hex
                        .chars()
                        .all(|h| h.is_ascii_digit() || h.is_ascii_uppercase()),
                "{name}: %{hex}"
            );
        } else {
            assert!(
                c.is_ascii_alphanumeric() || ".-*_".contains(c),
                "{name}: {c:?}"
            );
        }
    }
    assert_eq!(node["ephemeral"], true, "{node}");
    let url = &node["url"];
    assert_eq!(url["scheme"], "tri", "{node}");
    assert_eq!(url["host"], addr.ip().to_string(), "{node}");
    assert_eq!(url["port"], addr.port(), "{node}");
    assert_eq!(url["path"], "echo.Echo", "{node}");
    let params = &url["params"];
    for (k, v) in [
        ("interface", "echo.Echo"),
        ("side", "provider"),
        ("dynamic", "true"),
        ("anyhost", "false"),
        ("weight", weight),
        ("application", app),
    ] {
        assert_eq!(params[k], v, "{k} of {node}");
    }
    let timestamp: u64 = params["timestamp"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("a numeric timestamp: {node}"));
    // Dubbo's timestamp is wall-clock milliseconds, as lbkit's system clock reads them.
    let now = lbkit_core::Clock::System.now().as_millis();
    assert!(
        timestamp <= now && now - timestamp < 600_000,
        "timestamp {timestamp} is the registration time (now {now})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_providers_registered_by_lbkit_are_called_by_a_python_consumer() {
    let (Some(zk), Some(python)) = (lbkit_testkit::zookeeper(), lbkit_testkit::python()) else {
        return;
    };
    let dir = test_dir("dubbo-register");
    // A root of its own: the tonic service's name (`echo.Echo`) is fixed.
    let root = format!("lbkit-interop-{}", std::process::id());
    let providers = format!("/{root}/echo.Echo/providers");
    let (a, _stop_a) = echo_server("rust-a").await;
    let (b, _stop_b) = echo_server("rust-b").await;

    // `lbkit register` announces rust-a.
    let a_addr = a.to_string();
    let cmd = register_echo(
        &zk,
        &root,
        &[
            "--weight",
            "150",
            "--application",
            "interop",
            "--meta",
            "owner=team-a",
            "--address",
            &a_addr,
        ],
    );
    let mut register =
        Proc::spawn("register", cmd, &dir.join("register.log")).expect("start lbkit register");
    let line = register.line("registered ").await.expect("registered");
    let node_path = line.trim_start_matches("registered ").trim();

    // kazoo sees exactly the node lbkit says it wrote, with the fields Dubbo reads.
    let nodes = kazoo_nodes(&python, &zk, &providers, &dir).await;
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    assert_eq!(
        format!(
            "{providers}/{}",
            nodes[0]["name"].as_str().unwrap_or_default()
        ),
        node_path
    );
    check_provider_node(&nodes[0], a, "150", "interop");
    assert_eq!(nodes[0]["url"]["params"]["owner"], "team-a");

    // An `apache-dubbo` consumer finds it in ZooKeeper and calls it over Triple.
    let echo_calls = |n: &'static str| {
        [
            "--zk",
            zk.as_str(),
            "--root",
            root.as_str(),
            "--service",
            "echo.Echo",
            "--method",
            "Say",
            "--codec",
            "echo",
            "--calls",
            n,
        ]
    };
    let by = python_consumer(&python, &echo_calls("10"), &dir).await;
    assert_eq!(by, BTreeMap::from([("rust-a".to_owned(), 10)]));

    // The library's registration announces rust-b beside it.
    let path = ServicePath::new(&root, "echo.Echo", Layout::Dubbo).expect("a service path");
    let provider = Provider {
        protocol: "tri".into(),
        ..Provider::new(b.to_string())
    };
    let registration =
        ZkRegistration::spawn(ZkConfig::new(zk.clone()), path, provider).expect("valid");
    let mut reg_status = registration.status();
    tokio::time::timeout(WAIT, reg_status.wait_for(|s| s.registered))
        .await
        .expect("the library registers within the bound");
    let nodes = kazoo_nodes(&python, &zk, &providers, &dir).await;
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    let lib_node = nodes
        .iter()
        .find(|n| n["url"]["port"] == b.port())
        .expect("the library's node");
    check_provider_node(lib_node, b, "100", "lbkit");
    let by = python_consumer(&python, &echo_calls("40"), &dir).await;
    assert_eq!(by.values().sum::<usize>(), 40, "{by:?}");
    assert_eq!(by.len(), 2, "Dubbo's random balance reached both: {by:?}");

    // SIGTERM: `lbkit register` deletes its node and exits 0; then the library deregisters.
    let exit = register.stop().await;
    assert!(
        exit.is_some_and(|s| s.success()),
        "lbkit register exit: {exit:?}"
    );
    let nodes = kazoo_nodes(&python, &zk, &providers, &dir).await;
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    assert_eq!(nodes[0]["url"]["port"], b.port());
    registration.deregister().await;
    let nodes = kazoo_nodes(&python, &zk, &providers, &dir).await;
    assert!(nodes.is_empty(), "{nodes:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Who answered `n` calls through `sender`.
async fn answered_by(
    sender: &mut http2::SendRequest<Full<Bytes>>,
    service: &str,
    n: usize,
) -> BTreeMap<String, usize> {
    let mut by = BTreeMap::new();
    for i in 0..n {
        let (text, status) = greet(sender, service, "ruled")
            .await
            .unwrap_or_else(|e| panic!("call {i}: {e}"));
        assert_eq!(status, "0");
        *by.entry(text.split(':').next().unwrap_or_default().to_owned())
            .or_default() += 1;
    }
    by
}

/// dubbo-admin's rules, written by an independent client (kazoo) while calls flow: the proxy
/// and `lbkit watch` obey them (a provider disabled, then weighted), show which rule did what,
/// and forget them when the nodes go; a malformed rule is skipped and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn override_rules_written_as_dubbo_admin_writes_them_steer_the_proxy() {
    let (Some(zk), Some(python)) = (lbkit_testkit::zookeeper(), lbkit_testkit::python()) else {
        return;
    };
    let dir = test_dir("dubbo-rules");
    let service = format!("org.lbkit.interop{}.Ruled", std::process::id());
    let mut providers = providers(&python, &service, &zk, &[("r0", 0), ("r1", 0)], &dir).await;
    let r0 = format!("127.0.0.1:{}", providers[0].1);
    let cache = dir.join("registry-cache.json");
    let zookeeper = format!(
        r#"{{ zk = "{zk}", interface = "{service}", cache = "{}", application = "web" }}"#,
        cache.display()
    );
    let (mut proxy, admin, mut sender) =
        h2c_proxy(&zookeeper, "strategy = \"round-robin\"", 2, &dir).await;
    assert_eq!(answered_by(&mut sender, &service, 10).await.len(), 2);

    let rules = format!("/dubbo/{service}/configurators");
    let kazoo = |action: &'static str, rule: String| {
        let (python, zk, rules, dir) = (python.clone(), zk.clone(), rules.clone(), dir.clone());
        async move {
            let script = script("zk_nodes.py");
            let args = [script.to_str().expect("UTF-8"), &zk, &rules, action, &rule];
            let (ok, out) = run_python(&python, &args, &dir, "kazoo.log").await;
            assert!(ok, "zk_nodes.py {action} {rule}: {out:?}");
        }
    };

    // dubbo-admin's "disable" on r0: no call reaches it; watch and the admin API say why.
    let disable = format!(
        "override://{r0}/{service}?category=configurators&disabled=true&dynamic=false&enabled=true"
    );
    kazoo("--create", disable.clone()).await;
    let view = admin
        .until("r0 disabled", |v| {
            v.weights.iter().any(|(a, w, _)| *a == r0 && *w == 0)
        })
        .await;
    let (_, _, why) = view.weights.iter().find(|(a, _, _)| *a == r0).expect("r0");
    assert_eq!(why, &[format!("{disable} sets disabled=true")]);
    let by = answered_by(&mut sender, &service, 20).await;
    assert_eq!(by, BTreeMap::from([("r1".to_owned(), 20)]));
    let out = Command::new(env!("CARGO_BIN_EXE_lbkit"))
        .args(["watch", "--once", "--zk", &zk, "--interface", &service])
        .output()
        .await
        .expect("lbkit watch");
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        listed.contains(&format!("  rule {disable} sets disabled=true")),
        "{listed}"
    );
    // The registry cache keeps the rules' result, and `lbkit pick --explain` shows them.
    let explained = Command::new(env!("CARGO_BIN_EXE_lbkit"))
        .args(["pick", "-s", "round-robin", "-n", "1", "--explain", "-f"])
        .arg(&cache)
        .output()
        .await
        .expect("lbkit pick");
    let text = String::from_utf8_lossy(&explained.stdout);
    assert!(explained.status.success(), "{text}");
    assert!(
        text.contains(&format!("rule {disable} sets disabled=true")),
        "{text}"
    );

    // A malformed rule beside it changes nothing (skipped, logged, counted); a weight rule for
    // every provider, scoped to the proxy's application, composes with the disable.
    kazoo(
        "--create",
        format!("override://0.0.0.0/{service}?weight=heavy"),
    )
    .await;
    let all =
        format!("override://web@0.0.0.0/{service}?category=configurators&dynamic=false&weight=300");
    kazoo("--create", all.clone()).await;
    admin
        .until("r1 at 300", |v| {
            v.weights.iter().any(|(a, w, _)| *a != r0 && *w == 300)
        })
        .await;
    assert_eq!(
        answered_by(&mut sender, &service, 10).await,
        BTreeMap::from([("r1".to_owned(), 10)])
    );
    let logged = proxy.proc.line("malformed override rule skipped").await;
    assert!(
        logged.is_ok_and(|l| l.contains("heavy")),
        "the bad rule is logged, naming it"
    );

    // The disable removed: r0 serves again, at the rule's weight like r1.
    kazoo("--delete", disable).await;
    admin
        .until("both at 300", |v| {
            v.weights.iter().all(|(_, w, _)| *w == 300)
        })
        .await;
    let by = answered_by(&mut sender, &service, 20).await;
    assert_eq!(by.len(), 2, "{by:?}");
    assert_eq!(
        proxy.proc.count("malformed override rule skipped"),
        1,
        "logged once while it exists"
    );
    proxy.proc.stop().await;
    for (p, _) in &mut providers {
        p.stop().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// One `echo.Echo/Say` call through the proxy with `headers` (the tag's): the server that
/// answered, or why none did.
async fn say(
    sender: &mut http2::SendRequest<Full<Bytes>>,
    headers: &[(&str, &str)],
) -> Result<String, String> {
    // SayRequest { message: "hi" } by hand: field 1, length-delimited.
    let mut b = http::Request::post("http://lbkit.test/echo.Echo/Say")
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let req = b
        .body(Full::new(grpc_frame(b"\x0a\x02hi")))
        .map_err(|e| e.to_string())?;
    sender.ready().await.map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status();
    // A trailers-only gRPC answer (the proxy's own, to a gRPC caller): its status and message.
    let grpc = |name: &str| {
        resp.headers()
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    };
    if let Some(code) = grpc("grpc-status").filter(|c| c != "0") {
        let message = grpc("grpc-message").unwrap_or_default();
        return Err(format!("grpc-status {code}: {message}"));
    }
    let mut body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    if status != 200 || body.len() < 5 {
        return Err(format!("{status}: {}", String::from_utf8_lossy(&body)));
    }
    body.advance(5);
    // SayReply { message = 1, server = 2 }: both length-delimited strings.
    while body.len() >= 2 {
        let (field, len) = (body.get_u8() >> 3, usize::from(body.get_u8()));
        let value = body.split_to(len.min(body.len()));
        if field == 2 {
            return Ok(String::from_utf8_lossy(&value).into_owned());
        }
    }
    Err("no server in the reply".into())
}

/// Who answered `n` calls with `headers`.
async fn said_by(
    sender: &mut http2::SendRequest<Full<Bytes>>,
    headers: &[(&str, &str)],
    n: usize,
) -> BTreeMap<String, usize> {
    let mut by = BTreeMap::new();
    for i in 0..n {
        let server = say(sender, headers)
            .await
            .unwrap_or_else(|e| panic!("call {i} with {headers:?}: {e}"));
        *by.entry(server).or_default() += 1;
    }
    by
}

/// Tag routing end to end: Rust providers registered with `lbkit register` (one with its own
/// `dubbo.tag`) and by the library, a tag rule written by kazoo as dubbo-admin writes it to the
/// config center, and calls through the proxy carrying the tag as gRPC metadata (`dubbo.tag`,
/// `dubbo.force.tag`), as Dubbo's Triple consumers send their attachments.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tag_routing_follows_provider_tags_and_the_registrys_tag_rule() {
    let (Some(zk), Some(python)) = (lbkit_testkit::zookeeper(), lbkit_testkit::python()) else {
        return;
    };
    let dir = test_dir("dubbo-tags");
    let root = format!("lbkit-tags-{}", std::process::id());
    let (a, _stop_a) = echo_server("rust-a").await;
    let (b, _stop_b) = echo_server("rust-b").await;
    let (c, _stop_c) = echo_server("rust-c").await;
    // rust-c: `lbkit register` with its own tag (a grey release).
    let c_addr = c.to_string();
    let cmd = register_echo(
        &zk,
        &root,
        &[
            "--application",
            "shop",
            "--meta",
            "dubbo.tag=blue",
            "--address",
            &c_addr,
        ],
    );
    let mut register =
        Proc::spawn("register", cmd, &dir.join("register.log")).expect("start lbkit register");
    register.line("registered ").await.expect("registered");
    let path = ServicePath::new(&root, "echo.Echo", Layout::Dubbo).expect("a service path");
    let mut registrations = Vec::new();
    for addr in [a, b] {
        let provider = Provider {
            protocol: "tri".into(),
            application: "shop".into(),
            ..Provider::new(addr.to_string())
        };
        registrations.push(
            ZkRegistration::spawn(ZkConfig::new(zk.clone()), path.clone(), provider)
                .expect("valid"),
        );
    }
    let zookeeper = format!(r#"{{ zk = "{zk}", root = "{root}", interface = "echo.Echo" }}"#);
    let (mut proxy, admin, mut sender) =
        h2c_proxy(&zookeeper, "strategy = \"round-robin\"", 3, &dir).await;
    let (ra, rb, rc) = (a.to_string(), b.to_string(), c.to_string());

    // Its own tag: blue calls reach rust-c only; untagged and unknown tags never do.
    let blue = [("dubbo.tag", "blue")];
    assert_eq!(
        said_by(&mut sender, &blue, 10).await,
        BTreeMap::from([("rust-c".to_owned(), 10)])
    );
    let plain = said_by(&mut sender, &[], 20).await;
    assert_eq!(
        plain,
        BTreeMap::from([("rust-a".to_owned(), 10), ("rust-b".to_owned(), 10)])
    );
    let unknown = said_by(&mut sender, &[("dubbo.tag", "red")], 20).await;
    assert_eq!(
        unknown, plain,
        "an unknown tag falls back to the untagged providers"
    );
    let forced = say(
        &mut sender,
        &[("dubbo.tag", "red"), ("dubbo.force.tag", "true")],
    )
    .await;
    let err = forced.expect_err("a forced unknown tag has no provider");
    // UNAVAILABLE, the gRPC status of the proxy's 503, with its reason.
    assert!(
        err.starts_with("grpc-status 14") && err.contains("tag"),
        "{err}"
    );

    // dubbo-admin's tag rule for the providers' application: gray is rust-a.
    let node = format!("/{root}/config/{root}/shop.tag-router");
    let rule = format!(
        "force: false\nruntime: true\nenabled: true\nkey: shop\ntags:\n  - name: gray\n    addresses: [\"{ra}\"]\n"
    );
    let kazoo = |args: Vec<String>| {
        let (python, zk, node, dir) = (python.clone(), zk.clone(), node.clone(), dir.clone());
        async move {
            let script = script("zk_nodes.py");
            let mut all = vec![script.to_str().expect("UTF-8").to_owned(), zk, node];
            all.extend(args);
            let all: Vec<&str> = all.iter().map(String::as_str).collect();
            let (ok, out) = run_python(&python, &all, &dir, "kazoo.log").await;
            assert!(ok, "zk_nodes.py {all:?}: {out:?}");
        }
    };
    kazoo(vec!["--put".into(), rule]).await;
    admin
        .until("rust-a in gray", |v| {
            v.tags
                .iter()
                .any(|(addr, t)| *addr == ra && t.contains(&"gray (rule shop)".to_owned()))
        })
        .await;
    let gray = [("dubbo.tag", "gray")];
    assert_eq!(
        said_by(&mut sender, &gray, 10).await,
        BTreeMap::from([("rust-a".to_owned(), 10)])
    );
    // Untagged calls now avoid rust-a. As Dubbo 3's TagStateRouter does, with a rule in force
    // a provider's own tag reserves it only when the rule names that tag: blue is not a rule
    // tag, so rust-c takes untagged calls too (and still all blue ones).
    let untagged = said_by(&mut sender, &[], 10).await;
    assert_eq!(
        untagged,
        BTreeMap::from([("rust-b".to_owned(), 5), ("rust-c".to_owned(), 5)])
    );
    assert_eq!(
        said_by(&mut sender, &blue, 5).await,
        BTreeMap::from([("rust-c".to_owned(), 5)])
    );
    // `lbkit watch` shows each provider's tags and where they come from.
    let out = Command::new(env!("CARGO_BIN_EXE_lbkit"))
        .args([
            "watch",
            "--once",
            "--zk",
            &zk,
            "--root",
            &root,
            "--interface",
            "echo.Echo",
        ])
        .output()
        .await
        .expect("lbkit watch");
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(listed.contains("  tag gray (rule shop)"), "{listed}");
    assert!(listed.contains("  tag blue (own)"), "{listed}");

    // A malformed rule: logged and skipped, gray stays on rust-a.
    kazoo(vec!["--put".into(), "tags: [".into()]).await;
    let logged = proxy.proc.line("malformed tag rule skipped").await;
    assert!(
        logged.is_ok_and(|l| l.contains("tag-router")),
        "the bad rule is logged, naming its node"
    );
    assert_eq!(
        said_by(&mut sender, &gray, 5).await,
        BTreeMap::from([("rust-a".to_owned(), 5)])
    );

    // The rule deleted: gray has no provider again, untagged calls reach rust-a again.
    kazoo(vec!["--remove".into()]).await;
    admin
        .until("no rule", |v| {
            v.tags
                .iter()
                .all(|(_, t)| !t.iter().any(|x| x.contains("rule")))
        })
        .await;
    let back = said_by(&mut sender, &gray, 20).await;
    assert_eq!(
        back,
        BTreeMap::from([("rust-a".to_owned(), 10), ("rust-b".to_owned(), 10)])
    );
    let _ = (rb, rc);

    proxy.proc.stop().await;
    register.stop().await;
    for r in registrations {
        r.deregister().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}
