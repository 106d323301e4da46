//! One directory watcher for the whole process.
//!
//! Every watched file (each [`FileSource`](super::FileSource), the proxy's own configuration)
//! is followed through its directory ([`WatchedPath`]). One `notify` watcher serves them all:
//! one inotify instance for the process (and two threads: notify's, and ours that routes its
//! events), each directory watched once however many of its files are followed, and each event
//! delivered only to the files it may concern. Plain reads (opens and closes without a write,
//! our own reloads among them) stay on notify's thread and never wake ours.
//!
//! Before, every file opened a watcher of its own. Linux allows 128 inotify instances per
//! user by default (`fs.inotify.max_user_instances`), so a proxy or `lbkit xds` with more than
//! about 120 file services could not start; and files sharing a directory all woke up, and
//! resolved their paths, on every write to any of them.
//!
//! **Who gets an event.** A file whose path leads straight to itself (no symlink on the
//! way) can only change through events that name it, so it gets those alone. A file reached
//! through a symlink (a Kubernetes ConfigMap's `..data` swap) or not there yet gets every
//! event of its directory, and [`WatchedPath::concerns`] decides. When the kernel dropped
//! events (a queue overflow: `notify` asks for a rescan), every file is told it may have
//! changed.
//!
//! **Who wakes the hub thread.** The same rule, applied on notify's thread: an event that names
//! no followed file of a directory whose files are all reached straight (a log written next to
//! the configuration) is dropped there ([`filter`]), so it costs one lookup and no wake-up.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

use super::watch::WatchedPath;
use filter::Filter;

mod filter;

/// What a subscriber hears: the file may have changed (`Ok`), or the watch failed (`Err`,
/// the reason).
pub type Change = Result<(), String>;

/// A file followed by the process's directory watcher (see [`subscribe`]). Dropping it stops
/// the deliveries, and unwatches the directory when it was the directory's last file.
#[derive(Debug)]
pub struct Subscription {
    id: u64,
    hub: std_mpsc::Sender<Msg>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        // The hub thread never ends, so the send only fails at process exit.
        let _ = self.hub.send(Msg::Unsubscribe(self.id));
    }
}

/// Follow `path` through the process's one directory watcher: `tx` gets `Ok(())` after every
/// event that may have changed what the file reads ([`WatchedPath::concerns`]) and `Err` when
/// the watch reports an error. Blocks until the directory is watched (a round trip to the
/// watcher's thread: microseconds, so callers on an async runtime call it directly).
///
/// # Errors
/// When the directory does not exist or cannot be watched, or the watcher cannot be created.
pub fn subscribe(
    path: impl Into<PathBuf>,
    tx: mpsc::UnboundedSender<Change>,
) -> Result<Subscription, notify::Error> {
    let hub = hub()?;
    let (reply, answer) = std_mpsc::sync_channel(1);
    let watched = WatchedPath::new(path);
    let gone = || notify::Error::generic("the directory watcher's thread is gone");
    hub.send(Msg::Subscribe { watched, tx, reply })
        .map_err(|_| gone())?;
    let id = answer.recv().map_err(|_| gone())??;
    Ok(Subscription {
        id,
        hub: hub.clone(),
    })
}

/// The hub thread's mail: the watcher's events, and subscriptions coming and going.
enum Msg {
    Event(notify::Result<notify::Event>),
    Subscribe {
        watched: WatchedPath,
        tx: mpsc::UnboundedSender<Change>,
        reply: std_mpsc::SyncSender<Result<u64, notify::Error>>,
    },
    Unsubscribe(u64),
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Msg::Event(_) => "Event",
            Msg::Subscribe { .. } => "Subscribe",
            Msg::Unsubscribe(_) => "Unsubscribe",
        })
    }
}

/// The hub thread's mailbox, started on first use.
fn hub() -> Result<&'static std_mpsc::Sender<Msg>, notify::Error> {
    static HUB: OnceLock<Result<std_mpsc::Sender<Msg>, String>> = OnceLock::new();
    let started = HUB.get_or_init(|| {
        let (tx, rx) = std_mpsc::channel();
        let events = tx.clone();
        std::thread::Builder::new()
            .name("lbkit-file-watch".into())
            .spawn(move || Hub::new(events).run(rx))
            .map(|_| tx)
            .map_err(|e| format!("cannot start the directory watcher's thread: {e}"))
    });
    started
        .as_ref()
        .map_err(|e| notify::Error::generic(e.as_str()))
}

/// The one watcher and who listens to which directory. Owned by the hub thread alone, so it
/// needs no lock; the watcher's callback only posts to the thread's mailbox.
struct Hub {
    watcher: Option<notify::RecommendedWatcher>,
    routes: Routes,
    events: std_mpsc::Sender<Msg>,
    /// The routes' names, as the watcher's callback reads them (see [`filter`]).
    filter: Arc<ArcSwap<Filter>>,
}

