//! The resources `lbkit xds` serves: every service's Listener, Cluster and
//! ClusterLoadAssignment, each with the version at which it last changed. Feeds replace a
//! service's resources; a change wakes every stream once, and each stream sends only what
//! changed since it last sent (for endpoints, only the changed assignments).

use std::collections::BTreeMap;
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

/// Every resource at one version.
#[derive(Clone, Debug, Default)]
pub struct State {
    /// Increases with every change.
    pub version: u64,
    /// When the latest change was made (push latency is measured from here).
    pub changed_at: Option<Timestamp>,
    by_kind: [BTreeMap<String, Arc<Entry>>; 3],
}

impl State {
    /// The resources of `kind`, by name.
    pub fn resources(&self, kind: Kind) -> &BTreeMap<String, Arc<Entry>> {
        &self.by_kind[kind.index()]
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
            for map in &mut next.by_kind {
                map.remove(name);
            }
            true
        })
    }
}
