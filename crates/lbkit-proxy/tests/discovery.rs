//! End-to-end: the proxy's services fed by a watched endpoint file and by a real ZooKeeper
//! (Debian's package, started by `scripts/zookeeper.sh`; `LBKIT_ZK` names it).

mod common;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use http::StatusCode;
use lbkit_discovery::zookeeper::{Layout, Provider, ServicePath, ZkConfig, ZkRegistration};
use lbkit_proxy::Proxy;

/// A fresh directory for one test's files, removed with them when the value drops.
fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("lbkit-proxy-{name}-"))
        .tempdir()
        .expect("scratch dir")
}

/// A proxy config whose service `svc` takes its endpoints from `source` (a TOML fragment).
fn config_with_source(source: &str) -> String {
    format!(
        r#"{LISTENERS}
[[route]]
service = "svc"
timeout_ms = 5000
[service.svc]
{source}
strategy = "round-robin"
"#
    )
}

/// The pace of this file's polling loops: one look a millisecond at most.
///
/// Unpaced, two ZooKeeper tests at once sent 7 500–11 300 requests a second each through
/// their proxies; in about one run of this binary in 400–1 200 here (and once in CI) the test
/// ZooKeeper's JVM went silent for the tests' whole 20 s bound (its log has no line in
/// between, not even the session tracker's; every client reports "no response from
/// connection in 2400ms") and came back as the first of them gave up. Why the JVM stalls is
/// not known; paced, the loops leave the machine to it and still see a change within a
/// millisecond.
fn poll_pace() -> tokio::time::Interval {
    let mut pace = tokio::time::interval(Duration::from_millis(1));
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    pace
}

/// Send GETs until the bodies of the last `window` answers are exactly `names`. Answers from
/// the proxy itself (503 before the first publish) are allowed while waiting.
async fn until_serving(proxy: &Proxy, names: &[&str], window: usize) {
    let client = client();
    let want: HashSet<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let mut last: Vec<String> = Vec::new();
    let (mut tries, mut other) = (0u64, None);
    let mut pace = poll_pace();
    let served = tokio::time::timeout(WAIT, async {
        loop {
            pace.tick().await;
            let (status, body, _) = get(&client, proxy.listeners()[0], "/", &[]).await;
            tries += 1;
            if status == StatusCode::OK {
                last.push(body);
            } else {
                other = Some((status, body));
                last.clear();
            }
            if last.len() > window {
                last.remove(0);
            }
            if last.len() == window && last.iter().cloned().collect::<HashSet<_>>() == want {
                return;
            }
        }
    })
    .await;
    if served.is_err() {
        let (_, endpoints) = admin(&client, proxy, "GET", "/endpoints", "").await;
        panic!(
            "never served exactly {names:?} in {tries} requests; last answers {last:?}, \
             last other answer {other:?}; /endpoints: {endpoints}"
        );
    }
}

