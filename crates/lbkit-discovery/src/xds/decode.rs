//! xDS resources as lbkit reads them: the followed Cluster (where its endpoints come from, and
//! its `lb_policy`) and its ClusterLoadAssignment as endpoint specs. Every rejection is a
//! sentence naming the resource and the problem: it goes back to the control plane as the
//! NACK's `error_detail`, and the last good set stays.

use std::collections::HashSet;

use envoy_types::pb::envoy::config::cluster::v3::cluster::{
    ClusterDiscoveryType, DiscoveryType, LbPolicy,
};
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::{
    address, config_source::ConfigSourceSpecifier, socket_address::PortSpecifier, HealthStatus,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    lb_endpoint::HostIdentifier, ClusterLoadAssignment, LbEndpoint, LocalityLbEndpoints,
};
use envoy_types::pb::google::protobuf::Any;
use lbkit_core::EndpointSpec;
use prost::Message;

use super::{CLUSTER, ENDPOINTS};

/// Where the followed cluster's endpoints come from.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Endpoints {
    /// EDS over the same ADS stream, under this name.
    Eds(String),
    /// Inline in the cluster (a STATIC cluster's `load_assignment`).
    Inline(Vec<EndpointSpec>),
}

/// The followed cluster, checked.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ClusterInfo {
    /// Its endpoints' origin.
    pub endpoints: Endpoints,
    /// Its `lb_policy`, by Envoy's name (`ROUND_ROBIN`...).
    pub policy: &'static str,
}

/// The cluster named `want` among a CDS response's `resources`: `Ok(None)` when the response
/// does not carry it (the control plane removed it).
pub(crate) fn cluster(resources: &[Any], want: &str) -> Result<Option<ClusterInfo>, String> {
    for any in resources {
        if any.type_url != CLUSTER {
            return Err(format!("a {} in a Cluster response", any.type_url));
        }
        let c = Cluster::decode(&*any.value)
            .map_err(|e| format!("a Cluster that does not decode: {e}"))?;
        if c.name == want {
            return check_cluster(&c).map(Some);
        }
    }
    Ok(None)
}

fn check_cluster(c: &Cluster) -> Result<ClusterInfo, String> {
    let name = &c.name;
    let policy = LbPolicy::try_from(c.lb_policy)
        .map_err(|_| format!("cluster {name}: unknown lb_policy {}", c.lb_policy))?
        .as_str_name();
    let kind = match c.cluster_discovery_type {
        Some(ClusterDiscoveryType::Type(t)) => DiscoveryType::try_from(t)
            .map_err(|_| format!("cluster {name}: unknown discovery type {t}"))?,
        Some(ClusterDiscoveryType::ClusterType(_)) => {
            return Err(format!(
                "cluster {name}: a custom cluster type (lbkit follows EDS and STATIC clusters)"
            ));
        }
        None => DiscoveryType::Static,
    };
    let endpoints = match kind {
        DiscoveryType::Eds => Endpoints::Eds(eds_name(c)?),
        DiscoveryType::Static => {
            let cla = c
                .load_assignment
                .as_ref()
                .ok_or_else(|| format!("cluster {name}: STATIC without a load_assignment"))?;
            Endpoints::Inline(specs(cla)?)
        }
        other => {
            return Err(format!(
                "cluster {name}: type {} (lbkit follows EDS and STATIC clusters)",
                other.as_str_name()
            ))
        }
    };
    Ok(ClusterInfo { endpoints, policy })
}

/// The EDS name of an EDS cluster whose endpoints come over the same ADS stream.
fn eds_name(c: &Cluster) -> Result<String, String> {
    let eds = c.eds_cluster_config.as_ref();
    let source = eds.and_then(|e| e.eds_config.as_ref());
    match source.and_then(|s| s.config_source_specifier.as_ref()) {
        None | Some(ConfigSourceSpecifier::Ads(_)) | Some(ConfigSourceSpecifier::Self_(_)) => {}
        Some(_) => {
            return Err(format!(
            "cluster {}: eds_config is not ads (lbkit takes endpoints over the same ADS stream)",
            c.name
        ))
        }
    }
    let service = eds.map(|e| e.service_name.as_str()).unwrap_or_default();
    Ok(if service.is_empty() {
        c.name.clone()
    } else {
        service.to_owned()
    })
}

