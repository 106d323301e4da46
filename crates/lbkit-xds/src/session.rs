//! One ADS stream's state of the world, as a state machine without I/O: what the client
//! subscribed to per type, what it was last sent (each resource's version), and the nonce its
//! next ACK or NACK must carry. [`Session::on_request`] takes a client's request and
//! [`Session::on_change`] a cache change; both return the responses to send.
//!
//! The rules are the xDS protocol's for state of the world:
//! - Listener and Cluster: an empty first request subscribes to every resource (wildcard);
//!   each response carries every subscribed resource, so a removal is a response without it.
//! - ClusterLoadAssignment: by name only; a response carries only the assignments that
//!   changed since this stream last got them (a change of one service's endpoints sends one).
//! - A request whose `response_nonce` is not the latest one sent for its type is stale and
//!   ignored; one with `error_detail` is a NACK (the client kept its previous resources; the
//!   same resources are not sent again, the next change is).
//! - A client that reconnects starts a new session and gets the current state.

use std::collections::{BTreeSet, HashMap};

use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};

use crate::cache::{Kind, State};

/// What a type is subscribed to.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Subscription {
    /// Every resource of the type (Listener and Cluster only).
    All,
    /// These names.
    Names(BTreeSet<String>),
}

impl Subscription {
    fn of(kind: Kind, names: &[String], before: Option<&Subscription>) -> Subscription {
        let legacy_wildcard = kind.whole() && names.is_empty() && before.is_none();
        if legacy_wildcard || (kind.whole() && names.iter().any(|n| n == "*")) {
            return Subscription::All;
        }
        if kind.whole() && names.is_empty() && before == Some(&Subscription::All) {
            return Subscription::All;
        }
        Subscription::Names(names.iter().filter(|n| *n != "*").cloned().collect())
    }

    fn covers(&self, name: &str) -> bool {
        match self {
            Subscription::All => true,
            Subscription::Names(names) => names.contains(name),
        }
    }
}

#[derive(Debug, Default)]
struct TypeState {
    subscription: Option<Subscription>,
    /// Version of each resource as last sent.
    sent: HashMap<String, u64>,
    /// The latest nonce sent.
    nonce: Option<String>,
}

/// What a request amounted to.
#[derive(Debug)]
pub struct Reply<R = DiscoveryResponse> {
    /// The response to send, if any.
    pub response: Option<R>,
    /// The request was a NACK: its type and `error_detail` message.
    pub nack: Option<(Kind, String)>,
    /// The request was for a type this server does not serve.
    pub unknown_type: bool,
    /// The request carried a nonce other than the latest: ignored.
    pub stale: bool,
}

impl<R> Default for Reply<R> {
    fn default() -> Self {
        Reply {
            response: None,
            nack: None,
            unknown_type: false,
            stale: false,
        }
    }
}

impl<R> Reply<R> {
    /// A request for a type not served.
    pub(crate) fn unknown() -> Self {
        Reply {
            unknown_type: true,
            ..Reply::default()
        }
    }

    /// A request whose nonce is not the latest.
    pub(crate) fn stale() -> Self {
        Reply {
            stale: true,
            ..Reply::default()
        }
    }
}

/// Whether a request carrying `nonce` answers an older response than the latest sent for its
/// type (`latest`): such a request is ignored. A request without a nonce, or one that comes
/// before anything was sent, is not stale.
pub(crate) fn is_stale(nonce: &str, latest: Option<&String>) -> bool {
    !nonce.is_empty() && latest.is_some_and(|l| l != nonce)
}

/// The NACK a request carries, if any: its type and `error_detail` message.
pub(crate) fn nack_of(
    kind: Kind,
    error: Option<&envoy_types::pb::google::rpc::Status>,
) -> Option<(Kind, String)> {
    error.map(|status| (kind, status.message.clone()))
}

/// One stream's state.
#[derive(Debug, Default)]
pub struct Session {
    types: [TypeState; 3],
    nonces: u64,
}

impl Session {
    /// A new stream: nothing subscribed, nothing sent.
    pub fn new() -> Self {
        Session::default()
    }

    /// A request from the client.
    pub fn on_request(&mut self, request: &DiscoveryRequest, state: &State) -> Reply {
        let Some(kind) = Kind::of(&request.type_url) else {
            return Reply::unknown();
        };
        let ts = &mut self.types[kind as usize];
        if is_stale(&request.response_nonce, ts.nonce.as_ref()) {
            return Reply::stale();
        }
        let nack = nack_of(kind, request.error_detail.as_ref());
        let wanted = Subscription::of(kind, &request.resource_names, ts.subscription.as_ref());
        if ts.subscription.as_ref() == Some(&wanted) {
            return Reply {
                nack,
                ..Reply::default()
            };
        }
        // A first request, or Listener/Cluster names added, is answered even when nothing
        // changed (the whole list says what exists: a client waits for no timer).
        let force = match (&ts.subscription, &wanted) {
            (None, _) => true,
            (Some(Subscription::Names(had)), Subscription::Names(now)) => {
                kind.whole() && !now.is_subset(had)
            }
            (Some(Subscription::Names(_)), Subscription::All) => true,
            (Some(Subscription::All), _) => false,
        };
        ts.sent.retain(|name, _| wanted.covers(name));
        ts.subscription = Some(wanted);
        Reply {
            response: self.respond(kind, state, force),
            nack,
            ..Reply::default()
        }
    }