/// The value of the sample `name{service="svc"}` in `/metrics`.
async fn metric(proxy: &Proxy, name: &str) -> f64 {
    let (status, text) = admin(&client(), proxy, "GET", "/metrics", "").await;
    assert_eq!(status, StatusCode::OK);
    let prefix = format!("{name}{{service=\"svc\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("{name} missing from {text}"))
        .parse()
        .expect("a number")
}

fn endpoints_file(backends: &[&Backend]) -> String {
    backends
        .iter()
        .map(|b| format!("[[endpoint]]\naddress = \"{}\"\n", b.addr))
        .collect()
}

/// Replace `path` atomically (write a sibling, rename), as deploy tools do.
fn write(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_file_adds_and_removes_endpoints_and_a_broken_one_keeps_them() {
    let (a, b) = (Backend::start("a").await, Backend::start("b").await);
    let dir = scratch("file");
    let path = dir.path().join("endpoints.toml");
    write(&path, &endpoints_file(&[&a]));
    let text = config_with_source(&format!("file = {:?}", path.display().to_string()));
    let proxy = Proxy::start(parse(&text)).await.expect("proxy starts");
    until_serving(&proxy, &["a"], 4).await;

    write(&path, &endpoints_file(&[&a, &b]));
    until_serving(&proxy, &["a", "b"], 4).await;

    write(&path, &endpoints_file(&[&b]));
    until_serving(&proxy, &["b"], 6).await;

    // A broken file is rejected (counted as a source error) and the running set stays.
    let errors = || async { metric(&proxy, "lbkit_discovery_source_errors_total").await };
    assert_eq!(errors().await, 0.0);
    write(&path, "[[endpoint]]\naddress = ");
    tokio::time::timeout(WAIT, async {
        while errors().await < 1.0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the broken file is reported");
    let client = client();
    for _ in 0..20 {
        let (status, body, _) = get(&client, proxy.listeners()[0], "/", &[]).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "b"));
    }
    proxy.shutdown(Duration::from_secs(2)).await;
}

/// A Dubbo interface name of this run only (so reruns and other tests never see each other's
/// nodes) and its provider path.
fn zk_service(tag: &str, first: &Backend) -> (String, ServicePath) {
    let pid = std::process::id();
    let interface = format!("com.lbkit.proxytest.{tag}{pid}x{}", first.addr.port());
    let path = ServicePath::new("dubbo", &interface, Layout::Dubbo).expect("service path");
    (interface, path)
}

/// Register `backend` as a provider of `path`, and wait until its node exists (so a test that
/// then never sees it names the proxy, not the registration).
async fn register(zk: &str, path: &ServicePath, backend: &Backend) -> ZkRegistration {
    let reg = ZkRegistration::spawn(
        ZkConfig::new(zk),
        path.clone(),
        Provider::new(backend.addr.to_string()),
    )
    .expect("registration starts");
    let mut status = reg.status();
    let registered = tokio::time::timeout(WAIT, status.wait_for(|s| s.registered)).await;
    assert!(
        registered.is_ok(),
        "{} not registered in time: {:?}",
        backend.addr,
        status.get()
    );
    reg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_providers_come_and_go() {
    let Some(zk) = lbkit_testkit::zookeeper() else {
        return;
    };
    let (a, b) = (Backend::start("a").await, Backend::start("b").await);
    let (interface, path) = zk_service("Api", &a);
    let reg_a = register(&zk, &path, &a).await;
    let text = config_with_source(&format!(
        "zookeeper = {{ zk = {zk:?}, interface = {interface:?} }}"
    ));
    let proxy = Proxy::start(parse(&text)).await.expect("proxy starts");
    until_serving(&proxy, &["a"], 4).await;

    let reg_b = register(&zk, &path, &b).await;
    until_serving(&proxy, &["a", "b"], 4).await;

    // Deregistration deletes a's node; the watch removes it from the proxy's set.
    tokio::time::timeout(WAIT, reg_a.deregister())
        .await
        .expect("deregistered in time");
    until_serving(&proxy, &["b"], 6).await;

    proxy.shutdown(Duration::from_secs(2)).await;
    tokio::time::timeout(WAIT, reg_b.deregister())
        .await
        .expect("deregistered in time");
}

/// Whether the admin API reports the endpoint at `addr` of service `svc` as healthy.
async fn healthy(proxy: &Proxy, addr: std::net::SocketAddr) -> Option<bool> {
    let (_, body) = admin(&client(), proxy, "GET", "/endpoints", "").await;
    let doc: serde_json::Value = serde_json::from_str(&body).expect("json");
    doc["services"]["svc"]["endpoints"]
        .as_array()?
        .iter()
        .find(|e| e["address"] == addr.to_string())?["healthy"]
        .as_bool()
}

/// Wait until the admin API reports `addr` as healthy or not.
async fn flipped(proxy: &Proxy, addr: std::net::SocketAddr, want: bool) {
    tokio::time::timeout(WAIT, async {
        while healthy(proxy, addr).await != Some(want) {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{addr} never marked healthy={want}"));
}

// While ZooKeeper's empty push is held, the last published set stays published through a
// health flip, a reload and the refresh ticks (the proxy's upkeep once rebuilt from the empty
// desired set on any health change, and every request got a 503).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_empty_push_survives_a_health_flip_a_reload_and_ticks() {
    let Some(zk) = lbkit_testkit::zookeeper() else {
        return;
    };
    let (a, b) = (Backend::start("a").await, Backend::start("b").await);
    let (interface, path) = zk_service("Held", &a);
    let (reg_a, reg_b) = (
        register(&zk, &path, &a).await,
        register(&zk, &path, &b).await,
    );
    let source = format!(
        "zookeeper = {{ zk = {zk:?}, interface = {interface:?} }}\n\
         health_check = {{ kind = \"tcp\", interval_ms = 100, timeout_ms = 500, rise = 1, fall = 1 }}"
    );
    let text = config_with_source(&source);
    let proxy = Proxy::start(parse(&text)).await.expect("proxy starts");
    until_serving(&proxy, &["a", "b"], 6).await;

    // Both providers leave (one after the other): once the registry lists nobody, the push is
    // held and b, the last one listed, keeps serving.
    for reg in [reg_a, reg_b] {
        tokio::time::timeout(WAIT, reg.deregister())
            .await
            .expect("deregistered in time");
    }
    tokio::time::timeout(WAIT, async {
        while metric(&proxy, "lbkit_discovery_empty_held_total").await < 1.0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the empty push is held");
    until_serving(&proxy, &["b"], 6).await;

    // Health flips while it is held: b goes down (nothing is healthy: 503s, rightly), then up
    // again — and is served again, rebuilt from the held set, not from the empty one.
    let b_addr = b.kill();
    flipped(&proxy, b_addr, false).await;
    let _b = Backend::start_on("b", b_addr).await;
    flipped(&proxy, b_addr, true).await;
    until_serving(&proxy, &["b"], 6).await;
    drop(a);

    // A reload that keeps the service: the held set stays.
    let reloaded = format!("{text}\n[[route]]\npath_prefix = \"/other/\"\nservice = \"svc\"\n");
    proxy.reload(parse(&reloaded)).expect("reload");
    until_serving(&proxy, &["b"], 6).await;
    // Refresh ticks (every 250 ms) and health probes (every 100 ms) go on: a bounded run of
    // requests keeps landing on b.
    let client = client();
    for _ in 0..50 {
        let (status, body, _) = get(&client, proxy.listeners()[0], "/", &[]).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "b"));
    }
    proxy.shutdown(Duration::from_secs(2)).await;
}

// A reload that changes a service (here its `retries` and its file) makes a new service; it
// serves its predecessor's endpoints from the first request on, until its own source has
// produced a set — never 503 in between (issue 15: the new service started empty).
#[tokio::test]
async fn a_changed_service_serves_its_predecessors_endpoints_until_its_source_speaks() {
    let (a, b) = (Backend::start("a").await, Backend::start("b").await);
    let dir = scratch("reload-handover");
    let (first, second) = (
        dir.path().join("first.toml"),
        dir.path().join("second.toml"),
    );
    write(&first, &endpoints_file(&[&a, &b]));
    let source = |path: &PathBuf, retries: u32| {
        format!(
            "file = {:?}\nretries = {retries}",
            path.display().to_string()
        )
    };
    let proxy = Proxy::start(parse(&config_with_source(&source(&first, 2))))
        .await
        .expect("proxy starts");
    until_serving(&proxy, &["a", "b"], 4).await;
    // The new file does not exist yet: its source has no set to give.
    proxy
        .reload(parse(&config_with_source(&source(&second, 1))))
        .expect("reload");
    let client = client();
    for i in 0..20 {
        let (status, body, _) = get(&client, proxy.listeners()[0], "/", &[]).await;
        assert_eq!(
            status,
            StatusCode::OK,
            "request {i} after the reload: {body}"
        );
    }
    write(&second, &endpoints_file(&[&b]));
    until_serving(&proxy, &["b"], 6).await;
    proxy.shutdown(Duration::from_secs(2)).await;
}

// A proxy restarted while ZooKeeper is down routes to the providers its registry cache saved
// (issue 15: it answered 503 until ZooKeeper came back), and a server older than 3.6 (no
// persistent watches) is followed with one-shot watches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registry_cache_and_an_older_zookeeper_work_in_the_proxy() {
    let Some(zk) = lbkit_testkit::zookeeper() else {
        return;
    };
    let (a, b) = (Backend::start("a").await, Backend::start("b").await);
    let (interface, path) = zk_service("Cached", &a);
    let dir = scratch("zk-cache");
    let cache = dir.path().join("svc.cache.json");
    let reg_a = register(&zk, &path, &a).await;
    // Through a shim that makes the server look like ZooKeeper 3.5.
    let old = lbkit_testkit::zk_shim::ZkShim::older_than_3_6(&zk)
        .await
        .expect("shim");
    let text = config_with_source(&format!(
        "zookeeper = {{ zk = \"{}\", interface = {interface:?}, cache = {cache:?} }}",
        old.addr
    ));
    let proxy = Proxy::start(parse(&text)).await.expect("proxy starts");
    until_serving(&proxy, &["a"], 4).await;
    let reg_b = register(&zk, &path, &b).await;
    until_serving(&proxy, &["a", "b"], 4).await;
    assert!(
        old.refused() >= 1,
        "the proxy asked for a persistent watch first"
    );
    // The cache file has both (written after each change, off the request path).
    let mut pace = poll_pace();
    tokio::time::timeout(WAIT, async {
        loop {
            pace.tick().await;
            let saved = lbkit_discovery::zookeeper::read_cache(&cache)
                .ok()
                .flatten();
            if saved.is_some_and(|s| s.len() == 2) {
                break;
            }
        }
    })
    .await
    .expect("cache written in time");
    proxy.shutdown(Duration::from_secs(2)).await;

    // Restarted with ZooKeeper unreachable (nothing listens on the shim's port any more).
    let gone = old.addr;
    drop(old);
    let text = config_with_source(&format!(
        "zookeeper = {{ zk = \"{gone}\", interface = {interface:?}, cache = {cache:?} }}"
    ));
    let proxy = Proxy::start(parse(&text)).await.expect("proxy starts");
    until_serving(&proxy, &["a", "b"], 4).await;
    proxy.shutdown(Duration::from_secs(2)).await;
    for reg in [reg_a, reg_b] {
        tokio::time::timeout(WAIT, reg.deregister())
            .await
            .expect("deregistered in time");
    }
}

/// Who answered `n` GETs with `headers` (the proxy's own answers as `STATUS BODY`).
async fn answered(proxy: &Proxy, headers: &[(&str, &str)], n: usize) -> Vec<String> {
    answered_by(&client(), proxy, headers, n).await
}

/// [`answered`] through `client` (HTTP/1.1 or h2c).
async fn answered_by(
    client: &hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        http_body_util::Full<bytes::Bytes>,
    >,
    proxy: &Proxy,
    headers: &[(&str, &str)],
    n: usize,
) -> Vec<String> {
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..n {
        let (status, body, _) = get(client, proxy.listeners()[0], "/", headers).await;
        seen.insert(if status == StatusCode::OK {
            body
        } else {
            format!("{} {}", status.as_u16(), body.trim())
        });
    }
    seen.into_iter().collect()
}

/// Tag routing through the proxy's HTTP/1.1 engine: the tag is read from the configured
/// headers, a tagged request reaches its tag's endpoints, a forced unknown tag gets a 503
/// naming why, a request without a tag avoids tagged endpoints, and the default tag applies
/// to requests that carry none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tag_header_routes_requests_to_their_tags_endpoints() {
    let (a, b, c) = (
        Backend::start("a").await,
        Backend::start("b").await,
        Backend::start("c").await,
    );
    let dir = scratch("tags");
    let path = dir.path().join("endpoints.json");
    let entry = |bk: &Backend, tag: Option<&str>| match tag {
        Some(t) => format!(
            r#"{{"address": "{}", "metadata": {{"dubbo.tag": "{t}"}}}}"#,
            bk.addr
        ),
        None => format!(r#"{{"address": "{}"}}"#, bk.addr),
    };
    write(
        &path,
        &format!(
            "[{}, {}, {}]",
            entry(&a, Some("gray")),
            entry(&b, None),
            entry(&c, None)
        ),
    );
    let source = format!("file = {:?}", path.display().to_string());
    let text = config_with_source(&format!(
        "{source}\ntags = {{ header = \"X-Lane\", force_header = \"x-lane-only\" }}"
    ));
    let proxy = Proxy::start(parse(&text)).await.expect("proxy starts");
    until_serving(&proxy, &["b", "c"], 4).await;
    assert_eq!(answered(&proxy, &[("x-lane", "gray")], 10).await, ["a"]);
    assert_eq!(answered(&proxy, &[], 10).await, ["b", "c"]);
    // The default headers are not read when others are configured.
    assert_eq!(
        answered(&proxy, &[("dubbo.tag", "gray")], 10).await,
        ["b", "c"]
    );
    assert_eq!(
        answered(&proxy, &[("x-lane", "blue")], 10).await,
        ["b", "c"]
    );
    let forced = answered(&proxy, &[("x-lane", "blue"), ("x-lane-only", "true")], 1).await;
    assert_eq!(forced.len(), 1);
    assert!(
        forced[0].starts_with("503 ") && forced[0].contains("tag"),
        "{forced:?}"
    );
    // The same through the proxy's HTTP/2 engine (h2c with prior knowledge), which reads the
    // tag from hyper's header map by the names prepared once (`HttpTags`).
    let h2c = h2c_client();
    assert_eq!(
        answered_by(&h2c, &proxy, &[("x-lane", "gray")], 10).await,
        ["a"]
    );
    assert_eq!(answered_by(&h2c, &proxy, &[], 10).await, ["b", "c"]);
    assert_eq!(
        answered_by(&h2c, &proxy, &[("dubbo.tag", "gray")], 10).await,
        ["b", "c"]
    );
    let forced = answered_by(
        &h2c,
        &proxy,
        &[("x-lane", "blue"), ("x-lane-only", "true")],
        1,
    )
    .await;
    assert!(
        forced.len() == 1 && forced[0].starts_with("503 ") && forced[0].contains("tag"),
        "{forced:?}"
    );
    // The admin API lists each endpoint's tags.
    let (_, endpoints) = admin(&client(), &proxy, "GET", "/endpoints", "").await;
    assert!(endpoints.contains("gray (own)"), "{endpoints}");
    proxy.shutdown(Duration::from_secs(2)).await;

    // A default tag for requests without one.
    let text = config_with_source(&format!("{source}\ntags = {{ default = \"gray\" }}"));
    let proxy = Proxy::start(parse(&text)).await.expect("proxy starts");
    until_serving(&proxy, &["a"], 4).await;
    assert_eq!(
        answered(&proxy, &[("dubbo.tag", "blue")], 10).await,
        ["b", "c"]
    );
    proxy.shutdown(Duration::from_secs(2)).await;
}

/// Issue 17: `[service.NAME.trace]` records every attempt of the sampled requests (here all):
/// the refused connection to a dead endpoint and its retry are one request; a reload that
/// keeps the table keeps recording into the same file; bad fields are config errors by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_table_records_every_attempt_of_sampled_requests() {
    let (a, b) = (Backend::start("a").await, Backend::start("b").await);
    // Held refusing for the whole run: a port bound and closed again can go to another test's
    // backend, whose answers then stand where refusals were expected.
    let dead_addr = lbkit_testkit::refused_addr();
    let dir = scratch("trace");
    let path = dir.path().join("svc.lbkt");
    let text = format!(
        "{}[service.svc.trace]\npath = {:?}\nsample_rate = 1.0\nmax_bytes = 1048576\n",
        config_with_source(&format!(
            "endpoints = [\"{}\", \"{}\", \"{dead_addr}\"]",
            a.addr, b.addr
        )),
        path.display().to_string()
    );
    let proxy = Proxy::start(parse(&text)).await.expect("proxy starts");
    let answers = answered(&proxy, &[], 30).await;
    assert_eq!(
        answers,
        ["a", "b"],
        "the dead endpoint's requests are retried"
    );
    let recorder = proxy.service("svc").unwrap().trace().unwrap().clone();
    // Each flush returns once the writer has written what was queued: wait on that, bounded
    // (a response's last byte can reach the client just before its attempt is recorded).
    let mut trace = None;
    for _ in 0..100 {
        recorder.flush();
        let t = lbkit_trace::read(&path).unwrap();
        let requests: HashSet<u64> = t.records.iter().map(|r| r.request).collect();
        if requests.len() >= 30 {
            trace = Some(t);
            break;
        }
    }
    let trace = trace.expect("30 requests in the trace");
    let dead_text = dead_addr.to_string();
    let refused: Vec<_> = trace
        .records
        .iter()
        .filter(|r| *r.endpoint == *dead_text)
        .collect();
    assert!(!refused.is_empty());
    for r in &refused {
        assert_eq!(r.outcome, lbkit_trace::TraceOutcome::Connect);
        let retry = trace
            .records
            .iter()
            .find(|x| x.request == r.request && x.attempt == r.attempt + 1)
            .expect("the refused attempt's retry is in the trace");
        assert!(retry.retry && retry.outcome == lbkit_trace::TraceOutcome::Success);
    }
    assert!(trace
        .records
        .iter()
        .all(|r| &*r.service == "svc" && &*r.strategy == "round-robin"));

    // A reload with the same table keeps the recorder (and the file's segment).
    proxy
        .reload(parse(
            &text.replace("timeout_ms = 5000", "timeout_ms = 4000"),
        ))
        .expect("reload");
    let _ = answered(&proxy, &[], 5).await;
    let again = proxy.service("svc").unwrap();
    assert!(
        Arc::ptr_eq(again.trace().unwrap(), &recorder),
        "the recorder is kept"
    );
    proxy.shutdown(Duration::from_secs(2)).await;
    assert!(
        !lbkit_trace::previous_segment(&path).exists(),
        "one recorder: the file was not rotated by a second one"
    );

    for (good, bad, field) in [
        (
            "sample_rate = 1.0",
            "sample_rate = 0.0",
            "service.svc.trace.sample_rate",
        ),
        (
            "max_bytes = 1048576",
            "max_bytes = 10",
            "service.svc.trace.max_bytes",
        ),
        ("sample_rate = 1.0", "colour = 1", "unknown field `colour`"),
    ] {
        let t = text.replace(good, bad);
        let e = lbkit_proxy::Config::parse(&t, std::path::Path::new("t.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains(field), "{bad}: {e}");
    }
}

/// Issue 17: shadow mode through the admin API. A candidate (ketama on the route's hash key)
/// picks beside the live round robin for every request; nothing goes to its choices; the
/// report and `/metrics` say how often it disagrees and where it would have sent the traffic;
/// it survives a strategy switch and stops on DELETE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_strategy_reports_where_it_would_have_sent_requests() {
    let (a, b) = (Backend::start("a").await, Backend::start("b").await);
    let text = config_with_source(&format!("endpoints = [\"{}\", \"{}\"]", a.addr, b.addr))
        .replace(
            "timeout_ms = 5000",
            "timeout_ms = 5000\nhash_key = \"header:x-user\"",
        );
    let proxy = Proxy::start(parse(&text)).await.expect("proxy starts");
    until_serving(&proxy, &["a", "b"], 4).await;
    let c = client();
    let (status, body) = admin(&c, &proxy, "GET", "/services/svc/shadow", "").await;
    assert_eq!(
        (status, body.trim()),
        (StatusCode::NOT_FOUND, "no shadow runs")
    );
    let (status, body) = admin(
        &c,
        &proxy,
        "PUT",
        "/services/svc/shadow",
        r#"{"strategy": "nope"}"#,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, _) = admin(
        &c,
        &proxy,
        "PUT",
        "/services/svc/shadow",
        r#"{"strategy": "ketama"}"#,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let answers = answered(&proxy, &[("x-user", "alice")], 20).await;
    assert_eq!(
        answers,
        ["a", "b"],
        "the live round robin still sends to both"
    );
    let (status, body) = admin(&c, &proxy, "GET", "/services/svc/shadow", "").await;
    assert_eq!(status, StatusCode::OK);
    let r: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(r["candidate"], "ketama");
    assert_eq!(r["picks"], 20);
    assert_eq!(r["disagreements"], 10, "{r}");
    let shares: Vec<f64> = r["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["candidate_share"].as_f64().unwrap())
        .collect();
    let mut sorted = shares.clone();
    sorted.sort_by(f64::total_cmp);
    assert_eq!(sorted, [0.0, 1.0], "one key, one endpoint: {r}");
    assert!(r["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["live_share"] == 0.5));
    let (_, metrics) = admin(&c, &proxy, "GET", "/metrics", "").await;
    assert!(
        metrics.contains("lbkit_shadow_picks_total{service=\"svc\",candidate=\"ketama\"} 20"),
        "{metrics}"
    );

    // A strategy switch keeps the shadow and its counters.
    let (status, _) = admin(
        &c,
        &proxy,
        "PUT",
        "/services/svc/strategy",
        r#"{"strategy": "random"}"#,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let _ = answered(&proxy, &[("x-user", "alice")], 4).await;
    let (_, body) = admin(&c, &proxy, "GET", "/services/svc/shadow", "").await;
    let r: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(r["picks"], 24, "{r}");

    let (status, _) = admin(&c, &proxy, "DELETE", "/services/svc/shadow", "").await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = admin(&c, &proxy, "GET", "/services/svc/shadow", "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, metrics) = admin(&c, &proxy, "GET", "/metrics", "").await;
    assert!(!metrics.contains("lbkit_shadow"), "{metrics}");
    proxy.shutdown(Duration::from_secs(2)).await;
}

/// Delete the provider nodes of `regs` in one ZooKeeper transaction (a `multi`), as an
/// operator's script does, or as the ephemeral nodes of sessions that expire together go.
async fn delete_together(zk: &str, regs: &[&ZkRegistration]) {
    let client = zookeeper_client::Client::connect(zk)
        .await
        .expect("connect");
    let mut multi = client.new_multi_writer();
    for r in regs {
        let node = r.status().get().node.expect("a registered node");
        multi.add_delete(&node, None).expect("a delete");
    }
    multi.commit().await.expect("deleted in one transaction");
}

/// Wait until `/metrics` says `name` (of service `svc`) is at least `at_least`.
async fn metric_reaches(proxy: &Proxy, name: &str, at_least: f64) {
    let mut pace = poll_pace();
    let reached = tokio::time::timeout(WAIT, async {
        while metric(proxy, name).await < at_least {
            pace.tick().await;
        }
    });
    reached
        .await
        .unwrap_or_else(|_| panic!("{name} never reached {at_least}"));
}

/// GETs every 2 ms until told to stop: how many were sent and how many did not get a 200.
fn load(
    to: std::net::SocketAddr,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<(u64, u64)>,
) {
    let (stop, mut stopped) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let client = client();
        let (mut sent, mut failed) = (0, 0);
        let mut pace = tokio::time::interval(Duration::from_millis(2));
        while stopped.try_recv().is_err() {
            pace.tick().await;
            let (status, _, _) = get(&client, to, "/", &[]).await;
            sent += 1;
            failed += u64::from(status != StatusCode::OK);
        }
        (sent, failed)
    });
    (stop, task)
}

// Three of five providers leave ZooKeeper in one transaction while their servers still answer
// (sessions expiring together: a leader election, a partition between providers and the
// registry): all five stay served, as mass-removal protection holds the three. When their
// servers then stop, failing health checks confirm them gone and they leave; no request fails
// on the way (issue 40: the survivors took all the traffic at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn providers_deleted_together_stay_served_until_their_health_checks_fail() {
    let Some(zk) = lbkit_testkit::zookeeper() else {
        return;
    };
    let names = ["a", "b", "c", "d", "e"];
    let mut backends = Vec::new();
    for n in names {
        backends.push(Backend::start(n).await);
    }
    let (interface, path) = zk_service("Mass", &backends[0]);
    let mut regs = Vec::new();
    for b in &backends {
        regs.push(register(&zk, &path, b).await);
    }
    // Retries and their budget generous enough for the moment between a server stopping and
    // its health check failing (a request may meet three stopped servers in a row).
    let source = format!(
        "zookeeper = {{ zk = {zk:?}, interface = {interface:?} }}\n\
         retries = 4\nretry_budget_percent = 1000\n\
         health_check = {{ kind = \"tcp\", interval_ms = 100, timeout_ms = 500, rise = 1, fall = 1 }}"
    );
    let proxy = Proxy::start(parse(&config_with_source(&source)))
        .await
        .expect("proxy starts");
    until_serving(&proxy, &names, 15).await;
    let (stop, load) = load(proxy.listeners()[0]);
    delete_together(&zk, &[&regs[0], &regs[1], &regs[2]]).await;
    metric_reaches(&proxy, "lbkit_discovery_removals_held_total", 3.0).await;
    until_serving(&proxy, &names, 15).await;
    assert_eq!(metric(&proxy, "lbkit_discovery_endpoints_held").await, 3.0);
    // Their servers stop: the health checks confirm them gone.
    for b in backends.drain(..3) {
        b.kill();
    }
    metric_reaches(&proxy, "lbkit_discovery_removals_confirmed_total", 3.0).await;
    until_serving(&proxy, &["d", "e"], 6).await;
    let _ = stop.send(());
    let (sent, failed) = load.await.expect("the load task");
    assert!(sent >= 10, "{sent} requests under way");
    println!("{sent} requests under way, {failed} failed");
    assert_eq!(failed, 0, "{failed} of {sent} requests failed");
    assert_eq!(metric(&proxy, "lbkit_discovery_endpoints_held").await, 0.0);
    proxy.shutdown(Duration::from_secs(2)).await;
}

// Six of ten providers leave ZooKeeper in one transaction while their servers still answer:
// one update (one snapshot published), all ten served until the confirmation time
// (`removal_protection.confirm_ms`) lets the six go; and three of three leaving in one
// transaction are all kept by empty-push protection (before, the proxy took the deletions one
// by one in 7 of 12 runs, and one or two providers were left with the traffic of three).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_of_ten_deleted_together_stay_served_until_confirmed_by_time() {
    let Some(zk) = lbkit_testkit::zookeeper() else {
        return;
    };
    let names: Vec<String> = (0..10).map(|i| format!("p{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut backends = Vec::new();
    for n in &names {
        backends.push(Backend::start(n).await);
    }
    let (interface, path) = zk_service("Six", &backends[0]);
    let mut regs = Vec::new();
    for b in &backends {
        regs.push(register(&zk, &path, b).await);
    }
    let source = format!(
        "zookeeper = {{ zk = {zk:?}, interface = {interface:?} }}\n\
         removal_protection = {{ confirm_ms = 1500 }}"
    );
    let proxy = Proxy::start(parse(&config_with_source(&source)))
        .await
        .expect("proxy starts");
    until_serving(&proxy, &names, 20).await;
    let published = metric(&proxy, "lbkit_discovery_published_total").await;
    let six: Vec<&ZkRegistration> = regs[..6].iter().collect();
    delete_together(&zk, &six).await;
    metric_reaches(&proxy, "lbkit_discovery_removals_held_total", 6.0).await;
    let once = metric(&proxy, "lbkit_discovery_published_total").await - published;
    assert_eq!(once, 1.0, "one transaction, one update, one snapshot");
    until_serving(&proxy, &names, 20).await;
    // Nothing confirms them but time.
    metric_reaches(&proxy, "lbkit_discovery_removals_confirmed_total", 6.0).await;
    until_serving(&proxy, &names[6..], 8).await;
    proxy.shutdown(Duration::from_secs(2)).await;

    // Three of three in one transaction: empty-push protection keeps all three.
    let (interface, path) = zk_service("Three", &backends[7]);
    let mut regs = Vec::new();
    for b in &backends[7..] {
        regs.push(register(&zk, &path, b).await);
    }
    let source = format!("zookeeper = {{ zk = {zk:?}, interface = {interface:?} }}");
    let proxy = Proxy::start(parse(&config_with_source(&source)))
        .await
        .expect("proxy starts");
    until_serving(&proxy, &names[7..], 9).await;
    delete_together(&zk, &regs.iter().collect::<Vec<_>>()).await;
    metric_reaches(&proxy, "lbkit_discovery_empty_held_total", 1.0).await;
    until_serving(&proxy, &names[7..], 9).await;
    proxy.shutdown(Duration::from_secs(2)).await;
}

// The proxy registers as a Dubbo consumer of a Dubbo-layout interface, as Dubbo's consumers
// do, with no aperture asking for it: its node is in the consumers directory while it runs,
// gone after. It takes no place in an aperture: a client that numbers itself from the
// consumers, started after the proxy registered, counts itself alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_registers_as_a_consumer() {
    let Some(zk) = lbkit_testkit::zookeeper() else {
        return;
    };
    let backend = Backend::start("a").await;
    let (interface, path) = zk_service("Consumer", &backend);
    let reg = register(&zk, &path, &backend).await;
    let text = config_with_source(&format!(
        "zookeeper = {{ zk = {zk:?}, interface = {interface:?} }}"
    ));
    let proxy = Proxy::start(parse(&text)).await.expect("proxy starts");
    until_serving(&proxy, &["a"], 4).await;
    let dir = format!("/dubbo/{interface}/consumers");
    let client = zookeeper_client::Client::connect(&zk)
        .await
        .expect("connect");
    let consumers = || async {
        client
            .list_children(&dir)
            .await
            .unwrap_or_default()
            .into_iter()
            .filter(|c| c.contains("lbkit.consumer%3D"))
            .count()
    };
    let mut pace = poll_pace();
    tokio::time::timeout(WAIT, async {
        while consumers().await != 1 {
            pace.tick().await;
        }
    })
    .await
    .expect("the proxy's consumer node in time");
    let follower =
        lbkit_discovery::zookeeper::ZkPeers::new(ZkConfig::new(&zk), path.clone()).spawn();
    let mut coordinates = follower.coordinates();
    let first = tokio::time::timeout(WAIT, coordinates.wait_for(Option::is_some))
        .await
        .expect("coordinates in time")
        .expect("follower running")
        .expect("some");
    assert_eq!(first.count, 1, "the proxy takes no place in the aperture");
    drop(follower);
    proxy.shutdown(Duration::from_secs(2)).await;
    tokio::time::timeout(WAIT, async {
        while consumers().await != 0 {
            pace.tick().await;
        }
    })
    .await
    .expect("the proxy's consumer node left with it");
    tokio::time::timeout(WAIT, reg.deregister())
        .await
        .expect("deregistered");
}

#[test]
fn register_follows_the_layout_and_the_key() {
    let cfg = |zk: &str| {
        let text = config_with_source(&format!("zookeeper = {{ zk = \"127.0.0.1:2181\", {zk} }}"));
        parse(&text).services["svc"].registers_consumer()
    };
    assert!(cfg("interface = \"a.B\""), "Dubbo layout: by default");
    assert!(!cfg("interface = \"a.B\", register = false"));
    assert!(
        !cfg("interface = \"a.B\", layout = \"plain\""),
        "plain: not by default"
    );
    assert!(cfg(
        "interface = \"a.B\", layout = \"plain\", register = true"
    ));
}

/// The aperture's coordinates as `/endpoints` shows them: `(client_index, client_count)`.
async fn aperture_of(proxy: &Proxy) -> Option<(u64, u64)> {
    let (_, body) = admin(&client(), proxy, "GET", "/endpoints", "").await;
    let doc: serde_json::Value = serde_json::from_str(&body).expect("json");
    let a = &doc["services"]["svc"]["aperture"];
    Some((a["client_index"].as_u64()?, a["client_count"].as_u64()?))
}

// An aperture without client_index/client_count organises itself from the registry: the proxy
// registers as a Dubbo consumer, and as other consumers join, its slice narrows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aperture_takes_its_coordinates_from_the_consumers() {
    let Some(zk) = lbkit_testkit::zookeeper() else {
        return;
    };
    let backends = [
        Backend::start("a").await,
        Backend::start("b").await,
        Backend::start("c").await,
        Backend::start("d").await,
    ];
    let (interface, path) = zk_service("Aperture", &backends[0]);
    let mut regs = Vec::new();
    for b in &backends {
        regs.push(register(&zk, &path, b).await);
    }
    let text = config_with_source(&format!(
        "zookeeper = {{ zk = {zk:?}, interface = {interface:?} }}\n\
         stages = {{ aperture = {{ size = 1 }} }}"
    ));
    let proxy = Proxy::start(parse(&text)).await.expect("proxy starts");
    until_serving(&proxy, &["a", "b", "c", "d"], 16).await;
    let mut pace = poll_pace();
    let alone = tokio::time::timeout(WAIT, async {
        loop {
            pace.tick().await;
            if let Some(at) = aperture_of(&proxy).await {
                return at;
            }
        }
    })
    .await
    .expect("coordinates in time");
    assert_eq!(alone, (0, 1), "the only consumer");
    // Three more consumers: 4 clients over 4 providers, an aperture of 1 each.
    let others: Vec<_> = (0..3)
        .map(|_| lbkit_discovery::zookeeper::ZkPeers::new(ZkConfig::new(&zk), path.clone()).spawn())
        .collect();
    tokio::time::timeout(WAIT, async {
        while aperture_of(&proxy).await.map(|a| a.1) != Some(4) {
            pace.tick().await;
        }
    })
    .await
    .expect("four consumers seen in time");
    let client = client();
    let mut seen = HashSet::new();
    for _ in 0..20 {
        let (status, body, _) = get(&client, proxy.listeners()[0], "/", &[]).await;
        assert_eq!(status, StatusCode::OK);
        seen.insert(body);
    }
    assert_eq!(seen.len(), 1, "one provider in the aperture: {seen:?}");
    drop(others);
    proxy.shutdown(Duration::from_secs(2)).await;
    for r in regs {
        tokio::time::timeout(WAIT, r.deregister())
            .await
            .expect("deregistered");
    }
}