/// The ClusterLoadAssignment named `want` among an EDS response's `resources`, as specs;
/// `Ok(None)` when the response does not carry it. An assignment for a name this stream asked
/// for before (`asked`: a response still in flight when the cluster's EDS name changed) is
/// passed over; one for a cluster it never asked for is rejected.
pub(crate) fn endpoints(
    resources: &[Any],
    want: &str,
    asked: &HashSet<String>,
) -> Result<Option<Vec<EndpointSpec>>, String> {
    let mut found = None;
    for any in resources {
        if any.type_url != ENDPOINTS {
            return Err(format!(
                "a {} in a ClusterLoadAssignment response",
                any.type_url
            ));
        }
        let cla = ClusterLoadAssignment::decode(&*any.value)
            .map_err(|e| format!("a ClusterLoadAssignment that does not decode: {e}"))?;
        if cla.cluster_name == want {
            found = Some(specs(&cla)?);
        } else if !asked.contains(&cla.cluster_name) {
            return Err(format!(
                "a ClusterLoadAssignment for unknown cluster {:?} (asked for {want:?})",
                cla.cluster_name
            ));
        }
    }
    Ok(found)
}

/// An assignment's endpoints as specs: address, weight, health, zone (and region and
/// sub-zone as metadata), priority.
pub(crate) fn specs(cla: &ClusterLoadAssignment) -> Result<Vec<EndpointSpec>, String> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for group in &cla.endpoints {
        let mut sum = 0u64;
        for e in &group.lb_endpoints {
            let spec =
                spec(e, group).map_err(|why| format!("cluster {}: {why}", cla.cluster_name))?;
            sum += u64::from(spec.weight.max(1));
            if !seen.insert(spec.address.clone()) {
                return Err(format!(
                    "cluster {}: endpoint {} listed twice",
                    cla.cluster_name, spec.address
                ));
            }
            out.push(spec);
        }
        if sum > u64::from(u32::MAX) {
            return Err(format!(
                "cluster {}: the weights of locality {:?} sum to {sum}, above 4294967295",
                cla.cluster_name,
                group
                    .locality
                    .as_ref()
                    .map(|l| l.zone.as_str())
                    .unwrap_or_default()
            ));
        }
    }
    Ok(out)
}

fn spec(e: &LbEndpoint, group: &LocalityLbEndpoints) -> Result<EndpointSpec, String> {
    let Some(HostIdentifier::Endpoint(endpoint)) = &e.host_identifier else {
        return Err("an endpoint without an address (named endpoints are not followed)".into());
    };
    let socket = match endpoint.address.as_ref().and_then(|a| a.address.as_ref()) {
        Some(address::Address::SocketAddress(s)) => s,
        _ => return Err("an endpoint without a socket address".into()),
    };
    let port = match socket.port_specifier {
        Some(PortSpecifier::PortValue(p)) if (1..=65_535).contains(&p) => p,
        _ => return Err(format!("endpoint {}: no port in 1..=65535", socket.address)),
    };
    let address = if socket.address.contains(':') {
        format!("[{}]:{port}", socket.address)
    } else {
        format!("{}:{port}", socket.address)
    };
    crate::check_address(&address)?;
    let weight = match e.load_balancing_weight {
        Some(w) if w.value == 0 => {
            return Err(format!("endpoint {address}: weight 0 (at least 1)"))
        }
        Some(w) => w.value,
        None => 1,
    };
    let health = HealthStatus::try_from(e.health_status).unwrap_or(HealthStatus::Unknown);
    let mut spec = EndpointSpec::new(address)
        .with_weight(if health == HealthStatus::Draining {
            0
        } else {
            weight
        })
        .with_healthy(!matches!(
            health,
            HealthStatus::Unhealthy | HealthStatus::Timeout
        ))
        .with_priority(group.priority);
    if !matches!(health, HealthStatus::Healthy | HealthStatus::Unknown) {
        spec = spec.with_meta("xds.health", health.as_str_name());
    }
    if let Some(l) = &group.locality {
        if !l.zone.is_empty() {
            spec = spec.with_zone(l.zone.clone());
        }
        for (key, value) in [("xds.region", &l.region), ("xds.sub_zone", &l.sub_zone)] {
            if !value.is_empty() {
                spec = spec.with_meta(key, value.clone());
            }
        }
    }
    Ok(spec)
}
