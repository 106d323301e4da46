//! The ZooKeeper consumer: watches one service's provider directory and sends its providers.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::Either;
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use lbkit_core::{EndpointKey, EndpointSpec, Update};
use tokio::sync::{mpsc, watch};
use zookeeper_client::{
    AddWatchMode, Client, Error as ZkError, EventType, OneshotWatcher, PersistentWatcher,
    SessionState, StateWatcher, WatchedEvent,
};

use super::node::{decode, Decoded, Layout, ProviderFilter, ServicePath};
use super::nodes::Nodes;
use super::{connect, registry_err, ZkConfig};
use crate::cache;
use crate::controller::error_chain;
use crate::dubbo::ProviderUrl;
use crate::error::DiscoveryError;
use crate::governance::tag::{parse_tag_rule, tag_rule_path, TagRule};
use crate::governance::{
    parse_yaml_configurators, yaml_configurators_path, Overrides, RuleNode, RULES_METADATA,
};
use crate::source::Backoff;
use crate::source::{ChannelStream, Pace, SourceItem, Status, UpdateStream, SOURCE_QUEUE};

/// Longest wait for the round trip after a burst of events (`Consumer::sync`): ZooKeeper answers
/// in milliseconds; beyond this the connection is in trouble and the changes go out as seen.
const SYNC_WAIT: Duration = Duration::from_secs(1);

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
    /// Malformed override rules count here too.
    pub rejected: u64,
    /// Override rules in force (Dubbo layout: the nodes under `configurators`).
    pub rules: usize,
    /// Malformed override rules skipped; each counted once while it exists. Malformed tag
    /// rules (and their addresses that do not parse) count here too.
    pub rules_rejected: u64,
    /// The tag rule in force (Dubbo 3's `/dubbo/config/dubbo/<application>.tag-router`, for
    /// the providers' application): its node's path.
    pub tag_rule: Option<String>,
    /// Providers in the last set sent.
    pub providers: usize,
    /// Whether the last set sent came from the cache file (registry unreachable at start-up).
    pub from_cache: bool,
    /// Cache file writes.
    pub cache_writes: u64,
    /// Providers in the last set written to the cache file.
    pub cached: usize,
    /// Cache file writes that failed (a read-only or full disk). The first failure of a run is
    /// logged as an error naming the file; the next success is logged once too.
    pub cache_failures: u64,
    /// Whether the consumer watches with one-shot watches (the server has no persistent
    /// recursive watches, ZooKeeper < 3.6, or [`WatchMode::OneShot`] asked for them).
    pub one_shot_watches: bool,
    /// The last problem (connection, session, cache), if any.
    pub last_error: Option<String>,
}

/// How a [`ZkSource`] watches the provider directory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WatchMode {
    /// One persistent recursive watch (ZooKeeper ≥ 3.6); one-shot watches when the server
    /// answers that it has none (`UNIMPLEMENTED`, as 3.4 and 3.5 do). The default.
    #[default]
    Auto,
    /// Persistent recursive watches only: a server without them is an error.
    Persistent,
    /// One-shot watches, as Dubbo's Curator consumer sets them: a child watch on the
    /// directory (an existence watch while it does not exist) and, in the plain layout, a
    /// data watch on every node; each event lists the directory again and sets new ones.
    OneShot,
}

