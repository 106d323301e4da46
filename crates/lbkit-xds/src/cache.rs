//! The resources `lbkit xds` serves: every service's Listener, Cluster and
//! ClusterLoadAssignment, each with the version at which it last changed. Feeds replace a
//! service's resources; a change wakes every stream once, and each stream sends only what
//! changed since it last sent (for endpoints, only the changed assignments).
//!
//! The state keeps a short log of what changed ([`State::changed_since`]), so that a stream
//! woken by a change looks at the resources that changed, not at every resource: with 100
//! services and 50 clients, a change of one service's endpoints costs each stream that
//! assignment, not a comparison of 300 versions. (A Listener or Cluster change still sends, and
//! so looks at, the whole list in the state-of-the-world protocol.)

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use envoy_types::pb::google::protobuf::Any;
use lbkit_core::{Clock, Timestamp};
use tokio::sync::watch;

use crate::resources::{ServiceResources, CLUSTER, ENDPOINTS, LISTENER};

/// The three resource types served, in the order a client needs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// Listeners (LDS).
    Listener,
    /// Clusters (CDS).
    Cluster,
    /// Cluster load assignments (EDS).
    Endpoints,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 3] = [Kind::Listener, Kind::Cluster, Kind::Endpoints];

    /// The kind of a type URL, if served.
    pub fn of(type_url: &str) -> Option<Kind> {
        match type_url {
            LISTENER => Some(Kind::Listener),
            CLUSTER => Some(Kind::Cluster),
            ENDPOINTS => Some(Kind::Endpoints),
            _ => None,
        }
    }

    /// Its type URL.
    pub fn type_url(self) -> &'static str {
        match self {
            Kind::Listener => LISTENER,
            Kind::Cluster => CLUSTER,
            Kind::Endpoints => ENDPOINTS,
        }
    }

    /// A short name for logs and metric labels (`lds`, `cds`, `eds`).
    pub fn label(self) -> &'static str {
        match self {
            Kind::Listener => "lds",
            Kind::Cluster => "cds",
            Kind::Endpoints => "eds",
        }
    }

    /// Whether a response of this kind carries every subscribed resource (Listener and
    /// Cluster, in the state-of-the-world protocol) or only the changed ones.
    pub fn whole(self) -> bool {
        !matches!(self, Kind::Endpoints)
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One resource and the cache version at which it last changed.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// The version it last changed at.
    pub version: u64,
    /// A hash of its bytes: its version for incremental clients, which tell it back when they
    /// reconnect (to this process or a restarted one: equal bytes, equal version).
    pub hash: u64,
    /// The resource.
    pub resource: Any,
}

/// How many changed resources [`State`] remembers. A stream that fell further behind (a burst
/// of changes to many services) looks at every resource once instead.
pub const CHANGE_LOG: usize = 512;

/// Every resource at one version.
#[derive(Clone, Debug, Default)]
pub struct State {
    /// Increases with every change.
    pub version: u64,
    /// When the latest change was made (push latency is measured from here).
    pub changed_at: Option<Timestamp>,
    by_kind: [BTreeMap<String, Arc<Entry>>; 3],
    /// The latest resources set or removed, oldest first: (version, kind, name).
    log: VecDeque<(u64, Kind, Arc<str>)>,
    /// The log holds every change after this version.
    logged_after: u64,
}

impl State {
    /// The resources of `kind`, by name.
    pub fn resources(&self, kind: Kind) -> &BTreeMap<String, Arc<Entry>> {
        &self.by_kind[kind.index()]
    }

    /// The names of `kind` set or removed after version `since`, sorted, each once; `None`
    /// when the log does not reach back that far (then any resource may have changed).
    pub fn changed_since(&self, since: u64, kind: Kind) -> Option<Vec<&str>> {
        if since < self.logged_after {
            return None;
        }
        let mut names: Vec<&str> = self
            .log
            .iter()
            .rev()
            .take_while(|(v, _, _)| *v > since)
            .filter(|(_, k, _)| *k == kind)
            .map(|(_, _, name)| &**name)
            .collect();
        names.sort_unstable();
        names.dedup();
        Some(names)
    }

    /// The same state with its log forgotten: a stream then looks at every resource (tests
    /// compare the two).
    #[cfg(test)]
    pub(crate) fn without_log(&self) -> State {
        State {
            log: VecDeque::new(),
            logged_after: u64::MAX,
            ..self.clone()
        }
    }

