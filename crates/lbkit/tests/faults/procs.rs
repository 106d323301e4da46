//! The processes of a fault run: backends (this binary again), `lbkit proxy`, `lbkit register`,
//! a private ZooKeeper (scripts/zookeeper.sh). Every child is killed when its handle drops;
//! every wait is bounded.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;

/// Bound on any single wait for a process.
pub const WAIT: Duration = Duration::from_secs(30);

pub type Result<T> = std::result::Result<T, String>;

/// A child process whose stdout and stderr lines are collected (and copied to `log`).
pub struct Proc {
    pub name: String,
    child: Child,
    pub pid: u32,
    lines: watch::Receiver<Vec<String>>,
}

impl Proc {
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Result<Proc> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {name}: {e}"))?;
        let pid = child.id().ok_or_else(|| format!("{name} exited at once"))?;
        let (tx, lines) = watch::channel(Vec::new());
        let log = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let out = child.stdout.take().expect("piped stdout");
        let err = child.stderr.take().expect("piped stderr");
        for stream in [
            Box::new(out) as Box<dyn tokio::io::AsyncRead + Unpin + Send>,
            Box::new(err),
        ] {
            let tx = tx.clone();
            let mut log = log.try_clone().map_err(|e| e.to_string())?;
            tokio::spawn(async move {
                let mut reader = BufReader::new(stream).lines();
                while let Ok(Some(line)) = reader.next_line().await {
                    use std::io::Write as _;
                    let _ = writeln!(log, "{line}");
                    tx.send_modify(|l| l.push(line));
                }
            });
        }
        Ok(Proc {
            name: name.to_owned(),
            child,
            pid,
            lines,
        })
    }

    /// The first line containing `needle`, waiting for it (bounded).
    pub async fn line(&self, needle: &str) -> Result<String> {
        self.nth_line(needle, 1).await
    }

    /// The `n`-th line containing `needle`, waiting for it (bounded).
    pub async fn nth_line(&self, needle: &str, n: usize) -> Result<String> {
        let mut rx = self.lines.clone();
        let found = tokio::time::timeout(
            WAIT,
            rx.wait_for(|l| l.iter().filter(|s| s.contains(needle)).count() >= n),
        )
        .await;
        match found {
            Ok(Ok(lines)) => Ok(lines
                .iter()
                .filter(|s| s.contains(needle))
                .nth(n - 1)
                .cloned()
                .unwrap_or_default()),
            _ => Err(format!(
                "{}: no line {n} with {needle:?} within {WAIT:?}; its output ends: {}",
                self.name,
                self.tail()
            )),
        }
    }

    /// Lines containing `needle` so far.
    pub fn count(&self, needle: &str) -> usize {
        self.lines
            .borrow()
            .iter()
            .filter(|s| s.contains(needle))
            .count()
    }

    /// Every line so far.
    #[allow(dead_code)] // tests/xds.rs reads them; the fault run does not
    pub fn lines(&self) -> Vec<String> {
        self.lines.borrow().clone()
    }

    fn tail(&self) -> String {
        let lines = self.lines.borrow();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }

    pub fn signal(&self, sig: &str) -> Result<()> {
        signal(self.pid, sig)
    }

    /// SIGKILL and reap.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// SIGTERM, then wait for the exit (bounded; SIGKILL after): the exit status, or `None`
    /// when it had to be killed.
    pub async fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let _ = self.signal("TERM");
        match tokio::time::timeout(WAIT, self.child.wait()).await {
            Ok(status) => status.ok(),
            Err(_) => {
                self.kill().await;
                None
            }
        }
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

pub fn signal(pid: u32, sig: &str) -> Result<()> {
    let status = std::process::Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status()
        .map_err(|e| format!("kill -{sig} {pid}: {e}"))?;
    status
        .success()
        .then_some(())
        .ok_or_else(|| format!("kill -{sig} {pid}: {status}"))
}

/// A backend process: this binary with `LBKIT_FAULTS_BACKEND=NAME`, on a free port.
pub struct Backend {
    pub proc: Proc,
    pub name: String,
    pub addr: SocketAddr,
}

