//! One incremental (delta) ADS stream's state, as a state machine without I/O: what the client
//! subscribed to per type, the version of each resource it has, and the nonce its next ACK or
//! NACK must carry. Every response carries only what changed: the resources whose version the
//! client does not have, and the names of those that are gone (`removed_resources`), for every
//! type alike — a change of one cluster sends one Cluster, not all of them.
//!
//! The rules are the xDS protocol's for the incremental variants:
//! - Listener and Cluster: a first request that subscribes to nothing subscribes to everything
//!   (the legacy wildcard); `*` subscribes to everything, unsubscribing `*` stops that.
//! - `initial_resource_versions` (a client that reconnects) says what it already has: only
//!   what differs is sent.
//! - A name subscribed to that does not exist is answered in `removed_resources`, so a client
//!   knows it does not exist instead of waiting for it.
//! - Versions are hashes of the resources' bytes, so a client that reconnects to a restarted
//!   server is not sent what it already has, and never kept on a stale resource by a version
//!   number that happens to match.
//! - A stale nonce voids only the ACK or NACK it carries: the subscription changes on the same
//!   request count (a client sends them once).
//! - NACKs as in the state-of-the-world [`Session`](crate::session::Session).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource,
};

use crate::cache::{Entry, Kind, State};
use crate::session::{is_stale, nack_of, Reply};

/// Most names one stream may subscribe to by name, per type: a client cannot make the server
/// hold an unbounded set (what is served is the configured services, far fewer).
pub const MAX_NAMES: usize = 100_000;

#[derive(Debug, Default)]
struct TypeState {
    /// Subscribed to every resource of the type.
    wildcard: bool,
    /// Subscribed by name.
    names: BTreeSet<String>,
    /// Version (content hash) of each resource the client has.
    has: HashMap<String, u64>,
    /// The latest nonce sent.
    nonce: Option<String>,
    /// Whether the client has asked for this type yet.
    started: bool,
}

impl TypeState {
    /// What the client lacks of `held` (covered resources at another version than it has)
    /// and the names it has that are gone, among `only` when given.
    fn differences(
        &self,
        held: &BTreeMap<String, Arc<Entry>>,
        only: Option<&[&str]>,
    ) -> (Vec<Resource>, Vec<String>) {
        let lacks = |(name, e): &(&String, &Arc<Entry>)| {
            self.covers(name) && self.has.get(*name) != Some(&e.hash)
        };
        let resource = |(name, e): (&String, &Arc<Entry>)| Resource {
            name: name.clone(),
            version: format!("{:016x}", e.hash),
            resource: Some(e.resource.clone()),
            ..Resource::default()
        };
        let gone = |n: &&&str| self.has.contains_key(**n) && !held.contains_key(**n);
        match only {
            None => (
                held.iter().filter(lacks).map(resource).collect(),
                self.has
                    .keys()
                    .filter(|n| !held.contains_key(*n))
                    .cloned()
                    .collect(),
            ),
            Some(names) => (
                names
                    .iter()
                    .filter_map(|n| held.get_key_value(*n))
                    .filter(lacks)
                    .map(resource)
                    .collect(),
                names.iter().filter(gone).map(|n| (*n).to_owned()).collect(),
            ),
        }
    }

    fn covers(&self, name: &str) -> bool {
        self.wildcard || self.names.contains(name)
    }

    /// Take the request's subscription changes; the names newly subscribed to by name.
    fn subscribe(&mut self, kind: Kind, request: &DeltaDiscoveryRequest) -> Vec<String> {
        if !self.started {
            self.started = true;
            self.wildcard = kind.whole() && request.resource_names_subscribe.is_empty();
            for (name, version) in &request.initial_resource_versions {
                if let Ok(v) = u64::from_str_radix(version, 16) {
                    self.has.insert(name.clone(), v);
                }
            }
        }
        let mut added = Vec::new();
        for name in &request.resource_names_subscribe {
            if name == "*" {
                self.wildcard = true;
            } else if self.names.len() < MAX_NAMES && self.names.insert(name.clone()) {
                added.push(name.clone());
            }
        }
        for name in &request.resource_names_unsubscribe {
            if name == "*" {
                self.wildcard = false;
            } else {
                self.names.remove(name);
            }
        }
        let (wildcard, names) = (self.wildcard, &self.names);
        self.has.retain(|n, _| wildcard || names.contains(n));
        added
    }
}

