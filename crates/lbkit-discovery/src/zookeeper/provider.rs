//! The provider side: an ephemeral registration that survives session expiry.

use std::time::Duration;

use lbkit_core::Clock;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use zookeeper_client::{Acls, Client, CreateMode, Error as ZkError, SessionInfo, SessionState};

use super::node::{Layout, Provider, ServicePath};
use super::{connect, registry_err, ZkConfig};
use crate::controller::error_chain;
use crate::error::DiscoveryError;
use crate::source::Backoff;
use crate::source::Status;

/// How long a graceful deregistration may take: deleting the node, then waiting for the
/// session to close (ZooKeeper answers in milliseconds; this only bounds a dead server).
pub const DEREGISTER_TIMEOUT: Duration = Duration::from_secs(5);

/// State and counters of a [`ZkRegistration`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegistrationStatus {
    /// Whether the node exists under the current session.
    pub registered: bool,
    /// Times the node was created (1, plus one per re-registration after session expiry).
    pub registrations: u64,
    /// The node's full path, once registered.
    pub node: Option<String>,
    /// The last problem, if any.
    pub last_error: Option<String>,
}

enum Command {
    SetWeight(u32, oneshot::Sender<Result<(), DiscoveryError>>),
}

/// An endpoint registered as an ephemeral node, kept registered across session expiry (a new
/// session re-creates it), and removed by [`ZkRegistration::deregister`] — or, if the handle is
/// dropped, by the background task.
#[derive(Debug)]
pub struct ZkRegistration {
    commands: mpsc::Sender<Command>,
    shutdown: Option<oneshot::Sender<()>>,
    status: Status<RegistrationStatus>,
    session: watch::Receiver<Option<SessionInfo>>,
    task: JoinHandle<()>,
}

// === impl ZkRegistration ===

impl ZkRegistration {
    /// Register `provider` under `path` on `zk`, on the current tokio runtime. Registration
    /// happens in the background (retrying until ZooKeeper answers); wait for it with
    /// [`ZkRegistration::status`].
    ///
    /// # Errors
    /// [`DiscoveryError::Config`] for a provider that cannot be registered (bad address,
    /// unknown protocol, a value a URL cannot carry) or a bad connection string.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn(
        zk: ZkConfig,
        path: ServicePath,
        provider: Provider,
    ) -> Result<Self, DiscoveryError> {
        Self::spawn_with_delay(zk, path, provider, Duration::ZERO)
    }

    /// Like [`ZkRegistration::spawn`], waiting `delay` after a session expiry before
    /// registering again (default zero). Gives consumers a moment to see the provider gone,
    /// as after a real crash; tests use it to observe both transitions.
    ///
    /// # Errors
    /// As [`ZkRegistration::spawn`].
    pub fn spawn_with_delay(
        zk: ZkConfig,
        path: ServicePath,
        provider: Provider,
        delay: Duration,
    ) -> Result<Self, DiscoveryError> {
        zk.validate()?;
        provider.validate()?;
        let (commands, rx) = mpsc::channel(8);
        let (shutdown, shutdown_rx) = oneshot::channel();
        let (status_tx, status_rx) = watch::channel(RegistrationStatus::default());
        let (session_tx, session_rx) = watch::channel(None);
        let task = Task {
            zk,
            path,
            provider,
            delay,
            // Dubbo's `timestamp` is the export time, kept across re-registrations so warm-up
            // does not restart after a session expiry.
            timestamp_ms: Clock::System.now().as_millis(),
            status: status_tx,
            session: session_tx,
        };
        Ok(ZkRegistration {
            commands,
            shutdown: Some(shutdown),
            status: Status::new(status_rx),
            session: session_rx,
            task: tokio::spawn(task.run(rx, shutdown_rx)),
        })
    }

    /// The registration's state; wait on it with [`Status::wait_for`].
    pub fn status(&self) -> Status<RegistrationStatus> {
        self.status.clone()
    }

    /// The current session (id and password), e.g. to expire it in a failure test with
    /// [`expire_session`].
    pub fn session(&self) -> Option<SessionInfo> {
        self.session.borrow().clone()
    }

    /// Change the registered weight: the Dubbo layout replaces the node (delete and create in
    /// one transaction, so consumers never see both), the plain layout rewrites its data.
    ///
    /// # Errors
    /// The ZooKeeper error when registered and the update fails; while not registered the new
    /// weight is kept for the next registration and this returns `Ok`.
    pub async fn set_weight(&self, weight: u32) -> Result<(), DiscoveryError> {
        let (tx, rx) = oneshot::channel();
        let gone = || DiscoveryError::Config {
            field: "registration",
            reason: "the registration task has ended".into(),
        };
        self.commands
            .send(Command::SetWeight(weight, tx))
            .await
            .map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }

    /// Delete the node and close the session, waiting at most [`DEREGISTER_TIMEOUT`].
    pub async fn deregister(mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        let task = &mut self.task;
        if tokio::time::timeout(DEREGISTER_TIMEOUT * 2, task)
            .await
            .is_err()
        {
            tracing::warn!("deregistration did not finish in time");
        }
    }
}