impl Backend {
    pub async fn start(name: &str, dir: &Path) -> Result<Backend> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(exe);
        cmd.env("LBKIT_FAULTS_BACKEND", name);
        let proc = Proc::spawn(name, cmd, &dir.join(format!("{name}.log")))?;
        let line = proc.line("listening on ").await?;
        let addr = line
            .rsplit(' ')
            .next()
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| format!("{name}: bad announcement {line:?}"))?;
        Ok(Backend {
            proc,
            name: name.to_owned(),
            addr,
        })
    }
}

/// `lbkit proxy --config FILE`, once it has announced its listener and admin addresses.
pub struct Proxy {
    pub proc: Proc,
    pub listen: SocketAddr,
    pub admin: SocketAddr,
}

impl Proxy {
    pub async fn start(config: &Path, dir: &Path) -> Result<Proxy> {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_lbkit"));
        cmd.arg("proxy")
            .arg("--config")
            .arg(config)
            .env("LBKIT_LOG", "info");
        let proc = Proc::spawn("lbkit proxy", cmd, &dir.join("proxy.log"))?;
        let addr_of = |line: String| -> Result<SocketAddr> {
            line.rsplit(' ')
                .next()
                .and_then(|a| a.parse().ok())
                .ok_or_else(|| format!("lbkit proxy: bad announcement {line:?}"))
        };
        let listen = addr_of(proc.line("lbkit proxy: listening on").await?)?;
        let admin = addr_of(proc.line("lbkit proxy: admin on").await?)?;
        Ok(Proxy {
            proc,
            listen,
            admin,
        })
    }
}

