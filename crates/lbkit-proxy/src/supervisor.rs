//! The process around a [`Proxy`]: reload on SIGHUP and when the configuration file changes
//! (a broken file is rejected with one log line and the running configuration stays), and a
//! graceful, bounded drain on SIGTERM or SIGINT.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use lbkit_core::Clock;
use lbkit_discovery::file::subscribe;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, watch};

use crate::config::Config;
use crate::error::ProxyError;
use crate::server::{Proxy, Reloader};
use crate::state::State;

/// After a file event, wait this long for the writer to finish (editors write in several
/// steps) before reading the file once.
pub const RELOAD_DEBOUNCE: Duration = Duration::from_millis(100);

/// Reloads so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReloadCount {
    /// Configurations applied.
    pub applied: u64,
    /// Configurations rejected (the running one stayed).
    pub rejected: u64,
    /// Whether signal handlers and the file watcher are installed (changes from now on are seen).
    pub watching: bool,
}

/// Runs a [`Proxy`] with reloads and a graceful shutdown.
#[derive(Debug)]
pub struct Supervisor {
    proxy: Proxy,
    path: PathBuf,
    drain: Duration,
    counts: Arc<watch::Sender<ReloadCount>>,
}

// === impl Supervisor ===

impl Supervisor {
    /// Supervise `proxy`, whose configuration was read from `path`.
    pub fn new(proxy: Proxy, path: impl Into<PathBuf>, drain: Duration) -> Self {
        Supervisor {
            proxy,
            path: path.into(),
            drain,
            counts: Arc::new(watch::channel(ReloadCount::default()).0),
        }
    }

    /// The proxy.
    pub fn proxy(&self) -> &Proxy {
        &self.proxy
    }

    /// Watch the reload counters (wait on them rather than polling).
    pub fn reloads(&self) -> watch::Receiver<ReloadCount> {
        self.counts.subscribe()
    }

    /// Read the configuration file again and apply it, or keep the running one.
    ///
    /// # Errors
    /// The reason the file was rejected.
    pub fn reload(&self) -> Result<(), ProxyError> {
        reload_file(&self.path, &self.proxy.reloader(), &self.counts, self.drain)
    }

    /// [`Supervisor::reload`] on a blocking thread: reading a large file and starting its
    /// services takes tens to hundreds of milliseconds (1 000 services), and this task's
    /// thread may serve connections too (with one worker it is the only one).
    async fn reload_off_thread(&self) {
        let (path, reloader) = (self.path.clone(), self.proxy.reloader());
        let (counts, drain) = (self.counts.clone(), self.drain);
        let job =
            tokio::task::spawn_blocking(move || reload_file(&path, &reloader, &counts, drain));
        if let Err(e) = job.await {
            tracing::error!(error = %e, "the reload stopped before it finished");
        }
    }

    /// Serve until `stop` completes or SIGTERM/SIGINT arrives, then drain. Returns whether the
    /// drain finished in time.
    ///
    /// # Errors
    /// When the signal handlers or the file watcher cannot be installed.
    pub async fn run(self, stop: impl Future<Output = ()>) -> Result<bool, std::io::Error> {
        let mut hup = signal(SignalKind::hangup())?;
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let (tx, mut changes) = mpsc::unbounded_channel();
        // One directory watcher for the process (`lbkit_discovery::file::subscribe`): it hears of
        // editors' renames and Kubernetes' `..data` symlink swaps, not only in-place writes.
        let _watch = subscribe(&self.path, tx).map_err(std::io::Error::other)?;
        self.counts.send_modify(|c| c.watching = true);
        tokio::pin!(stop);
        loop {
            tokio::select! {
                _ = hup.recv() => self.reload_off_thread().await,
                Some(change) = changes.recv() => {
                    if let Err(reason) = change {
                        tracing::warn!(%reason, "configuration file watch error");
                        continue;
                    }
                    tokio::time::sleep(RELOAD_DEBOUNCE).await;
                    while changes.try_recv().is_ok() {}
                    self.reload_off_thread().await;
                }
                _ = term.recv() => break,
                _ = int.recv() => break,
                _ = &mut stop => break,
            }
        }
        tracing::info!(drain = ?self.drain, "shutting down: draining connections");
        Ok(self.proxy.shutdown(self.drain).await)
    }
}

/// Read the configuration file at `path` and apply it, or keep the running one; count either.
fn reload_file(
    path: &Path,
    reloader: &Reloader,
    counts: &watch::Sender<ReloadCount>,
    drain: Duration,
) -> Result<(), ProxyError> {
    let began = Clock::System.now();
    let result = Config::load(path)
        .map_err(ProxyError::from)
        .and_then(|c| reloader.reload_since(c, began));
    match result {
        Ok(replaced) => {
            counts.send_modify(|c| c.applied += 1);
            retire(replaced, drain);
            Ok(())
        }
        Err(e) => {
            tracing::error!("configuration rejected, keeping the running one: {e}");
            counts.send_modify(|c| c.rejected += 1);
            Err(e)
        }
    }
}

/// How often a replaced configuration's thread looks whether requests still use it.
const RETIRE_POLL: Duration = Duration::from_millis(5);

/// Let go of a replaced configuration on a thread of its own. Whichever thread drops the last
/// reference frees it (with 1 000 services of 100 endpoints, tens of milliseconds of frees),
/// and requests that began before the swap hold one: wait for them, at most `drain`, so that
/// the frees happen here and not on a worker between two requests.
fn retire(replaced: Arc<State>, drain: Duration) {
    let spawned = std::thread::Builder::new()
        .name("lbkit-retire".into())
        .spawn(move || {
            let mut waited = Duration::ZERO;
            while Arc::strong_count(&replaced) > 1 && waited < drain {
                std::thread::sleep(RETIRE_POLL);
                waited += RETIRE_POLL;
            }
            drop(replaced);
        });
    if let Err(e) = spawned {
        // The configuration was dropped with the closure: freed here, on this thread.
        tracing::debug!(error = %e, "no thread to retire the replaced configuration");
    }
}
