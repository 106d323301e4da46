//! The ZooKeeper consumer: watches one service's provider directory and sends its providers.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use futures_util::FutureExt;
use lbkit_core::{EndpointKey, EndpointSpec, Update};
use tokio::sync::{mpsc, watch};
use zookeeper_client::{AddWatchMode, Client, Error as ZkError, EventType, SessionState};

use super::node::{decode_dubbo, decode_plain, Decoded, Layout, ProviderFilter, ServicePath};
use super::{cache, connect, registry_err, Backoff, ZkConfig};
use crate::controller::error_chain;
use crate::error::DiscoveryError;
use crate::source::{ChannelStream, SourceItem, Status, UpdateStream, SOURCE_QUEUE};

/// State and counters of a [`ZkSource`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ZkStatus {
    /// Whether a session is connected now.
    pub connected: bool,
    /// Sessions established (a new one after each expiry).
    pub sessions: u64,
    /// Full listings of the provider directory (one per session and per reconnection).
    pub listings: u64,
    /// Watch events handled.
    pub events: u64,
    /// Malformed nodes skipped (`discovery_rejected_total`); each counted once while it exists.
    pub rejected: u64,
    /// Providers in the last set sent.
    pub providers: usize,
    /// Whether the last set sent came from the cache file (registry unreachable at start-up).
    pub from_cache: bool,
    /// Cache file writes.
    pub cache_writes: u64,
    /// Providers in the last set written to the cache file.
    pub cached: usize,
    /// The last problem (connection, session, cache), if any.
    pub last_error: Option<String>,
}

/// A consumer of one service's providers in ZooKeeper. See the [module docs](super).
#[derive(Clone, Debug)]
pub struct ZkSource {
    zk: ZkConfig,
    path: ServicePath,
    filter: ProviderFilter,
    cache: Option<PathBuf>,
}

// === impl ZkSource ===

impl ZkSource {
    /// Watch the providers of `path` on `zk`.
    pub fn new(zk: ZkConfig, path: ServicePath) -> Self {
        ZkSource {
            zk,
            path,
            filter: ProviderFilter::default(),
            cache: None,
        }
    }

    /// Keep only the Dubbo providers `filter` matches (group, version, protocol).
    pub fn with_filter(mut self, filter: ProviderFilter) -> Self {
        self.filter = filter;
        self
    }

    /// Save the last known non-empty set to `path` after each change, and serve it at start-up
    /// when the registry cannot be reached (see [`write_cache`](super::write_cache)).
    pub fn with_cache(mut self, path: impl Into<PathBuf>) -> Self {
        self.cache = Some(path.into());
        self
    }

    /// Start watching on the current tokio runtime. The stream yields a `Reset` after every
    /// listing and change, and an `Err` when the registry becomes unreachable or the session
    /// is lost; the task ends when the stream is dropped.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn(self) -> (UpdateStream, Status<ZkStatus>) {
        let (tx, rx) = mpsc::channel(SOURCE_QUEUE);
        let (status_tx, status_rx) = watch::channel(ZkStatus::default());
        let status = Arc::new(status_tx);
        let cache = self
            .cache
            .clone()
            .map(|p| cache::spawn_writer(p, status.clone()));
        let task = Consumer {
            dir: self.path.dir(),
            source: self,
            tx,
            status,
            nodes: BTreeMap::new(),
            logged: HashSet::new(),
            sent: None,
            cache,
        };
        tokio::spawn(task.run());
        (ChannelStream::new(rx).boxed(), Status::new(status_rx))
    }
}

/// Why a session ended.
enum End {
    /// The stream was dropped: stop.
    Gone,
    /// The session is gone (expired, closed) or unusable: make a new one.
    Lost(DiscoveryError),
}

struct Consumer {
    source: ZkSource,
    dir: String,
    tx: mpsc::Sender<SourceItem>,
    status: Arc<watch::Sender<ZkStatus>>,
    /// Provider nodes by name: the endpoint, or `None` (filtered out or malformed).
    nodes: BTreeMap<String, Option<EndpointSpec>>,
    /// Malformed nodes already logged and counted (pruned when they go away).
    logged: HashSet<String>,
    /// The set last sent.
    sent: Option<Vec<EndpointSpec>>,
    cache: Option<watch::Sender<Arc<Vec<EndpointSpec>>>>,
}