/// A free loopback port (bound, then released: a child binds it a moment later). Taken below
/// the kernel's ephemeral range, so that no outgoing connection of a test running beside this
/// one (a ZooKeeper client, an HTTP client) takes it in that moment: a port the kernel handed
/// out for `bind(0)` is one it may hand to the next `connect` too, which made a Python
/// provider's export fail now and then. Successive calls in one process try successive ports.
pub fn free_port() -> Result<u16> {
    use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    let (low, high) = (10_000u32, ephemeral_low.max(10_100));
    let span = high - low;
    // Processes start at different places (their pid), then walk.
    let base = (u64::from(std::process::id()) * 7_919 % u64::from(span)) as u32;
    for _ in 0..200 {
        let port = low + (base + NEXT.fetch_add(1, Relaxed)) % span;
        let port = u16::try_from(port).map_err(|e| e.to_string())?;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

/// A private ZooKeeper server (scripts/zookeeper.sh with its own state directory).
pub struct ZooKeeper {
    pub addr: String,
    dir: PathBuf,
}

impl ZooKeeper {
    pub fn start(dir: &Path) -> Result<ZooKeeper> {
        let out = zk_script(dir, "start")?;
        let addr = out
            .trim()
            .strip_prefix("export LBKIT_ZK=")
            .ok_or_else(|| format!("zookeeper.sh start printed {out:?}"))?
            .to_owned();
        Ok(ZooKeeper {
            addr,
            dir: dir.to_owned(),
        })
    }

    pub fn pid(&self) -> Result<u32> {
        std::fs::read_to_string(self.dir.join("pid"))
            .map_err(|e| e.to_string())?
            .trim()
            .parse()
            .map_err(|e| format!("zookeeper pid: {e}"))
    }
}

impl Drop for ZooKeeper {
    fn drop(&mut self) {
        if let Ok(pid) = self.pid() {
            let _ = signal(pid, "CONT");
        }
        let _ = zk_script(&self.dir, "stop");
    }
}

fn zk_script(dir: &Path, cmd: &str) -> Result<String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/zookeeper.sh");
    let out = std::process::Command::new(script)
        .arg(cmd)
        .env("LBKIT_ZK_DIR", dir)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("zookeeper.sh {cmd}: {e}"))?;
    if !out.status.success() {
        return Err(format!("zookeeper.sh {cmd}: {}", out.status));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `lbkit register` for one backend: keeps its provider node until stopped.
pub async fn register(zk: &str, interface: &str, backend: &Backend, dir: &Path) -> Result<Proc> {
    register_at(zk, interface, backend.addr, &backend.name, &[], dir).await
}

/// `lbkit register` of `addr` (called `name` in logs) under `interface`, with `more` arguments,
/// once its node exists; it keeps the node until stopped.
pub async fn register_at(
    zk: &str,
    interface: &str,
    addr: SocketAddr,
    name: &str,
    more: &[&str],
    dir: &Path,
) -> Result<Proc> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lbkit"));
    cmd.args([
        "register",
        "--zk",
        zk,
        "--interface",
        interface,
        "--address",
    ])
    .arg(addr.to_string())
    .args(more);
    let log = dir.join(format!("register-{name}.log"));
    let proc = Proc::spawn(&format!("register {name}"), cmd, &log)?;
    proc.line("registered ").await?;
    Ok(proc)
}

/// Delete the provider nodes of `backends` under `interface` in one ZooKeeper transaction (a
/// `multi`), as an operator's script does, or as sessions that expire together take them; their
/// `lbkit register` processes and servers go on. Returns the nodes deleted.
pub async fn delete_together(zk: &str, interface: &str, backends: &[Backend]) -> Result<usize> {
    let err = |e: zookeeper_client::Error| format!("zookeeper {zk}: {e}");
    let client = zookeeper_client::Client::connect(zk).await.map_err(err)?;
    let dir = format!("/dubbo/{interface}/providers");
    let nodes = client.list_children(&dir).await.map_err(err)?;
    let mut multi = client.new_multi_writer();
    let mut n = 0;
    for node in &nodes {
        // Node names are URL-encoded provider URLs: `...127.0.0.1%3APORT...`.
        let ours = backends
            .iter()
            .any(|b| node.contains(&format!("{}%3A{}", b.addr.ip(), b.addr.port())));
        if ours {
            multi
                .add_delete(&format!("{dir}/{node}"), None)
                .map_err(err)?;
            n += 1;
        }
    }
    multi
        .commit()
        .await
        .map_err(|e| format!("zookeeper multi: {e}"))?;
    Ok(n)
}

/// `scripts/zookeeper.sh restart` for the server in `dir` (same port and data).
pub fn zk_restart(dir: &Path) -> Result<()> {
    zk_script(dir, "restart").map(drop)
}

/// Make `dir` read-only (`on`) or writable again; says how. As root, whom permissions do not
/// stop, with the immutable attribute (`chattr +i`); otherwise by clearing its write bits.
pub fn read_only(dir: &Path, on: bool) -> Result<String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0");
    let (cmd, args) = if root {
        ("chattr", [if on { "+i" } else { "-i" }])
    } else {
        ("chmod", [if on { "a-w" } else { "u+w" }])
    };
    let how = format!("{cmd} {}", args[0]);
    let status = std::process::Command::new(cmd)
        .args(args)
        .arg(dir)
        .status()
        .map_err(|e| format!("{how}: {e}"))?;
    if !status.success() {
        return Err(format!("{how} {}: {status}", dir.display()));
    }
    // Check that it took: a file cannot be made in it now (or can again).
    let probe = dir.join(".probe");
    let writable = std::fs::write(&probe, b"x").is_ok();
    let _ = std::fs::remove_file(&probe);
    if writable == on {
        return Err(format!("{how} {}: had no effect", dir.display()));
    }
    Ok(how)
}

/// A full file system over `dir`: a 64 KiB tmpfs mounted on it and filled up. Unmounted when
/// dropped. Needs the right to mount (root with CAP_SYS_ADMIN).
pub struct FullDisk(PathBuf);

pub fn full_disk(dir: &Path) -> Result<FullDisk> {
    let out = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(dir)
        .output()
        .map_err(|e| format!("mount: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "mount -t tmpfs: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let full = FullDisk(dir.to_owned());
    // Fill it: writes until the file system refuses.
    let chunk = vec![0u8; 4096];
    let mut f = std::fs::File::create(dir.join("fill")).map_err(|e| format!("fill: {e}"))?;
    use std::io::Write as _;
    while f.write_all(&chunk).is_ok() {}
    Ok(full)
}

impl Drop for FullDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}
