//! `lbkit xds` with 200 file services, one endpoints file each in one directory (issue 43's "200
//! file services" check): every file source used to open an inotify instance of its own, and
//! Linux allows 128 a user by default, so the process failed at start-up with `Too many open
//! files` (at the 35th service on a machine whose other processes held the rest). One watcher
//! serves the process now. Checked end to end: the server starts and serves the first and the
//! last service's endpoint to `lbkit watch --xds`, and follows a change of the last file.
//!
//! It catches the old failure where `fs.inotify.max_user_instances` is at Linux's default (128,
//! as on the project's machines); where a machine raises it, it checks that the server serves.
//! Its own test binary: no other test's watchers count against the limit.

#[path = "faults/procs.rs"]
#[allow(dead_code)] // the fault run's process handling; this test uses part of it
mod procs;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use procs::{Proc, WAIT};
use tokio::process::Command;

const SERVICES: usize = 200;

fn test_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("eps")).expect("a test directory");
    dir
}

/// Service `s`'s one endpoint (`10.S/256.S%256.1:port`), written as its file.
fn write_endpoints(dir: &Path, s: usize, port: u16) {
    let text = format!(r#"[{{"address": "10.{}.{}.1:{port}"}}]"#, s / 256, s % 256);
    let tmp = dir.join(format!("eps/.svc{s}.tmp"));
    std::fs::write(&tmp, text).expect("write endpoints");
    std::fs::rename(&tmp, dir.join(format!("eps/svc{s}.json"))).expect("rename endpoints");
}

/// `lbkit watch --xds ads --cluster svcS --once`: its stdout.
async fn watch_once(ads: SocketAddr, s: usize) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_lbkit"))
        .args([
            "watch",
            "--xds",
            &ads.to_string(),
            "--cluster",
            &format!("svc{s}"),
        ])
        .args(["--once", "--timeout-ms", "10000"])
        .output();
    let out = tokio::time::timeout(WAIT, out)
        .await
        .expect("lbkit watch within the bound")
        .expect("lbkit watch runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "lbkit watch svc{s}: {}\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[tokio::test]
async fn two_hundred_file_services_share_one_watcher_and_serve() {
    let dir = test_dir("xds-many-files");
    let mut config = String::from("[xds]\nbind = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n");
    for s in 0..SERVICES {
        write_endpoints(&dir, s, 80);
        let file = dir.join(format!("eps/svc{s}.json"));
        config += &format!("\n[service.svc{s}]\nfile = \"{}\"\n", file.display());
    }
    std::fs::write(dir.join("xds.toml"), config).expect("write the config");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lbkit"));
    cmd.arg("xds").arg("--config").arg(dir.join("xds.toml"));
    let mut xds = Proc::spawn("lbkit xds", cmd, &dir.join("xds.log")).expect("lbkit xds");
    let line = xds.line("lbkit xds: ADS on").await.unwrap_or_else(|e| {
        panic!("{e}; its output:\n{}", xds.lines().join("\n"));
    });
    let ads: SocketAddr = line
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .expect("an address");
    assert!(xds.alive(), "{}", xds.lines().join("\n"));
    assert!(watch_once(ads, 0).await.contains("10.0.0.1:80"));
    let last = SERVICES - 1;
    let at = |port: u16| format!("10.{}.{}.1:{port}", last / 256, last % 256);
    assert!(watch_once(ads, last).await.contains(&at(80)));
    // The shared watcher still follows each file: the last one changes, and `lbkit watch`
    // following that cluster prints the new endpoint (each wait bounded).
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lbkit"));
    cmd.args([
        "watch",
        "--xds",
        &ads.to_string(),
        "--cluster",
        &format!("svc{last}"),
    ]);
    let mut follow = Proc::spawn("lbkit watch", cmd, &dir.join("watch.log")).expect("lbkit watch");
    follow.line(&at(80)).await.expect("the listing");
    write_endpoints(&dir, last, 81);
    follow.line(&at(81)).await.unwrap_or_else(|e| {
        panic!("{e}; lbkit watch printed:\n{}", follow.lines().join("\n"));
    });
    follow.kill().await;
    assert!(
        !xds.lines()
            .iter()
            .any(|l| l.contains("Too many open files")),
        "{}",
        xds.lines().join("\n")
    );
    xds.kill().await;
}
