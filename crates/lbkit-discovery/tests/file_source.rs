//! The watched file source through the controller: reload on change (in place and by rename),
//! a broken file keeps the previous set, and a fixed file recovers.
#![cfg(feature = "runtime")]

mod common;

use std::path::Path;
use std::sync::Arc;

use common::{temp_dir, wait_status, WAIT};
use lbkit_core::Snapshot;
use lbkit_discovery::file::{subscribe, FileSource};
use lbkit_discovery::{Controller, ControllerConfig};
use tokio::sync::mpsc;

fn weights(s: &Snapshot) -> Vec<(String, u32)> {
    common::entries(s)
}

/// Replace the file the way deploy tools do: write a sibling, rename it over.
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("toml.new");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

async fn next(rx: &mut mpsc::UnboundedReceiver<Arc<Snapshot>>) -> Arc<Snapshot> {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("a snapshot in time")
        .expect("controller running")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_on_change_and_keeps_the_last_good_set_on_a_broken_file() {
    let dir = temp_dir("file-source");
    let path = dir.path().join("endpoints.toml");
    std::fs::write(
        &path,
        "[[endpoint]]\naddress = \"10.0.0.1:80\"\n[[endpoint]]\naddress = \"10.0.0.2:80\"\nweight = 5\n",
    )
    .unwrap();
    let (updates, mut status) = FileSource::new(&path).spawn().expect("watch");
    let controller = Controller::new(ControllerConfig::default());
    let metrics = controller.metrics();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(controller.run(updates, move |s| {
        let _ = tx.send(s);
    }));

    let first = next(&mut rx).await;
    assert_eq!(
        weights(&first),
        [("10.0.0.1:80".into(), 100), ("10.0.0.2:80".into(), 5)]
    );

    // An in-place write.
    std::fs::write(
        &path,
        "[[endpoint]]\naddress = \"10.0.0.1:80\"\n[[endpoint]]\naddress = \"10.0.0.2:80\"\nweight = 7\n[[endpoint]]\naddress = \"10.0.0.3:80\"\n",
    )
    .unwrap();
    let second = next(&mut rx).await;
    assert_eq!(second.len(), 3);
    assert_eq!(second.endpoints()[1].weight(), 7);
    assert!(
        Arc::ptr_eq(
            first.endpoints()[0].stats_arc(),
            second.endpoints()[0].stats_arc()
        ),
        "endpoints that stay keep their statistics (calls in flight finish normally)"
    );

    // A broken file: reported and counted; nothing is published.
    replace(&path, "[[endpoint]]\naddress = 10.0.0.9\n");
    let st = wait_status(&mut status, "the parse error", |s| s.errors >= 1).await;
    assert!(
        st.last_error
            .as_deref()
            .is_some_and(|e| e.contains("endpoints.toml:2")),
        "{st:?}"
    );

    // Fixed by a rename: the new set arrives, and it is the first thing published since. It
    // drops all three endpoints at once: a mass removal, held until each is confirmed gone.
    replace(&path, "[[endpoint]]\naddress = \"10.0.0.4:80\"\n");
    let third = next(&mut rx).await;
    let w = weights(&third);
    assert_eq!(w.len(), 4, "{w:?}");
    assert!(w.contains(&("10.0.0.4:80".into(), 100)), "{w:?}");
    assert_eq!((metrics.removals_held(), metrics.held()), (3, 3));
    assert!(metrics.source_errors() >= 1);
    assert!(rx.try_recv().is_err());
    task.abort();
}

/// Publish `text` as a new version of a Kubernetes-style mounted file: a fresh timestamped
/// directory, a `..data_tmp` symlink to it, renamed over `..data` (what the kubelet does on a
/// ConfigMap update; the file itself is a symlink `name → ..data/name` that never changes).
fn kubelet_swap(dir: &Path, version: &str, name: &str, text: &str) {
    let versioned = dir.join(format!("..{version}"));
    std::fs::create_dir_all(&versioned).expect("version dir");
    std::fs::write(versioned.join(name), text).expect("write");
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(format!("..{version}"), &tmp).expect("symlink");
    std::fs::rename(&tmp, dir.join("..data")).expect("swap ..data");
    let link = dir.join(name);
    if std::fs::symlink_metadata(&link).is_err() {
        std::os::unix::fs::symlink(format!("..data/{name}"), &link).expect("file symlink");
    }
}

// A ConfigMap update renames `..data`, an event that never names the file: still a reload
// (issue 15: such swaps went unnoticed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubernetes_symlink_swap_is_a_change() {
    let tmp = temp_dir("file-k8s");
    let dir = tmp.path();
    kubelet_swap(
        dir,
        "v1",
        "endpoints.toml",
        "[[endpoint]]\naddress = \"10.0.0.1:80\"\n",
    );
    let path = dir.join("endpoints.toml");
    let (updates, _status) = FileSource::new(&path).spawn().expect("watch");
    let controller = Controller::new(ControllerConfig::default());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(controller.run(updates, move |s| {
        let _ = tx.send(s);
    }));
    assert_eq!(
        weights(&*next(&mut rx).await),
        [("10.0.0.1:80".into(), 100)]
    );
    kubelet_swap(
        dir,
        "v2",
        "endpoints.toml",
        "[[endpoint]]\naddress = \"10.0.0.2:80\"\n",
    );
    assert_eq!(
        weights(&*next(&mut rx).await),
        [("10.0.0.2:80".into(), 100)]
    );
    task.abort();
}

// A directory deleted and made again (`rm -rf conf && cp -r new conf`) while a source of the
// old one still holds its route (a reload's old services drain while the new ones start): the
// new source is watched all the same. (The shared watcher's first version kept the route and
// never watched the new directory: the new source was deaf.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_made_again_is_watched_again() {
    let tmp = temp_dir("file-again");
    let dir = tmp.path().join("conf");
    std::fs::create_dir(&dir).unwrap();
    let path = dir.join("endpoints.toml");
    std::fs::write(&path, "[[endpoint]]\naddress = \"10.0.0.1:80\"\n").unwrap();
    let (old_tx, _old_rx) = mpsc::unbounded_channel();
    let _old = subscribe(&path, old_tx).expect("subscribe");

    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(&path, "[[endpoint]]\naddress = \"10.0.0.2:80\"\n").unwrap();
    let (tx, mut changes) = mpsc::unbounded_channel();
    let _new = subscribe(&path, tx).expect("subscribe");
    std::fs::write(&path, "[[endpoint]]\naddress = \"10.0.0.3:80\"\n").unwrap();
    let heard = tokio::time::timeout(WAIT, changes.recv())
        .await
        .expect("the new source hears of the write in time");
    assert_eq!(heard, Some(Ok(())));
}
