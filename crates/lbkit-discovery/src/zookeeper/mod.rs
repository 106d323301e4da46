//! ZooKeeper in Dubbo's registry layout (and a plain one): the consumer ([`ZkSource`]), the
//! provider side ([`ZkRegistration`]) and the registry cache (feature `zookeeper`).
//!
//! **Layouts** ([`Layout`]). Dubbo: `/<root>/<interface>/providers/<URL-encoded provider URL>`,
//! root `dubbo` by default, decoded with [`ProviderUrl`](crate::dubbo::ProviderUrl) (weight,
//! timestamp, warm-up, `enabled`/`disabled`) and filtered by group, version and protocol
//! ([`ProviderFilter`]). Plain: `/<root>/<service>/<host:port>` with optional JSON data
//! `{"weight", "zone", "metadata"}`.
//!
//! **Consumer.** One persistent recursive watch on the provider directory delivers every
//! creation, deletion and data change (no polling); after a reconnection the directory is
//! listed again, since events can be lost while disconnected (ZOOKEEPER-4698). A listing or a
//! rule change is sent as a full `Reset`, sorted by key (registry order is arbitrary); a node
//! change as the providers it changed (`Add`, `Remove`). Servers older than 3.6
//! have no persistent watches (they answer `UNIMPLEMENTED` and close the connection, as many
//! Dubbo shops' 3.4 and 3.5 ensembles do): the consumer then watches with one-shot watches, as
//! Dubbo's own Curator consumer does ([`WatchMode`]; [`ZkStatus::one_shot_watches`] says so). Malformed nodes are
//! skipped, logged once per node and counted ([`ZkStatus::rejected`]); they never stop the
//! watch. While ZooKeeper is unreachable or the session is lost, nothing is sent, so the last
//! set stays published; a new session is made after expiry. The last non-empty set is saved to
//! the registry cache file ([`ZkSource::with_cache`]) and served at start-up when the registry
//! cannot be reached.
//!
//! **Peers.** [`ZkPeers`] registers the client as a Dubbo consumer under
//! `/<root>/<interface>/consumers` and derives its aperture coordinates (its index among the
//! consumers, and their count) from the nodes there, following joins and leaves and keeping
//! the last coordinates while the registry is unreachable.
//!
//! **Provider.** [`ZkRegistration`] creates an ephemeral node, re-creates it with a new
//! session after expiry, follows weight changes, and deletes it on [`ZkRegistration::deregister`].
//!
//! ```no_run
//! # async fn demo() -> Result<(), lbkit_discovery::DiscoveryError> {
//! use lbkit_discovery::zookeeper::{Layout, Provider, ServicePath, ZkConfig, ZkRegistration, ZkSource};
//! let zk = ZkConfig::new("127.0.0.1:2181");
//! let path = ServicePath::new("dubbo", "com.acme.Greeter", Layout::Dubbo)?;
//! let registration = ZkRegistration::spawn(zk.clone(), path.clone(), Provider::new("10.0.0.1:20880"))?;
//! let (updates, status) = ZkSource::new(zk, path).with_cache("greeter.cache.json").spawn();
//! // Controller::new(..).run(updates, publisher(balancer, clock)).await;
//! # let _ = (updates, status);
//! registration.deregister().await;
//! # Ok(()) }
//! ```

use std::time::Duration;

use zookeeper_client::Client;

use crate::address::check_address;
use crate::error::DiscoveryError;

mod consumer;
mod node;
mod nodes;
mod peers;
mod provider;

pub use crate::cache::{read_cache, write_cache};
pub use crate::governance::RULES_METADATA;
pub use consumer::{WatchMode, ZkSource, ZkStatus};
pub use node::{decode_node, Layout, Provider, ProviderFilter, ServicePath, KNOWN_PROTOCOLS};
pub use peers::{PeersHandle, ZkPeers};
pub use provider::{expire_session, RegistrationStatus, ZkRegistration, DEREGISTER_TIMEOUT};
pub use zookeeper_client::SessionInfo;

/// How to reach ZooKeeper.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZkConfig {
    /// Connection string: `host:port[,host:port…]`.
    pub servers: String,
    /// Session timeout asked of the server (which clamps it to its `min`/`maxSessionTimeout`).
    /// Default 6 s, the client's default: ephemeral nodes of a dead provider vanish that long
    /// after it stopped answering.
    pub session_timeout: Duration,
    /// Bound on establishing one session. Default 5 s.
    pub connect_timeout: Duration,
    /// First pause between failed connection attempts; doubles up to [`ZkConfig::retry_max`].
    /// Default 100 ms.
    pub retry_min: Duration,
    /// Longest pause between connection attempts. Default 2 s.
    pub retry_max: Duration,
}

// === impl ZkConfig ===

impl ZkConfig {
    /// Defaults for `servers`.
    pub fn new(servers: impl Into<String>) -> Self {
        ZkConfig {
            servers: servers.into(),
            session_timeout: Duration::from_secs(6),
            connect_timeout: Duration::from_secs(5),
            retry_min: Duration::from_millis(100),
            retry_max: Duration::from_secs(2),
        }
    }

    /// Check the connection string.
    ///
    /// # Errors
    /// [`DiscoveryError::Config`] naming the bad server.
    pub fn validate(&self) -> Result<(), DiscoveryError> {
        for server in self.servers.split(',') {
            check_address(server.trim()).map_err(|reason| node::config_err("zk", reason))?;
        }
        Ok(())
    }
}

/// One attempt to establish a session, bounded by `connect_timeout`. Fails fast when every
/// server refuses the connection.
pub(crate) async fn connect(zk: &ZkConfig) -> Result<Client, DiscoveryError> {
    let connector = Client::connector()
        .with_session_timeout(zk.session_timeout)
        .with_fail_eagerly();
    let unreachable = |source| DiscoveryError::Unreachable {
        servers: zk.servers.clone(),
        source,
    };
    match tokio::time::timeout(zk.connect_timeout, connector.connect(&zk.servers)).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(e)) => Err(unreachable(e)),
        Err(_) => Err(unreachable(zookeeper_client::Error::Timeout)),
    }
}

pub(crate) fn registry_err(path: &str, source: zookeeper_client::Error) -> DiscoveryError {
    DiscoveryError::Registry {
        path: path.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap_and_resets() {
        let zk = ZkConfig::new("a:1");
        let mut b = crate::source::Backoff::between(zk.retry_min, zk.retry_max);
        let seen: Vec<u64> = (0..7).map(|_| b.next_delay().as_millis() as u64).collect();
        assert_eq!(seen, [100, 200, 400, 800, 1600, 2000, 2000]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(100));
    }

    #[test]
    fn servers_are_checked() {
        assert!(ZkConfig::new("127.0.0.1:2181,zk2:2181").validate().is_ok());
        assert!(ZkConfig::new("127.0.0.1").validate().is_err());
        assert!(ZkConfig::new("127.0.0.1:2181/chroot").validate().is_err());
    }
}
