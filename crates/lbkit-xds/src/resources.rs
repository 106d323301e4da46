//! One lbkit service as xDS resources: a Cluster (EDS over ADS, with the strategy's `lb_policy`
//! where Envoy has the same one), a ClusterLoadAssignment (weights, health, zones as localities
//! with weights, priorities) and a Listener for proxyless gRPC (an API listener whose inline
//! routes send requests to the cluster: [`listener`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;

use envoy_types::pb::envoy::config::cluster::v3::cluster::{
    ClusterDiscoveryType, DiscoveryType, EdsClusterConfig, LbPolicy,
};
use envoy_types::pb::envoy::config::cluster::v3::load_balancing_policy::Policy;
use envoy_types::pb::envoy::config::cluster::v3::{Cluster, LoadBalancingPolicy, OutlierDetection};
use envoy_types::pb::envoy::config::core::v3::{
    address, config_source, socket_address, Address, AggregatedConfigSource, ApiVersion,
    ConfigSource, HealthStatus, Http2ProtocolOptions, Locality, SocketAddress,
    TypedExtensionConfig,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    lb_endpoint, ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints,
};
use envoy_types::pb::envoy::extensions::load_balancing_policies::{
    maglev::v3::Maglev, random::v3::Random, ring_hash::v3::ring_hash, ring_hash::v3::RingHash,
    round_robin::v3::RoundRobin, wrr_locality::v3::WrrLocality,
};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::{
    explicit_http_config, ExplicitHttpConfig, UpstreamProtocolOptions,
};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions;
use envoy_types::pb::google::protobuf::{Any, Duration as PbDuration, UInt32Value};
use envoy_types::util::pack_any;
use lbkit_core::{EndpointIdx, Snapshot};
use lbkit_proxy::config::{OutlierDetection as OutlierConfig, ServiceConfig};

pub use crate::listener::{hash_policy, listener, ListenerRoute};
pub use lbkit_discovery::xds::{CLUSTER, ENDPOINTS, LISTENER};

/// How an lbkit strategy reaches Envoy and gRPC: the `lb_policy` and, when they differ, why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyMapping {
    /// The `lb_policy` the cluster carries.
    pub policy: LbPolicy,
    /// `None` when Envoy's policy is the same algorithm; otherwise what differs.
    pub differs: Option<&'static str>,
    /// What proxyless gRPC clients do with it, when that differs from lbkit's strategy.
    pub grpc: Option<&'static str>,
}

/// The `lb_policy` for lbkit strategy `strategy`: the same algorithm where Envoy has it
/// (round robin with weights, least request, random, ring hash, Maglev), else the closest one
/// and a sentence saying what is lost (`lbkit xds --check` prints it; nothing is changed
/// silently).
pub fn lb_policy(strategy: &str) -> PolicyMapping {
    use LbPolicy::*;
    let (policy, differs) = match strategy {
        "weighted-round-robin" => (RoundRobin, None),
        "round-robin" => (
            RoundRobin,
            Some("Envoy's ROUND_ROBIN honours endpoint weights; lbkit's round-robin ignores them (the same when weights are equal)"),
        ),
        "random" => (Random, None),
        "weighted-random" => (
            RoundRobin,
            Some("Envoy's RANDOM ignores weights: weighted ROUND_ROBIN gives the same shares, in turn instead of at random"),
        ),
        "least-request" => (LeastRequest, None),
        "p2c-least-loaded" | "least-active" | "best-available" => (
            LeastRequest,
            Some("Envoy's LEAST_REQUEST (two random choices by active requests) stands in for it"),
        ),
        "consistent-hash" | "ketama" => (RingHash, None),
        "maglev" => (Maglev, None),
        "rendezvous" | "nodes" => (
            RingHash,
            Some("Envoy has no rendezvous hashing: RING_HASH keeps keys on endpoints, with other placements"),
        ),
        _ => (
            RoundRobin,
            Some("Envoy and gRPC have no such policy: the cluster gets weighted ROUND_ROBIN"),
        ),
    };
    let grpc = match policy {
        RoundRobin => Some("proxyless gRPC's ROUND_ROBIN ignores endpoint weights (within a locality)"),
        Random => Some("proxyless gRPC has no random policy: its clients take the cluster's load_balancing_policy fallback, locality-weighted round robin"),
        Maglev => Some("proxyless gRPC has no Maglev: its clients take the cluster's load_balancing_policy fallback, ring hash (hashing by a [[route]]'s header hash_key, at random without one), or round robin where ring hash is missing"),
        RingHash => Some("proxyless gRPC hashes by a header the route names, and no [[route]] to this service has a header hash_key: requests hash at random"),
        _ => None,
    };
    PolicyMapping {
        policy,
        differs,
        grpc,
    }
}