    /// The cache changed: what each subscribed type must now be sent.
    pub fn on_change(&mut self, state: &State) -> Vec<DiscoveryResponse> {
        Kind::ALL
            .into_iter()
            .filter_map(|kind| self.respond(kind, state, false))
            .collect()
    }

    /// The response for `kind`, if it has anything to say (`force`: a first request, which
    /// gets an answer even when empty).
    fn respond(&mut self, kind: Kind, state: &State, force: bool) -> Option<DiscoveryResponse> {
        let ts = &mut self.types[kind as usize];
        let subscription = ts.subscription.as_ref()?;
        let matched: Vec<_> = state
            .resources(kind)
            .iter()
            .filter(|(name, _)| subscription.covers(name))
            .collect();
        let fresh = |(name, entry): &(&String, &std::sync::Arc<crate::cache::Entry>)| {
            ts.sent.get(*name) != Some(&entry.version)
        };
        let send: Vec<_> = if kind.whole() {
            let removed = ts
                .sent
                .keys()
                .any(|n| !state.resources(kind).contains_key(n));
            let changed = force || removed || matched.iter().any(fresh);
            if !changed {
                return None;
            }
            ts.sent.clear();
            matched
        } else {
            let send: Vec<_> = matched.into_iter().filter(|m| fresh(m)).collect();
            if send.is_empty() && !force {
                return None;
            }
            send
        };
        for (name, entry) in &send {
            ts.sent.insert((*name).clone(), entry.version);
        }
        self.nonces += 1;
        let nonce = self.nonces.to_string();
        ts.nonce = Some(nonce.clone());
        Some(DiscoveryResponse {
            version_info: state.version.to_string(),
            resources: send.iter().map(|(_, e)| e.resource.clone()).collect(),
            type_url: kind.type_url().to_owned(),
            nonce,
            ..DiscoveryResponse::default()
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::cache::Cache;
    use crate::resources::{self, CLUSTER, ENDPOINTS};
    use envoy_types::pb::google::rpc::Status;
    use lbkit_core::{EndpointSpec, Snapshot, Timestamp};
    use lbkit_proxy::config::ServiceConfig;

    fn config() -> ServiceConfig {
        let text = "[service.x]\nendpoints = [\"127.0.0.1:1\"]\n";
        let path = std::path::Path::new("t.toml");
        crate::XdsConfig::parse(text, path).unwrap().services["x"].clone()
    }

    /// Set service `name` to endpoints `addrs` in `cache`.
    pub(crate) fn set(cache: &Cache, name: &str, addrs: &[&str]) {
        let specs = addrs.iter().map(|a| EndpointSpec::new(*a)).collect();
        let snapshot = Snapshot::from_specs(specs, Timestamp::ZERO);
        cache.set(name, &resources::service(name, &config(), &snapshot).0);
    }

    fn request(type_url: &str, names: &[&str], nonce: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            type_url: type_url.to_owned(),
            resource_names: names.iter().map(|n| (*n).to_owned()).collect(),
            response_nonce: nonce.to_owned(),
            ..DiscoveryRequest::default()
        }
    }

    fn names(response: &DiscoveryResponse) -> Vec<String> {
        use prost::Message as _;
        response
            .resources
            .iter()
            .map(|any| match any.type_url.as_str() {
                CLUSTER => {
                    envoy_types::pb::envoy::config::cluster::v3::Cluster::decode(&*any.value)
                        .unwrap()
                        .name
                }
                _ => {
                    envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment::decode(
                        &*any.value,
                    )
                    .unwrap()
                    .cluster_name
                }
            })
            .collect()
    }

    #[test]
    fn clusters_are_a_wildcard_whole_list_and_a_removal_is_a_list_without_it() {
        let cache = Cache::new();
        set(&cache, "a", &["127.0.0.1:1"]);
        set(&cache, "b", &["127.0.0.1:2"]);
        let mut s = Session::new();
        let first = s.on_request(&request(CLUSTER, &[], ""), &cache.state());
        let sent = first.response.expect("a first answer");
        assert_eq!(names(&sent), ["a", "b"]);
        // The ACK asks for nothing new: no answer.
        let ack = s.on_request(&request(CLUSTER, &[], &sent.nonce), &cache.state());
        assert!(ack.response.is_none() && ack.nack.is_none() && !ack.stale);
        // Endpoints of a change: the clusters are the same bytes, nothing to send.
        set(&cache, "a", &["127.0.0.1:3"]);
        assert!(s.on_change(&cache.state()).is_empty());
        // A new service: the whole list again.
        set(&cache, "c", &["127.0.0.1:4"]);
        let pushed = s.on_change(&cache.state());
        assert_eq!(pushed.len(), 1);
        assert_eq!(names(&pushed[0]), ["a", "b", "c"]);
        cache.remove("b");
        let pushed = s.on_change(&cache.state());
        assert_eq!(names(&pushed[0]), ["a", "c"]);
        assert_eq!(pushed[0].version_info, cache.state().version.to_string());
    }

    #[test]
    fn endpoints_go_by_name_and_only_the_changed_ones_are_sent() {
        let cache = Cache::new();
        set(&cache, "a", &["127.0.0.1:1"]);
        set(&cache, "b", &["127.0.0.1:2"]);
        let mut s = Session::new();
        // An empty EDS request subscribes to nothing (no wildcard for endpoints).
        let none = s.on_request(&request(ENDPOINTS, &[], ""), &cache.state());
        assert_eq!(
            names(&none.response.expect("a first answer")),
            Vec::<String>::new()
        );
        let both = s.on_request(&request(ENDPOINTS, &["a", "b"], ""), &cache.state());
        let sent = both.response.expect("the two");
        assert_eq!(names(&sent), ["a", "b"]);
        set(&cache, "a", &["127.0.0.1:1", "127.0.0.1:9"]);
        let pushed = s.on_change(&cache.state());
        assert_eq!(pushed.len(), 1);
        assert_eq!(names(&pushed[0]), ["a"], "only the changed assignment");
        // An ACK of the older response is stale: ignored.
        let stale = s.on_request(
            &request(ENDPOINTS, &["a", "b"], &sent.nonce),
            &cache.state(),
        );
        assert!(stale.stale && stale.response.is_none());
        // Unsubscribe from b, then again: b is sent again.
        let nonce = pushed[0].nonce.clone();
        let only_a = s.on_request(&request(ENDPOINTS, &["a"], &nonce), &cache.state());
        assert!(only_a.response.is_none(), "a is current: nothing to send");
        let again = s.on_request(&request(ENDPOINTS, &["a", "b"], &nonce), &cache.state());
        assert_eq!(names(&again.response.expect("b again")), ["b"]);
    }

    #[test]
    fn a_nack_is_reported_and_the_same_resources_are_not_sent_again() {
        let cache = Cache::new();
        set(&cache, "a", &["127.0.0.1:1"]);
        let mut s = Session::new();
        let sent = s
            .on_request(&request(ENDPOINTS, &["a"], ""), &cache.state())
            .response
            .expect("a");
        let mut nack = request(ENDPOINTS, &["a"], &sent.nonce);
        nack.error_detail = Some(Status {
            code: 3,
            message: "weights out of range".to_owned(),
            details: Vec::new(),
        });
        let reply = s.on_request(&nack, &cache.state());
        assert_eq!(
            reply.nack,
            Some((Kind::Endpoints, "weights out of range".to_owned()))
        );
        assert!(reply.response.is_none());
        assert!(s.on_change(&cache.state()).is_empty());
        // The next change is sent.
        set(&cache, "a", &["127.0.0.1:2"]);
        assert_eq!(s.on_change(&cache.state()).len(), 1);
    }

    #[test]
    fn other_types_are_flagged_and_a_new_stream_gets_the_current_state() {
        let cache = Cache::new();
        set(&cache, "a", &["127.0.0.1:1"]);
        let mut s = Session::new();
        let secret = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
        assert!(
            s.on_request(&request(secret, &[], ""), &cache.state())
                .unknown_type
        );
        let first = s.on_request(&request(ENDPOINTS, &["a"], ""), &cache.state());
        set(&cache, "a", &["127.0.0.1:2"]);
        let mut reconnected = Session::new();
        let fresh = reconnected.on_request(&request(ENDPOINTS, &["a"], ""), &cache.state());
        let (first, fresh) = (first.response.unwrap(), fresh.response.unwrap());
        assert_ne!(
            first.resources, fresh.resources,
            "the current assignment, not the first"
        );
        assert_eq!(fresh.version_info, cache.state().version.to_string());
    }

    #[test]
    fn a_listener_name_added_is_answered_and_a_first_request_may_carry_a_nonce() {
        use crate::resources::LISTENER;
        let cache = Cache::new();
        set(&cache, "a", &["127.0.0.1:1"]);
        let mut s = Session::new();
        let first = s.on_request(&request(LISTENER, &["a"], "from-before"), &cache.state());
        assert!(!first.stale, "nothing was sent yet: no nonce is stale");
        let first = first.response.expect("a");
        // A second channel: `a` and `other`, which does not exist. The whole list answers at
        // once (a gRPC client would otherwise wait out its does-not-exist timer).
        let more = s.on_request(
            &request(LISTENER, &["a", "other"], &first.nonce),
            &cache.state(),
        );
        let more = more.response.expect("answered although nothing changed");
        assert_eq!(more.resources.len(), 1);
    }
}
