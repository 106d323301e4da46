//! The file source: an endpoints file (TOML, JSON or Dubbo URL lines, read by [`load`]),
//! watched with `notify` and reloaded when it changes.
//!
//! * The file's **directory** is watched, so editors and deploy tools that replace the file
//!   (write a temporary file, then rename it over) are seen as well as in-place writes. The
//!   process has one directory watcher for all its files ([`subscribe`](super::subscribe)).
//! * Events arriving within [`FileSource::with_debounce`] of each other cause one reload.
//! * A reload that parses to the same endpoints sends nothing. One that fails to read or parse
//!   keeps the previous set (the stream yields the error, the controller keeps the last
//!   snapshot), logs a warning and counts it in [`FileStatus::errors`]; fixing the file
//!   recovers.
//! * Reloads go through the same [`Controller`](crate::Controller) path as every source:
//!   endpoints that stay keep their statistics, so calls in flight finish normally.

use std::path::{Path, PathBuf};
use std::time::Duration;

use lbkit_core::{Clock, EndpointSpec, Update};
use notify::event::{AccessKind, AccessMode, EventKind};
use tokio::sync::{mpsc, watch};

use super::load;
use crate::error::{DiscoveryError, SourceError};
use crate::source::{ChannelStream, SourceItem, Status, UpdateStream, SOURCE_QUEUE};

/// Default pause after a change before reloading: long enough to see a write and its rename as
/// one change, short next to how often people edit endpoint files.
pub const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(50);

/// Counters of a [`FileSource`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileStatus {
    /// Successful loads (including the first), whether or not the set changed.
    pub loads: u64,
    /// Loads that failed to read or parse (the previous set was kept).
    pub errors: u64,
    /// The last failure, if the last load failed.
    pub last_error: Option<String>,
}

/// A watched endpoints file.
///
/// ```no_run
/// # async fn demo() -> Result<(), lbkit_discovery::DiscoveryError> {
/// use lbkit_discovery::file::FileSource;
/// let (updates, status) = FileSource::new("endpoints.toml").spawn()?;
/// # let _ = (updates, status); Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct FileSource {
    path: PathBuf,
    debounce: Duration,
    clock: Clock,
}

// === impl FileSource ===

impl FileSource {
    /// Watch `path` (`.toml`, `.json` or `.txt`, as [`load`] reads them).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        FileSource {
            path: path.into(),
            debounce: DEFAULT_DEBOUNCE,
            clock: Clock::System,
        }
    }

    /// Wait this long after a change for further changes before reloading
    /// (default [`DEFAULT_DEBOUNCE`]).
    pub fn with_debounce(mut self, debounce: Duration) -> Self {
        self.debounce = debounce;
        self
    }

    /// Use `clock` for the `now` that [`load`] needs.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Start watching on the current tokio runtime. The stream yields a `Reset` with the file's
    /// endpoints (or the error, if it is broken), then one per change. The task ends when the
    /// stream is dropped.
    ///
    /// # Errors
    /// [`DiscoveryError::Watch`] when the file's directory cannot be watched.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn(self) -> Result<(UpdateStream, Status<FileStatus>), DiscoveryError> {
        let (ev_tx, ev_rx) = mpsc::unbounded_channel();
        let subscription = super::dirs::subscribe(self.path.clone(), ev_tx).map_err(|e| {
            DiscoveryError::Watch {
                path: WatchedPath::new(self.path.clone()).dir(),
                reason: e.to_string(),
            }
        })?;
        let (tx, rx) = mpsc::channel(SOURCE_QUEUE);
        let (status_tx, status_rx) = watch::channel(FileStatus::default());
        let task = Task {
            source: self,
            tx,
            status: status_tx,
            last: None,
        };
        tokio::spawn(task.run(subscription, ev_rx));
        Ok((ChannelStream::new(rx).boxed(), Status::new(status_rx)))
    }
}

struct Task {
    source: FileSource,
    tx: mpsc::Sender<SourceItem>,
    status: watch::Sender<FileStatus>,
    /// The set last sent.
    last: Option<Vec<EndpointSpec>>,
}

