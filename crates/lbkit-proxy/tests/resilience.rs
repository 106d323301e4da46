//! End-to-end under trouble: a dying endpoint, strategy switches and reloads under load, and the
//! admin API.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use http::StatusCode;
use lbkit_proxy::{Proxy, Supervisor};

/// A fresh directory named `{prefix}…`, removed with everything in it when the value drops.
fn scratch(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("scratch dir")
}

/// The `eligible` flag of the endpoint at `addr`, from `GET /endpoints`.
async fn eligible(proxy: &Proxy, addr: std::net::SocketAddr) -> bool {
    endpoint_json(proxy, addr).await["eligible"]
        .as_bool()
        .expect("eligible flag")
}

/// A proxy on the configuration file at `path`, under a [`Supervisor`] whose file watcher is in
/// place (changes from now on are seen).
struct Supervised {
    addr: std::net::SocketAddr,
    reloads: tokio::sync::watch::Receiver<lbkit_proxy::ReloadCount>,
    stop: tokio::sync::oneshot::Sender<()>,
    run: tokio::task::JoinHandle<std::io::Result<bool>>,
}

impl Supervised {
    async fn start(path: &std::path::Path) -> Supervised {
        let proxy = Proxy::start(lbkit_proxy::Config::load(path).unwrap())
            .await
            .unwrap();
        let addr = proxy.listeners()[0];
        let supervisor = Supervisor::new(proxy, path, Duration::from_secs(2));
        let mut reloads = supervisor.reloads();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let run = tokio::spawn(supervisor.run(async move {
            let _ = stopped.await;
        }));
        // The supervisor task installs its file watcher when it first runs: wait for it, or a
        // write can land before anything watches the file.
        tokio::time::timeout(WAIT, reloads.wait_for(|c| c.watching))
            .await
            .unwrap()
            .unwrap();
        Supervised {
            addr,
            reloads,
            stop,
            run,
        }
    }

    /// Wait until `applied` configurations were applied; false when WAIT passed first.
    async fn applied(&mut self, applied: u64) -> bool {
        tokio::time::timeout(WAIT, self.reloads.wait_for(|c| c.applied >= applied))
            .await
            .is_ok()
    }

    /// Stop and drain; whether the drain finished in time.
    async fn stop(self) -> bool {
        let _ = self.stop.send(());
        tokio::time::timeout(WAIT, self.run)
            .await
            .unwrap()
            .unwrap()
            .unwrap()
    }
}

