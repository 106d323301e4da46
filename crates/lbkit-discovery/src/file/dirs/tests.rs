//! The routing of the process's directory watcher, driven with hand-made events (no watcher).

use notify::event::{CreateKind, DataChange, EventKind, ModifyKind, RenameMode};
use notify::Event;

use super::*;

struct Listener {
    id: u64,
    rx: mpsc::UnboundedReceiver<Change>,
}

impl Listener {
    /// Everything heard so far.
    fn heard(&mut self) -> Vec<Change> {
        std::iter::from_fn(|| self.rx.try_recv().ok()).collect()
    }
}

fn listen(routes: &mut Routes, path: &Path) -> Listener {
    let watched = WatchedPath::new(path);
    let dir = std::fs::canonicalize(watched.dir()).expect("directory exists");
    let (tx, rx) = mpsc::unbounded_channel();
    let id = routes.add(dir, watched, tx);
    Listener { id, rx }
}

fn canonical_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let canonical = std::fs::canonicalize(dir.path()).expect("canonical");
    (dir, canonical)
}

fn write(path: &Path) -> Event {
    Event::new(EventKind::Modify(ModifyKind::Data(DataChange::Any))).add_path(path.into())
}

#[test]
fn a_file_reached_directly_hears_only_of_events_naming_it() {
    let (_keep, dir) = canonical_dir();
    for name in ["a.toml", "b.toml"] {
        std::fs::write(dir.join(name), "").unwrap();
    }
    let mut routes = Routes::default();
    let mut a = listen(&mut routes, &dir.join("a.toml"));
    let mut b = listen(&mut routes, &dir.join("b.toml"));

    routes.dispatch(&write(&dir.join("a.toml")));
    assert_eq!(a.heard(), [Ok(())]);
    assert_eq!(b.heard(), [], "a sibling's write does not wake b");

    // An editor's temporary file, then its rename over b.
    std::fs::write(dir.join("b.toml.new"), "x").unwrap();
    routes.dispatch(&write(&dir.join("b.toml.new")));
    std::fs::rename(dir.join("b.toml.new"), dir.join("b.toml")).unwrap();
    routes.dispatch(
        &Event::new(EventKind::Modify(ModifyKind::Name(RenameMode::Both)))
            .add_path(dir.join("b.toml.new"))
            .add_path(dir.join("b.toml")),
    );
    assert_eq!(
        b.heard(),
        [Ok(())],
        "the rename names b: once, not per path"
    );
    assert_eq!(a.heard(), []);
}

#[test]
fn plain_reads_wake_no_one() {
    let (_keep, dir) = canonical_dir();
    std::fs::write(dir.join("a.toml"), "").unwrap();
    let mut routes = Routes::default();
    let mut a = listen(&mut routes, &dir.join("a.toml"));
    let read =
        Event::new(EventKind::Access(notify::event::AccessKind::Read)).add_path(dir.join("a.toml"));
    routes.dispatch(&read);
    assert_eq!(a.heard(), []);
    // Nor do they wake the hub thread: the watcher's thread keeps them.
    let filter = routes.filter();
    assert!(!forwarded(&Ok(read), &filter));
    let open = Event::new(EventKind::Access(notify::event::AccessKind::Open(
        notify::event::AccessMode::Any,
    )))
    .add_path(dir.join("a.toml"));
    assert!(!forwarded(&Ok(open), &filter));
    let written = Event::new(EventKind::Access(notify::event::AccessKind::Close(
        notify::event::AccessMode::Write,
    )))
    .add_path(dir.join("a.toml"));
    assert!(forwarded(&Ok(written), &filter));
    assert!(forwarded(
        &Err(notify::Error::generic("queue overflow")),
        &filter
    ));
}