    fn logged(&mut self, kind: Kind, name: &str) {
        if self.log.len() == CHANGE_LOG {
            if let Some((v, _, _)) = self.log.pop_front() {
                self.logged_after = self.logged_after.max(v);
            }
        }
        self.log.push_back((self.version, kind, name.into()));
    }
}

/// The shared resource cache.
#[derive(Clone, Debug)]
pub struct Cache {
    tx: Arc<watch::Sender<Arc<State>>>,
    clock: Clock,
}

impl Default for Cache {
    fn default() -> Self {
        Cache::new()
    }
}

impl Cache {
    /// An empty cache at version 0.
    pub fn new() -> Self {
        Cache {
            tx: Arc::new(watch::channel(Arc::new(State::default())).0),
            clock: Clock::System,
        }
    }

    /// The same, stamping changes with `clock` (tests: a manual clock).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The clock changes are stamped with.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The current state.
    pub fn state(&self) -> Arc<State> {
        self.tx.borrow().clone()
    }

    /// Follow the state: a receiver that wakes on every change.
    pub fn subscribe(&self) -> watch::Receiver<Arc<State>> {
        self.tx.subscribe()
    }

    /// Set service `name`'s resources. Resources whose bytes are unchanged keep their version;
    /// when none changed, nothing is published. Returns whether anything changed.
    pub fn set(&self, name: &str, resources: &ServiceResources) -> bool {
        let pairs = [
            (Kind::Listener, &resources.listener),
            (Kind::Cluster, &resources.cluster),
            (Kind::Endpoints, &resources.endpoints),
        ];
        let now = self.clock.now();
        self.tx.send_if_modified(|state| {
            let changed: Vec<_> = pairs
                .iter()
                .filter(|(kind, any)| {
                    state.resources(*kind).get(name).map(|e| &e.resource) != Some(*any)
                })
                .collect();
            if changed.is_empty() {
                return false;
            }
            let next = Arc::make_mut(state);
            next.version += 1;
            next.changed_at = Some(now);
            for (kind, any) in changed {
                let entry = Entry {
                    version: next.version,
                    hash: xxhash_rust::xxh64::xxh64(&any.value, 0),
                    resource: (*any).clone(),
                };
                next.by_kind[kind.index()].insert(name.to_owned(), Arc::new(entry));
                next.logged(*kind, name);
            }
            true
        })
    }

    /// Remove service `name` (clients are told by the next Listener and Cluster responses).
    pub fn remove(&self, name: &str) -> bool {
        let now = self.clock.now();
        self.tx.send_if_modified(|state| {
            if Kind::ALL
                .iter()
                .all(|k| !state.resources(*k).contains_key(name))
            {
                return false;
            }
            let next = Arc::make_mut(state);
            next.version += 1;
            next.changed_at = Some(now);
            for kind in Kind::ALL {
                if next.by_kind[kind.index()].remove(name).is_some() {
                    next.logged(kind, name);
                }
            }
            true
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::tests::set;

    #[test]
    fn the_log_names_what_changed_and_says_when_it_does_not_reach_back() {
        let cache = Cache::new();
        set(&cache, "a", &["127.0.0.1:1"]);
        let after_a = cache.state().version;
        set(&cache, "b", &["127.0.0.1:1"]);
        set(&cache, "a", &["127.0.0.1:2"]);
        cache.remove("b");
        let state = cache.state();
        let names = |since, kind| state.changed_since(since, kind);
        assert_eq!(names(after_a, Kind::Endpoints), Some(vec!["a", "b"]));
        assert_eq!(
            names(after_a, Kind::Cluster),
            Some(vec!["b"]),
            "a's cluster is the same"
        );
        assert_eq!(names(state.version, Kind::Listener), Some(vec![]));
        for i in 0..CHANGE_LOG {
            set(&cache, &format!("s{i}"), &["127.0.0.1:1"]);
        }
        let state = cache.state();
        assert_eq!(
            state.changed_since(after_a, Kind::Endpoints),
            None,
            "trimmed"
        );
        assert_eq!(
            state.changed_since(state.version - 1, Kind::Endpoints),
            Some(vec![&*format!("s{}", CHANGE_LOG - 1)])
        );
    }
}
