//! `lbkit proxy --check` and a short `lbkit proxy --config` run.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

#[path = "support/run.rs"]
mod run;
use run::lbkit;

/// A file written in its own scratch directory; both are removed when the value drops.
struct TempFile {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl std::ops::Deref for TempFile {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

fn file(name: &str, text: &str) -> TempFile {
    let dir = tempfile::Builder::new()
        .prefix("lbkit-proxy-cli-")
        .tempdir()
        .unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    TempFile { path, _dir: dir }
}

const GOOD: &str = r#"
[admin]
bind = "127.0.0.1:0"
[[listener]]
bind = "127.0.0.1:0"
[[route]]
service = "api"
[service.api]
endpoints = ["127.0.0.1:9=100"]
strategy = "round-robin"
"#;

#[test]
fn check_accepts_a_good_file() {
    let path = file("good.toml", GOOD);
    let out = lbkit(&["proxy", "--check", path.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("ok: "));
}

#[test]
fn check_errors_exit_2_with_one_line_naming_file_and_field() {
    for (name, text, field) in [
        (
            "strategy.toml",
            GOOD.replace("round-robin", "nope"),
            "service.api.strategy",
        ),
        (
            "unknown.toml",
            GOOD.replace("strategy =", "stratgy ="),
            "stratgy",
        ),
        (
            "route.toml",
            GOOD.replace("service = \"api\"", "service = \"web\""),
            "route[0].service",
        ),
        (
            "eps.toml",
            GOOD.replace("127.0.0.1:9=100", "nohost"),
            "service.api.endpoints",
        ),
        (
            "open-admin.toml",
            GOOD.replacen("bind = \"127.0.0.1:0\"", "bind = \"0.0.0.0:0\"", 1),
            "admin.token",
        ),
        (
            "hedge.toml",
            GOOD.replace("service = \"api\"", "service = \"api\"\nhedge = \"p95\"")
                .replace("strategy =", "retries = 0\nstrategy ="),
            "route[0].hedge",
        ),
        (
            "orca.toml",
            GOOD.replace("strategy =", "orca_oob_ms = 1000\nstrategy ="),
            "service.api.orca_oob_ms",
        ),
    ] {
        let path = file(name, &text);
        let out = lbkit(&["proxy", "--check", path.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{name}: {err}");
        assert!(err.contains(name) && err.contains(field), "{name}: {err}");
    }
    let out = lbkit(&["proxy", "--check", "/nonexistent/proxy.toml"]);
    assert_eq!(out.status.code(), Some(2));
    // An admin API beyond loopback is accepted with a token, or when explicitly allowed.
    let open = GOOD.replacen("bind = \"127.0.0.1:0\"", "bind = \"0.0.0.0:0\"", 1);
    for (name, extra) in [
        ("admin-token.toml", "token = \"s3cret\"\n"),
        ("admin-allowed.toml", "allow_unauthenticated = true\n"),
    ] {
        let text = open.replacen("[admin]\n", &format!("[admin]\n{extra}"), 1);
        let path = file(name, &text);
        let out = lbkit(&["proxy", "--check", path.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: {err}");
    }
}

#[test]
fn proxy_serves_and_stops_on_sigterm() {
    let backend = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let baddr = backend.local_addr().unwrap();
    let serve = std::thread::spawn(move || {
        let (mut s, _) = backend.accept().unwrap();
        let mut buf = [0u8; 4096];
        let _ = s.read(&mut buf).unwrap();
        s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi")
            .unwrap();
    });
    let path = file(
        "run.toml",
        &GOOD.replace("127.0.0.1:9=100", &baddr.to_string()),
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_lbkit"))
        .args([
            "proxy",
            "--threads",
            "1",
            "--config",
            path.to_str().unwrap(),
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let addr = first.rsplit(' ').next().unwrap().to_owned();
    let mut s = TcpStream::connect(&addr).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(
        out.starts_with("HTTP/1.1 200") && out.ends_with("hi"),
        "{out}"
    );
    serve.join().unwrap();
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    assert!(child.wait().unwrap().success());
}