impl Task {
    async fn run(
        mut self,
        subscription: super::dirs::Subscription,
        mut changes: mpsc::UnboundedReceiver<super::dirs::Change>,
    ) {
        let _subscription = subscription; // dropping it stops the deliveries
        if !self.reload().await {
            return;
        }
        loop {
            let change = tokio::select! {
                change = changes.recv() => change,
                () = self.tx.closed() => return,
            };
            match change {
                None => {
                    // Only if the watcher's thread died: say so, the source is deaf from here.
                    tracing::warn!(path = %self.source.path.display(), "the directory watcher is gone; the file is no longer followed");
                    return;
                }
                Some(Ok(())) => {}
                Some(Err(reason)) => {
                    let err = DiscoveryError::Watch {
                        path: self.source.path.clone(),
                        reason,
                    };
                    tracing::warn!(error = %err, "file watch error");
                    if self.tx.send(Err(err)).await.is_err() {
                        return;
                    }
                    continue;
                }
            }
            let deadline = tokio::time::Instant::now() + self.source.debounce;
            while let Ok(Some(_)) = tokio::time::timeout_at(deadline, changes.recv()).await {}
            if !self.reload().await {
                return;
            }
        }
    }

    /// Load the file and send what changed. Returns false when the consumer is gone.
    async fn reload(&mut self) -> bool {
        let path = self.source.path.clone();
        let now = self.source.clock.now();
        let loaded = tokio::task::spawn_blocking(move || load(&path, now))
            .await
            .unwrap_or_else(|e| {
                Err(SourceError::new(
                    self.source.path.display().to_string(),
                    None,
                    format!("reload task failed: {e}"),
                ))
            });
        match loaded {
            Ok(entries) => {
                let specs: Vec<EndpointSpec> = entries.into_iter().map(|e| e.spec).collect();
                self.status.send_modify(|s| {
                    s.loads += 1;
                    s.last_error = None;
                });
                if self.last.as_ref() == Some(&specs) {
                    return !self.tx.is_closed();
                }
                tracing::info!(path = %self.source.path.display(), endpoints = specs.len(), "endpoints file loaded");
                self.last = Some(specs.clone());
                self.tx.send(Ok(Update::Reset(specs))).await.is_ok()
            }
            Err(e) => {
                tracing::warn!(error = %e, "endpoints file not reloaded; keeping the previous set");
                self.status.send_modify(|s| {
                    s.errors += 1;
                    s.last_error = Some(e.to_string());
                });
                self.tx.send(Err(DiscoveryError::File(e))).await.is_ok()
            }
        }
    }
}

/// A file watched through its directory: which events in that directory may have changed
/// what the file reads.
///
/// An event naming the file counts (an in-place write, an editor's rename over it). So does
/// any other change in the directory after which the path resolves somewhere else: a file
/// reached through symlinks, as Kubernetes mounts a ConfigMap (`app.toml → ..data/app.toml`,
/// `..data → ..2026_12_01_…`), is updated by renaming a new `..data` symlink over the old
/// one, an event that never names the file. Plain reads never count (our own reloads open
/// and read the file).
///
/// ```
/// use lbkit_discovery::file::WatchedPath;
/// let mut watched = WatchedPath::new("/etc/lbkit/proxy.toml");
/// let event = notify::Event::new(notify::EventKind::Any).add_path("/etc/lbkit/proxy.toml".into());
/// assert!(watched.concerns(&event));
/// ```
#[derive(Debug, Clone)]
pub struct WatchedPath {
    path: PathBuf,
    /// Where the path led after the last event that concerned it.
    resolved: Option<PathBuf>,
}

impl WatchedPath {
    /// Watch `path` (resolved now).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        let resolved = std::fs::canonicalize(&path).ok();
        WatchedPath { path, resolved }
    }

    /// The path as given.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where the path led after the last event that concerned it (`None`: nowhere).
    pub(crate) fn resolved(&self) -> Option<&Path> {
        self.resolved.as_deref()
    }

    /// The directory to watch: the file's own (renames over it happen there).
    pub fn dir(&self) -> PathBuf {
        match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        }
    }

    /// Whether `ev`, seen in [`dir`](Self::dir), may have changed the file (see the type's
    /// docs). Resolves the path again on every event that is not a read.
    pub fn concerns(&mut self, ev: &notify::Event) -> bool {
        if read_only(ev) {
            return false;
        }
        let named = ev
            .paths
            .iter()
            .any(|p| p.file_name() == self.path.file_name());
        let moved = self.refresh();
        named || moved
    }

    /// Resolve the path again; whether it now leads elsewhere than before.
    pub(crate) fn refresh(&mut self) -> bool {
        let resolved = std::fs::canonicalize(&self.path).ok();
        let moved = resolved != self.resolved;
        self.resolved = resolved;
        moved
    }
}

/// Whether `ev` is a plain read, which never changes a file (our own reloads open and read it).
pub(super) fn read_only(ev: &notify::Event) -> bool {
    matches!(
        ev.kind,
        EventKind::Access(AccessKind::Open(_) | AccessKind::Read | AccessKind::Any)
            | EventKind::Access(AccessKind::Close(AccessMode::Read | AccessMode::Execute))
    )
}
