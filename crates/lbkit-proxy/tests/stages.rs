//! Stages through the proxy, both engines: a configured header picks the metadata subset,
//! fallback `none` answers 503, backups stay idle while the primaries serve, `/endpoints`
//! shows the stages, and a bad `stages` table is refused naming its field.

mod common;

use std::collections::HashMap;

use common::*;
use http::StatusCode;

fn endpoints_file(dir: &tempfile::TempDir, eps: &[(&Backend, &str, u32)]) -> String {
    let text: String = eps
        .iter()
        .map(|(b, version, priority)| {
            format!(
                "[[endpoint]]\naddress = \"{}\"\npriority = {priority}\nmetadata = {{ version = \"{version}\" }}\n",
                b.addr
            )
        })
        .collect();
    let path = dir.path().join("eps.toml");
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().replace('\\', "/")
}

fn config(file: &str, fallback: &str) -> String {
    format!(
        "{LISTENERS}[[route]]\nservice = \"svc\"\n[service.svc]\nfile = \"{file}\"\n\
         strategy = \"round-robin\"\n\
         [service.svc.stages]\nsubsets = {{ keys = [[\"version\"]], fallback = \"{fallback}\", \
         headers = {{ version = \"x-version\" }} }}\n"
    )
}

async fn counts(
    client: &hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        http_body_util::Full<bytes::Bytes>,
    >,
    proxy: &lbkit_proxy::Proxy,
    n: usize,
    headers: &[(&str, &str)],
) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for _ in 0..n {
        let (status, body, _) = get(client, proxy.listeners()[0], "/", headers).await;
        *counts
            .entry(format!("{} {body}", status.as_u16()))
            .or_default() += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_picks_the_subset_in_both_engines() {
    let (a, b, c, d) = (
        Backend::start("a").await,
        Backend::start("b").await,
        Backend::start("c").await,
        Backend::start("d").await,
    );
    let dir = tempfile::tempdir().unwrap();
    let file = endpoints_file(
        &dir,
        &[(&a, "v1", 0), (&b, "v2", 0), (&c, "v2", 0), (&d, "v2", 1)],
    );
    let proxy = published(&config(&file, "none")).await;
    for client in [client(), h2c_client()] {
        let v2 = counts(&client, &proxy, 40, &[("x-version", "v2")]).await;
        assert_eq!(
            v2.len(),
            2,
            "v2's tier 0 (b, c), never the backup d: {v2:?}"
        );
        assert!(
            v2.contains_key("200 b") && v2.contains_key("200 c"),
            "{v2:?}"
        );
        let v1 = counts(&client, &proxy, 10, &[("x-version", "v1")]).await;
        assert_eq!(v1.keys().collect::<Vec<_>>(), vec!["200 a"]);
        let none = counts(&client, &proxy, 3, &[("x-version", "v9")]).await;
        assert_eq!(none.len(), 1, "{none:?}");
        let (answer, _) = none.into_iter().next().unwrap();
        assert!(
            answer.starts_with("503"),
            "fallback none: 503, got {answer}"
        );
    }
    let (status, body) = admin(&client(), &proxy, "GET", "/endpoints", "").await;
    assert_eq!(status, StatusCode::OK);
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    let stages = &doc["services"]["svc"]["stages"];
    assert!(
        stages["error"]
            .as_str()
            .is_some_and(|e| e.contains("no subset")),
        "a request without the header has no subset: {stages}"
    );
    let eps = doc["services"]["svc"]["endpoints"].as_array().unwrap();
    assert_eq!(eps.iter().filter(|e| e["priority"] == 1).count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_shows_tier_loads_of_the_fallback() {
    let (a, b) = (Backend::start("a").await, Backend::start("b").await);
    let dir = tempfile::tempdir().unwrap();
    let file = endpoints_file(&dir, &[(&a, "v1", 0), (&b, "v1", 1)]);
    let proxy = published(&config(&file, "any")).await;
    let (_, body) = admin(&client(), &proxy, "GET", "/endpoints", "").await;
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    let stages = &doc["services"]["svc"]["stages"];
    assert_eq!(stages["subset"]["kind"], "fallback", "{stages}");
    let loads: Vec<u64> = stages["tiers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["load_percent"].as_u64().unwrap())
        .collect();
    assert_eq!(loads, vec![100, 0]);
    let got = counts(&client(), &proxy, 10, &[]).await;
    assert_eq!(got.keys().collect::<Vec<_>>(), vec!["200 a"]);
}

#[test]
fn a_bad_stages_table_names_its_field() {
    let text = config("/nonexistent.toml", "sometimes");
    let err = lbkit_proxy::config::Config::parse(&text, std::path::Path::new("p.toml"))
        .expect_err("unknown fallback");
    assert!(
        err.to_string()
            .contains("service.svc.stages.subsets.fallback"),
        "{err}"
    );
}

#[test]
fn register_false_beside_a_self_organising_aperture_is_refused() {
    let text = "[[listener]]\nbind = \"127.0.0.1:0\"\n\
        [[route]]\npath_prefix = \"/\"\nservice = \"svc\"\n\
        [service.svc]\n\
        zookeeper = { zk = \"127.0.0.1:2181\", interface = \"a.B\", register = false }\n\
        stages = { aperture = { size = 2 } }\n";
    let err = lbkit_proxy::config::Config::parse(text, std::path::Path::new("p.toml"))
        .expect_err("an aperture from the registry needs the registration");
    assert!(
        err.to_string().contains("service.svc.zookeeper.register"),
        "{err}"
    );
    let with_coordinates = text.replace("size = 2", "size = 2, client_index = 0, client_count = 3");
    lbkit_proxy::config::Config::parse(&with_coordinates, std::path::Path::new("p.toml"))
        .expect("coordinates given: no registration needed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxys_own_zone_keeps_traffic_local() {
    let (a, b, c) = (
        Backend::start("a").await,
        Backend::start("b").await,
        Backend::start("c").await,
    );
    let dir = tempfile::tempdir().unwrap();
    let text: String = [(&a, "eu"), (&b, "eu"), (&c, "us")]
        .iter()
        .map(|(b, z)| format!("[[endpoint]]\naddress = \"{}\"\nzone = \"{z}\"\n", b.addr))
        .collect();
    let path = dir.path().join("eps.toml");
    std::fs::write(&path, text).unwrap();
    let file = path.to_str().unwrap().replace('\\', "/");
    let config = format!(
        "{LISTENERS}[[route]]\nservice = \"svc\"\n[service.svc]\nfile = \"{file}\"\n\
         strategy = \"round-robin\"\nzone = \"eu\"\n"
    );
    let proxy = published(&config).await;
    let got = counts(&client(), &proxy, 30, &[]).await;
    let mut seen: Vec<&String> = got.keys().collect();
    seen.sort();
    assert_eq!(seen, vec!["200 a", "200 b"], "the local zone only: {got:?}");
}