struct Task {
    zk: ZkConfig,
    path: ServicePath,
    provider: Provider,
    delay: Duration,
    timestamp_ms: u64,
    status: watch::Sender<RegistrationStatus>,
    session: watch::Sender<Option<SessionInfo>>,
}

impl Task {
    async fn run(mut self, mut commands: mpsc::Receiver<Command>, mut stop: oneshot::Receiver<()>) {
        let mut backoff = Backoff::between(self.zk.retry_min, self.zk.retry_max);
        loop {
            let client = tokio::select! {
                c = connect(&self.zk) => c,
                _ = &mut stop => return,
            };
            let registered = match client {
                Ok(client) => match self.register(&client).await {
                    Ok(node) => Ok((client, node)),
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            };
            let (client, node) = match registered {
                Ok(ok) => ok,
                Err(e) => {
                    self.failed(&e);
                    tokio::select! {
                        () = tokio::time::sleep(backoff.next_delay()) => continue,
                        _ = &mut stop => return,
                    }
                }
            };
            backoff.reset();
            if self.serve(client, node, &mut commands, &mut stop).await {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep(self.delay) => {}
                _ = &mut stop => return,
            }
        }
    }

    /// Keep one session's registration. Returns true after a graceful shutdown, false when the
    /// session ended and a new one is needed.
    async fn serve(
        &mut self,
        client: Client,
        mut node: String,
        commands: &mut mpsc::Receiver<Command>,
        stop: &mut oneshot::Receiver<()>,
    ) -> bool {
        let mut state = client.state_watcher();
        loop {
            tokio::select! {
                s = state.changed() => match s {
                    SessionState::SyncConnected => {
                        // Reconnected within the session: the node survives, unless someone
                        // deleted it meanwhile.
                        if let Ok(None) = client.check_stat(&node).await {
                            match self.register(&client).await {
                                Ok(n) => node = n,
                                Err(e) => self.failed(&e),
                            }
                        }
                    }
                    s if s.is_terminated() => {
                        tracing::warn!(node = %node, state = %s, "zookeeper session ended; registering again");
                        self.status.send_modify(|st| st.registered = false);
                        return false;
                    }
                    _ => {}
                },
                cmd = commands.recv() => match cmd {
                    Some(Command::SetWeight(w, reply)) => {
                        let result = self.set_weight(&client, &node, w).await;
                        if let Ok(n) = &result {
                            node.clone_from(n);
                        }
                        let _ = reply.send(result.map(|_| ()));
                    }
                    None => break,
                },
                _ = &mut *stop => break,
            }
        }
        self.close(client, &node, state).await;
        true
    }

    async fn set_weight(
        &mut self,
        client: &Client,
        node: &str,
        weight: u32,
    ) -> Result<String, DiscoveryError> {
        let old = self.provider.weight;
        self.provider.weight = weight;
        let (name, data) = self.provider.node(&self.path, self.timestamp_ms);
        let path = format!("{}/{name}", self.path.dir());
        let result = match self.path.layout() {
            Layout::Plain => client.set_data(node, &data, None).await.map(|_| ()),
            Layout::Dubbo if path == node => Ok(()),
            Layout::Dubbo => {
                let mut multi = client.new_multi_writer();
                let options = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
                let added = multi
                    .add_delete(node, None)
                    .and_then(|()| multi.add_create(&path, &data, &options));
                match added {
                    Ok(()) => multi.commit().await.map(|_| ()).map_err(ZkError::from),
                    Err(e) => Err(e),
                }
            }
        };
        match result {
            Ok(()) => {
                self.status.send_modify(|s| s.node = Some(path.clone()));
                Ok(path)
            }
            Err(e) => {
                self.provider.weight = old;
                Err(registry_err(node, e))
            }
        }
    }

    /// Create the ephemeral node (and its parents). Returns its path.
    async fn register(&mut self, client: &Client) -> Result<String, DiscoveryError> {
        let dir = self.path.dir();
        let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
        client
            .mkdir(&dir, &persistent)
            .await
            .map_err(|e| registry_err(&dir, e))?;
        let (name, data) = self.provider.node(&self.path, self.timestamp_ms);
        let node = format!("{dir}/{name}");
        let ephemeral = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
        let mut created = client.create(&node, &data, &ephemeral).await.map(|_| ());
        if let Err(ZkError::NodeExists) = created {
            // Left by an earlier session of ours that the server has not expired yet, or held
            // by another process for the same address: take it over, as Dubbo does.
            match client.check_stat(&node).await {
                Ok(Some(stat)) if stat.ephemeral_owner == client.session_id().0 => {
                    created = Ok(());
                }
                _ => {
                    let _ = client.delete(&node, None).await;
                    created = client.create(&node, &data, &ephemeral).await.map(|_| ());
                }
            }
        }
        created.map_err(|e| registry_err(&node, e))?;
        tracing::info!(node = %node, "registered");
        self.session.send_replace(Some(client.session().clone()));
        self.status.send_modify(|s| {
            s.registered = true;
            s.registrations += 1;
            s.node = Some(node.clone());
            s.last_error = None;
        });
        Ok(node)
    }

    fn failed(&self, e: &DiscoveryError) {
        let text = error_chain(e);
        tracing::warn!(error = %text, "registration failed; retrying");
        self.status.send_modify(|s| {
            s.registered = false;
            s.last_error = Some(text);
        });
    }

    /// Delete the node, then drop the client and wait for the session to close (the client
    /// has no `close()`; ephemeral nodes would otherwise linger for a session timeout).
    async fn close(&self, client: Client, node: &str, mut state: zookeeper_client::StateWatcher) {
        match tokio::time::timeout(DEREGISTER_TIMEOUT, client.delete(node, None)).await {
            Ok(Ok(()) | Err(ZkError::NoNode)) => tracing::info!(node = %node, "deregistered"),
            Ok(Err(e)) => {
                tracing::warn!(node = %node, error = %e, "could not delete the node; it goes with the session")
            }
            Err(_) => {
                tracing::warn!(node = %node, "delete timed out; the node goes with the session")
            }
        }
        drop(client);
        let closed = async { while !state.changed().await.is_terminated() {} };
        if tokio::time::timeout(DEREGISTER_TIMEOUT, closed)
            .await
            .is_err()
        {
            tracing::warn!("zookeeper session did not close in time");
        }
        self.session.send_replace(None);
        self.status.send_modify(|s| s.registered = false);
    }
}

/// Expire another client's session: attach to it with its id and password, then close it.
/// The server deletes the session's ephemeral nodes and the owner sees `Expired` — what a long
/// network partition does. For failure tests and chaos drills.
///
/// The owner reconnects as soon as the server hands its session to us, and may take it back
/// before our close arrives, so this attaches and closes until the server answers that the
/// session has expired, within three connection timeouts.
///
/// # Errors
/// [`DiscoveryError::Unreachable`] when the session could not be closed in time.
pub async fn expire_session(zk: &ZkConfig, session: SessionInfo) -> Result<(), DiscoveryError> {
    let deadline = tokio::time::Instant::now() + zk.connect_timeout * 3;
    let mut last = ZkError::Timeout;
    while tokio::time::Instant::now() < deadline {
        let attach = Client::connector()
            .with_session(session.clone())
            .with_fail_eagerly()
            .connect(&zk.servers);
        match tokio::time::timeout_at(deadline, attach).await {
            Ok(Err(ZkError::SessionExpired)) => return Ok(()),
            Ok(Ok(client)) => {
                let mut state = client.state_watcher();
                drop(client); // closes the session, unless the owner took it back first
                let closed = async { while !state.changed().await.is_terminated() {} };
                let _ = tokio::time::timeout(CLOSE_WAIT, closed).await;
            }
            Ok(Err(e)) => last = e,
            Err(_) => break,
        }
    }
    Err(DiscoveryError::Unreachable {
        servers: zk.servers.clone(),
        source: last,
    })
}

/// How long [`expire_session`] waits for one close before trying again.
const CLOSE_WAIT: Duration = Duration::from_secs(1);