/// One incremental stream's state.
#[derive(Debug, Default)]
pub struct DeltaSession {
    types: [TypeState; 3],
    nonces: u64,
    /// The cache version of the last change handled ([`DeltaSession::on_change`]).
    seen: u64,
}

impl DeltaSession {
    /// A new stream: nothing subscribed, nothing sent.
    pub fn new() -> Self {
        DeltaSession::default()
    }

    /// A request from the client.
    pub fn on_request(
        &mut self,
        request: &DeltaDiscoveryRequest,
        state: &State,
    ) -> Reply<DeltaDiscoveryResponse> {
        let Some(kind) = Kind::of(&request.type_url) else {
            return Reply::unknown();
        };
        let ts = &mut self.types[kind as usize];
        // The subscription changes count whatever the nonce: a client does not send them
        // again (Envoy puts them on its ACKs). A stale nonce only voids the ACK or NACK.
        let stale = is_stale(&request.response_nonce, ts.nonce.as_ref());
        let nack = nack_of(kind, request.error_detail.as_ref()).filter(|_| !stale);
        let plain_ack = ts.started
            && request.resource_names_subscribe.is_empty()
            && request.resource_names_unsubscribe.is_empty();
        if plain_ack {
            // Nothing to look at: what changed since the last push, the next change's push
            // sends (the request left the change unseen). An ACK costs O(1), not O(resources).
            return Reply {
                nack,
                stale,
                ..Reply::default()
            };
        }
        let first = !ts.started;
        let added = ts.subscribe(kind, request);
        let missing: Vec<String> = added
            .into_iter()
            .filter(|n| !state.resources(kind).contains_key(n))
            .collect();
        Reply {
            response: self.respond(kind, state, first, missing, None),
            nack,
            stale,
            ..Reply::default()
        }
    }

    /// The cache changed: what each subscribed type must now be sent. Only the resources
    /// changed since the last call are looked at, when the cache's log reaches back that far.
    pub fn on_change(&mut self, state: &State) -> Vec<DeltaDiscoveryResponse> {
        let since = std::mem::replace(&mut self.seen, state.version);
        Kind::ALL
            .into_iter()
            .filter_map(|kind| match state.changed_since(since, kind) {
                Some(names) if names.is_empty() => None,
                only => self.respond(kind, state, false, Vec::new(), only.as_deref()),
            })
            .collect()
    }

