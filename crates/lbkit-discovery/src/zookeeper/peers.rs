//! Aperture coordinates that organise themselves: the client registers as a Dubbo consumer
//! under `/<root>/<interface>/consumers` (an ephemeral node named by its URL-encoded
//! `consumer://` URL, as Dubbo's own consumers register) and derives its index and the client
//! count from lbkit's nodes there (Dubbo's own consumers, which register there too, are not
//! counted): its place in their sorted names, and how many there are. Every
//! client sorts the same names, so the indices are a permutation of `0..count`; joins and
//! leaves move them; while ZooKeeper is unreachable the last coordinates stay (nothing is sent),
//! and a new session registers again.

use lbkit_core::stage::Coordinates;
use percent_encoding::utf8_percent_encode;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use zookeeper_client::{Acls, Client, CreateMode, Error as ZkError, SessionState};

use super::node::{Layout, ServicePath, JAVA_URL_ENCODE};
use super::{connect, registry_err, ZkConfig};
use crate::controller::error_chain;
use crate::error::DiscoveryError;
use crate::source::Backoff;

/// What marks an lbkit client's consumer node (`lbkit.instance=` URL-encoded): the nodes
/// counted, so Dubbo's own consumers of the interface (which register there too) are not.
const PEER_MARK: &str = "lbkit.instance%3D";

/// Registers this client as a consumer and follows the lbkit consumers of one interface.
#[derive(Clone, Debug)]
pub struct ZkPeers {
    zk: ZkConfig,
    path: ServicePath,
    application: String,
    host: String,
    /// Whether this client takes a place in the aperture (its node carries [`PEER_MARK`] and
    /// it lists its peers), or only registers.
    counted: bool,
}

/// A running [`ZkPeers`]: the coordinates as they change. Dropping it deregisters (the
/// session closes and its ephemeral node goes).
#[derive(Debug)]
pub struct PeersHandle {
    coordinates: watch::Receiver<Option<Coordinates>>,
    node: watch::Receiver<Option<String>>,
    task: JoinHandle<()>,
}

impl Drop for PeersHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl PeersHandle {
    /// This client's coordinates: `None` until the first listing.
    pub fn coordinates(&self) -> watch::Receiver<Option<Coordinates>> {
        self.coordinates.clone()
    }

    /// The path of this client's consumer node, while registered.
    pub fn node(&self) -> Option<String> {
        self.node.borrow().clone()
    }
}

impl ZkPeers {
    /// A consumer of `path`'s interface on `zk`, as application `lbkit` on this host.
    pub fn new(zk: ZkConfig, path: ServicePath) -> Self {
        ZkPeers {
            zk,
            path,
            application: "lbkit".to_owned(),
            host: local_host(),
            counted: true,
        }
    }

    /// Register only, as Dubbo's consumers do, taking no place in the aperture: the node
    /// carries no peer mark (`lbkit.consumer=` instead of `lbkit.instance=`), so the clients
    /// that number themselves do not count this one, and the consumers are not listed (the
    /// coordinates stay `None`). Only the node is watched, to register again if someone
    /// deletes it.
    pub fn register_only(mut self) -> Self {
        self.counted = false;
        self
    }

    /// Name the consumer's application (Dubbo's `application` parameter).
    pub fn with_application(mut self, application: impl Into<String>) -> Self {
        self.application = application.into();
        self
    }

    /// The directory the consumers register in: Dubbo's `/<root>/<interface>/consumers`; in
    /// the plain layout (whose service directory holds the providers themselves)
    /// `/<root>/<service>.consumers` beside it.
    pub fn dir(&self) -> String {
        match self.path.layout() {
            Layout::Dubbo => format!("/{}/{}/consumers", self.path.root(), self.path.service()),
            Layout::Plain => format!("/{}/{}.consumers", self.path.root(), self.path.service()),
        }
    }

    /// This client's consumer URL (unique per instance: a random `lbkit.instance`, or
    /// `lbkit.consumer` when it only registers).
    fn url(&self, instance: u64) -> String {
        let service = self.path.service();
        let ts = lbkit_core::Clock::System.now().as_millis();
        let mark = if self.counted { "instance" } else { "consumer" };
        format!(
            "consumer://{}/{service}?application={}&category=consumers&check=false&\
             interface={service}&lbkit.{mark}={instance:016x}&pid={}&side=consumer&timestamp={ts}",
            self.host,
            self.application,
            std::process::id()
        )
    }