impl Consumer {
    async fn run(mut self) {
        let mut backoff = Backoff::new(&self.source.zk);
        let mut reported = false;
        loop {
            let connected = tokio::select! {
                c = connect(&self.source.zk) => c,
                () = self.tx.closed() => return,
            };
            let error = match connected {
                Ok(client) => {
                    backoff.reset();
                    reported = false;
                    match self.session(&client).await {
                        End::Gone => return,
                        End::Lost(e) => e,
                    }
                }
                Err(e) => {
                    if self.sent.is_none() && !self.serve_cache().await {
                        return;
                    }
                    e
                }
            };
            let text = error_chain(&error);
            self.status.send_modify(|s| {
                s.connected = false;
                s.last_error = Some(text.clone());
            });
            if !reported {
                // Once per outage: the controller logs and counts it and keeps the last set.
                reported = true;
                if self.tx.send(Err(error)).await.is_err() {
                    return;
                }
            } else {
                tracing::debug!(error = %text, "zookeeper still unreachable");
            }
            tokio::select! {
                () = tokio::time::sleep(backoff.next_delay()) => {}
                () = self.tx.closed() => return,
            }
        }
    }

    /// Send the cached set, if there is one. Returns false when the consumer is gone.
    async fn serve_cache(&mut self) -> bool {
        let Some(path) = self.source.cache.clone() else {
            return true;
        };
        match tokio::task::spawn_blocking(move || cache::read_cache(&path)).await {
            Ok(Ok(Some(specs))) => {
                tracing::warn!(
                    providers = specs.len(),
                    "zookeeper unreachable: serving the registry cache"
                );
                self.status.send_modify(|s| {
                    s.from_cache = true;
                    s.providers = specs.len();
                });
                self.sent = Some(specs.clone());
                self.tx.send(Ok(Update::Reset(specs))).await.is_ok()
            }
            Ok(Ok(None)) => true,
            Ok(Err(e)) => self.tx.send(Err(e)).await.is_ok(),
            Err(e) => {
                tracing::warn!(error = %e, "registry cache reader failed");
                true
            }
        }
    }

    async fn session(&mut self, client: &Client) -> End {
        self.status.send_modify(|s| {
            s.connected = true;
            s.sessions += 1;
            s.last_error = None;
        });
        let mut watcher = match client
            .watch(&self.dir, AddWatchMode::PersistentRecursive)
            .await
        {
            Ok(w) => w,
            Err(e) => return End::Lost(registry_err(&self.dir, e)),
        };
        let mut relist = true;
        loop {
            if relist {
                match self.relist(client).await {
                    Ok(()) => relist = false,
                    Err(e) if ends_session(&e) => return End::Lost(registry_err(&self.dir, e)),
                    // Connection loss: the reconnection event triggers the next listing.
                    Err(e) => tracing::debug!(error = %e, "listing interrupted"),
                }
            }
            if !self.flush().await {
                return End::Gone;
            }
            let mut event = tokio::select! {
                ev = watcher.changed() => ev,
                () = self.tx.closed() => return End::Gone,
            };
            // Handle what is already queued before sending: a burst becomes one update.
            loop {
                self.status.send_modify(|s| s.events += 1);
                match event.event_type {
                    EventType::Session => match event.session_state {
                        SessionState::Disconnected => {
                            self.status.send_modify(|s| s.connected = false);
                        }
                        SessionState::SyncConnected | SessionState::ConnectedReadOnly => {
                            self.status.send_modify(|s| s.connected = true);
                            relist = true;
                        }
                        // Terminal (expired, closed, auth failed): the watcher is done; never
                        // poll it again.
                        state => {
                            let e = registry_err(&self.dir, state_error(state));
                            return End::Lost(e);
                        }
                    },
                    EventType::NodeChildrenChanged => relist = true,
                    EventType::NodeDeleted if event.path == self.dir => self.nodes.clear(),
                    kind => {
                        if let Err(e) = self.node_event(client, kind, &event.path).await {
                            if ends_session(&e) {
                                return End::Lost(registry_err(&event.path, e));
                            }
                            relist = true;
                        }
                    }
                }
                match watcher.changed().now_or_never() {
                    Some(next) => event = next,
                    None => break,
                }
            }
        }
    }

