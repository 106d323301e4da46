//! End-to-end: the proxy's services fed by a watched endpoint file and by a real ZooKeeper
//! (Debian's package, started by `scripts/zookeeper.sh`; `LBKIT_ZK` names it).

mod common;

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use common::*;
use http::StatusCode;
use lbkit_proxy::Proxy;

/// A fresh directory for one test's files.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lbkit-proxy-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// A proxy config whose service `svc` takes its endpoints from `source` (a TOML fragment).
fn config_with_source(source: &str) -> String {
    format!(
        r#"
[admin]
bind = "127.0.0.1:0"
[[listener]]
bind = "127.0.0.1:0"
[[route]]
service = "svc"
timeout_ms = 5000
[service.svc]
{source}
strategy = "round-robin"
"#
    )
}

/// Send GETs until the bodies of the last `window` answers are exactly `names`. Answers from
/// the proxy itself (503 before the first publish) are allowed while waiting.
async fn until_serving(proxy: &Proxy, names: &[&str], window: usize) {
    let client = client();
    let want: HashSet<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let mut last: Vec<String> = Vec::new();
    tokio::time::timeout(WAIT, async {
        loop {
            let (status, body, _) = get(&client, proxy.listeners()[0], "/", &[]).await;
            if status == StatusCode::OK {
                last.push(body);
            } else {
                last.clear();
            }
            if last.len() > window {
                last.remove(0);
            }
            if last.len() == window && last.iter().cloned().collect::<HashSet<_>>() == want {
                return;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("never served exactly {names:?}; last answers {last:?}"));
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
    let path = dir.join("endpoints.toml");
    write(&path, &endpoints_file(&[&a]));
    let text = config_with_source(&format!("file = {:?}", path.display().to_string()));
    let proxy = Proxy::start(parse(&text)).await.expect("proxy starts");
    until_serving(&proxy, &["a"], 4).await;

    write(&path, &endpoints_file(&[&a, &b]));
    until_serving(&proxy, &["a", "b"], 4).await;

    write(&path, &endpoints_file(&[&b]));
    until_serving(&proxy, &["b"], 6).await;

    // A broken file is rejected (counted as a source error) and the running set stays.
    let errors = || async { metric(&proxy, "lbkit_proxy_discovery_source_errors_total").await };
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
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_providers_come_and_go() {
    use lbkit_discovery::zookeeper::{Layout, Provider, ServicePath, ZkConfig, ZkRegistration};

    let Some(zk) = lbkit_testkit::zookeeper() else {
        return;
    };
    let (a, b) = (Backend::start("a").await, Backend::start("b").await);
    // A service name of this run only, so reruns and other tests never see each other's nodes.
    let interface = format!(
        "com.lbkit.proxytest.Api{}x{}",
        std::process::id(),
        a.addr.port()
    );
    let path = ServicePath::new("dubbo", &interface, Layout::Dubbo).expect("service path");
    let register = |backend: &Backend| {
        ZkRegistration::spawn(
            ZkConfig::new(zk.clone()),
            path.clone(),
            Provider::new(backend.addr.to_string()),
        )
        .expect("registration starts")
    };
    let reg_a = register(&a);
    let text = config_with_source(&format!(
        "zookeeper = {{ zk = {zk:?}, interface = {interface:?} }}"
    ));
    let proxy = Proxy::start(parse(&text)).await.expect("proxy starts");
    until_serving(&proxy, &["a"], 4).await;

    let reg_b = register(&b);
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
