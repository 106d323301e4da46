//! `consistent-hash` against Dubbo's `ConsistentHashLoadBalance`
//! (`org.apache.dubbo.rpc.cluster.loadbalance`, Apache-2.0): the algorithm is written out again
//! here, independently of the library, from Dubbo's `ConsistentHashSelector`, and a few picks
//! are pinned to values computed outside Rust (Python's `hashlib` and `bisect`, same algorithm).

use std::collections::BTreeMap;
use std::sync::Arc;

use lbkit_core::{Availability, Balancer, EndpointSpec, FastRng, PickContext, Snapshot, Timestamp};
use lbkit_strategy::catalog::{build, Params};
use md5::{Digest, Md5};

/// Dubbo's `hash(digest, number)`.
fn dubbo_hash(digest: &[u8], number: usize) -> u32 {
    (u32::from(digest[3 + number * 4]) << 24)
        | (u32::from(digest[2 + number * 4]) << 16)
        | (u32::from(digest[1 + number * 4]) << 8)
        | u32::from(digest[number * 4])
}

/// Dubbo's `ConsistentHashSelector`: `TreeMap<Long, Invoker>` filled with `put`.
struct Selector {
    virtual_invokers: BTreeMap<u32, String>,
}

impl Selector {
    fn new(addresses: &[&str], replica_number: u32) -> Self {
        let mut virtual_invokers = BTreeMap::new();
        for address in addresses {
            for i in 0..replica_number / 4 {
                let digest = Md5::digest(format!("{address}{i}").as_bytes());
                for h in 0..4 {
                    virtual_invokers.insert(dubbo_hash(&digest, h), (*address).to_owned());
                }
            }
        }
        Selector { virtual_invokers }
    }

    /// `select`: `md5(key)`, `hash(digest, 0)`, `ceilingEntry` else `firstEntry`.
    fn select(&self, key: &str) -> &str {
        let hash = dubbo_hash(&Md5::digest(key.as_bytes()), 0);
        let entry = self
            .virtual_invokers
            .range(hash..)
            .next()
            .or_else(|| self.virtual_invokers.iter().next())
            .expect("non-empty ring");
        entry.1
    }
}

fn balancer(specs: Vec<EndpointSpec>, params: &[(&str, &str)]) -> Balancer {
    let snap = Arc::new(Snapshot::from_specs(specs, Timestamp::ZERO));
    let strategy = build(
        "consistent-hash",
        Params::from_pairs(params.iter().copied()),
    )
    .unwrap();
    Balancer::new(strategy, snap, Timestamp::ZERO).with_availability(Availability::OFF)
}

fn lbkit_pick(b: &Balancer, key: &str) -> String {
    let mut rng = FastRng::seed_from_u64(1);
    let mut cx = PickContext::new(Timestamp::ZERO, &mut rng).with_key(key.as_bytes());
    b.pick(&mut cx).unwrap().endpoint().address().to_owned()
}

const PROVIDERS: [&str; 3] = [
    "10.20.153.10:20880",
    "10.20.153.11:20880",
    "10.20.153.12:20880",
];

#[test]
fn pinned_vectors_computed_outside_rust() {
    let b = balancer(PROVIDERS.map(EndpointSpec::new).to_vec(), &[]);
    let expected = [
        ("1", "10.20.153.12:20880"),
        ("2", "10.20.153.10:20880"),
        ("3", "10.20.153.12:20880"),
        ("hello", "10.20.153.12:20880"),
        ("user-42", "10.20.153.11:20880"),
        ("", "10.20.153.11:20880"),
        ("中文", "10.20.153.11:20880"),
        ("dubbo", "10.20.153.10:20880"),
    ];
    for (key, provider) in expected {
        assert_eq!(lbkit_pick(&b, key), provider, "key {key:?}");
    }
    // Key points, as Dubbo's hash(md5(key), 0) gives them.
    assert_eq!(dubbo_hash(&Md5::digest(b"1"), 0), 0x3842_cac4);
    assert_eq!(dubbo_hash(&Md5::digest("中文".as_bytes()), 0), 0x23c2_baa7);
    let b320 = balancer(
        PROVIDERS.map(EndpointSpec::new).to_vec(),
        &[("nodes", "320")],
    );
    assert_eq!(lbkit_pick(&b320, "user-42"), "10.20.153.11:20880");
    assert_eq!(lbkit_pick(&b320, "2"), "10.20.153.10:20880");
}

#[test]
fn same_provider_as_dubbo_for_many_keys_and_fleets() {
    let fleets: Vec<Vec<String>> = vec![
        PROVIDERS.iter().map(|s| s.to_string()).collect(),
        (1..=17).map(|i| format!("192.168.0.{i}:20880")).collect(),
        (0..40)
            .map(|i| format!("provider-{i}.example.com:{}", 20000 + i))
            .collect(),
        vec!["[2001:db8::1]:20880".into(), "[2001:db8::2]:20880".into()],
    ];
    for fleet in &fleets {
        let addrs: Vec<&str> = fleet.iter().map(String::as_str).collect();
        for nodes in [160u32, 4, 99, 1000] {
            let dubbo = Selector::new(&addrs, nodes);
            let specs = addrs
                .iter()
                .map(|&a| EndpointSpec::new(a).with_weight(1 + a.len() as u32));
            let b = balancer(specs.collect(), &[("nodes", &nodes.to_string())]);
            for k in 0..2_000 {
                let key = format!("{k}:{}", k * 7919);
                assert_eq!(
                    lbkit_pick(&b, &key),
                    dubbo.select(&key),
                    "nodes {nodes}, key {key}"
                );
            }
        }
    }
}

#[test]
fn colliding_points_go_to_the_provider_put_last_as_treemap_put_does() {
    // Two registrations of one address make identical points: Dubbo's TreeMap keeps the later.
    let specs = vec![
        EndpointSpec::new("10.0.0.1:20880").with_key("first"),
        EndpointSpec::new("10.0.0.1:20880").with_key("second"),
    ];
    let b = balancer(specs, &[]);
    for k in 0..200 {
        let mut rng = FastRng::seed_from_u64(1);
        let key = k.to_string();
        let mut cx = PickContext::new(Timestamp::ZERO, &mut rng).with_key(key.as_bytes());
        assert_eq!(b.pick(&mut cx).unwrap().endpoint().key().as_str(), "second");
    }
}