#[test]
fn a_file_behind_a_symlink_hears_of_the_swap_that_never_names_it() {
    // Kubernetes' ConfigMap layout: app.toml -> ..data/app.toml, ..data -> ..v1.
    let (_keep, dir) = canonical_dir();
    for v in ["..v1", "..v2"] {
        std::fs::create_dir(dir.join(v)).unwrap();
        std::fs::write(dir.join(v).join("app.toml"), v).unwrap();
    }
    std::os::unix::fs::symlink("..v1", dir.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/app.toml", dir.join("app.toml")).unwrap();
    std::fs::write(dir.join("plain.toml"), "").unwrap();
    let mut routes = Routes::default();
    let mut app = listen(&mut routes, &dir.join("app.toml"));
    let mut plain = listen(&mut routes, &dir.join("plain.toml"));

    std::os::unix::fs::symlink("..v2", dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    routes.dispatch(
        &Event::new(EventKind::Modify(ModifyKind::Name(RenameMode::To)))
            .add_path(dir.join("..data")),
    );
    assert_eq!(app.heard(), [Ok(())]);
    assert_eq!(plain.heard(), [], "a plain file is not woken by the swap");

    // The same event again: app's path already leads there, nothing changed.
    routes.dispatch(
        &Event::new(EventKind::Modify(ModifyKind::Name(RenameMode::To)))
            .add_path(dir.join("..data")),
    );
    assert_eq!(app.heard(), []);
}

#[test]
fn a_file_not_there_yet_hears_of_its_creation() {
    let (_keep, dir) = canonical_dir();
    let mut routes = Routes::default();
    let mut later = listen(&mut routes, &dir.join("later.toml"));
    std::fs::write(dir.join("later.toml"), "").unwrap();
    routes.dispatch(
        &Event::new(EventKind::Create(CreateKind::File)).add_path(dir.join("later.toml")),
    );
    assert_eq!(later.heard(), [Ok(())]);
}

#[test]
fn lost_events_tell_everyone_and_errors_reach_their_directory() {
    let (_keep1, one) = canonical_dir();
    let (_keep2, two) = canonical_dir();
    let mut routes = Routes::default();
    let mut a = listen(&mut routes, &one.join("a.toml"));
    let mut b = listen(&mut routes, &two.join("b.toml"));

    let rescan = Event::new(EventKind::Other).set_flag(notify::event::Flag::Rescan);
    routes.dispatch(&rescan);
    assert_eq!((a.heard(), b.heard()), (vec![Ok(())], vec![Ok(())]));

    let err = notify::Error::generic("watch gone").add_path(one.join("a.toml"));
    routes.fail(&err);
    let heard = a.heard();
    assert!(
        matches!(heard.as_slice(), [Err(r)] if r.contains("watch gone")),
        "{heard:?}"
    );
    assert_eq!(b.heard(), [], "another directory's error is not b's");

    routes.fail(&notify::Error::generic("queue"));
    assert_eq!(
        (a.heard().len(), b.heard().len()),
        (1, 1),
        "no path: everyone"
    );
}

#[test]
fn a_directory_is_released_with_its_last_file() {
    let (_keep, dir) = canonical_dir();
    let mut routes = Routes::default();
    let a = listen(&mut routes, &dir.join("a.toml"));
    let b = listen(&mut routes, &dir.join("b.toml"));
    assert!(routes.watches(&dir));
    assert_eq!(routes.remove(a.id), None, "b still listens");
    assert_eq!(routes.remove(a.id), None, "removing twice is harmless");
    assert_eq!(routes.remove(b.id), Some(dir.clone()));
    assert!(!routes.watches(&dir));
}

#[test]
fn writes_to_files_no_one_follows_stay_on_the_watchers_thread() {
    let (_keep, dir) = canonical_dir();
    let (_keep2, elsewhere) = canonical_dir();
    std::fs::write(dir.join("a.toml"), "").unwrap();
    let mut routes = Routes::default();
    let mut a = listen(&mut routes, &dir.join("a.toml"));
    let filter = routes.filter();
    let passes = |ev: Event| forwarded(&Ok(ev), &filter);

    assert!(
        !passes(write(&dir.join("h2load.log"))),
        "a log beside a.toml"
    );
    assert!(
        !passes(write(&elsewhere.join("a.toml"))),
        "another directory"
    );
    assert!(passes(write(&dir.join("a.toml"))));
    assert!(passes(
        Event::new(EventKind::Modify(ModifyKind::Name(RenameMode::Both)))
            .add_path(dir.join("a.toml.new"))
            .add_path(dir.join("a.toml"))
    ));
    assert!(passes(write(&dir)), "the directory itself (deleted, moved)");
    assert!(passes(
        write(&dir.join("h2load.log")).set_flag(notify::event::Flag::Rescan)
    ));
    assert!(
        passes(Event::new(EventKind::Any)),
        "no path: may be anyone's"
    );

    // What the filter keeps back, the routes would have told no one.
    routes.dispatch(&write(&dir.join("h2load.log")));
    assert_eq!(a.heard(), []);
}

#[test]
fn a_directory_with_a_file_behind_a_symlink_or_not_there_yet_lets_every_name_through() {
    let (_keep, dir) = canonical_dir();
    std::fs::write(dir.join("a.toml"), "").unwrap();
    let mut routes = Routes::default();
    let _a = listen(&mut routes, &dir.join("a.toml"));
    let other = write(&dir.join("..data"));
    assert!(!forwarded(&Ok(other.clone()), &routes.filter()));

    let later = listen(&mut routes, &dir.join("later.toml"));
    assert!(
        forwarded(&Ok(other.clone()), &routes.filter()),
        "later.toml is not there yet"
    );
    std::fs::write(dir.join("later.toml"), "").unwrap();
    routes.dispatch(
        &Event::new(EventKind::Create(CreateKind::File)).add_path(dir.join("later.toml")),
    );
    assert!(
        !forwarded(&Ok(other.clone()), &routes.filter()),
        "now reached straight"
    );

    routes.remove(later.id);
    std::fs::create_dir(dir.join("..v1")).unwrap();
    std::fs::write(dir.join("..v1").join("b.toml"), "").unwrap();
    std::os::unix::fs::symlink("..v1/b.toml", dir.join("b.toml")).unwrap();
    let _b = listen(&mut routes, &dir.join("b.toml"));
    assert!(
        forwarded(&Ok(other), &routes.filter()),
        "b.toml is a symlink"
    );
}

#[test]
fn a_file_turned_symlink_is_told_once_its_directory_lets_every_name_through() {
    let (_keep, dir) = canonical_dir();
    std::fs::write(dir.join("a.toml"), "v1").unwrap();
    let mut hub = Hub::new(std_mpsc::channel().0);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let watched = WatchedPath::new(dir.join("a.toml"));
    hub.routes.add(dir.clone(), watched, tx);
    hub.refresh_filter(false);
    assert!(!hub.filter.load().passes(&write(&dir.join("..data"))));

    // a.toml becomes a symlink into ..data; the event names it, so it passes and is routed.
    std::fs::create_dir(dir.join("..v2")).unwrap();
    std::fs::write(dir.join("..v2").join("a.toml"), "v2").unwrap();
    std::os::unix::fs::symlink("..v2", dir.join("..data")).unwrap();
    std::fs::remove_file(dir.join("a.toml")).unwrap();
    std::os::unix::fs::symlink("..data/a.toml", dir.join("a.toml")).unwrap();
    hub.routes.dispatch(&write(&dir.join("a.toml")));
    assert_eq!(std::iter::from_fn(|| rx.try_recv().ok()).count(), 1);

    // Publishing the wider filter tells a.toml once more: a swap of ..data dropped by the
    // narrower one meanwhile is read then.
    hub.refresh_filter(true);
    assert!(hub.filter.load().passes(&write(&dir.join("..data"))));
    assert_eq!(
        std::iter::from_fn(|| rx.try_recv().ok()).collect::<Vec<_>>(),
        [Ok(())]
    );
    hub.refresh_filter(true);
    assert_eq!(rx.try_recv().ok(), None, "told once, when it widened");
}

/// The hub thread itself: an event that turns a followed file into a symlink widens the filter
/// the watcher's thread reads, and the file is told twice (the event, then the widening). Each
/// step waits on the hub's reply to a later subscription: mail is handled in order.
#[test]
fn the_hub_widens_its_filter_after_the_event_that_made_a_symlink() {
    let (_keep, dir) = canonical_dir();
    std::fs::write(dir.join("a.toml"), "v1").unwrap();
    std::fs::write(dir.join("b.toml"), "").unwrap();
    let hub = Hub::new(std_mpsc::channel().0);
    let filter = Arc::clone(&hub.filter);
    let (mail, inbox) = std_mpsc::channel();
    let thread = std::thread::spawn(move || hub.run(inbox));
    let subscribe = |name: &str| {
        let (tx, rx) = mpsc::unbounded_channel();
        let (reply, answer) = std_mpsc::sync_channel(1);
        let watched = WatchedPath::new(dir.join(name));
        mail.send(Msg::Subscribe { watched, tx, reply }).unwrap();
        answer.recv().unwrap().expect("subscribed");
        rx
    };
    let mut a = subscribe("a.toml");
    assert!(!filter.load().passes(&write(&dir.join("..data"))));

    std::fs::create_dir(dir.join("..v2")).unwrap();
    std::fs::write(dir.join("..v2").join("a.toml"), "v2").unwrap();
    std::os::unix::fs::symlink("..v2", dir.join("..data")).unwrap();
    std::fs::remove_file(dir.join("a.toml")).unwrap();
    std::os::unix::fs::symlink("..data/a.toml", dir.join("a.toml")).unwrap();
    mail.send(Msg::Event(Ok(write(&dir.join("a.toml")))))
        .unwrap();
    let _b = subscribe("b.toml"); // handled after the event
    assert!(filter.load().passes(&write(&dir.join("..data"))));
    let heard: Vec<Change> = std::iter::from_fn(|| a.try_recv().ok()).collect();
    assert_eq!(heard, [Ok(()), Ok(())], "the event, then the widening");
    drop(mail);
    thread.join().unwrap();
}

/// A path that turned into a symlink before its directory was watched is resolved again once
/// it is: its directory's filter passes every event from the start.
#[test]
fn a_subscription_resolves_its_path_again_once_watched() {
    let (_keep, dir) = canonical_dir();
    std::fs::write(dir.join("a.toml"), "v1").unwrap();
    let watched = WatchedPath::new(dir.join("a.toml")); // resolved while a plain file
    std::fs::create_dir(dir.join("..v2")).unwrap();
    std::fs::write(dir.join("..v2").join("a.toml"), "v2").unwrap();
    std::fs::remove_file(dir.join("a.toml")).unwrap();
    std::os::unix::fs::symlink("..v2/a.toml", dir.join("a.toml")).unwrap();
    let mut hub = Hub::new(std_mpsc::channel().0);
    hub.subscribe(watched, mpsc::unbounded_channel().0)
        .expect("subscribed");
    hub.refresh_filter(false);
    assert!(hub.filter.load().passes(&write(&dir.join("..v3"))));
}