/// The cluster's `load_balancing_policy` for the policies proxyless gRPC lacks (Maglev,
/// random): the policy itself first, which Envoy takes (the first in the list it supports, the
/// same as `lb_policy`), then what gRPC clients run instead (gRFC A52: a client takes the first
/// policy it supports; without this list, a gRPC client rejects the cluster). `None` for the
/// others: `lb_policy` says it to everyone.
pub fn typed_policy(policy: LbPolicy) -> Option<LoadBalancingPolicy> {
    let round_robin = || {
        let endpoints = LoadBalancingPolicy {
            policies: vec![typed("round_robin", RoundRobin::default())],
        };
        typed(
            "wrr_locality",
            WrrLocality {
                endpoint_picking_policy: Some(endpoints),
            },
        )
    };
    let policies = match policy {
        LbPolicy::Maglev => vec![
            typed("maglev", Maglev::default()),
            // xxHash by name: grpc-js rejects DEFAULT_HASH (which is xxHash to Envoy).
            typed(
                "ring_hash",
                RingHash {
                    hash_function: ring_hash::HashFunction::XxHash as i32,
                    ..RingHash::default()
                },
            ),
            round_robin(),
        ],
        LbPolicy::Random => vec![typed("random", Random::default()), round_robin()],
        _ => return None,
    };
    Some(LoadBalancingPolicy { policies })
}

/// One entry of a `load_balancing_policy`: Envoy's extension `envoy.load_balancing_policies.NAME`.
fn typed<M: prost::Name + prost::Message>(name: &str, config: M) -> Policy {
    Policy {
        typed_extension_config: Some(TypedExtensionConfig {
            name: format!("envoy.load_balancing_policies.{name}"),
            typed_config: Some(pack_any(config)),
        }),
    }
}

/// The Cluster NAME: endpoints by EDS over the same ADS stream, `lb_policy` from the strategy,
/// the connect timeout, and HTTP/2 to the endpoints when the service sets `h2c`.
pub fn cluster(name: &str, cfg: &ServiceConfig) -> Cluster {
    let eds_config = ConfigSource {
        resource_api_version: ApiVersion::V3 as i32,
        config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(
            AggregatedConfigSource {},
        )),
        ..ConfigSource::default()
    };
    let mut cluster = Cluster {
        name: name.to_owned(),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)),
        eds_cluster_config: Some(EdsClusterConfig {
            eds_config: Some(eds_config),
            service_name: String::new(),
        }),
        lb_policy: lb_policy(&cfg.strategy).policy as i32,
        load_balancing_policy: typed_policy(lb_policy(&cfg.strategy).policy),
        connect_timeout: Some(duration(cfg.connect_timeout_ms)),
        outlier_detection: outlier_detection(&cfg.outlier_detection),
        ..Cluster::default()
    };
    if cfg.h2c {
        let options = HttpProtocolOptions {
            upstream_protocol_options: Some(UpstreamProtocolOptions::ExplicitHttpConfig(
                ExplicitHttpConfig {
                    protocol_config: Some(
                        explicit_http_config::ProtocolConfig::Http2ProtocolOptions(
                            Http2ProtocolOptions::default(),
                        ),
                    ),
                },
            )),
            ..HttpProtocolOptions::default()
        };
        cluster.typed_extension_protocol_options.insert(
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions".to_owned(),
            pack_any(options),
        );
    }
    cluster
}

/// The service's `outlier_detection` as Envoy's: consecutive failures (`consecutive_5xx`),
/// interval, first ejection and its 10 × cap (as lbkit's), and the ejection percentage.
/// Proxyless gRPC reads only success-rate and failure-percentage ejection, so it ejects
/// nothing from this.
fn outlier_detection(od: &OutlierConfig) -> Option<OutlierDetection> {
    let u32v = |value| Some(UInt32Value { value });
    od.enabled.then(|| OutlierDetection {
        consecutive_5xx: u32v(od.consecutive_failures),
        interval: Some(duration(od.interval_ms)),
        base_ejection_time: Some(duration(od.base_ejection_ms)),
        max_ejection_time: Some(duration(od.base_ejection_ms.saturating_mul(10))),
        max_ejection_percent: u32v(od.max_ejection_percent),
        ..OutlierDetection::default()
    })
}