/// Send GETs until `done` holds after one of them; every GET must succeed.
async fn load_until<F, Fut>(proxy: &Proxy, mut done: F) -> usize
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let client = client();
    let mut sent = 0;
    tokio::time::timeout(WAIT, async {
        loop {
            for _ in 0..20 {
                let (status, body, _) = get(&client, proxy.listeners()[0], "/", &[]).await;
                assert_eq!(status, StatusCode::OK, "request {sent} failed: {body}");
                sent += 1;
            }
            if done().await {
                break;
            }
        }
    })
    .await
    .expect("condition reached in time");
    sent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_endpoint_is_retried_around_ejected_and_readmitted() {
    let (a, b, c) = (
        Backend::start("a").await,
        Backend::start("b").await,
        Backend::start("c").await,
    );
    let od = "outlier_detection = { interval_ms = 50, consecutive_failures = 3, base_ejection_ms = 300, max_ejection_percent = 50 }\n\
              retry_budget_percent = 100";
    // Loopback load runs at thousands of requests per second, so the third of them that hit the
    // dead endpoint before its ejection needs a budget above the default 20 %.
    let proxy = start(&config_text(&[&a, &b, &c], "round-robin", od)).await;
    let p = &proxy;
    let b_addr = b.kill();
    // Every GET still succeeds (retried on another endpoint) until b is ejected...
    load_until(p, move || async move { !eligible(p, b_addr).await }).await;
    let (_, metrics) = admin(&client(), p, "GET", "/metrics", "").await;
    let ejections =
        format!("lbkit_endpoint_ejections_total{{service=\"svc\",endpoint=\"{b_addr}\"}} ");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with(&ejections) && !l.ends_with(" 0")),
        "{metrics}"
    );
    // ...and it is readmitted once it answers again.
    let b = Backend::start_on("b", b_addr).await;
    load_until(p, move || async move { eligible(p, b_addr).await }).await;
    // Round robin over three eligible endpoints: b answers within three requests.
    let client = client();
    let mut served = false;
    for _ in 0..3 {
        served |= get(&client, p.listeners()[0], "/", &[]).await.1 == "b";
    }
    drop(b);
    assert!(served, "b readmitted but not picked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_health_check_marks_down_and_up() {
    let (a, b) = (Backend::start("a").await, Backend::start("b").await);
    let hc = "health_check = { kind = \"tcp\", interval_ms = 50, timeout_ms = 200, rise = 2, fall = 2 }\n\
              outlier_detection = { enabled = false }\nretry_budget_percent = 100";
    let proxy = start(&config_text(&[&a, &b], "round-robin", hc)).await;
    let p = &proxy;
    let b_addr = b.kill();
    load_until(p, move || async move { !eligible(p, b_addr).await }).await;
    let _b = Backend::start_on("b", b_addr).await;
    load_until(p, move || async move { eligible(p, b_addr).await }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strategy_switch_under_load_fails_nothing() {
    let (a, b, c) = (
        Backend::start("a").await,
        Backend::start("b").await,
        Backend::start("c").await,
    );
    let proxy = Arc::new(start(&config_text(&[&a, &b, &c], "round-robin", "")).await);
    let mut load = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let proxy = proxy.clone();
        load.spawn(async move {
            let client = client();
            for i in 0..150 {
                let (status, body, _) = get(&client, proxy.listeners()[0], "/", &[]).await;
                assert_eq!(status, StatusCode::OK, "request {i}: {body}");
            }
        });
    }
    let strategies = [
        "p2c-ewma",
        "least-request",
        "weighted-random",
        "ketama",
        "round-robin",
    ];
    for (i, s) in strategies.iter().cycle().take(15).enumerate() {
        let body = if i % 5 == 0 {
            format!("{{\"strategy\":\"{s}\",\"params\":{{\"default_rtt_ms\":20}}}}")
        } else {
            format!("{{\"strategy\":\"{s}\"}}")
        };
        let (status, text) = admin(&client(), &proxy, "PUT", "/services/svc/strategy", &body).await;
        assert_eq!(status, StatusCode::OK, "{s}: {text}");
        tokio::task::yield_now().await;
    }
    while let Some(r) = load.join_next().await {
        r.expect("load task");
    }
    let (_, doc) = admin(&client(), &proxy, "GET", "/endpoints", "").await;
    let doc: serde_json::Value = serde_json::from_str(&doc).unwrap();
    assert_eq!(doc["services"]["svc"]["strategy"], "round-robin");
    let bad = admin(
        &client(),
        &proxy,
        "PUT",
        "/services/svc/strategy",
        "{\"strategy\":\"nope\"}",
    )
    .await;
    assert_eq!(bad.0, StatusCode::BAD_REQUEST);
    let missing = admin(
        &client(),
        &proxy,
        "PUT",
        "/services/other/strategy",
        "{\"strategy\":\"random\"}",
    )
    .await;
    assert_eq!(missing.0, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_rejects_a_broken_file_and_applies_a_good_one() {
    let (a, b) = (Backend::start("a").await, Backend::start("b").await);
    let tmp = scratch("lbkit-proxy-reload-");
    let dir = tmp.path();
    let path = dir.join("proxy.toml");
    let good = config_text(&[&a, &b], "round-robin", "");
    std::fs::write(&path, &good).unwrap();
    let mut proxy = Supervised::start(&path).await;
    let addr = proxy.addr;
    let client = client();
    assert_eq!(get(&client, addr, "/", &[]).await.0, StatusCode::OK);

    std::fs::write(&path, good.replace("round-robin", "no-such-strategy")).unwrap();
    tokio::time::timeout(WAIT, proxy.reloads.wait_for(|c| c.rejected >= 1))
        .await
        .unwrap()
        .unwrap();
    for _ in 0..10 {
        assert_eq!(get(&client, addr, "/", &[]).await.0, StatusCode::OK);
    }

    std::fs::write(&path, good.replace("round-robin", "weighted-random")).unwrap();
    assert!(proxy.applied(1).await);
    for _ in 0..10 {
        assert_eq!(get(&client, addr, "/", &[]).await.0, StatusCode::OK);
    }
    assert!(proxy.stop().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_outputs_parse_and_the_token_is_checked() {
    let a = Backend::start("a").await;
    let text =
        config_text(&[&a], "round-robin", "").replace("[admin]", "[admin]\ntoken = \"t0ken\"");
    let proxy = start(&text).await;
    let client = client();
    assert_eq!(
        admin(&client, &proxy, "GET", "/healthz", "").await.0,
        StatusCode::UNAUTHORIZED
    );
    let authed = |path: &str| {
        http::Request::get(format!("http://{}{path}", proxy.admin_addr()))
            .header("authorization", "Bearer t0ken")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap()
    };
    use http_body_util::BodyExt;
    let text_of = |resp: http::Response<hyper::body::Incoming>| async move {
        String::from_utf8(
            resp.into_body()
                .collect()
                .await
                .unwrap()
                .to_bytes()
                .to_vec(),
        )
        .unwrap()
    };
    let health = client.request(authed("/healthz")).await.unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    let endpoints = text_of(client.request(authed("/endpoints")).await.unwrap()).await;
    let doc: serde_json::Value = serde_json::from_str(&endpoints).unwrap();
    let ep = &doc["services"]["svc"]["endpoints"][0];
    assert_eq!(ep["address"], a.addr.to_string());
    assert_eq!(ep["weight"], 100);
    assert!(ep["eligible"].as_bool().unwrap() && ep["requests"].as_u64().unwrap() >= 1);
    assert!(ep["in_flight"].is_u64() && ep["effective_weight"].is_u64());
    let metrics = text_of(client.request(authed("/metrics")).await.unwrap()).await;
    let mut names = std::collections::HashSet::new();
    for line in metrics.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = line.rsplit_once(' ').expect("sample line");
        value
            .parse::<f64>()
            .unwrap_or_else(|_| panic!("bad value in {line}"));
        let name = series.split('{').next().unwrap();
        assert!(
            (series.ends_with('}') || !series.contains('{'))
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "{line}"
        );
        names.insert(name.to_owned());
    }
    for n in [
        "lbkit_proxy_requests_total",
        "lbkit_proxy_request_duration_seconds_bucket",
        "lbkit_proxy_client_connections",
        "lbkit_proxy_client_connections_max",
        "lbkit_proxy_in_flight",
        "lbkit_endpoint_ejections_total",
        "lbkit_endpoint_in_flight",
        "lbkit_endpoint_call_duration_seconds_bucket",
        "lbkit_endpoint_call_duration_seconds_sum",
    ] {
        assert!(names.contains(n), "{n} missing from {metrics}");
    }
    // Per endpoint, the histogram counts the calls that finished: at least the one made above,
    // and `+Inf` equals `_count`.
    let calls: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("lbkit_endpoint_call_duration_seconds_count{"))
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<f64>().unwrap())
        .sum();
    let inf: f64 = metrics
        .lines()
        .filter(|l| {
            l.starts_with("lbkit_endpoint_call_duration_seconds_bucket{")
                && l.contains("le=\"+Inf\"")
        })
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<f64>().unwrap())
        .sum();
    assert!(calls >= 1.0 && calls == inf, "{metrics}");
}

// A request the client abandons while its upstream call is in flight (an HTTP/2 client that
// goes away, so hyper drops the request) still ends in the service's metrics: the envelope
// closes it when dropped, and the upstream call is a cancellation, not the endpoint's failure.
#[tokio::test]
async fn a_request_its_client_abandons_ends_in_the_metrics() {
    let (arrived_tx, mut arrived) = tokio::sync::mpsc::unbounded_channel();
    let (backend, _) = counting_server(move |mut stream| {
        let arrived = arrived_tx.clone();
        async move {
            use tokio::io::AsyncReadExt;
            let mut buf = [0u8; 1024];
            if stream.read(&mut buf).await.unwrap_or(0) > 0 {
                let _ = arrived.send(());
            }
            // Never answers; holds the connection until the proxy drops it.
            let _ = stream.read(&mut buf).await;
        }
    })
    .await;
    let text = config_for(&[backend], "round-robin", "");
    Proxy::pin_runtime_thread();
    let proxy = Proxy::start(parse(&text)).await.expect("proxy starts");
    let h2: hyper_util::client::legacy::Client<_, http_body_util::Full<bytes::Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .http2_only(true)
            .build_http();
    let uri = format!("http://{}/slow", proxy.listeners()[0]);
    let req = http::Request::get(uri)
        .body(Default::default())
        .expect("request");
    let call = tokio::spawn(async move { h2.request(req).await.map(|r| r.status()) });
    tokio::time::timeout(WAIT, arrived.recv())
        .await
        .expect("the request reached the backend in time");
    assert_eq!(sample(&proxy, "lbkit_proxy_in_flight").await, 1.0);
    // The client goes away: its task, its connection and the request with them.
    call.abort();
    let _ = call.await;
    tokio::time::timeout(WAIT, async {
        while sample(&proxy, "lbkit_proxy_in_flight").await != 0.0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the abandoned request ended in time");
    assert_eq!(sample(&proxy, "lbkit_proxy_requests_total").await, 1.0);
    assert_eq!(sample(&proxy, "lbkit_proxy_failures_total").await, 0.0);
    assert_eq!(
        sample(&proxy, "lbkit_endpoint_cancellations_total").await,
        1.0
    );
    assert_eq!(sample(&proxy, "lbkit_endpoint_in_flight").await, 0.0);
}

// The config mounted the Kubernetes way (`proxy.toml → ..data/proxy.toml`): a ConfigMap
// update renames a new `..data` symlink over the old one, and that is a reload (issue 15).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubernetes_configmap_swap_reloads_the_config() {
    let a = Backend::start("a").await;
    let root = scratch("lbkit-proxy-k8s-");
    let dir = root.path();
    let swap = |version: &str, text: &str| {
        let versioned = dir.join(format!("..{version}"));
        std::fs::create_dir_all(&versioned).unwrap();
        std::fs::write(versioned.join("proxy.toml"), text).unwrap();
        let tmp = dir.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(format!("..{version}"), &tmp).unwrap();
        std::fs::rename(&tmp, dir.join("..data")).unwrap();
    };
    let good = config_text(&[&a], "round-robin", "");
    swap("v1", &good);
    let path = dir.join("proxy.toml");
    std::os::unix::fs::symlink("..data/proxy.toml", &path).unwrap();
    let mut proxy = Supervised::start(&path).await;
    swap("v2", &good.replace("round-robin", "weighted-random"));
    assert!(proxy.applied(1).await, "the swap was seen");
    proxy.stop().await;
}

// Idle connections to the admin listener are closed after `header_read_timeout_ms`, so they
// cannot take every admin slot: `/healthz` answers with 64 idle connections open (issue 15:
// it stopped answering, and a liveness probe would restart the sidecar).
#[tokio::test]
async fn idle_admin_connections_cannot_starve_healthz() {
    let a = Backend::start("a").await;
    let proxy = start(&config_text(&[&a], "round-robin", "")).await;
    let mut idle = Vec::new();
    for _ in 0..64 {
        idle.push(
            tokio::net::TcpStream::connect(proxy.admin_addr())
                .await
                .expect("connect"),
        );
    }
    let (status, body) =
        tokio::time::timeout(WAIT, admin(&client(), &proxy, "GET", "/healthz", ""))
            .await
            .expect("/healthz answered in time");
    assert_eq!((status, body.as_str()), (StatusCode::OK, "ok\n"));
    drop(idle);
}

// A TCP listener's connection with no byte either way for `limits.tcp_idle_timeout_ms` is
// closed (issue 15: the relay had no idle limit, so idle clients held slots for ever).
#[tokio::test]
async fn an_idle_tcp_relay_connection_is_closed() {
    let (backend, accepted) = counting_server(|mut stream| async move {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 64];
        // Silent: reads until the proxy closes its side.
        while stream.read(&mut buf).await.unwrap_or(0) > 0 {}
    })
    .await;
    let text = format!(
        "{LISTENERS}[[listener]]\nbind = \"127.0.0.1:0\"\nprotocol = \"tcp\"\nservice = \"svc\"\n\
         [limits]\ntcp_idle_timeout_ms = 200\n[[route]]\nservice = \"svc\"\n\
         [service.svc]\nendpoints = [\"{backend}\"]\n"
    );
    Proxy::pin_runtime_thread();
    let proxy = Proxy::start(parse(&text)).await.expect("proxy starts");
    let mut client = tokio::net::TcpStream::connect(proxy.listeners()[1])
        .await
        .expect("connect");
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 8];
    let read = tokio::time::timeout(WAIT, client.read(&mut buf))
        .await
        .expect("closed by the idle limit in time");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
}