impl Hub {
    fn new(events: std_mpsc::Sender<Msg>) -> Self {
        Hub {
            watcher: None,
            routes: Routes::default(),
            events,
            filter: Arc::default(),
        }
    }

    fn run(mut self, mail: std_mpsc::Receiver<Msg>) {
        for msg in mail {
            match msg {
                Msg::Event(Ok(ev)) => {
                    self.routes.dispatch(&ev);
                    self.refresh_filter(true);
                }
                Msg::Event(Err(e)) => self.routes.fail(&e),
                Msg::Subscribe { watched, tx, reply } => {
                    let id = self.subscribe(watched, tx);
                    // Published before the subscriber hears back and reads its file.
                    self.refresh_filter(false);
                    // The subscriber waits for this answer; it is gone only if it panicked.
                    let _ = reply.send(id);
                }
                Msg::Unsubscribe(id) => {
                    self.unsubscribe(id);
                    self.refresh_filter(false);
                }
            }
        }
    }

    /// Publish the routes' filter to the watcher's thread when it changed (rebuilt from the
    /// routes after every event that reaches this thread: few do). After an event
    /// (`after_event`), a directory it widened had a file turn indirect (now a symlink, or
    /// gone): the narrower filter may have dropped the events still queued behind that one,
    /// such as a change of where the symlink leads, so the directory's indirect files are told
    /// they may have changed, now that the wider filter is out.
    fn refresh_filter(&mut self, after_event: bool) {
        let next = Arc::new(self.routes.filter());
        if *self.filter.load_full() == *next {
            return;
        }
        let before = self.filter.swap(Arc::clone(&next));
        if !after_event {
            return;
        }
        let widened: Vec<PathBuf> = next.widened(&before).map(Path::to_path_buf).collect();
        if !widened.is_empty() {
            self.routes.each(Some(&widened), |sub| {
                if sub.indirect() {
                    let _ = sub.tx.send(Ok(()));
                }
            });
        }
    }

    fn subscribe(
        &mut self,
        mut watched: WatchedPath,
        tx: mpsc::UnboundedSender<Change>,
    ) -> Result<u64, notify::Error> {
        let given = watched.dir();
        let dir = std::fs::canonicalize(&given)
            .map_err(|e| notify::Error::io(e).add_path(given.clone()))?;
        // Watched again even when others listen there already: the kernel drops a watch when
        // its directory is deleted or replaced (`rm -rf conf && cp -r new conf`), and the
        // sources of a reload subscribe while the old ones still hold the route. notify adds
        // to a live watch (`IN_MASK_ADD`) and sets up a lost one anew.
        self.watcher()?.watch(&dir, RecursiveMode::NonRecursive)?;
        // Resolved again now that the directory is watched: the path may have turned into a
        // symlink since the subscriber resolved it, and its filter must then pass every event.
        watched.refresh();
        Ok(self.routes.add(dir, watched, tx))
    }

    fn unsubscribe(&mut self, id: u64) {
        let Some(dir) = self.routes.remove(id) else {
            return;
        };
        if let Some(w) = self.watcher.as_mut() {
            // Fails when the directory is gone, and then the kernel dropped the watch itself.
            let _ = w.unwatch(&dir);
        }
    }

    fn watcher(&mut self) -> Result<&mut notify::RecommendedWatcher, notify::Error> {
        if self.watcher.is_none() {
            let events = self.events.clone();
            let filter = Arc::clone(&self.filter);
            let w = notify::recommended_watcher(move |ev| {
                if forwarded(&ev, &filter.load()) {
                    // The hub thread never ends while the watcher lives (it owns it).
                    let _ = events.send(Msg::Event(ev));
                }
            })?;
            self.watcher = Some(w);
        }
        Ok(self.watcher.as_mut().expect("set above"))
    }
}

/// Whether the watcher's thread hands `ev` to the hub thread: an error, a lost-events notice,
/// or an event that is not a plain read and that `filter` lets through. The watcher asks for
/// opens, so every read of any file in a watched directory (our own reloads among them) would
/// otherwise wake the hub thread for nothing; so would writes to files no one follows.
fn forwarded(ev: &notify::Result<notify::Event>, filter: &Filter) -> bool {
    ev.as_ref().map_or(true, |ev| {
        ev.need_rescan() || (!super::watch::read_only(ev) && filter.passes(ev))
    })
}

/// Directories and their subscribers. Directory keys are canonical paths, as the watcher
/// reports events under the path it was given.
#[derive(Default)]
struct Routes {
    dirs: HashMap<PathBuf, Vec<Sub>>,
    next: u64,
}