/// Milliseconds as a protobuf duration.
fn duration(ms: u64) -> PbDuration {
    PbDuration {
        seconds: (ms / 1000).min(i64::MAX as u64) as i64,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

/// An endpoint lbkit cannot hand over: Envoy's EDS takes IP addresses only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// The endpoint's key.
    pub key: String,
    /// Its address as the source gave it.
    pub address: String,
}

/// The ClusterLoadAssignment NAME from the service's current snapshot, with the endpoints left
/// out because their address is not `IP:PORT`.
///
/// - Localities are the endpoints' zones (no zone: the empty locality), one group per priority
///   and zone, each with a `load_balancing_weight` (the sum of its healthy endpoints'
///   weights, at least 1) as proxyless gRPC requires.
/// - Priorities are ranked densely from 0 (lbkit's 0, 5, 9 become 0, 1, 2: Envoy wants no gaps).
/// - Health: an endpoint the source or the health overlay marks unhealthy, or that is ejected,
///   is `UNHEALTHY`; weight 0 (Dubbo's `disabled`, a draining provider) is `DRAINING` (Envoy
///   wants weights of at least 1, so it is sent with weight 1 and takes no new requests).
pub fn load_assignment(name: &str, snapshot: &Snapshot) -> (ClusterLoadAssignment, Vec<Skipped>) {
    let mut served = Vec::new();
    let mut skipped = Vec::new();
    for (i, e) in snapshot.endpoints().iter().enumerate() {
        match e.address().parse::<SocketAddr>() {
            Ok(addr) => served.push((EndpointIdx::new(i), addr)),
            Err(_) => skipped.push(Skipped {
                key: e.key().as_str().to_owned(),
                address: e.address().to_owned(),
            }),
        }
    }
    // Ranked over the endpoints sent only: a priority held by skipped ones leaves no gap.
    let ranks: BTreeMap<u32, u32> = {
        let mut p: Vec<u32> = served
            .iter()
            .map(|(i, _)| snapshot.endpoint(*i).priority())
            .collect();
        p.sort_unstable();
        p.dedup();
        p.into_iter().zip(0..).collect()
    };
    let mut groups: BTreeMap<(u32, String), Vec<LbEndpoint>> = BTreeMap::new();
    for (idx, addr) in served {
        let e = snapshot.endpoint(idx);
        let group = (ranks[&e.priority()], e.zone().unwrap_or("").to_owned());
        groups
            .entry(group)
            .or_default()
            .push(lb_endpoint(snapshot, idx, addr));
    }
    let endpoints = groups
        .into_iter()
        .map(|((priority, zone), lb_endpoints)| {
            let weight: u64 = lb_endpoints
                .iter()
                .filter(|e| e.health_status == HealthStatus::Healthy as i32)
                .map(|e| u64::from(e.load_balancing_weight.map_or(1, |w| w.value)))
                .sum();
            LocalityLbEndpoints {
                locality: Some(Locality {
                    zone,
                    ..Locality::default()
                }),
                lb_endpoints,
                load_balancing_weight: Some(UInt32Value {
                    value: weight.clamp(1, u64::from(u32::MAX)) as u32,
                }),
                priority,
                ..LocalityLbEndpoints::default()
            }
        })
        .collect();
    let cla = ClusterLoadAssignment {
        cluster_name: name.to_owned(),
        endpoints,
        ..ClusterLoadAssignment::default()
    };
    (cla, skipped)
}

/// One endpoint: its address, weight and health.
fn lb_endpoint(snapshot: &Snapshot, idx: EndpointIdx, addr: SocketAddr) -> LbEndpoint {
    let e = snapshot.endpoint(idx);
    let health = if e.weight() == 0 {
        HealthStatus::Draining
    } else if !e.is_healthy() || snapshot.ejected_until(idx).is_some() {
        HealthStatus::Unhealthy
    } else {
        HealthStatus::Healthy
    };
    let socket = SocketAddress {
        address: addr.ip().to_string(),
        port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(
            addr.port(),
        ))),
        ..SocketAddress::default()
    };
    LbEndpoint {
        host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
            address: Some(Address {
                address: Some(address::Address::SocketAddress(socket)),
            }),
            ..Endpoint::default()
        })),
        health_status: health as i32,
        load_balancing_weight: Some(UInt32Value {
            value: e.weight().max(1),
        }),
        ..LbEndpoint::default()
    }
}

