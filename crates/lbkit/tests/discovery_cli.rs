//! Black-box tests of `lbkit watch` and `lbkit register`: exit statuses, and a registration seen
//! by a watcher and removed on SIGTERM against a real ZooKeeper (`LBKIT_ZK`, see
//! `scripts/zookeeper.sh`; unset: fails in CI, skipped elsewhere).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Bound on every wait for a child process.
const WAIT: Duration = Duration::from_secs(30);

fn lbkit(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lbkit"))
        .args(args)
        .env("LBKIT_LOG", "off")
        .output()
        .expect("run lbkit")
}

fn zk() -> Option<String> {
    lbkit_testkit::zookeeper()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn bad_arguments_exit_2() {
    for args in [
        vec!["watch", "--interface", "x"],                      // no --zk
        vec!["watch", "--zk", "127.0.0.1", "--interface", "x"], // no port
        vec!["watch", "--zk", "127.0.0.1:2181", "--interface", "a/b"],
        vec![
            "watch",
            "--zk",
            "127.0.0.1:2181",
            "--interface",
            "x",
            "--layout",
            "flat",
        ],
        vec![
            "watch",
            "--zk",
            "127.0.0.1:2181",
            "--interface",
            "x",
            "--watch",
            "sometimes",
        ],
        vec![
            "register",
            "--zk",
            "127.0.0.1:2181",
            "--interface",
            "x",
            "--address",
            "nohost",
        ],
        vec![
            "register",
            "--zk",
            "127.0.0.1:2181",
            "--interface",
            "x",
            "--address",
            "a:1",
            "--protocol",
            "smtp",
        ],
        vec![
            "register",
            "--zk",
            "127.0.0.1:2181",
            "--interface",
            "x",
            "--address",
            "a:1",
            "--meta",
            "novalue",
        ],
    ] {
        let out = lbkit(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(!stderr(&out).contains("panicked"), "{args:?}");
    }
}

#[test]
fn unreachable_registry_exits_1_within_the_timeout() {
    // A port whose connections are refused.
    let port = lbkit_testkit::refused_addr().port();
    let zk = format!("127.0.0.1:{port}");
    let out = lbkit(&[
        "watch",
        "--zk",
        &zk,
        "--interface",
        "x",
        "--once",
        "--timeout-ms",
        "500",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("unreachable") && err.contains("500 ms"),
        "{err}"
    );
    let out = lbkit(&[
        "register",
        "--zk",
        &zk,
        "--interface",
        "x",
        "--address",
        "10.0.0.1:1",
        "--timeout-ms",
        "500",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
}

/// The child's stdout lines, delivered through a channel so every wait is bounded.
fn lines(child: &mut Child) -> mpsc::Receiver<String> {
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

fn wait_exit(mut child: Child) -> Option<i32> {
    let (tx, rx) = mpsc::channel();
    let pid = child.id();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait().ok().and_then(|s| s.code()));
    });
    rx.recv_timeout(WAIT)
        .unwrap_or_else(|_| panic!("lbkit (pid {pid}) did not exit in time"))
}

#[test]
fn register_is_watched_and_sigterm_deregisters() {
    let Some(zk) = zk() else { return };
    let interface = format!("lbkit.test.cli.p{}", std::process::id());
    for layout in ["dubbo", "plain"] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_lbkit"))
            .args([
                "register",
                "--zk",
                &zk,
                "--interface",
                &interface,
                "--layout",
                layout,
            ])
            .args([
                "--address",
                "10.9.0.1:20880",
                "--weight",
                "300",
                "--zone",
                "eu-1",
            ])
            .env("LBKIT_LOG", "off")
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn lbkit register");
        let out = lines(&mut child);
        let first = out.recv_timeout(WAIT).expect("registered line");
        assert!(first.starts_with("registered /dubbo/"), "{first}");

        let watch = lbkit(&[
            "watch",
            "--zk",
            &zk,
            "--interface",
            &interface,
            "--layout",
            layout,
            "--once",
        ]);
        assert_eq!(watch.status.code(), Some(0), "{}", stderr(&watch));
        let text = String::from_utf8_lossy(&watch.stdout);
        let row = text
            .lines()
            .find(|l| l.starts_with("10.9.0.1:20880"))
            .unwrap_or_else(|| panic!("{text}"));
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cols[1], "300", "configured weight: {row}");
        let effective: u32 = cols[2].parse().expect("effective weight");
        assert!((1..=300).contains(&effective), "{row}");

        let kill = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .expect("kill");
        assert!(kill.success());
        let last = out.recv_timeout(WAIT).expect("deregistered line");
        assert!(last.starts_with("deregistered /dubbo/"), "{last}");
        assert_eq!(wait_exit(child), Some(0));

        let watch = lbkit(&[
            "watch",
            "--zk",
            &zk,
            "--interface",
            &interface,
            "--layout",
            layout,
            "--once",
            "--watch",
            "one-shot",
        ]);
        let text = String::from_utf8_lossy(&watch.stdout);
        assert!(text.contains(": 0 providers"), "gone at once: {text}");
    }
}

/// Child processes killed when dropped, so a failed assertion leaves none behind.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `lbkit` with `args`, its stdout read line by line.
fn spawn_lines(args: &[&str], children: &mut Children) -> mpsc::Receiver<String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_lbkit"))
        .args(args)
        .env("LBKIT_LOG", "off")
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn lbkit");
    let out = lines(&mut child);
    children.0.push(child);
    out
}

/// Three of five providers deleted in one ZooKeeper transaction: `lbkit watch` shows the
/// registry as it is (three `-` lines) and says the change is a mass removal, which the
/// proxy and tower pools hold back (issue 40).
#[test]
fn watch_says_when_a_change_is_a_mass_removal() {
    let Some(zk) = zk() else { return };
    let interface = format!("lbkit.test.cli.mass{}", std::process::id());
    let (mut children, mut nodes) = (Children(Vec::new()), Vec::new());
    for i in 1..=5 {
        let address = format!("10.9.1.{i}:20880");
        let args = ["register", "--zk", &zk, "--interface", &interface];
        let out = spawn_lines(
            &[&args[..], &["--address", &address]].concat(),
            &mut children,
        );
        let first = out.recv_timeout(WAIT).expect("registered line");
        let node = first.strip_prefix("registered ").expect("a node path");
        nodes.push(node.to_owned());
    }
    let args = ["watch", "--zk", &zk, "--interface", &interface];
    let shown = spawn_lines(&args, &mut children);
    let until = |what: &dyn Fn(&str) -> bool| loop {
        let line = shown.recv_timeout(WAIT).expect("a line in time");
        if what(&line) {
            return line;
        }
    };
    until(&|l: &str| l.ends_with(": 5 providers"));
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime.block_on(async {
        let client = zookeeper_client::Client::connect(&zk)
            .await
            .expect("connect");
        let mut multi = client.new_multi_writer();
        for node in &nodes[..3] {
            multi.add_delete(node, None).expect("a delete");
        }
        multi.commit().await.expect("deleted in one transaction");
    });
    until(&|l: &str| l.starts_with("# change: 2 providers"));
    let line = until(&|l: &str| l.starts_with('!'));
    assert!(
        line.starts_with("! mass removal: 5 -> 2 providers within 10 s"),
        "{line}"
    );
}
