//! The process around a [`Proxy`]: reload on SIGHUP and when the configuration file changes
//! (a broken file is rejected with one log line and the running configuration stays), and a
//! graceful, bounded drain on SIGTERM or SIGINT.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lbkit_discovery::file::WatchedPath;
use notify::{RecursiveMode, Watcher};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, watch};

use crate::config::Config;
use crate::error::ProxyError;
use crate::server::Proxy;

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
    counts: watch::Sender<ReloadCount>,
}

// === impl Supervisor ===

impl Supervisor {
    /// Supervise `proxy`, whose configuration was read from `path`.
    pub fn new(proxy: Proxy, path: impl Into<PathBuf>, drain: Duration) -> Self {
        Supervisor {
            proxy,
            path: path.into(),
            drain,
            counts: watch::channel(ReloadCount::default()).0,
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
        let result = Config::load(&self.path)
            .map_err(ProxyError::from)
            .and_then(|c| self.proxy.reload(c));
        match &result {
            Ok(()) => self.counts.send_modify(|c| c.applied += 1),
            Err(e) => {
                tracing::error!("configuration rejected, keeping the running one: {e}");
                self.counts.send_modify(|c| c.rejected += 1);
            }
        }
        result
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
        let _watcher = watch_file(&self.path, tx).map_err(std::io::Error::other)?;
        self.counts.send_modify(|c| c.watching = true);
        tokio::pin!(stop);
        loop {
            tokio::select! {
                _ = hup.recv() => { let _ = self.reload(); }
                Some(()) = changes.recv() => {
                    tokio::time::sleep(RELOAD_DEBOUNCE).await;
                    while changes.try_recv().is_ok() {}
                    let _ = self.reload();
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

/// Watch the directory of `path` (editors replace files by renaming; Kubernetes swaps a
/// ConfigMap's `..data` symlink) and report the events after which the file may read
/// differently (`lbkit_discovery::file::WatchedPath`).
fn watch_file(
    path: &Path,
    tx: mpsc::UnboundedSender<()>,
) -> notify::Result<notify::RecommendedWatcher> {
    let mut watched = WatchedPath::new(path);
    let dir = watched.dir();
    let mut watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        if ev.is_ok_and(|ev| watched.concerns(&ev)) {
            let _ = tx.send(());
        }
    })?;
    watcher.watch(&dir, RecursiveMode::NonRecursive)?;
    Ok(watcher)
}
