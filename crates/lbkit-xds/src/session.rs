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
use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};

use crate::cache::{Entry, Kind, State};

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
    /// The names of the request that set the subscription, as the client listed them: an ACK
    /// repeating them changes nothing, and is known without building a set.
    asked: Vec<String>,
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
    /// The cache version of the last change handled ([`Session::on_change`]).
    seen: u64,
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
        let unchanged = || Reply {
            nack: nack.clone(),
            ..Reply::default()
        };
        if ts.subscription.is_some() && request.resource_names == ts.asked {
            return unchanged();
        }
        let wanted = Subscription::of(kind, &request.resource_names, ts.subscription.as_ref());
        ts.asked.clone_from(&request.resource_names);
        if ts.subscription.as_ref() == Some(&wanted) {
            return unchanged();
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
            response: self.respond(kind, state, force, None),
            nack,
            ..Reply::default()
        }
    }

    /// The cache changed: what each subscribed type must now be sent. Only the resources
    /// changed since the last call are looked at when the cache's log reaches back that far
    /// (a type with none is passed over; Listener and Cluster responses still list all).
    pub fn on_change(&mut self, state: &State) -> Vec<DiscoveryResponse> {
        let since = std::mem::replace(&mut self.seen, state.version);
        Kind::ALL
            .into_iter()
            .filter_map(|kind| match state.changed_since(since, kind) {
                Some(names) if names.is_empty() => None,
                Some(names) if !kind.whole() => self.respond(kind, state, false, Some(&names)),
                _ => self.respond(kind, state, false, None),
            })
            .collect()
    }

    /// The response for `kind`, if it has anything to say (`force`: a first request, which
    /// gets an answer even when empty). `only`: the resources to look at (sorted), when not
    /// all of them may have changed.
    fn respond(
        &mut self,
        kind: Kind,
        state: &State,
        force: bool,
        only: Option<&[&str]>,
    ) -> Option<DiscoveryResponse> {
        let ts = &mut self.types[kind as usize];
        let subscription = ts.subscription.as_ref()?;
        let held = state.resources(kind);
        let covered = |(name, _): &(&String, &Arc<Entry>)| subscription.covers(name);
        let matched: Vec<_> = match only {
            None => held.iter().filter(covered).collect(),
            Some(names) => names
                .iter()
                .filter_map(|n| held.get_key_value(*n))
                .filter(covered)
                .collect(),
        };
        let fresh =
            |(name, entry): &(&String, &Arc<Entry>)| ts.sent.get(*name) != Some(&entry.version);
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
        cache.set(name, &resources::service(name, &config(), &[], &snapshot).0);
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

    /// What a change-log stream and a look-at-everything stream do over one history.
    #[derive(Clone, Debug)]
    enum Op {
        Set(usize, usize),
        Remove(usize),
        Wake,
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            3 => (0..6usize, 0..3usize).prop_map(|(s, v)| Op::Set(s, v)),
            1 => (0..6usize).prop_map(Op::Remove),
            2 => Just(Op::Wake),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config {
            cases: 64,
            rng_seed: proptest::test_runner::RngSeed::Fixed(0x6c6f_6773),
            ..proptest::test_runner::Config::default()
        })]

        /// Looking only at the logged changes sends exactly what looking at every resource
        /// sends, in both protocols.
        #[test]
        fn the_change_log_sends_what_a_full_look_sends(ops in proptest::collection::vec(op(), 1..40)) {
            use crate::delta::DeltaSession;
            use crate::resources::LISTENER;
            use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
            let cache = Cache::new();
            let (mut logged, mut full) = (Session::new(), Session::new());
            let (mut dlogged, mut dfull) = (DeltaSession::new(), DeltaSession::new());
            let state = cache.state();
            for kind in [LISTENER, CLUSTER] {
                logged.on_request(&request(kind, &[], ""), &state);
                full.on_request(&request(kind, &[], ""), &state);
            }
            let eds = request(ENDPOINTS, &["s0", "s1", "s2", "s4"], "");
            logged.on_request(&eds, &state);
            full.on_request(&eds, &state);
            for kind in [LISTENER, CLUSTER, ENDPOINTS] {
                let r = DeltaDiscoveryRequest {
                    type_url: kind.to_owned(),
                    resource_names_subscribe: vec!["*".to_owned()],
                    ..DeltaDiscoveryRequest::default()
                };
                dlogged.on_request(&r, &state);
                dfull.on_request(&r, &state);
            }
            for op in ops {
                match op {
                    Op::Set(s, v) => set(&cache, &format!("s{s}"), &[&format!("127.0.0.1:{}", v + 1)]),
                    Op::Remove(s) => { cache.remove(&format!("s{s}")); }
                    Op::Wake => {
                        let state = cache.state();
                        proptest::prop_assert_eq!(logged.on_change(&state), full.on_change(&state.without_log()));
                        proptest::prop_assert_eq!(dlogged.on_change(&state), dfull.on_change(&state.without_log()));
                    }
                }
            }
        }
    }
}
