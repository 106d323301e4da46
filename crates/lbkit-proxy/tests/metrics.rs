//! `/metrics` as Prometheus reads it: parsed with the Prometheus project's own Python parsers
//! (`prometheus_client`, pinned in scripts/requirements.txt; `scripts/test.sh` makes the
//! virtual environment), every family typed and documented, the histograms histograms.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::*;

#[tokio::test]
async fn metrics_parse_with_the_prometheus_parsers_every_family_typed_and_documented() {
    let Some(python) = lbkit_testkit::python() else {
        return;
    };
    let (a, b) = (Backend::start("a").await, Backend::start("b").await);
    let proxy = start(&config_text(&[&a, &b], "round-robin", "")).await;
    let http = client();
    for _ in 0..5 {
        get(&http, proxy.listeners()[0], "/", &[]).await;
    }
    let (status, text) = admin(&http, &proxy, "GET", "/metrics", "").await;
    assert_eq!(status, 200);
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/check_metrics.py"
    );
    let mut child = Command::new(&python)
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("python ends");
    assert!(
        out.status.success(),
        "{}\n--- /metrics ---\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    // OpenMetrics (what the content type says), read by the OpenMetrics parser.
    let parser = doc["format"].as_str().expect("format").to_owned();
    assert_eq!(parser, "openmetrics");
    {
        let families = doc["families"]
            .as_object()
            .unwrap_or_else(|| panic!("{doc}"));
        for (name, f) in families {
            assert_ne!(f["type"], "unknown", "{parser}: {name} untyped");
            assert_ne!(f["documentation"], "", "{parser}: {name} has no HELP");
        }
        let kind = |name: &str| {
            families[name]["type"]
                .as_str()
                .unwrap_or("missing")
                .to_owned()
        };
        assert_eq!(
            kind("lbkit_proxy_request_duration_seconds"),
            "histogram",
            "{parser}"
        );
        assert_eq!(
            kind("lbkit_endpoint_call_duration_seconds"),
            "histogram",
            "{parser}"
        );
        assert_eq!(kind("lbkit_proxy_requests"), "counter", "{parser}");
        // The families a tower pool writes too (lbkit_tower::telemetry).
        for shared in [
            "lbkit_endpoint_calls",
            "lbkit_endpoint_failures",
            "lbkit_retries",
            "lbkit_discovery_published",
        ] {
            assert_eq!(kind(shared), "counter", "{parser}: {shared}");
        }
        assert_eq!(kind("lbkit_endpoint_in_flight"), "gauge", "{parser}");
        assert_eq!(kind("lbkit_proxy_client_connections"), "gauge", "{parser}");
        assert!(families.len() >= 17, "{parser}: {families:?}");
    }
}