    /// Creation, data change or deletion of a node under the directory.
    async fn node_event(
        &mut self,
        client: &Client,
        kind: EventType,
        path: &str,
    ) -> Result<(), ZkError> {
        let Some(name) = path
            .strip_prefix(self.dir.as_str())
            .and_then(|rest| rest.strip_prefix('/'))
            .filter(|n| !n.is_empty() && !n.contains('/'))
        else {
            return Ok(()); // the directory itself, or deeper nodes
        };
        if kind == EventType::NodeDeleted {
            self.nodes.remove(name);
            self.logged.remove(name);
            return Ok(());
        }
        let data = match self.source.path.layout() {
            Layout::Dubbo => Vec::new(),
            Layout::Plain => match client.get_data(path).await {
                Ok((data, _)) => data,
                Err(ZkError::NoNode) => {
                    self.nodes.remove(name);
                    return Ok(());
                }
                Err(e) => return Err(e),
            },
        };
        let decoded = self.decode(name, &data);
        self.nodes.insert(name.to_owned(), decoded);
        Ok(())
    }

    /// List the directory (and, in the plain layout, read every node, pipelined).
    async fn relist(&mut self, client: &Client) -> Result<(), ZkError> {
        let children = match client.list_children(&self.dir).await {
            Ok(c) => c,
            Err(ZkError::NoNode) => Vec::new(),
            Err(e) => return Err(e),
        };
        let mut nodes = BTreeMap::new();
        match self.source.path.layout() {
            Layout::Dubbo => {
                for name in children {
                    let decoded = self.decode(&name, &[]);
                    nodes.insert(name, decoded);
                }
            }
            Layout::Plain => {
                // Requests are sent when the futures are made: one round trip for all.
                let paths: Vec<String> = children
                    .iter()
                    .map(|c| format!("{}/{c}", self.dir))
                    .collect();
                let reads: Vec<_> = paths.iter().map(|p| client.get_data(p)).collect();
                for (name, read) in children.into_iter().zip(reads) {
                    match read.await {
                        Ok((data, _)) => {
                            let decoded = self.decode(&name, &data);
                            nodes.insert(name, decoded);
                        }
                        Err(ZkError::NoNode) => {}
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        self.logged.retain(|n| nodes.contains_key(n));
        self.nodes = nodes;
        self.status.send_modify(|s| s.listings += 1);
        Ok(())
    }

    fn decode(&mut self, name: &str, data: &[u8]) -> Option<EndpointSpec> {
        let decoded = match self.source.path.layout() {
            Layout::Dubbo => decode_dubbo(name, &self.source.filter),
            Layout::Plain => decode_plain(name, data),
        };
        match decoded {
            Decoded::Endpoint(spec) => {
                self.logged.remove(name);
                Some(spec)
            }
            Decoded::Filtered => None,
            Decoded::Rejected(reason) => {
                if self.logged.insert(name.to_owned()) {
                    tracing::warn!(dir = %self.dir, node = name, %reason, "malformed provider node skipped");
                    self.status.send_modify(|s| s.rejected += 1);
                }
                None
            }
        }
    }

    /// Send the current set if it differs from the last one sent. False when the consumer is
    /// gone.
    async fn flush(&mut self) -> bool {
        let mut by_key: BTreeMap<EndpointKey, EndpointSpec> = BTreeMap::new();
        for (name, spec) in &self.nodes {
            let Some(spec) = spec else { continue };
            if by_key.contains_key(&spec.key) {
                tracing::debug!(node = %name, key = %spec.key, "duplicate provider; the first node (by name) wins");
                continue;
            }
            by_key.insert(spec.key.clone(), spec.clone());
        }
        let specs: Vec<EndpointSpec> = by_key.into_values().collect();
        if self.sent.as_ref() == Some(&specs) {
            // The registry confirmed the cached set.
            self.status
                .send_if_modified(|s| std::mem::replace(&mut s.from_cache, false));
            return true;
        }
        self.status.send_modify(|s| {
            s.providers = specs.len();
            s.from_cache = false;
        });
        if let Some(cache) = self.cache.as_ref().filter(|_| !specs.is_empty()) {
            cache.send_replace(Arc::new(specs.clone()));
        }
        self.sent = Some(specs.clone());
        self.tx.send(Ok(Update::Reset(specs))).await.is_ok()
    }
}

/// Errors after which this session is useless.
fn ends_session(e: &ZkError) -> bool {
    matches!(
        e,
        ZkError::SessionExpired | ZkError::ClientClosed | ZkError::AuthFailed
    )
}

fn state_error(state: SessionState) -> ZkError {
    match state {
        SessionState::Expired => ZkError::SessionExpired,
        SessionState::AuthFailed => ZkError::AuthFailed,
        _ => ZkError::ClientClosed,
    }
}