/// The three resources of one service, packed.
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceResources {
    /// The Listener NAME.
    pub listener: Any,
    /// The Cluster NAME.
    pub cluster: Any,
    /// The ClusterLoadAssignment NAME.
    pub endpoints: Any,
}

/// Service NAME's resources for `snapshot`, with the endpoints that could not be expressed:
/// its Listener routes as `routes` says (the `[[route]]`s to it; none: one route for every
/// request).
pub fn service(
    name: &str,
    cfg: &ServiceConfig,
    routes: &[ListenerRoute],
    snapshot: &Snapshot,
) -> (ServiceResources, Vec<Skipped>) {
    let (cla, skipped) = load_assignment(name, snapshot);
    let resources = ServiceResources {
        listener: pack_any(listener(name, routes)),
        cluster: pack_any(cluster(name, cfg)),
        endpoints: pack_any(cla),
    };
    (resources, skipped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lbkit_core::{EndpointSpec, Timestamp};

    #[test]
    fn zones_are_weighted_localities_priorities_dense_and_health_carried() {
        let specs = vec![
            EndpointSpec::new("10.0.0.1:80")
                .with_zone("eu-1")
                .with_weight(100),
            EndpointSpec::new("10.0.0.2:80")
                .with_zone("eu-1")
                .with_weight(0),
            EndpointSpec::new("10.0.0.3:80")
                .with_zone("us-1")
                .with_healthy(false),
            EndpointSpec::new("[::1]:81").with_priority(5),
            EndpointSpec::new("db.internal:5432").with_priority(2),
        ];
        let snapshot = Snapshot::from_specs(specs, Timestamp::ZERO);
        let (cla, skipped) = load_assignment("web", &snapshot);
        assert_eq!(cla.cluster_name, "web");
        assert_eq!(skipped.len(), 1);
        assert_eq!(skipped[0].address, "db.internal:5432");
        let groups: Vec<_> = cla
            .endpoints
            .iter()
            .map(|g| {
                let zone = g.locality.as_ref().unwrap().zone.clone();
                let health: Vec<i32> = g.lb_endpoints.iter().map(|e| e.health_status).collect();
                (
                    g.priority,
                    zone,
                    g.load_balancing_weight.unwrap().value,
                    health,
                )
            })
            .collect();
        let (healthy, draining, unhealthy) = (
            HealthStatus::Healthy as i32,
            HealthStatus::Draining as i32,
            HealthStatus::Unhealthy as i32,
        );
        assert_eq!(
            groups,
            [
                (0, "eu-1".to_owned(), 100, vec![healthy, draining]),
                (0, "us-1".to_owned(), 1, vec![unhealthy]),
                (1, "".to_owned(), 100, vec![healthy]),
            ],
            "priority 5 ranks 1 (2, held by a skipped endpoint only, leaves no gap); a locality \
             weighs what its healthy endpoints weigh (at least 1)"
        );
    }

    #[test]
    fn strategies_envoy_lacks_say_what_they_get() {
        let maglev = lb_policy("maglev");
        assert_eq!((maglev.policy, maglev.differs), (LbPolicy::Maglev, None));
        assert!(maglev
            .grpc
            .is_some_and(|g| g.contains("fallback, ring hash")));
        assert_eq!(lb_policy("least-request").policy, LbPolicy::LeastRequest);
        let adaptive = lb_policy("adaptive");
        assert_eq!(adaptive.policy, LbPolicy::RoundRobin);
        assert!(adaptive.differs.is_some());
    }

    #[test]
    fn policies_grpc_lacks_carry_a_list_with_their_fallback() {
        let names = |policy| -> Vec<String> {
            typed_policy(policy)
                .map(|l| l.policies)
                .unwrap_or_default()
                .into_iter()
                .filter_map(|p| p.typed_extension_config.map(|c| c.name))
                .map(|n| {
                    n.trim_start_matches("envoy.load_balancing_policies.")
                        .to_owned()
                })
                .collect()
        };
        assert_eq!(
            names(LbPolicy::Maglev),
            ["maglev", "ring_hash", "wrr_locality"]
        );
        assert_eq!(names(LbPolicy::Random), ["random", "wrr_locality"]);
        for alone in [
            LbPolicy::RoundRobin,
            LbPolicy::LeastRequest,
            LbPolicy::RingHash,
        ] {
            assert_eq!(
                names(alone),
                Vec::<String>::new(),
                "{alone:?}: lb_policy alone"
            );
        }
    }
}