struct Sub {
    id: u64,
    watched: WatchedPath,
    /// Where the file is when no symlink leads elsewhere: the canonical directory and its name.
    direct: Option<PathBuf>,
    tx: mpsc::UnboundedSender<Change>,
}

impl Sub {
    /// Whether events that do not name the file may still change it: the path goes through a
    /// symlink, or leads nowhere yet.
    fn indirect(&self) -> bool {
        self.direct.is_none() || self.watched.resolved() != self.direct.as_deref()
    }

    fn named_in(&self, ev: &notify::Event, dir: &Path) -> bool {
        let name = self.watched.path().file_name();
        ev.paths
            .iter()
            .any(|p| p.parent() == Some(dir) && p.file_name() == name)
    }
}

impl Routes {
    #[cfg(test)]
    fn watches(&self, dir: &Path) -> bool {
        self.dirs.contains_key(dir)
    }

    fn add(
        &mut self,
        dir: PathBuf,
        watched: WatchedPath,
        tx: mpsc::UnboundedSender<Change>,
    ) -> u64 {
        self.next += 1;
        let direct = watched.path().file_name().map(|name| dir.join(name));
        let sub = Sub {
            id: self.next,
            watched,
            direct,
            tx,
        };
        self.dirs.entry(dir).or_default().push(sub);
        self.next
    }

    /// What the watcher's thread may let through: per directory, the names of its files when
    /// each is reached straight, or every name (see [`filter`]).
    fn filter(&self) -> Filter {
        let mut filter = Filter::default();
        for (dir, subs) in &self.dirs {
            let names = (!subs.iter().any(Sub::indirect)).then(|| {
                let names = subs.iter().filter_map(|s| s.watched.path().file_name());
                names.map(OsString::from).collect()
            });
            filter.insert(dir.clone(), names);
        }
        filter
    }

    /// Forget subscriber `id`; returns its directory when no one else listens there.
    fn remove(&mut self, id: u64) -> Option<PathBuf> {
        let dir = self.dirs.iter_mut().find_map(|(dir, subs)| {
            let at = subs.iter().position(|s| s.id == id)?;
            subs.swap_remove(at);
            subs.is_empty().then(|| dir.clone())
        })?;
        self.dirs.remove(&dir);
        Some(dir)
    }

    /// Deliver `ev` to the subscribers it may concern (see the module's docs).
    fn dispatch(&mut self, ev: &notify::Event) {
        if ev.need_rescan() {
            self.each(None, |sub| {
                // Events were lost: where the path leads may have changed unseen too.
                sub.watched.refresh();
                let _ = sub.tx.send(Ok(()));
            });
            return;
        }
        if super::watch::read_only(ev) {
            return;
        }
        for dir in self.touched(ev) {
            let Some(subs) = self.dirs.get_mut(&dir) else {
                continue;
            };
            let on_dir = ev.paths.contains(&dir);
            for sub in subs {
                let may = on_dir || sub.indirect() || sub.named_in(ev, &dir);
                if may && sub.watched.concerns(ev) {
                    let _ = sub.tx.send(Ok(()));
                }
            }
        }
    }

    /// The watcher failed: tell the subscribers of the directories it names, or everyone.
    fn fail(&mut self, err: &notify::Error) {
        let reason = err.to_string();
        let dirs: Vec<PathBuf> = err.paths.iter().flat_map(|p| self.keys_of(p)).collect();
        let only = (!dirs.is_empty()).then_some(dirs);
        self.each(only.as_deref(), |sub| {
            let _ = sub.tx.send(Err(reason.clone()));
        });
    }

    /// Call `f` on every subscriber, or on those of the directories in `only`.
    fn each(&mut self, only: Option<&[PathBuf]>, mut f: impl FnMut(&mut Sub)) {
        for (dir, subs) in &mut self.dirs {
            if only.is_none_or(|o| o.contains(dir)) {
                subs.iter_mut().for_each(&mut f);
            }
        }
    }

    /// The watched directories an event's paths are in (or are), each once.
    fn touched(&self, ev: &notify::Event) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = Vec::new();
        let keys: Vec<PathBuf> = if ev.paths.is_empty() {
            self.dirs.keys().cloned().collect()
        } else {
            ev.paths.iter().flat_map(|p| self.keys_of(p)).collect()
        };
        for d in keys {
            if !dirs.contains(&d) {
                dirs.push(d);
            }
        }
        dirs
    }

    /// The watched directories `p` is in, or is.
    fn keys_of(&self, p: &Path) -> Vec<PathBuf> {
        [p.parent(), Some(p)]
            .into_iter()
            .flatten()
            .filter(|d| self.dirs.contains_key(*d))
            .map(Path::to_path_buf)
            .collect()
    }
}

#[cfg(test)]
mod tests;
