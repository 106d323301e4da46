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