    /// Register and follow, on the current tokio runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn(self) -> PeersHandle {
        let (coords_tx, coordinates) = watch::channel(None);
        let (node_tx, node) = watch::channel(None);
        let name = utf8_percent_encode(
            &self.url(lbkit_core::FastRng::from_entropy().next_u64()),
            JAVA_URL_ENCODE,
        )
        .to_string();
        let task = tokio::spawn(async move {
            let mut backoff = Backoff::between(self.zk.retry_min, self.zk.retry_max);
            loop {
                match connect(&self.zk).await {
                    Ok(client) => {
                        backoff.reset();
                        if let Err(e) = self.session(&client, &name, &coords_tx, &node_tx).await {
                            tracing::warn!(error = %error_chain(&e), "consumer registration lost; keeping the last coordinates");
                        }
                        node_tx.send_replace(None);
                    }
                    Err(e) => {
                        tracing::debug!(error = %error_chain(&e), "zookeeper unreachable; keeping the last coordinates");
                    }
                }
                tokio::time::sleep(backoff.next_delay()).await;
            }
        });
        PeersHandle {
            coordinates,
            node,
            task,
        }
    }

    /// One session: register, then list the consumers at every change until the session ends.
    async fn session(
        &self,
        client: &Client,
        name: &str,
        coords: &watch::Sender<Option<Coordinates>>,
        node_tx: &watch::Sender<Option<String>>,
    ) -> Result<(), DiscoveryError> {
        let dir = self.dir();
        let node = format!("{dir}/{name}");
        register(client, &dir, &node).await?;
        node_tx.send_replace(Some(node.clone()));
        tracing::info!(node = %node, "registered as a consumer");
        if !self.counted {
            return hold(client, &dir, &node).await;
        }
        let mut state = client.state_watcher();
        loop {
            let (mut children, watcher) = client
                .list_and_watch_children(&dir)
                .await
                .map_err(|e| registry_err(&dir, e))?;
            // Only lbkit's clients share the ring: Dubbo's own consumers register here too,
            // and talk to every provider.
            children.retain(|c| c.contains(PEER_MARK));
            if !children.iter().any(|c| c == name) {
                // Deleted by someone else: register again.
                register(client, &dir, &node).await?;
                continue;
            }
            children.sort_unstable();
            let index = children.iter().position(|c| c == name).unwrap_or(0);
            let at = Coordinates {
                index: u32::try_from(index).unwrap_or(u32::MAX),
                count: u32::try_from(children.len()).unwrap_or(u32::MAX),
            };
            coords.send_if_modified(|c| {
                let changed = *c != Some(at);
                *c = Some(at);
                changed
            });
            tokio::select! {
                _ = watcher.changed() => {}
                s = next_end(&mut state) => return Err(registry_err(&dir, s)),
            }
        }
    }
}

/// Keep `node` registered until the session ends: watch it alone, and create it again if
/// someone deletes it.
async fn hold(client: &Client, dir: &str, node: &str) -> Result<(), DiscoveryError> {
    let mut state = client.state_watcher();
    loop {
        let (stat, watcher) = client
            .check_and_watch_stat(node)
            .await
            .map_err(|e| registry_err(node, e))?;
        if stat.is_none() {
            register(client, dir, node).await?;
            continue;
        }
        tokio::select! {
            _ = watcher.changed() => {}
            s = next_end(&mut state) => return Err(registry_err(node, s)),
        }
    }
}

/// The first terminal state of the session.
async fn next_end(state: &mut zookeeper_client::StateWatcher) -> ZkError {
    loop {
        match state.changed().await {
            SessionState::Expired => return ZkError::SessionExpired,
            SessionState::AuthFailed => return ZkError::AuthFailed,
            SessionState::Closed => return ZkError::ClientClosed,
            _ => {}
        }
    }
}

/// Create `node` (ephemeral) under `dir` (made persistent when missing); an old node of the
/// same name is taken over.
async fn register(client: &Client, dir: &str, node: &str) -> Result<(), DiscoveryError> {
    let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
    client
        .mkdir(dir, &persistent)
        .await
        .map_err(|e| registry_err(dir, e))?;
    let ephemeral = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
    match client.create(node, &[], &ephemeral).await {
        Ok(_) | Err(ZkError::NodeExists) => Ok(()),
        Err(e) => Err(registry_err(node, e)),
    }
}

/// This host's name for the consumer URL (the `HOSTNAME` environment variable, else
/// `127.0.0.1`): only a label, the index comes from the node's whole name.
fn local_host() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| {
            !h.is_empty()
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-.".contains(&b))
        })
        .unwrap_or_else(|| "127.0.0.1".to_owned())
}