// A client that breaks its upload (malformed chunked framing, or gone mid-body) gets 400, and
// one too slow to upload within the route's timeout gets 408; none of it counts against the
// endpoint (issue 15: each was a 502/504 recorded as the endpoint's failure, and a handful got
// a healthy endpoint ejected).
#[tokio::test]
async fn a_client_that_breaks_or_stalls_its_upload_is_not_the_endpoints_failure() {
    let (backend, _) = counting_server(|mut stream| async move {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 1024];
        // Reads the request and its body as they come; never answers before the body ends.
        while stream.read(&mut buf).await.unwrap_or(0) > 0 {}
    })
    .await;
    let text =
        config_for(&[backend], "round-robin", "").replace("timeout_ms = 5000", "timeout_ms = 300");
    Proxy::pin_runtime_thread();
    let proxy = Proxy::start(parse(&text)).await.expect("proxy starts");
    let to = proxy.listeners()[0];
    let head =
        "POST /up HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
    // Wait for the endpoint (a streamed upload is not retried, so the first must find it).
    tokio::time::timeout(WAIT, async {
        while !admin(&client(), &proxy, "GET", "/endpoints", "")
            .await
            .1
            .contains(&backend.to_string())
        {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("endpoint published");
    for (what, body, shut, want) in [
        ("malformed chunk", "5\r\nhello\r\nzz\r\n", false, "400"),
        ("aborted upload", "5\r\nhel", true, "400"),
        ("stalled upload", "5\r\nhello\r\n", false, "408"),
    ] {
        let answer = raw_exchange(to, format!("{head}{body}").as_bytes(), shut).await;
        let status = answer.split(' ').nth(1).unwrap_or("");
        assert_eq!(status, want, "{what}: {answer}");
    }
    let (_, doc) = admin(&client(), &proxy, "GET", "/endpoints", "").await;
    let doc: serde_json::Value = serde_json::from_str(&doc).expect("json");
    let ep = &doc["services"]["svc"]["endpoints"][0];
    assert_eq!(ep["failures"], 0, "{ep}");
    assert_eq!(ep["requests"], 3, "{ep}");
}

/// A proxy whose client-connection limits are all 300 ms, with a route timeout of 300 ms.
async fn short_limits_proxy() -> (Proxy, Backend) {
    let a = Backend::start("a").await;
    let text = config_text(&[&a], "round-robin", "")
        .replace(
            "header_read_timeout_ms = 300",
            "header_read_timeout_ms = 300\nidle_timeout_ms = 300\nstream_idle_timeout_ms = 300",
        )
        .replace("timeout_ms = 5000", "timeout_ms = 300");
    (start(&text).await, a)
}

// Every state of a connection the fast path hands to hyper has a timer (issue 15: a half-sent
// h2c preface, a slow body of an HTTP/1.0 or `Expect: 100-continue` request held their slot for
// ever): each of these connections is closed by the proxy.
#[tokio::test]
async fn connections_hyper_serves_are_closed_in_every_stuck_state() {
    let (proxy, _a) = short_limits_proxy().await;
    let to = proxy.listeners()[0];
    // HTTP/2: the proxy's SETTINGS may come first, then the connection closes. HTTP/1: the
    // backend answers without waiting for the body (an answer, then the close), or the proxy
    // gives up on the upload (408).
    for (what, raw, answer_starts) in [
        (
            "half-sent h2c preface",
            &b"PRI * HTTP/2.0\r\n\r\nSM"[..],
            "",
        ),
        (
            "h2c preface, then nothing",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            "",
        ),
        (
            "Expect: 100-continue, body never sent",
            b"POST / HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 10\r\n\r\n",
            "HTTP/1.1 ",
        ),
        (
            "HTTP/1.0, half the body",
            b"POST / HTTP/1.0\r\nContent-Length: 10\r\n\r\nhello",
            "HTTP/1.",
        ),
    ] {
        // Reads until the proxy closes, within `WAIT`.
        let answer = raw_exchange(to, raw, false).await;
        assert!(answer.starts_with(answer_starts), "{what}: {answer:?}");
    }
}

// An HTTP/2 connection with nothing in flight is closed after `idle_timeout_ms` (GOAWAY), and
// one whose client stopped granting flow-control window after `stream_idle_timeout_ms` (issue
// 15: both held their slot, and the second its upstream body, for ever).
#[tokio::test]
async fn idle_and_stuck_http2_connections_are_closed() {
    let (proxy, _a) = short_limits_proxy().await;
    let to = proxy.listeners()[0];
    for path in ["/", "/big"] {
        let stream = tokio::net::TcpStream::connect(to).await.expect("connect");
        let (mut send, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(stream),
        )
        .await
        .expect("h2 handshake");
        let conn = tokio::spawn(conn);
        let req = http::Request::get(format!("http://{to}{path}"))
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .expect("request");
        let resp = send.send_request(req).await.expect("answered");
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
        // `/`: read the answer, then idle. `/big`: hold it unread, so the window runs out.
        let held = if path == "/" {
            use http_body_util::BodyExt;
            resp.into_body().collect().await.expect("body");
            None
        } else {
            Some(resp)
        };
        let _ = tokio::time::timeout(WAIT, conn)
            .await
            .unwrap_or_else(|_| panic!("{path}: the proxy closed the connection in time"));
        drop(held);
    }
}

/// Writes `text` into the FIFO at `path` for every reader that opens it, until `stop` (each
/// open for writing waits for a reader: to end the loop, set `stop` and open the FIFO for
/// reading without blocking, see [`release_fifo`]).
#[cfg(target_os = "linux")]
fn feed_fifo(path: &std::path::Path, text: &str, stop: &std::sync::atomic::AtomicBool) {
    use std::io::Write as _;
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        match std::fs::OpenOptions::new().write(true).open(path) {
            Ok(mut f) => {
                let _ = f.write_all(text.as_bytes());
            }
            Err(e) => panic!("cannot open {} for writing: {e}", path.display()),
        }
    }
}

/// A reader of the FIFO at `path` that never blocks: a writer waiting in `open` goes on.
#[cfg(target_os = "linux")]
fn release_fifo(path: &std::path::Path) -> std::fs::File {
    use std::os::unix::fs::OpenOptionsExt as _;
    const O_NONBLOCK: i32 = 0o4000; // Linux
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(O_NONBLOCK)
        .open(path)
        .expect("with O_NONBLOCK, a FIFO opens for reading at once")
}

// With one worker the supervisor shares its thread with the connections: a reload that takes
// long (a configuration of 1 000 services takes hundreds of milliseconds to read and start)
// must not stall them. The configuration file is made a FIFO, so the reload's read holds
// until the test writes it: requests are answered in the meantime.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "current_thread")]
async fn a_slow_reload_does_not_stall_requests_on_the_supervisors_thread() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let (a, b) = (Backend::start("a").await, Backend::start("b").await);
    let tmp = scratch("lbkit-proxy-slow-reload-");
    let dir = tmp.path();
    let path = dir.join("proxy.toml");
    let good = config_text(&[&a, &b], "round-robin", "");
    let next = good.replace("round-robin", "weighted-random");
    std::fs::write(&path, &good).unwrap();
    let mut proxy = Supervised::start(&path).await;
    let addr = proxy.addr;

    // The FIFO gets a second name, through which the test writes (events on it are not the
    // configuration file's), then replaces the file: the watcher reloads, the read holds.
    let (fifo, keep) = (dir.join("held.fifo"), dir.join("keep.fifo"));
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success(), "mkfifo");
    std::fs::hard_link(&fifo, &keep).unwrap();
    std::fs::rename(&fifo, &path).unwrap();
    // A thread holds the reader: its open for writing returns once the reload opened the FIFO
    // to read, and it lets go when the test says so — or after 10 s, when the reload stalled
    // this thread.
    let timed_out = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let (held_tx, held_rx) = tokio::sync::oneshot::channel::<()>();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let (feed_tx, feed_rx) = std::sync::mpsc::channel::<()>();
    let holder = {
        let (keep, next) = (keep.clone(), next.clone());
        let (timed_out, stop) = (timed_out.clone(), stop.clone());
        std::thread::spawn(move || {
            use std::io::Write as _;
            let mut writer = std::fs::OpenOptions::new().write(true).open(&keep).unwrap();
            let _ = held_tx.send(());
            if release_rx.recv_timeout(Duration::from_secs(10)).is_err() {
                timed_out.store(true, Ordering::SeqCst);
            }
            writer.write_all(next.as_bytes()).unwrap();
            drop(writer);
            // The write above is a change too: a reload may open the FIFO again before the
            // test replaces it. Feed such readers (once the first reload is in, so that no
            // reader gets two copies) until the proxy has stopped.
            if feed_rx.recv_timeout(WAIT).is_ok() {
                feed_fifo(&keep, &next, &stop);
            }
        })
    };
    tokio::time::timeout(WAIT, held_rx)
        .await
        .expect("the reload began")
        .unwrap();
    let client = client();
    for _ in 0..5 {
        assert_eq!(get(&client, addr, "/", &[]).await.0, StatusCode::OK);
    }
    assert!(
        !timed_out.load(Ordering::SeqCst),
        "requests waited for the reload"
    );
    assert_eq!(
        proxy.reloads.borrow().applied,
        0,
        "the reload is still reading"
    );
    release_tx.send(()).unwrap();
    let applied = proxy.applied(1).await;
    assert!(applied, "reloads: {:?}", *proxy.reloads.borrow());
    let file = dir.join("proxy.toml.new");
    std::fs::write(&file, &next).unwrap();
    std::fs::rename(&file, &path).unwrap();
    feed_tx.send(()).unwrap();
    assert_eq!(get(&client, addr, "/", &[]).await.0, StatusCode::OK);

    assert!(proxy.stop().await);
    stop.store(true, Ordering::SeqCst);
    let reader = release_fifo(&keep);
    holder.join().unwrap();
    drop(reader);
}
