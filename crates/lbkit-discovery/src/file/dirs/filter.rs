//! What the watcher's own thread lets through to the hub thread.
//!
//! inotify watches whole directories, so a log or a temporary file written next to a followed
//! file raises an event on every write. The hub thread would wake for each, look up its
//! routes and find no one to tell. The hub publishes a [`Filter`] of the names it routes, and
//! the watcher's callback drops the events that name none of them before they cross threads.
//!
//! The filter is a copy of the routes and may lag them by the events still queued: a file
//! reached straight that turns into a symlink widens its directory to every name only once the
//! hub has handled the event that made the symlink. An event dropped in between (the symlink's
//! target swapped at once) is not lost: the hub tells every file whose directory it widened
//! that it may have changed, after the wider filter is published, so that file reads again (see
//! [`Hub::refresh_filter`](super::Hub)).

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Per watched (canonical) directory: the names of the files followed there straight, or
/// `None` when any of them is reached through a symlink or is not there yet, so that every
/// event of the directory may concern it.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Filter {
    dirs: HashMap<PathBuf, Option<Vec<OsString>>>,
}

impl Filter {
    /// Directory `dir` lets every event through (`names` is `None`) or those naming `names`.
    pub(super) fn insert(&mut self, dir: PathBuf, names: Option<Vec<OsString>>) {
        self.dirs.insert(dir, names);
    }

    /// Whether `ev` may concern a followed file: a lost-events notice, an event with no path,
    /// on a watched directory itself, or naming a file of one that is followed (or in one that
    /// lets every name through). Plain reads are the caller's to drop.
    pub(super) fn passes(&self, ev: &notify::Event) -> bool {
        ev.need_rescan() || ev.paths.is_empty() || ev.paths.iter().any(|p| self.admits(p))
    }

    fn admits(&self, p: &Path) -> bool {
        if self.dirs.contains_key(p) {
            return true;
        }
        let (Some(dir), Some(name)) = (p.parent(), p.file_name()) else {
            return false;
        };
        match self.dirs.get(dir) {
            Some(None) => true,
            Some(Some(names)) => names.iter().any(|n| n == name),
            None => false,
        }
    }

    /// The directories that let every name through here and did not in `before`.
    pub(super) fn widened<'a>(&'a self, before: &'a Filter) -> impl Iterator<Item = &'a Path> {
        self.dirs.iter().filter_map(move |(dir, names)| {
            let was_narrow = matches!(before.dirs.get(dir), Some(Some(_)));
            (names.is_none() && was_narrow).then_some(dir.as_path())
        })
    }
}