impl WatchMode {
    /// The names [`WatchMode::parse`] takes, as configuration files and `lbkit watch --watch`
    /// spell them.
    pub const NAMES: [&'static str; 3] = ["auto", "persistent", "one-shot"];

    /// The mode named `name` (one of [`WatchMode::NAMES`]).
    ///
    /// # Errors
    /// A message naming the accepted names.
    ///
    /// ```
    /// use lbkit_discovery::zookeeper::WatchMode;
    /// assert_eq!(WatchMode::parse("one-shot"), Ok(WatchMode::OneShot));
    /// assert!(WatchMode::parse("sometimes").is_err());
    /// ```
    pub fn parse(name: &str) -> Result<WatchMode, String> {
        match name {
            "auto" => Ok(WatchMode::Auto),
            "persistent" => Ok(WatchMode::Persistent),
            "one-shot" => Ok(WatchMode::OneShot),
            other => Err(format!(
                "unknown watch mode {other:?} (expected one of {})",
                WatchMode::NAMES.join(", ")
            )),
        }
    }
}

/// A consumer of one service's providers in ZooKeeper. See the [module docs](super).
#[derive(Clone, Debug)]
pub struct ZkSource {
    zk: ZkConfig,
    path: ServicePath,
    filter: ProviderFilter,
    cache: Option<PathBuf>,
    watch: WatchMode,
    governance: bool,
    application: Option<String>,
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
            watch: WatchMode::Auto,
            governance: true,
            application: None,
        }
    }

    /// Whether to obey the service's override rules (Dubbo layout; default on): each
    /// provider's URL is rewritten by the rules under `configurators` that apply to it
    /// ([`governance`](crate::governance)) before its weight is read, and the endpoint's
    /// metadata `dubbo.rules` names the rules that did it. The same switch obeys Dubbo 3's YAML
    /// configurators and the tag rule of the providers' application
    /// ([`governance::tag`](crate::governance::tag)), written into the endpoints' metadata for
    /// tag routing ([`lbkit_core::route`]).
    pub fn with_governance(mut self, on: bool) -> Self {
        self.governance = on;
        self
    }

    /// The consumer's Dubbo application, for rules scoped to an application (a rule applies
    /// when it names this application or the provider's own).
    pub fn with_application(mut self, application: impl Into<String>) -> Self {
        self.application = Some(application.into());
        self
    }

    /// Watch the directory as `mode` says (default [`WatchMode::Auto`]).
    pub fn with_watch(mut self, mode: WatchMode) -> Self {
        self.watch = mode;
        self
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

    /// Start watching on the current tokio runtime. The stream yields a `Reset` (the whole set,
    /// in key order) after every listing, rule change and start from the cache, the changed
    /// providers (`Add`, then `Remove`) after node changes, and an `Err` when the registry
    /// becomes unreachable or the session is lost; the task ends when the stream is dropped.
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
            .map(|p| cache::spawn_writer(p, cache_status(status.clone())));
        let one_shot = self.watch == WatchMode::OneShot;
        let rules_dir = self.path.rules_dir().filter(|_| self.governance);
        // Dubbo 3's YAML configurators: the service's, and the consumer application's.
        let rules_yaml: Vec<String> = if rules_dir.is_some() {
            let keys = std::iter::once(self.path.service()).chain(self.application.as_deref());
            keys.map(|k| yaml_configurators_path(self.path.root(), k))
                .collect()
        } else {
            Vec::new()
        };
        let task = Consumer {
            dir: self.path.dir(),
            rules_dir,
            rules_yaml,
            yaml: BTreeMap::new(),
            tag_path: None,
            tag_doc: None,
            rules: BTreeMap::new(),
            overrides: Overrides::default(),
            source: self,
            tx,
            status,
            nodes: Nodes::default(),
            logged: HashSet::new(),
            sent: None,
            pace: Pace::default(),
            cache,
            one_shot,
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

/// Why a session's persistent watches are not set.
enum Opened {
    /// The server has none: watch with one-shot watches.
    OneShot,
    /// The session or the consumer is gone.
    Lost(End),
}

/// A session's persistent watches.
struct Watches {
    /// The providers' directory, recursively.
    providers: PersistentWatcher,
    /// The rules' nodes.
    rules: Vec<PersistentWatcher>,
    /// The tag rule of the providers' application, once set.
    tag: Option<PersistentWatcher>,
}

/// What a session has to do before it waits for the next event.
struct Due {
    /// List the providers again.
    relist: bool,
    /// Set the persistent watches again (after a cut).
    rewatch: bool,
    /// List the rules again.
    relist_rules: bool,
}

struct Consumer {
    source: ZkSource,
    dir: String,
    /// Where the override rules are, when the consumer obeys them.
    rules_dir: Option<String>,
    /// Dubbo 3's YAML configurator nodes to obey (their data is the document).
    rules_yaml: Vec<String>,
    /// Each YAML node's last data and its rules (none when malformed: logged and counted once
    /// per content).
    yaml: BTreeMap<String, (Vec<u8>, Vec<RuleNode>)>,
    /// The tag rule node of the providers' application (Dubbo's `TagStateRouter` follows the
    /// first provider's `application`), when the consumer obeys rules.
    tag_path: Option<String>,
    /// Its last data and rule (none when malformed or not valid; a malformed one keeps the
    /// last good rule).
    tag_doc: Option<(Vec<u8>, Option<TagRule>)>,
    /// Rule nodes by name: the rule, or `None` (malformed: logged and counted once).
    rules: BTreeMap<String, Option<RuleNode>>,
    /// The rules in force, from `rules`.
    overrides: Overrides,
    tx: mpsc::Sender<SourceItem>,
    status: Arc<watch::Sender<ZkStatus>>,
    /// Provider nodes by name: the endpoint, or `None` (filtered out or malformed); and by key.
    nodes: Nodes,
    /// Malformed nodes already logged and counted (pruned when they go away).
    logged: HashSet<String>,
    /// The set last sent, by key.
    sent: Option<BTreeMap<EndpointKey, EndpointSpec>>,
    /// No set is sent before the last send's end plus its cost: see [`Consumer::flush`].
    pace: Pace,
    cache: Option<watch::Sender<Arc<Vec<EndpointSpec>>>>,
    /// Watch with one-shot watches (asked for, or the server has no persistent ones).
    one_shot: bool,
}

impl Consumer {
    async fn run(mut self) {
        let mut backoff = Backoff::between(self.source.zk.retry_min, self.source.zk.retry_max);
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
                self.sent = Some(specs.iter().map(|s| (s.key.clone(), s.clone())).collect());
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
        self.status
            .send_modify(|s| s.one_shot_watches = self.one_shot);
        if self.one_shot {
            return self.session_one_shot(client).await;
        }
        let mut watches = match self.open_watches(client).await {
            Ok(w) => w,
            Err(Opened::OneShot) => return self.session_one_shot(client).await,
            Err(Opened::Lost(end)) => return end,
        };
        let mut due = Due {
            relist: true,
            rewatch: false,
            relist_rules: self.rules_dir.is_some(),
        };
        loop {
            match self.catch_up(client, &mut watches, &mut due).await {
                Ok(true) => {}
                Ok(false) => continue,
                Err(end) => return end,
            }
            if !self.flush().await {
                return End::Gone;
            }
            let event = match self.next_event(&mut watches, &mut due).await {
                Ok(Some(event)) => event,
                Ok(None) => continue,
                Err(end) => return end,
            };
            if let Some(end) = self.burst(client, &mut watches, &mut due, event).await {
                return end;
            }
        }
    }

    /// The session's persistent watches: the providers' directory (recursive) and the rules'.
    /// A server without persistent watches (ZooKeeper < 3.6) switches the consumer to
    /// one-shot watches when the watch mode is `auto`.
    async fn open_watches(&mut self, client: &Client) -> Result<Watches, Opened> {
        let providers = match client
            .watch(&self.dir, AddWatchMode::PersistentRecursive)
            .await
        {
            Ok(w) => w,
            Err(ZkError::Unimplemented) if self.source.watch == WatchMode::Auto => {
                // ZooKeeper < 3.6 answers an unknown request so and closes the connection
                // (the session lives on): one-shot watches from now on.
                tracing::warn!(
                    dir = %self.dir,
                    "the server has no persistent recursive watches (ZooKeeper < 3.6): \
                     watching with one-shot watches"
                );
                self.one_shot = true;
                self.status.send_modify(|s| s.one_shot_watches = true);
                return Err(Opened::OneShot);
            }
            Err(e) => return Err(Opened::Lost(End::Lost(registry_err(&self.dir, e)))),
        };
        match self.watch_rules(client).await {
            Ok(rules) => Ok(Watches {
                providers,
                rules,
                tag: None,
            }),
            Err(e) => Err(Opened::Lost(End::Lost(registry_err(&self.dir, e)))),
        }
    }

    /// What is due before waiting for the next event: the tag rule's watch (another
    /// application's tag rule: its own watch, the others stay), the watches set again after a
    /// cut, the rules and the providers listed again. `Ok(false)`: the listing named another
    /// application, whose tag rule is to be watched and read before sending (start the turn
    /// again); `Err`: the session is gone.
    async fn catch_up(
        &mut self,
        client: &Client,
        watches: &mut Watches,
        due: &mut Due,
    ) -> Result<bool, End> {
        if self.retarget_tag() {
            watches.tag = None;
            due.relist_rules = true;
        }
        if let (Some(path), None) = (&self.tag_path, &watches.tag) {
            match client.watch(path, AddWatchMode::PersistentRecursive).await {
                Ok(w) => watches.tag = Some(w),
                Err(e) if ends_session(&e) => return Err(End::Lost(registry_err(path, e))),
                Err(e) => tracing::debug!(error = %e, "tag rule watch not set yet"),
            }
        }
        if due.rewatch {
            self.rewatch(client, watches, due).await?;
        }
        if due.relist_rules {
            match self.relist_rules(client).await {
                Ok(()) => due.relist_rules = false,
                Err(e) if ends_session(&e) => return Err(End::Lost(registry_err(&self.dir, e))),
                Err(e) => tracing::debug!(error = %e, "rules listing interrupted"),
            }
        }
        if due.relist {
            match self.relist(client).await {
                Ok(()) => due.relist = false,
                Err(e) if ends_session(&e) => return Err(End::Lost(registry_err(&self.dir, e))),
                // Connection loss: the reconnection event triggers the next listing.
                Err(e) => tracing::debug!(error = %e, "listing interrupted"),
            }
            return Ok(self.tag_path == self.wanted_tag_path());
        }
        Ok(true)
    }

    /// The persistent watches set again after a cut. zookeeper-client 0.11 does not set them
    /// again on a new connection (its `resend_watches` sends only the one-shot kinds), so the
    /// server would stop sending events. The new watcher is in place before the old one
    /// drops, so the path stays watched.
    async fn rewatch(
        &mut self,
        client: &Client,
        watches: &mut Watches,
        due: &mut Due,
    ) -> Result<(), End> {
        let again = match client
            .watch(&self.dir, AddWatchMode::PersistentRecursive)
            .await
        {
            Ok(w) => self.watch_rules(client).await.map(|r| (w, r)),
            Err(e) => Err(e),
        };
        match again {
            Ok((w, r)) => {
                (watches.providers, watches.rules) = (w, r);
                due.rewatch = false;
                // Set again at the top of the next turn, as the others were here.
                watches.tag = None;
            }
            Err(e) if ends_session(&e) => return Err(End::Lost(registry_err(&self.dir, e))),
            // Lost again: the next reconnection asks for them.
            Err(e) => tracing::debug!(error = %e, "watch not set again yet"),
        }
        Ok(())
    }

    /// The next providers' event; `Ok(None)` after a rules event (handled: the rules are due
    /// to be listed again), `Err` when the session or the consumer is gone.
    async fn next_event(
        &mut self,
        watches: &mut Watches,
        due: &mut Due,
    ) -> Result<Option<WatchedEvent>, End> {
        tokio::select! {
            ev = watches.providers.changed() => Ok(Some(ev)),
            ev = rules_event(&mut watches.rules, watches.tag.as_mut()) => {
                self.status.send_modify(|s| s.events += 1);
                match (ev.event_type, ev.session_state) {
                    // The providers' watcher follows the session; a terminal state ends
                    // this watcher too (never poll it again).
                    (EventType::Session, SessionState::Disconnected
                        | SessionState::SyncConnected
                        | SessionState::ConnectedReadOnly) => {}
                    (EventType::Session, state) => {
                        let dir = self.rules_dir.clone().unwrap_or_default();
                        return Err(End::Lost(registry_err(&dir, state_error(state))));
                    }
                    _ => due.relist_rules = true,
                }
                Ok(None)
            }
            () = self.tx.closed() => Err(End::Gone),
        }
    }

    /// `event` and what is already queued behind it, handled before sending: a burst becomes
    /// one update. Once, after the queue runs dry while connected, one round trip
    /// ([`sync`](Self::sync)) lets the rest of a transaction's events in. `Some`: the session
    /// or the consumer is gone.
    async fn burst(
        &mut self,
        client: &Client,
        watches: &mut Watches,
        due: &mut Due,
        mut event: WatchedEvent,
    ) -> Option<End> {
        let mut synced = false;
        loop {
            if let Err(end) = self.handle(client, due, &event).await {
                return Some(end);
            }
            if let Some(next) = watches.providers.changed().now_or_never() {
                event = next;
                continue;
            }
            let connected = self.status.borrow().connected;
            if std::mem::replace(&mut synced, true)
                || !connected
                || event.event_type == EventType::Session
            {
                return None;
            }
            if let Some(end) = self.sync(client).await {
                return Some(end);
            }
            event = watches.providers.changed().now_or_never()?;
        }
    }

    /// One providers' event: the session's state, a listing due, a node read or forgotten.
    async fn handle(
        &mut self,
        client: &Client,
        due: &mut Due,
        event: &WatchedEvent,
    ) -> Result<(), End> {
        self.status.send_modify(|s| s.events += 1);
        match event.event_type {
            EventType::Session => match event.session_state {
                SessionState::Disconnected => {
                    self.status.send_modify(|s| s.connected = false);
                }
                SessionState::SyncConnected | SessionState::ConnectedReadOnly => {
                    self.status.send_modify(|s| s.connected = true);
                    (due.relist, due.rewatch) = (true, true);
                    due.relist_rules = self.rules_dir.is_some();
                }
                // Terminal (expired, closed, auth failed): the watcher is done; never poll it
                // again.
                state => return Err(End::Lost(registry_err(&self.dir, state_error(state)))),
            },
            EventType::NodeChildrenChanged => due.relist = true,
            EventType::NodeDeleted if event.path == self.dir => self.nodes.clear(),
            kind => {
                if let Err(e) = self.node_event(client, kind, &event.path).await {
                    if ends_session(&e) {
                        return Err(End::Lost(registry_err(&event.path, e)));
                    }
                    due.relist = true;
                }
            }
        }
        Ok(())
    }

    /// One round trip after a burst of events: ZooKeeper sends the events of a transaction
    /// before its answer to any later request of this session, so once the answer is here,
    /// every event of the transactions committed so far is queued (the deletions of one
    /// `multi`, sessions expiring together), and they become one update, not one each.
    /// Bounded by [`SYNC_WAIT`]: a connection lost meanwhile holds the request until the
    /// session is back, and what was already seen goes out first. `Some`: the session or the
    /// consumer is gone.
    async fn sync(&self, client: &Client) -> Option<End> {
        let synced = tokio::select! {
            r = tokio::time::timeout(SYNC_WAIT, client.check_stat(&self.dir)) => r.ok(),
            () = self.tx.closed() => return Some(End::Gone),
        };
        match synced {
            Some(Err(e)) if ends_session(&e) => Some(End::Lost(registry_err(&self.dir, e))),
            _ => None,
        }
    }

    /// A session with one-shot watches: list (setting watches), send, wait for the first
    /// event or a reconnection, and list again.
    async fn session_one_shot(&mut self, client: &Client) -> End {
        let mut state = client.state_watcher();
        loop {
            let watchers = match self.list_watching(client).await {
                Ok(w) => w,
                Err(e) if ends_session(&e) => return End::Lost(registry_err(&self.dir, e)),
                // Connection loss: list again once the session says what happened.
                Err(e) => {
                    tracing::debug!(error = %e, "listing interrupted");
                    match self.next_state(&mut state).await {
                        Some(end) => return end,
                        None => continue,
                    }
                }
            };
            if !self.flush().await {
                return End::Gone;
            }
            let mut fired: FuturesUnordered<_> =
                watchers.into_iter().map(OneshotWatcher::changed).collect();
            loop {
                tokio::select! {
                    Some(event) = fired.next() => {
                        self.status.send_modify(|s| s.events += 1);
                        if event.event_type == EventType::Session {
                            let e = state_error(event.session_state);
                            return End::Lost(registry_err(&self.dir, e));
                        }
                        // A change: list again, with new watches (the old ones drop).
                        break;
                    }
                    end = self.next_state(&mut state) => match end {
                        Some(end) => return end,
                        // Reconnected: list again, as after any reconnection. Disconnected:
                        // wait on.
                        None if self.status.borrow().connected => break,
                        None => {}
                    },
                    () = self.tx.closed() => return End::Gone,
                }
            }
        }
    }

    /// The session's next state: `None` while it lives (the status follows it), the end once
    /// it is over.
    async fn next_state(&self, state: &mut StateWatcher) -> Option<End> {
        match state.changed().await {
            SessionState::Disconnected => {
                self.status.send_modify(|s| s.connected = false);
                None
            }
            SessionState::SyncConnected | SessionState::ConnectedReadOnly => {
                self.status.send_modify(|s| s.connected = true);
                None
            }
            terminal => Some(End::Lost(registry_err(&self.dir, state_error(terminal)))),
        }
    }

    /// List the directory setting one-shot watches: on its children (on its existence while
    /// it does not exist) and, in the plain layout, on every node's data.
    async fn list_watching(&mut self, client: &Client) -> Result<Vec<OneshotWatcher>, ZkError> {
        let (children, dir_watch) = list_and_watch(client, &self.dir).await?;
        let (nodes, mut watchers) = self.read_nodes(client, children, true).await?;
        watchers.push(dir_watch);
        self.listed(nodes);
        self.retarget_tag();
        if let Some(path) = self.tag_path.clone() {
            let (data, watch) = read_and_watch(client, &path).await?;
            self.tag_read(&path, data);
            watchers.push(watch);
        }
        if let Some(dir) = self.rules_dir.clone() {
            let (children, rules_watch) = list_and_watch(client, &dir).await?;
            self.rules_listed(children);
            watchers.push(rules_watch);
        }
        for path in self.rules_yaml.clone() {
            let (data, watch) = read_and_watch(client, &path).await?;
            self.yaml_read(&path, data);
            watchers.push(watch);
        }
        self.rules_changed();
        Ok(watchers)
    }

    /// Persistent recursive watches on the rules directory and the YAML configurator nodes,
    /// when the consumer obeys rules (a watch on a node that does not exist yet reports its
    /// creation).
    async fn watch_rules(&self, client: &Client) -> Result<Vec<PersistentWatcher>, ZkError> {
        let mut watchers = Vec::new();
        for path in self.rules_dir.iter().chain(&self.rules_yaml) {
            watchers.push(
                client
                    .watch(path, AddWatchMode::PersistentRecursive)
                    .await?,
            );
        }
        Ok(watchers)
    }

    /// List the rules directory and read the YAML configurators (absent: no rules).
    async fn relist_rules(&mut self, client: &Client) -> Result<(), ZkError> {
        if let Some(dir) = self.rules_dir.clone() {
            let children = match client.list_children(&dir).await {
                Ok(c) => c,
                Err(ZkError::NoNode) => Vec::new(),
                Err(e) => return Err(e),
            };
            self.rules_listed(children);
        }
        for path in self.rules_yaml.clone() {
            let data = match client.get_data(&path).await {
                Ok((data, _)) => Some(data),
                Err(ZkError::NoNode) => None,
                Err(e) => return Err(e),
            };
            self.yaml_read(&path, data);
        }
        if let Some(path) = self.tag_path.clone() {
            let data = match client.get_data(&path).await {
                Ok((data, _)) => Some(data),
                Err(ZkError::NoNode) => None,
                Err(e) => return Err(e),
            };
            self.tag_read(&path, data);
        }
        self.rules_changed();
        Ok(())
    }

    /// Follow the providers' application: the tag rule node to obey is its
    /// `<application>.tag-router` (as Dubbo's `TagStateRouter.notify` takes the first
    /// provider's). Returns whether it changed (the old application's rule no longer applies).
    fn retarget_tag(&mut self) -> bool {
        let wanted = self.wanted_tag_path();
        if wanted == self.tag_path {
            return false;
        }
        tracing::debug!(service = %self.source.path.service(), node = ?wanted, "following the providers' tag rule node");
        self.tag_path = wanted;
        self.tag_doc = None;
        self.nodes.touch_all();
        self.status.send_modify(|s| s.tag_rule = None);
        true
    }

    /// The tag rule node of the providers' application (the first provider's, by node name)
    /// when the consumer obeys rules.
    fn wanted_tag_path(&self) -> Option<String> {
        self.rules_dir.as_ref()?;
        let app = self
            .nodes
            .specs()
            .find_map(|(_, s)| s.metadata.get("application").filter(|a| !a.is_empty()))?;
        Some(tag_rule_path(self.source.path.root(), app))
    }

    /// The tag rule node's data (`None`: no such node). A malformed document is logged and
    /// counted once per content and the last good rule stays (Dubbo's `TagStateRouter.process`
    /// keeps its rule when a push does not parse); a deleted node ends the rule.
    fn tag_read(&mut self, path: &str, data: Option<Vec<u8>>) {
        let Some(data) = data.filter(|d| !d.iter().all(u8::is_ascii_whitespace)) else {
            if self.tag_doc.take().is_some_and(|(_, r)| r.is_some()) {
                tracing::info!(node = %path, "tag rule removed");
                self.nodes.touch_all();
            }
            self.status.send_modify(|s| s.tag_rule = None);
            return;
        };
        if self
            .tag_doc
            .as_ref()
            .is_some_and(|(known, _)| *known == data)
        {
            return;
        }
        let reject = |status: &watch::Sender<ZkStatus>| {
            status.send_modify(|s| {
                s.rules_rejected += 1;
                s.rejected += 1;
            });
        };
        let rule = match parse_tag_rule(&String::from_utf8_lossy(&data)) {
            Ok(parsed) => {
                for bad in &parsed.bad_addresses {
                    tracing::warn!(node = %path, address = %bad, "tag rule address skipped: it matches no provider");
                    reject(&self.status);
                }
                if parsed.rule.is_none() {
                    tracing::warn!(node = %path, "tag rule has no tags: not valid, providers' own tags route");
                }
                parsed.rule
            }
            Err(reason) => {
                tracing::warn!(node = %path, %reason, "malformed tag rule skipped; the last good rule stays");
                reject(&self.status);
                self.tag_doc.as_ref().and_then(|(_, last)| last.clone())
            }
        };
        let in_force = rule.as_ref().filter(|r| r.enabled).map(|_| path.to_owned());
        tracing::info!(node = %path, in_force = in_force.is_some(), "tag rule read");
        self.status.send_modify(|s| s.tag_rule = in_force);
        self.tag_doc = Some((data, rule));
        self.nodes.touch_all();
    }

    /// A YAML configurator node's data (`None`: no such node): its rules. A malformed document
    /// is logged and counted once per content, and the node's last good rules stay in force
    /// (as Dubbo's configuration listener keeps its configurators when a push does not parse:
    /// an operator's typo does not undo a disable).
    fn yaml_read(&mut self, path: &str, data: Option<Vec<u8>>) {
        let Some(data) = data.filter(|d| !d.iter().all(u8::is_ascii_whitespace)) else {
            self.yaml.remove(path);
            return;
        };
        if self.yaml.get(path).is_some_and(|(known, _)| *known == data) {
            return;
        }
        let text = String::from_utf8_lossy(&data);
        let rules = match parse_yaml_configurators(&text, self.source.path.service()) {
            Ok(rules) => rules,
            Err(reason) => {
                tracing::warn!(node = %path, %reason, "malformed override rule skipped; the last good rules stay");
                self.status.send_modify(|s| {
                    s.rules_rejected += 1;
                    s.rejected += 1;
                });
                self.yaml
                    .get(path)
                    .map(|(_, last)| last.clone())
                    .unwrap_or_default()
            }
        };
        self.yaml.insert(path.to_owned(), (data, rules));
    }

    /// A full listing of the rules directory replaces the rules; a malformed rule is logged
    /// and counted once while it exists.
    fn rules_listed(&mut self, children: Vec<String>) {
        let mut rules = BTreeMap::new();
        for name in children {
            let node = match self.rules.remove(&name) {
                Some(known) => known,
                None => match RuleNode::parse(&name) {
                    Ok(rule) => Some(rule),
                    Err(e) => {
                        tracing::warn!(dir = ?self.rules_dir, node = %name, reason = %e.reason, "malformed override rule skipped");
                        self.status.send_modify(|s| {
                            s.rules_rejected += 1;
                            s.rejected += 1;
                        });
                        None
                    }
                },
            };
            rules.insert(name, node);
        }
        self.rules = rules;
    }

    /// The rules in force, from the directory's nodes (in name order) and the YAML documents.
    fn rules_changed(&mut self) {
        let from_dir = self.rules.values().flatten().cloned();
        let from_yaml = self.yaml.values().flat_map(|(_, r)| r.iter().cloned());
        let overrides = Overrides::new(from_dir.chain(from_yaml));
        if overrides != self.overrides {
            tracing::info!(service = %self.source.path.service(), rules = overrides.len(), "override rules changed");
            self.status.send_modify(|s| s.rules = overrides.len());
            self.overrides = overrides;
            self.nodes.touch_all();
        }
    }

    /// `spec` (of node `name`) as the override rules make it: its URL rewritten by the rules
    /// that apply, and metadata `dubbo.rules` naming them and what they set.
    fn governed(&self, name: &str, spec: &EndpointSpec) -> EndpointSpec {
        if self.overrides.is_empty() {
            return spec.clone();
        }
        let Ok(url) = ProviderUrl::parse(name) else {
            return spec.clone();
        };
        let (rewritten, applied) = self
            .overrides
            .apply(&url, self.source.application.as_deref());
        let applied: Vec<String> = applied
            .iter()
            .filter(|(_, sets)| !sets.is_empty())
            .map(|(rule, sets)| {
                let sets: Vec<String> = sets.iter().map(|(k, v)| format!("{k}={v}")).collect();
                format!("{} sets {}", rule.text, sets.join(","))
            })
            .collect();
        if applied.is_empty() {
            return spec.clone();
        }
        match rewritten.to_spec() {
            Ok(mut governed) => {
                governed.key = spec.key.clone();
                governed
                    .metadata
                    .insert(RULES_METADATA.to_owned(), applied.join("; "));
                governed
            }
            Err(e) => {
                tracing::debug!(node = name, reason = %e.reason, "override rules left an unusable URL; ignored");
                spec.clone()
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
        let (nodes, _) = self.read_nodes(client, children, false).await?;
        self.listed(nodes);
        Ok(())
    }

    /// The nodes named `children`, decoded; in the plain layout each one's data is read, all
    /// requests sent before the first answer is awaited (one round trip), with a one-shot data
    /// watch on each when `watch`. A node gone in between is left out (its parent's watch, or
    /// the persistent one, reports it).
    async fn read_nodes(
        &mut self,
        client: &Client,
        children: Vec<String>,
        watch: bool,
    ) -> Result<(BTreeMap<String, Option<EndpointSpec>>, Vec<OneshotWatcher>), ZkError> {
        let (mut nodes, mut watchers) = (BTreeMap::new(), Vec::new());
        if self.source.path.layout() == Layout::Dubbo {
            for name in children {
                let decoded = self.decode(&name, &[]);
                nodes.insert(name, decoded);
            }
            return Ok((nodes, watchers));
        }
        let paths: Vec<String> = children
            .iter()
            .map(|c| format!("{}/{c}", self.dir))
            .collect();
        // Requests are sent when the futures are made.
        let reads: Vec<_> = paths
            .iter()
            .map(|p| {
                if watch {
                    Either::Left(
                        client
                            .get_and_watch_data(p)
                            .map(|r| r.map(|(d, _, w)| (d, Some(w)))),
                    )
                } else {
                    Either::Right(client.get_data(p).map(|r| r.map(|(d, _)| (d, None))))
                }
            })
            .collect();
        for (name, read) in children.into_iter().zip(reads) {
            match read.await {
                Ok((data, watcher)) => {
                    watchers.extend(watcher);
                    let decoded = self.decode(&name, &data);
                    nodes.insert(name, decoded);
                }
                Err(ZkError::NoNode) => {}
                Err(e) => return Err(e),
            }
        }
        Ok((nodes, watchers))
    }

    /// A full listing replaces the nodes.
    fn listed(&mut self, nodes: BTreeMap<String, Option<EndpointSpec>>) {
        self.logged.retain(|n| nodes.contains_key(n));
        self.nodes.replace(nodes);
        self.status.send_modify(|s| s.listings += 1);
    }

    fn decode(&mut self, name: &str, data: &[u8]) -> Option<EndpointSpec> {
        let decoded = decode(self.source.path.layout(), name, data, &self.source.filter);
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

    /// Send what changed since the last send, if anything did. False when the consumer is
    /// gone.
    ///
    /// After a listing or a rule change every provider is derived again and the whole set is
    /// sent, in key order (`Update::Reset`); otherwise only the providers of the keys whose
    /// nodes changed are derived again (O(log n) each) and only they are sent: the new and
    /// changed ones (`Update::Add`, in key order), then the keys gone (`Update::Remove`) —
    /// additions first, so a consumer that takes the two apart never sees a set emptied
    /// between them. Still, the consumer's taking a change costs O(providers) (a snapshot is
    /// rebuilt): a directory of thousands of providers changing every few milliseconds would
    /// queue changes faster than anyone uses them. So after a send that took `t` (building
    /// it, and waiting for room in the channel while the consumer lags), the next one waits
    /// `t`; the changes in between are coalesced into it (scale of configuration,
    /// BENCHMARKS.md).
    async fn flush(&mut self) -> bool {
        self.pace.wait().await;
        let began = tokio::time::Instant::now();
        let touched = self.nodes.take_touched();
        let updates = match (touched, self.sent.is_some()) {
            (Some(keys), true) => self.changes(keys),
            _ => self.whole_set(),
        };
        let Some(sent) = self.sent.as_ref().filter(|_| !updates.is_empty()) else {
            return true;
        };
        self.status.send_modify(|s| {
            s.providers = sent.len();
            s.from_cache = false;
        });
        if let Some(cache) = self.cache.as_ref().filter(|_| !sent.is_empty()) {
            cache.send_replace(Arc::new(sent.values().cloned().collect()));
        }
        for update in updates {
            if self.tx.send(Ok(update)).await.is_err() {
                return false;
            }
        }
        self.pace.done(began);
        true
    }

    /// The provider of `key` as sent: the first node (by name) decoding to it, under the rules.
    fn provider(&self, key: &EndpointKey) -> Option<EndpointSpec> {
        let (name, spec) = self.nodes.provider(key)?;
        Some(self.derive(name, spec))
    }

    /// Node `name`'s `spec` as sent: under the override rules and the tag rule.
    fn derive(&self, name: &str, spec: &EndpointSpec) -> EndpointSpec {
        let mut governed = self.governed(name, spec);
        if let Some(rule) = self.tag_doc.as_ref().and_then(|(_, r)| r.as_ref()) {
            rule.annotate(&mut governed);
        }
        governed
    }

    /// Derive the whole set again: a reset to it when it differs from the set last sent, else
    /// nothing (the registry confirmed the cached set, if that was it).
    fn whole_set(&mut self) -> Vec<Update> {
        let mut set: BTreeMap<EndpointKey, EndpointSpec> = BTreeMap::new();
        for (name, spec) in self.nodes.specs() {
            if set.contains_key(&spec.key) {
                tracing::debug!(node = %name, key = %spec.key, "duplicate provider; the first node (by name) wins");
                continue;
            }
            // In name order, the first node of a key is its provider.
            set.insert(spec.key.clone(), self.derive(name, spec));
        }
        if self.sent.as_ref() == Some(&set) {
            self.status
                .send_if_modified(|s| std::mem::replace(&mut s.from_cache, false));
            return Vec::new();
        }
        let reset = Update::Reset(set.values().cloned().collect());
        self.sent = Some(set);
        vec![reset]
    }

    /// Derive the providers of `keys` again into the set last sent: the providers added or
    /// changed and the keys gone, as updates (none when nothing changed).
    fn changes(&mut self, keys: BTreeSet<EndpointKey>) -> Vec<Update> {
        let now: Vec<(EndpointKey, Option<EndpointSpec>)> = keys
            .into_iter()
            .map(|key| {
                let provider = self.provider(&key);
                (key, provider)
            })
            .collect();
        let Some(sent) = self.sent.as_mut() else {
            return Vec::new();
        };
        let (mut added, mut gone) = (Vec::new(), Vec::new());
        for (key, provider) in now {
            match provider {
                Some(spec) if sent.get(&key) != Some(&spec) => {
                    added.push(spec.clone());
                    sent.insert(key, spec);
                }
                Some(_) => {}
                None => {
                    if sent.remove(&key).is_some() {
                        gone.push(key);
                    }
                }
            }
        }
        let added = (!added.is_empty()).then_some(Update::Add(added));
        let gone = (!gone.is_empty()).then_some(Update::Remove(gone));
        added.into_iter().chain(gone).collect()
    }
}

/// The next event of any rules watcher (the tag rule's among them); never, without one.
async fn rules_event(
    watchers: &mut [PersistentWatcher],
    tag: Option<&mut PersistentWatcher>,
) -> WatchedEvent {
    let changed: Vec<_> = watchers
        .iter_mut()
        .chain(tag)
        .map(|w| Box::pin(w.changed()))
        .collect();
    if changed.is_empty() {
        return std::future::pending().await;
    }
    futures_util::future::select_all(changed).await.0
}

/// Read `path`'s data with a one-shot watch on it (on its existence while it does not exist:
/// `None`).
async fn read_and_watch(
    client: &Client,
    path: &str,
) -> Result<(Option<Vec<u8>>, OneshotWatcher), ZkError> {
    loop {
        match client.get_and_watch_data(path).await {
            Ok((data, _, watch)) => return Ok((Some(data), watch)),
            Err(ZkError::NoNode) => {}
            Err(e) => return Err(e),
        }
        // Made in between (`Some`): read it.
        if let (None, watch) = client.check_and_watch_stat(path).await? {
            return Ok((None, watch));
        }
    }
}

/// List `dir`'s children with a one-shot watch on them (on its existence while it does not
/// exist).
async fn list_and_watch(
    client: &Client,
    dir: &str,
) -> Result<(Vec<String>, OneshotWatcher), ZkError> {
    loop {
        match client.list_and_watch_children(dir).await {
            Ok(listed) => return Ok(listed),
            Err(ZkError::NoNode) => {}
            Err(e) => return Err(e),
        }
        // Made in between (`Some`): list it.
        if let (None, watch) = client.check_and_watch_stat(dir).await? {
            return Ok((Vec::new(), watch));
        }
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

/// How a registry cache write is counted in the source's status.
fn cache_status(status: Arc<watch::Sender<ZkStatus>>) -> impl Fn(cache::Written) + Send + 'static {
    move |written| match written {
        Ok(n) => status.send_modify(|s| {
            s.cache_writes += 1;
            s.cached = n;
        }),
        Err(e) => status.send_modify(|s| {
            s.cache_failures += 1;
            s.last_error = Some(e.to_string());
        }),
    }
}
