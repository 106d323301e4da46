//! `ketama` against a trace recorded from a real nginx (`hash $request_uri consistent`), as
//! published by Cloudflare's pingora-ketama (Apache-2.0; see `tests/data/nginx-ketama/README.md`).

use std::sync::Arc;

use lbkit_core::{Availability, Balancer, EndpointSpec, FastRng, PickContext, Snapshot, Timestamp};
use lbkit_strategy::catalog::{build, Params};

const TRACE: &str = include_str!("data/nginx-ketama/sample-nginx-upstream.csv");
const CONF: &str = include_str!("data/nginx-ketama/nginx.conf");

/// `(request_uri, upstream_addr)` per request.
fn trace() -> Vec<(&'static str, &'static str)> {
    TRACE
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| l.split_once(',').expect("uri,upstream"))
        .collect()
}

/// The servers of the published nginx.conf, in config order, with their weights.
fn servers() -> Vec<(&'static str, u32)> {
    CONF.lines()
        .filter_map(|l| l.trim().strip_prefix("server "))
        .filter(|l| !l.starts_with('{'))
        .map(|l| {
            let mut parts = l.trim_end_matches(';').split_whitespace();
            let addr = parts.next().expect("server address");
            let weight = parts
                .find_map(|p| p.strip_prefix("weight="))
                .map_or(1, |w| w.parse().expect("weight"));
            (addr, weight)
        })
        .collect()
}

fn balancer(down: Option<&str>) -> Balancer {
    let specs = servers()
        .into_iter()
        .map(|(a, w)| {
            EndpointSpec::new(a)
                .with_weight(w)
                .with_healthy(Some(a) != down)
        })
        .collect();
    let snap = Arc::new(Snapshot::from_specs(specs, Timestamp::ZERO));
    Balancer::new(
        build("ketama", Params::new()).unwrap(),
        snap,
        Timestamp::ZERO,
    )
    .with_availability(Availability::OFF)
}

fn pick(b: &Balancer, rng: &mut FastRng, key: &str) -> String {
    let mut cx = PickContext::new(Timestamp::ZERO, rng).with_key(key.as_bytes());
    let guard = b.pick(&mut cx).expect("a server");
    guard.endpoint().address().to_owned()
}

#[test]
fn the_published_config_is_nine_servers_of_weight_100() {
    let s = servers();
    assert_eq!(s.len(), 9);
    assert!(s.iter().all(|&(a, w)| a.ends_with(":443") && w == 100));
    assert_eq!(trace().len(), 1001);
}

#[test]
fn every_request_goes_where_nginx_sent_it() {
    let b = balancer(None);
    let mut rng = FastRng::seed_from_u64(1);
    let mut mismatches = Vec::new();
    for (uri, upstream) in trace() {
        let got = pick(&b, &mut rng, uri);
        if got != upstream {
            mismatches.push((uri, upstream, got));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of 1001 differ: {:?}",
        mismatches.len(),
        &mismatches[..mismatches.len().min(5)]
    );
}

/// nginx's own ring, written out independently: all servers, sorted, de-duplicated (first
/// kept).
fn nginx_ring() -> Vec<(u32, &'static str)> {
    let mut points: Vec<(u32, &'static str)> = Vec::new();
    for (server, weight) in servers() {
        let (host, port) = server.rsplit_once(':').expect("host:port");
        let mut prev = [0u8; 4];
        for _ in 0..weight * 160 {
            let mut h = crc32fast::Hasher::new();
            h.update(host.as_bytes());
            h.update(b"\0");
            h.update(port.as_bytes());
            h.update(&prev);
            let hash = h.finalize();
            prev = hash.to_le_bytes();
            points.push((hash, server));
        }
    }
    points.sort_by_key(|p| p.0);
    points.dedup_by_key(|p| p.0);
    points
}

/// nginx's pick: the first point at or after the key's CRC32, walking past points of a down
/// server (`hp->hash++`).
fn nginx_pick(points: &[(u32, &'static str)], uri: &str, down: &str) -> &'static str {
    let hash = crc32fast::hash(uri.as_bytes());
    let start = points.partition_point(|p| p.0 < hash);
    (0..points.len())
        .map(|i| points[(start + i) % points.len()].1)
        .find(|&s| s != down)
        .expect("a live server")
}

#[test]
fn a_down_server_moves_only_its_own_requests_as_nginx_would() {
    let down = "10.0.0.3:443";
    let b = balancer(Some(down));
    let mut rng = FastRng::seed_from_u64(1);
    let mut moved = 0;
    let ring = nginx_ring();
    for (uri, upstream) in trace() {
        let got = pick(&b, &mut rng, uri);
        assert_eq!(got, nginx_pick(&ring, uri, down), "{uri}");
        if upstream == down {
            moved += 1;
        } else {
            assert_eq!(got, upstream, "{uri} moved although its server is up");
        }
    }
    assert_eq!(moved, 118);
}
