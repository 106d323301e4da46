//! Hundreds of watched files in one process: one inotify instance serves them all, each
//! directory is watched once and released with its last file (issue 44: every file source
//! opened an inotify instance of its own, and Linux's default limit is 128 per user).
//!
//! Its own test binary, so that no other test's watches are counted.
#![cfg(all(feature = "runtime", target_os = "linux"))]

mod common;

use std::path::{Path, PathBuf};

use common::{temp_dir, WAIT};
use futures_util::StreamExt;
use lbkit_core::Update;
use lbkit_discovery::file::{subscribe, FileSource};
use tokio::sync::mpsc;

/// The process's inotify instances, and the watches each holds (from `/proc/self/fdinfo`).
fn inotify_watches() -> Vec<usize> {
    let mut found = Vec::new();
    for fd in std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .flatten()
    {
        let is_inotify =
            std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == "anon_inode:inotify");
        let info = Path::new("/proc/self/fdinfo").join(fd.file_name());
        if let (true, Ok(text)) = (is_inotify, std::fs::read_to_string(info)) {
            found.push(
                text.lines()
                    .filter(|l| l.starts_with("inotify wd:"))
                    .count(),
            );
        }
    }
    found
}

fn endpoints_file(dir: &Path, name: &str, address: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("[[endpoint]]\naddress = \"{address}\"\n")).expect("write");
    path
}

const DIRS: usize = 150;

/// 300 files, two in each of 150 directories.
fn files(root: &Path) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    for d in 0..DIRS {
        let dir = root.join(format!("svc{d}"));
        std::fs::create_dir(&dir).expect("mkdir");
        for f in 0..2 {
            paths.push(endpoints_file(
                &dir,
                &format!("e{f}.toml"),
                &format!("10.0.{d}.{f}:80"),
            ));
        }
    }
    paths
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_files_share_one_watcher() {
    let root = temp_dir("file-many");
    let paths = files(root.path());

    // Subscriptions hold their directories, and release them when dropped. The watcher's
    // mailbox is in order, so once a later subscription is answered the releases are done.
    let (tx, _rx) = mpsc::unbounded_channel();
    let held: Vec<_> = paths
        .iter()
        .map(|p| subscribe(p, tx.clone()).expect("subscribe"))
        .collect();
    assert_eq!(
        inotify_watches(),
        [DIRS],
        "one instance, one watch per directory"
    );
    drop(held);
    let barrier = subscribe(root.path().join("barrier.toml"), tx.clone()).expect("subscribe");
    assert_eq!(inotify_watches(), [1], "released with their last file");
    drop(barrier);

    // 300 sources, more than twice the inotify instances a user may open by default.
    let mut streams = Vec::new();
    for path in &paths {
        let (updates, _status) = FileSource::new(path).spawn().expect("watch");
        streams.push(updates);
    }
    assert_eq!(inotify_watches(), [DIRS]);
    for (i, s) in streams.iter_mut().enumerate() {
        let first = tokio::time::timeout(WAIT, s.next()).await.expect("in time");
        assert!(
            matches!(first, Some(Ok(Update::Reset(ref v))) if v.len() == 1),
            "#{i}"
        );
    }

    // A change reaches its own source.
    let changed = 123;
    std::fs::write(&paths[changed], "[[endpoint]]\naddress = \"10.9.9.9:80\"\n").expect("write");
    let next = tokio::time::timeout(WAIT, streams[changed].next())
        .await
        .expect("in time");
    match next {
        Some(Ok(Update::Reset(v))) => assert_eq!(v[0].address, "10.9.9.9:80"),
        other => panic!("{other:?}"),
    }
}
