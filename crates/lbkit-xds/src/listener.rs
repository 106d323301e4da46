//! The Listener NAME for proxyless gRPC (`xds:///NAME`): an API listener carrying an HTTP
//! connection manager whose inline route configuration sends requests to cluster NAME, through
//! the router filter — by the `[[route]]`s to service NAME when the file has some (each one's
//! path prefix, and its `hash_key` as the route's `hash_policy`, which a hashing cluster needs:
//! without one, gRPC and Envoy hash every request at random), then every other request.

use envoy_types::pb::envoy::config::listener::v3::{ApiListener, Listener};
use envoy_types::pb::envoy::config::route::v3::route_action::{hash_policy, HashPolicy};
use envoy_types::pb::envoy::config::route::v3::{
    route, route_action, route_match, Route, RouteAction, RouteConfiguration, RouteMatch,
    VirtualHost,
};
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager, http_filter, HttpConnectionManager, HttpFilter,
};
use envoy_types::util::pack_any;
use lbkit_strategy::hash::KeyExtractor;

/// A route of the Listener NAME: requests whose path starts with `prefix` go to cluster NAME,
/// hashed by `hash` when the cluster hashes (ring hash, Maglev).
#[derive(Clone, Debug, PartialEq)]
pub struct ListenerRoute {
    /// The path prefix (`[[route]]`'s `path_prefix`).
    pub prefix: String,
    /// The hash key (`[[route]]`'s `hash_key`).
    pub hash: Option<KeyExtractor>,
}

/// The route's `hash_policy` for `key`, or `None` where xDS has no way to say it (RPC
/// arguments). Headers reach Envoy and gRPC alike; cookies, query parameters and the source
/// address reach Envoy only (gRPC's ring hash reads headers: gRFC A42); `path` and `uri` hash
/// the `:path` pseudo-header, which Envoy reads with its query (so `path` hashes the query too).
///
/// ```
/// use lbkit_xds::resources::hash_policy;
/// let p = hash_policy(&"header:x-user".parse().unwrap()).unwrap();
/// assert!(format!("{p:?}").contains("x-user"));
/// assert!(hash_policy(&"arg:0".parse().unwrap()).is_none());
/// ```
pub fn hash_policy(key: &KeyExtractor) -> Option<HashPolicy> {
    use hash_policy::PolicySpecifier as P;
    let header = |name: &str| {
        P::Header(hash_policy::Header {
            header_name: name.to_owned(),
            ..hash_policy::Header::default()
        })
    };
    let specifier = match key {
        KeyExtractor::Header(name) => header(name),
        KeyExtractor::Path | KeyExtractor::Uri => header(":path"),
        KeyExtractor::Cookie(name) => P::Cookie(hash_policy::Cookie {
            name: name.clone(),
            ..hash_policy::Cookie::default()
        }),
        KeyExtractor::Query(name) => {
            P::QueryParameter(hash_policy::QueryParameter { name: name.clone() })
        }
        KeyExtractor::SourceIp => {
            P::ConnectionProperties(hash_policy::ConnectionProperties { source_ip: true })
        }
        KeyExtractor::RpcArgument(_) | KeyExtractor::RpcArguments(_) => return None,
    };
    Some(HashPolicy {
        policy_specifier: Some(specifier),
        terminal: false,
    })
}

/// A route of every request starting with `prefix` to cluster `name`, hashed by `hash`.
fn route_to(name: &str, prefix: &str, hash: Option<&KeyExtractor>) -> Route {
    Route {
        r#match: Some(RouteMatch {
            path_specifier: Some(route_match::PathSpecifier::Prefix(prefix.to_owned())),
            ..RouteMatch::default()
        }),
        action: Some(route::Action::Route(RouteAction {
            cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(name.to_owned())),
            hash_policy: hash.and_then(hash_policy).into_iter().collect(),
            ..RouteAction::default()
        })),
        ..Route::default()
    }
}

/// The Listener NAME: `routes` in order, then one for every other request.
pub fn listener(name: &str, routes: &[ListenerRoute]) -> Listener {
    let routes = routes
        .iter()
        .map(|r| route_to(name, &r.prefix, r.hash.as_ref()))
        .chain([route_to(name, "", None)])
        .collect();
    let routes = RouteConfiguration {
        name: name.to_owned(),
        virtual_hosts: vec![VirtualHost {
            name: name.to_owned(),
            domains: vec!["*".to_owned()],
            routes,
            ..VirtualHost::default()
        }],
        ..RouteConfiguration::default()
    };
    let hcm = HttpConnectionManager {
        stat_prefix: name.to_owned(),
        route_specifier: Some(http_connection_manager::RouteSpecifier::RouteConfig(routes)),
        http_filters: vec![HttpFilter {
            name: "envoy.filters.http.router".to_owned(),
            config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(
                Router::default(),
            ))),
            ..HttpFilter::default()
        }],
        ..HttpConnectionManager::default()
    };
    Listener {
        name: name.to_owned(),
        api_listener: Some(ApiListener {
            api_listener: Some(pack_any(hcm)),
        }),
        ..Listener::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    /// The routes of the Listener's inline route configuration, as `(prefix, hash policies)`.
    fn routes(l: &Listener) -> Vec<(String, usize)> {
        let any = l
            .api_listener
            .as_ref()
            .unwrap()
            .api_listener
            .as_ref()
            .unwrap();
        let hcm = HttpConnectionManager::decode(&*any.value).unwrap();
        let Some(http_connection_manager::RouteSpecifier::RouteConfig(rc)) = hcm.route_specifier
        else {
            panic!("an inline route configuration");
        };
        rc.virtual_hosts[0]
            .routes
            .iter()
            .map(|r| {
                let Some(route_match::PathSpecifier::Prefix(p)) =
                    r.r#match.as_ref().unwrap().path_specifier.clone()
                else {
                    panic!("a prefix")
                };
                let Some(route::Action::Route(a)) = &r.action else {
                    panic!("a route action")
                };
                (p, a.hash_policy.len())
            })
            .collect()
    }

    #[test]
    fn routes_come_in_file_order_then_every_other_request() {
        assert_eq!(routes(&listener("web", &[])), vec![(String::new(), 0)]);
        let given = [
            ListenerRoute {
                prefix: "/pkg.Users/".into(),
                hash: Some("header:x-user".parse().unwrap()),
            },
            ListenerRoute {
                prefix: "/".into(),
                hash: Some("arg:0".parse().unwrap()),
            },
        ];
        assert_eq!(
            routes(&listener("web", &given)),
            vec![
                ("/pkg.Users/".to_owned(), 1),
                ("/".to_owned(), 0),
                (String::new(), 0)
            ]
        );
    }
}