    /// The response for `kind`: the covered resources the client does not have at their
    /// version, and the names gone (`removed` adds names subscribed to that do not exist).
    /// `force`: a first request, answered even when there is nothing to say. `only`: the
    /// resources to look at, when not all of them may have changed.
    fn respond(
        &mut self,
        kind: Kind,
        state: &State,
        force: bool,
        mut removed: Vec<String>,
        only: Option<&[&str]>,
    ) -> Option<DeltaDiscoveryResponse> {
        let ts = &mut self.types[kind as usize];
        if !ts.started {
            return None;
        }
        let held = state.resources(kind);
        let (resources, gone) = ts.differences(held, only);
        for name in &gone {
            ts.has.remove(name);
        }
        removed.extend(gone);
        removed.sort_unstable();
        removed.dedup();
        if resources.is_empty() && removed.is_empty() && !force {
            return None;
        }
        for r in &resources {
            ts.has.insert(r.name.clone(), held[&r.name].hash);
        }
        self.nonces += 1;
        let nonce = self.nonces.to_string();
        ts.nonce = Some(nonce.clone());
        Some(DeltaDiscoveryResponse {
            system_version_info: state.version.to_string(),
            resources,
            type_url: kind.type_url().to_owned(),
            removed_resources: removed,
            nonce,
            ..DeltaDiscoveryResponse::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::Cache;
    use crate::resources::{CLUSTER, ENDPOINTS};
    use crate::session::tests::set;
    use envoy_types::pb::google::rpc::Status;

    fn request(type_url: &str, subscribe: &[&str], nonce: &str) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: type_url.to_owned(),
            resource_names_subscribe: subscribe.iter().map(|n| (*n).to_owned()).collect(),
            response_nonce: nonce.to_owned(),
            ..DeltaDiscoveryRequest::default()
        }
    }

    fn names(r: &DeltaDiscoveryResponse) -> Vec<&str> {
        r.resources.iter().map(|x| x.name.as_str()).collect()
    }

    #[test]
    fn a_change_of_one_resource_sends_that_one_and_a_removal_its_name() {
        let cache = Cache::new();
        set(&cache, "a", &["127.0.0.1:1"]);
        set(&cache, "b", &["127.0.0.1:2"]);
        let mut s = DeltaSession::new();
        let first = s.on_request(&request(CLUSTER, &[], ""), &cache.state());
        let first = first.response.expect("the wildcard's first answer");
        assert_eq!(names(&first), ["a", "b"]);
        let ack = s.on_request(&request(CLUSTER, &[], &first.nonce), &cache.state());
        assert!(ack.response.is_none() && ack.nack.is_none() && !ack.stale);
        // A new cluster: only it (state of the world would send all three).
        set(&cache, "c", &["127.0.0.1:3"]);
        let pushed = s.on_change(&cache.state());
        assert_eq!(pushed.len(), 1);
        assert_eq!(names(&pushed[0]), ["c"]);
        assert!(pushed[0].removed_resources.is_empty());
        cache.remove("a");
        let pushed = s.on_change(&cache.state());
        assert!(pushed[0].resources.is_empty());
        assert_eq!(pushed[0].removed_resources, ["a"]);
    }

    #[test]
    fn endpoints_by_name_missing_ones_said_and_a_reconnection_gets_only_what_differs() {
        let cache = Cache::new();
        set(&cache, "a", &["127.0.0.1:1"]);
        set(&cache, "b", &["127.0.0.1:2"]);
        let mut s = DeltaSession::new();
        let r = s.on_request(&request(ENDPOINTS, &["a", "zz"], ""), &cache.state());
        let r = r.response.expect("an answer");
        assert_eq!(names(&r), ["a"]);
        assert_eq!(
            r.removed_resources,
            ["zz"],
            "a name that does not exist is said so"
        );
        let a_version = r.resources[0].version.clone();
        set(&cache, "b", &["127.0.0.1:9"]);
        assert!(
            s.on_change(&cache.state()).is_empty(),
            "b is not subscribed to"
        );

        // A new stream that already has a at its version, and an old b.
        let mut again = DeltaSession::new();
        let mut req = request(ENDPOINTS, &["a", "b"], "");
        req.initial_resource_versions = [
            ("a".to_owned(), a_version),
            ("b".to_owned(), "1".to_owned()),
        ]
        .into();
        let r = again.on_request(&req, &cache.state()).response.expect("b");
        assert_eq!(names(&r), ["b"]);

        // A NACK is reported; unsubscribing stops the pushes.
        let mut nack = request(ENDPOINTS, &[], &r.nonce);
        nack.error_detail = Some(Status {
            code: 3,
            message: "no".to_owned(),
            details: Vec::new(),
        });
        assert_eq!(
            again.on_request(&nack, &cache.state()).nack,
            Some((Kind::Endpoints, "no".to_owned()))
        );
        let mut off = request(ENDPOINTS, &[], &r.nonce);
        off.resource_names_unsubscribe = vec!["b".to_owned()];
        again.on_request(&off, &cache.state());
        set(&cache, "b", &["127.0.0.1:10"]);
        assert!(again.on_change(&cache.state()).is_empty());
    }

    #[test]
    fn subscriptions_on_a_stale_ack_count_and_a_first_request_may_carry_a_nonce() {
        let cache = Cache::new();
        set(&cache, "a", &["127.0.0.1:1"]);
        set(&cache, "b", &["127.0.0.1:2"]);
        let mut s = DeltaSession::new();
        // A client resuming elsewhere may send a nonce first: not stale, nothing sent before.
        let first = s.on_request(&request(ENDPOINTS, &["a"], "elsewhere-7"), &cache.state());
        assert!(!first.stale);
        let first = first.response.expect("a");
        set(&cache, "a", &["127.0.0.1:3"]);
        let pushed = s.on_change(&cache.state());
        // The ACK of the first response is stale now, but its new subscription counts.
        let ack = s.on_request(&request(ENDPOINTS, &["b"], &first.nonce), &cache.state());
        assert!(ack.stale);
        assert_eq!(
            names(&ack.response.expect("b, subscribed on a stale ACK")),
            ["b"]
        );
        assert_eq!(names(&pushed[0]), ["a"]);
    }
}
