#!/usr/bin/env python3
"""How fast and how cheaply `lbkit xds` pushes changes to its clients.

    eval "$(scripts/zookeeper.sh start)"; eval "$(scripts/python.sh)"; eval "$(scripts/envoy.sh)"
    $LBKIT_PYTHON scripts/bench-xds.py latency [--rounds 100] [--grpc-rounds 30] [--out F.json]
    $LBKIT_PYTHON scripts/bench-xds.py scale [--rounds 20] [--envoys 50] [--out F.json]

Reads LBKIT_ZK (latency), LBKIT_ENVOY and `--lbkit PATH` (default target/release/lbkit; build
it with `cargo build --release -p lbkit`). Starts and stops everything it needs but ZooKeeper;
its children are stopped on exit, on failure and on SIGINT/SIGTERM/SIGHUP too. Scratch files
(configs, bootstraps, logs) go to target/bench-xds/MODE-PID/. A summary goes to stderr, the
figures as JSON to stdout (or --out). lbkit xds runs with LBKIT_LOG=info: its "resources
changed" lines (wall-clock stamped as a service's new resources enter its cache) split each
latency into "until lbkit's cache changed" and the rest.

latency  Push latency of one ZooKeeper change, end to end. One `lbkit xds` serves service `web`
         from ZooKeeper (a fresh Dubbo interface per run; strategy weighted-round-robin, so
         Envoy and gRPC use ROUND_ROBIN); two providers g0, g1 (grpcio servers,
         scripts/grpc_deadline.py) are always there. Provider nodes are ephemeral znodes written
         with kazoo, as Dubbo writes them (the URL-encoded provider URL under
         /dubbo/IFACE/providers). t0 is taken just after kazoo's create/delete returns.
         envoy: one Envoy (ADS: CDS + EDS). --rounds rounds alternate adding and removing one
           provider node (an address nothing listens on); t1 is the first answer of Envoy's
           admin GET /clusters (polled every 1 ms over one keep-alive connection) that lists /
           no longer lists `web::ADDR::`.
         grpc: a proxyless grpcio client in this process (GRPC_XDS_BOOTSTRAP, xds:///web: LDS,
           CDS, EDS), one thread calling /lbkit.Deadline/Call in a tight loop, recording when
           each call was answered and by which server. --grpc-rounds rounds alternate adding a
           provider whose server is already up (a new server for every add; t1 = the first call
           it answers, so this includes connecting to it) and removing it again (t1 = the last
           call it answers, a lower bound: the removed server had every 3rd call, so the JSON's
           remove_resolution_ms is how much later its next turn would have come; a removal is
           taken as done when 0.5 s and 300 calls pass without it).
         Add and remove are reported apart: median, p99 and max in ms. Also lbkit xds's own
         lbkit_xds_push_latency_seconds (from a cache change to the response being handed to a
         stream: the server's share of the above), pushes and NACKs from its /metrics.
scale    The cost of serving many services to many clients. One `lbkit xds` serves --services
         (100) services of --endpoints (1000) endpoints each, every one from its own watched
         JSON file (addresses 10.S.x.y:80 that nothing serves; one shared directory, or one
         directory each with --dir-per-service), to --envoys (50) Envoys (--concurrency 1),
         started in batches of --batch; each batch must hold every cluster with every host
         (`/stats?usedonly&filter=...membership_total`) before the next starts. Envoys are only
         added while MemAvailable stays above --reserve-mb after them (estimated from the first
         Envoy's RSS) and while the ramp-up is under --ramp-limit seconds: the JSON says how
         many ran (`envoys_run`) and why fewer (`envoys_short_reason`).
         Measured: lbkit xds's RSS (VmRSS) before any Envoy, once all are synced and after the
         changes; the bytes of the initial pushes (lbkit_xds_pushed_bytes_total by type, all
         and per Envoy); then --rounds changes of ONE endpoint of one service (its file
         rewritten, a temporary file renamed over it; the service varies by round): per round
         the time from the rename to lbkit's cache change (its log), to the median Envoy and to
         the last Envoy having applied it (each Envoy's cluster.svcK.update_time, the epoch ms
         at which it applied that cluster's assignment: exact to the ms however late it is
         read, so the Envoys are read only from 0.3 s after the change and no polling competes
         for the CPU); membership_change is checked to have moved on every Envoy. Per change:
         lbkit xds's CPU seconds (utime + stime of /proc/PID/stat, and over its idle rate), the
         Envoys' CPU together, and lbkit_xds_pushed_bytes_total / pushes_total by type, next
         to one service's assignment times the number of Envoys (what an O(change) push costs)
         and the full initial push.
         --delta: the Envoys speak incremental ADS (DELTA_GRPC). --perf FILE: `perf record -g`
         of lbkit xds over the change rounds alone (`perf report -i FILE`).
"""
import argparse
import datetime
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRATCH = REPO / "target" / "bench-xds"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg):
    print(f"bench-xds: {msg}", file=sys.stderr, flush=True)


# === processes ===


class Procs:
    """Every child this script starts, stopped (SIGTERM, then SIGKILL) by stop_all."""

    def __init__(self):
        self.children = []

    def spawn(self, name, argv, log_path, env=None):
        """Start argv in its own session, stdout and stderr to log_path."""
        logf = open(log_path, "wb")
        p = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=logf,
            env=env,
            start_new_session=True,
        )
        logf.close()
        p.bench_name = name
        self.children.append(p)
        return p

    def stop(self, procs, grace=10.0):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def stop_all(self):
        self.stop(self.children)
        self.children = []


def on_signal(signum, _frame):
    raise SystemExit(128 + signum)


def wait_file_text(path, pattern, proc, timeout):
    """The first match of `pattern` in the file at `path` (a child's log), within `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(pattern, path.read_text(errors="replace")) if path.exists() else None
        if m:
            return m
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.bench_name} exited ({proc.returncode}); see {path}")
        time.sleep(0.02)
    raise TimeoutError(f"{proc.bench_name}: no {pattern!r} in {path} within {timeout} s")


def proc_rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def proc_cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def mem_available_mb():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    return 0


# === HTTP, metrics, statistics ===


class Admin:
    """GETs on 127.0.0.1:PORT over one keep-alive connection (reopened after an error)."""

    def __init__(self, port, timeout=5.0):
        self.port, self.timeout, self.conn = port, timeout, None

    def get(self, path):
        for attempt in (0, 1):
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPConnection("127.0.0.1", self.port,
                                                           timeout=self.timeout)
                self.conn.request("GET", path)
                r = self.conn.getresponse()
                body = r.read().decode(errors="replace")
                if r.status != 200:
                    raise RuntimeError(f"GET :{self.port}{path}: HTTP {r.status}: {body[:200]}")
                return body
            except (OSError, http.client.HTTPException):
                self.close()
                if attempt:
                    raise
        return ""

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


METRIC_LINE = re.compile(r"^([A-Za-z_:][\w:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text):
    """OpenMetrics text as {"name{labels}": value} (labels as printed)."""
    out = {}
    for line in text.splitlines():
        m = METRIC_LINE.match(line)
        if m and not line.startswith("#"):
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def by_type(metrics, name):
    return {t: int(metrics.get(f'{name}{{type="{t}"}}', 0)) for t in ("lds", "cds", "eds")}


def xds_counters(metrics):
    """lbkit xds's counters and push-latency histogram, from parse_metrics' result."""
    h = "lbkit_xds_push_latency_seconds"
    buckets = {}
    for key, value in metrics.items():
        m = re.match(rf'{h}_bucket\{{le="([^"]+)"\}}', key)
        if m:
            buckets[m.group(1)] = int(value)
    count = int(metrics.get(f"{h}_count", 0))
    total = metrics.get(f"{h}_sum", 0.0)
    return {
        "clients": int(metrics.get("lbkit_xds_clients", 0)),
        "pushes": by_type(metrics, "lbkit_xds_pushes_total"),
        "pushed_bytes": by_type(metrics, "lbkit_xds_pushed_bytes_total"),
        "nacks": sum(v for k, v in metrics.items() if k.startswith("lbkit_xds_nacks_total")),
        "push_latency": {
            "count": count,
            "sum_s": round(total, 6),
            "mean_ms": round(1000 * total / count, 3) if count else None,
            "buckets_le_s": buckets,
        },
    }


def summary(xs):
    """n, median, p99, max (and min) of a list of ms values, rounded to 0.01 ms."""
    s = sorted(xs)
    if not s:
        return {"n": 0}
    n = len(s)
    med = s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
    p99 = s[min(n - 1, int(0.99 * n))]
    r = lambda v: round(v, 2)  # noqa: E731
    return {"n": n, "median_ms": r(med), "p99_ms": r(p99), "max_ms": r(s[-1]), "min_ms": r(s[0])}


def fmt(stat):
    if not stat.get("n"):
        return "no samples"
    return (f"median {stat['median_ms']} ms, p99 {stat['p99_ms']} ms, max {stat['max_ms']} ms "
            f"(n={stat['n']})")


# === lbkit xds and Envoy ===


def start_xds(procs, lbkit, config_text, workdir, log_level="warn"):
    """Start `lbkit xds --config` (LBKIT_LOG=log_level); returns (process, ADS port, admin
    port). Its log is workdir/xds.log."""
    cfg = workdir / "xds.toml"
    cfg.write_text(config_text)
    logp = workdir / "xds.log"
    env = dict(os.environ, LBKIT_LOG=log_level)
    p = procs.spawn("lbkit xds", [str(lbkit), "xds", "--config", str(cfg)], logp, env=env)
    ads = wait_file_text(logp, r"lbkit xds: ADS on [\d.]+:(\d+)", p, 60)
    admin = wait_file_text(logp, r"lbkit xds: admin on [\d.]+:(\d+)", p, 10)
    return p, int(ads.group(1)), int(admin.group(1))


def xds_metrics(admin):
    return parse_metrics(admin.get("/metrics"))


ENVOY_BOOTSTRAP = """\
node: {{id: bench-envoy-{n}, cluster: bench}}
admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: 0}}}}}}
dynamic_resources:
  ads_config:
    api_type: {api}
    transport_api_version: V3
    grpc_services: [{{envoy_grpc: {{cluster_name: lbkit_xds}}}}]
  cds_config: {{ads: {{}}, resource_api_version: V3}}
static_resources:
  clusters:
  - name: lbkit_xds
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    load_assignment:
      cluster_name: lbkit_xds
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {ads}}}}}}}
"""


def spawn_envoy(procs, envoy, n, ads_port, workdir, delta=False):
    """Start Envoy number n (admin on a free port, written to a file); returns (proc, paths).
    `delta`: incremental ADS (DELTA_GRPC) instead of state of the world."""
    boot = workdir / f"envoy-{n}.yaml"
    api = "DELTA_GRPC" if delta else "GRPC"
    boot.write_text(ENVOY_BOOTSTRAP.format(n=n, ads=ads_port, api=api))
    addr_file = workdir / f"envoy-{n}.admin"
    addr_file.unlink(missing_ok=True)
    base_id = (os.getpid() % 2000) * 100 + n
    argv = [envoy, "-c", str(boot), "--concurrency", "1", "--log-level", "warn",
            "--base-id", str(base_id), "--admin-address-path", str(addr_file)]
    p = procs.spawn(f"envoy-{n}", argv, workdir / f"envoy-{n}.log")
    return p, addr_file


def envoy_admin(proc, addr_file, timeout=60):
    """The Envoy's admin, once it listens (its address file written)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = addr_file.read_text().strip() if addr_file.exists() else ""
        if text.endswith(tuple("0123456789")):
            return Admin(int(text.rsplit(":", 1)[1]))
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.bench_name} exited ({proc.returncode})")
        time.sleep(0.05)
    raise TimeoutError(f"{proc.bench_name}: no admin address within {timeout} s")


def wait_until(what, check, timeout, every=0.02):
    """Call check() until it returns a true value (returned); TimeoutError after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout} s")
        time.sleep(every)


# === latency: ZooKeeper ===


def provider_path(iface, addr, protocol):
    url = (f"{protocol}://{addr}/{iface}?anyhost=true&application=bench-xds&interface={iface}"
           f"&side=provider&weight=100")
    return f"/dubbo/{iface}/providers/{urllib.parse.quote(url, safe='')}"


def zk_client(hosts):
    from kazoo.client import KazooClient

    zk = KazooClient(hosts=hosts, timeout=10)
    zk.start(timeout=10)
    return zk


def latency_config(zk_hosts, iface):
    return (
        '[xds]\nbind = "127.0.0.1:0"\nadmin = "127.0.0.1:0"\n\n[service.web]\n'
        f'zookeeper = {{ zk = "{zk_hosts}", interface = "{iface}" }}\n'
        'strategy = "weighted-round-robin"\n'
    )


def start_grpc_servers(procs, names, workdir):
    """grpc_deadline.py servers answering with their name: {name: port}, once all serve."""
    ports, started = {}, []
    for name in names:
        port = free_port()
        logp = workdir / f"grpc-{name}.log"
        argv = [sys.executable, str(REPO / "scripts" / "grpc_deadline.py"), "server",
                str(port), name, "0"]
        started.append((procs.spawn(f"grpc server {name}", argv, logp), logp))
        ports[name] = port
    for p, logp in started:
        wait_file_text(logp, r"(?m)^serving$", p, 60)
    return ports


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# === latency: Envoy ===


def envoy_has(admin, addr):
    return f"web::{addr}::" in admin.get("/clusters")


def envoy_rounds(zk, iface, admin, rounds):
    """Alternate adding and removing one provider node: per round its kind, the ms until
    /clusters shows it (None: not within 10 s) and t0 as epoch ms."""
    addr = f"127.0.0.1:{free_port()}"  # nothing listens there
    node = provider_path(iface, addr, "dubbo")
    rows = []
    for r in range(rounds):
        adding = r % 2 == 0
        if adding:
            zk.create(node, b"", ephemeral=True, makepath=True)
        else:
            zk.delete(node)
        t0, t0_epoch_ms = time.monotonic(), time.time() * 1000
        took = None
        while time.monotonic() - t0 < 10:
            if envoy_has(admin, addr) == adding:
                took = (time.monotonic() - t0) * 1000
                break
            time.sleep(0.001)
        rows.append({"kind": "add" if adding else "remove", "ms": took, "t0_epoch_ms": t0_epoch_ms})
        time.sleep(0.05)
    if zk.exists(node):
        zk.delete(node)
    return rows


# === latency: proxyless gRPC ===


class Caller:
    """A proxyless grpcio channel to xds:///web, called in a tight loop by one thread; keeps
    (time answered, server name or "failed:CODE") per call."""

    def __init__(self, bootstrap):
        import grpc

        os.environ["GRPC_XDS_BOOTSTRAP"] = str(bootstrap)
        self.grpc = grpc
        self.channel = grpc.insecure_channel("xds:///web")
        self.call = self.channel.unary_unary("/lbkit.Deadline/Call")
        self.records = []
        self.stopping = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stopping:
            try:
                who = self.call(b"ping", timeout=5).decode().split(" ")[0]
            except self.grpc.RpcError as e:
                who = f"failed:{e.code().name}"
                time.sleep(0.001)
            self.records.append((time.monotonic(), who))

    def stop(self):
        self.stopping = True
        self.thread.join(timeout=10)
        self.channel.close()

    def recent(self, n):
        return {who for _, who in self.records[-n:]}


def grpc_add(caller, zk, node, name, timeout=10):
    """Create `node`; ms until `name` first answers (or None), and t0 as epoch ms."""
    start = len(caller.records)
    zk.create(node, b"", ephemeral=True, makepath=True)
    t0, t0_epoch_ms = time.monotonic(), time.time() * 1000
    deadline = t0 + timeout
    while time.monotonic() < deadline:
        recs = caller.records
        for t, who in recs[start:]:
            if who == name:
                return (t - t0) * 1000, t0_epoch_ms
        start = len(recs)
        time.sleep(0.005)
    return None, t0_epoch_ms


def grpc_remove(caller, zk, node, name, timeout=10, quiet_s=0.5, quiet_calls=300):
    """Delete `node`; ms until the last call `name` answers (once quiet_s and quiet_calls
    pass without it) or None, and t0 as epoch ms."""
    zk.delete(node)
    t0, t0_epoch_ms = time.monotonic(), time.time() * 1000
    deadline = t0 + timeout
    last, scanned = None, len(caller.records)
    while time.monotonic() < deadline:
        recs = caller.records
        for i in range(scanned, len(recs)):
            if recs[i][1] == name:
                last = (i, recs[i][0])
        scanned = len(recs)
        if last is None:
            last = (scanned - 1, t0)  # not answered since t0: already gone
        if scanned - last[0] > quiet_calls and time.monotonic() - last[1] > quiet_s:
            return (last[1] - t0) * 1000, t0_epoch_ms
        time.sleep(0.01)
    return None, t0_epoch_ms


def grpc_rounds(caller, zk, iface, extra, rounds):
    """Alternate adding a new server's node and removing it again: rows as envoy_rounds'."""
    rows = []
    for r in range(rounds):
        name = f"x{r // 2}"
        node = provider_path(iface, f"127.0.0.1:{extra[name]}", "tri")
        step = grpc_add if r % 2 == 0 else grpc_remove
        took, t0_epoch_ms = step(caller, zk, node, name)
        rows.append({"kind": "add" if r % 2 == 0 else "remove", "ms": took,
                     "t0_epoch_ms": t0_epoch_ms})
        time.sleep(0.2)
    return rows


def round_summary(rows, log_path, service):
    """add and remove apart: the measured ms, and ms from t0 to lbkit's cache change (its
    "resources changed" log line: ZooKeeper's watch, lbkit's read of the providers and the
    new resources), with the timeouts."""
    delays = cache_delays(log_path, [(r["t0_epoch_ms"], service) for r in rows])
    out = {"timeouts": sum(r["ms"] is None for r in rows)}
    for kind in ("add", "remove"):
        out[kind] = summary([r["ms"] for r in rows if r["kind"] == kind and r["ms"] is not None])
        out[f"{kind}_to_cache_change"] = summary(
            [d for r, d in zip(rows, delays) if r["kind"] == kind and d is not None])
    return out


# === latency: the run ===


def latency_setup(procs, args, workdir, zk, iface):
    """Base providers, lbkit xds and Envoy, all following `web`; returns a dict of handles."""
    adds = (args.grpc_rounds + 1) // 2
    names = ["g0", "g1"] + [f"x{i}" for i in range(adds)]
    log(f"starting {len(names)} grpc servers")
    ports = start_grpc_servers(procs, names, workdir)
    for g in ("g0", "g1"):
        zk.create(provider_path(iface, f"127.0.0.1:{ports[g]}", "tri"), b"", ephemeral=True,
                  makepath=True)
    xds, ads, admin_port = start_xds(procs, args.lbkit, latency_config(args.zk, iface), workdir,
                                     "info")
    envoy, addr_file = spawn_envoy(procs, args.envoy, 0, ads, workdir, args.delta)
    eadmin = envoy_admin(envoy, addr_file)
    wait_until("Envoy lists g0 and g1", lambda: all(
        envoy_has(eadmin, f"127.0.0.1:{ports[g]}") for g in ("g0", "g1")), 30)
    boot = workdir / "grpc-bootstrap.json"
    boot.write_text(json.dumps({
        "xds_servers": [{"server_uri": f"127.0.0.1:{ads}", "channel_creds": [{"type": "insecure"}],
                         "server_features": ["xds_v3"]}],
        "node": {"id": "bench-grpc"}}))
    return {"ports": ports, "xds": xds, "xds_admin": Admin(admin_port), "envoy": eadmin,
            "boot": boot}


def run_latency(procs, args, workdir):
    # The caller thread and the round loop share the GIL: hand it over every 0.2 ms, not 5,
    # so that neither's timestamps wait for the other.
    sys.setswitchinterval(0.0002)
    iface = f"org.lbkit.bench.Xds{os.getpid()}t{int(time.time())}"
    zk = zk_client(args.zk)
    try:
        h = latency_setup(procs, args, workdir, zk, iface)
        log(f"envoy: {args.rounds} rounds")
        e_rows = envoy_rounds(zk, iface, h["envoy"], args.rounds)
        m_envoy = xds_counters(xds_metrics(h["xds_admin"]))
        caller = Caller(h["boot"])
        try:
            wait_until("grpc client gets g0 and g1",
                       lambda: caller.recent(50) == {"g0", "g1"}, 30)
            log(f"grpc: {args.grpc_rounds} rounds")
            c0, t_start = len(caller.records), time.monotonic()
            g_rows = grpc_rounds(caller, zk, iface, h["ports"], args.grpc_rounds)
            rate = (len(caller.records) - c0) / (time.monotonic() - t_start)
            failed = sum(1 for _, who in caller.records if who.startswith("failed"))
        finally:
            caller.stop()
        m_all = xds_counters(xds_metrics(h["xds_admin"]))
        h["envoy"].close()
    finally:
        procs.stop_all()
        cleanup_zk(zk, iface)
    return {
        "mode": "latency", "interface": iface,
        "envoy": {"rounds": args.rounds, **round_summary(e_rows, workdir / "xds.log", "web")},
        "grpc": {"rounds": args.grpc_rounds, **round_summary(g_rows, workdir / "xds.log", "web"),
                 "calls_per_s": round(rate), "failed_calls": failed,
                 # 3 servers in turn: the removed one answered every 3rd call
                 "remove_resolution_ms": round(3000 / rate, 2) if rate else None},
        "xds_metrics_after_envoy_rounds": m_envoy,
        "xds_metrics": m_all,
    }


def cleanup_zk(zk, iface):
    try:
        zk.delete(f"/dubbo/{iface}", recursive=True)
    except Exception as e:  # noqa: BLE001 - best effort
        log(f"could not remove /dubbo/{iface}: {e}")
    zk.stop()
    zk.close()


def print_latency(res):
    for target in ("envoy", "grpc"):
        r = res[target]
        log(f"{target}: add    {fmt(r['add'])}")
        log(f"{target}: remove {fmt(r['remove'])}  (timeouts {r['timeouts']})")
        log(f"{target}:   of which ZooKeeper write -> lbkit's cache: add "
            f"{fmt(r['add_to_cache_change'])}; remove {fmt(r['remove_to_cache_change'])}")
    g = res["grpc"]
    log(f"grpc: {g['calls_per_s']} calls/s, {g['failed_calls']} failed; a removal is seen to "
        f"within {g['remove_resolution_ms']} ms (the removed server had every 3rd call)")
    m = res["xds_metrics"]
    pl = m["push_latency"]
    log(f"lbkit xds push latency: count {pl['count']}, sum {pl['sum_s']} s, "
        f"mean {pl['mean_ms']} ms; pushes {m['pushes']}; NACKs {m['nacks']}")


# === scale ===


def endpoint_file_text(svc, endpoints, variant):
    """Service svc's endpoints; endpoint 0's address depends on `variant` (0 = the original)."""
    eps = [{"address": f"10.{svc}.{e // 250}.{e % 250 + 1}:80", "weight": 100}
           for e in range(endpoints)]
    if variant:
        eps[0]["address"] = f"10.{svc}.200.{variant}:80"
    return json.dumps(eps)


def write_atomically(path, text):
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def endpoint_path(workdir, svc, dir_per_service):
    """endpoints/svcK.json, or endpoints/svcK/svcK.json with --dir-per-service (each file
    source watches its file's directory: one shared directory wakes every watcher)."""
    epdir = workdir / "endpoints" / (f"svc{svc}" if dir_per_service else "")
    epdir.mkdir(parents=True, exist_ok=True)
    return epdir / f"svc{svc}.json"


def scale_config(workdir, services, endpoints, dir_per_service):
    out = ['[xds]\nbind = "127.0.0.1:0"\nadmin = "127.0.0.1:0"\n']
    for s in range(services):
        path = endpoint_path(workdir, s, dir_per_service)
        write_atomically(path, endpoint_file_text(s, endpoints, 0))
        out.append(f'[service.svc{s}]\nfile = "{path}"\n')
    return "\n".join(out)


MEMBERSHIP = urllib.parse.quote(r"^cluster\.svc[0-9]+\.membership_total$")


def envoy_synced(admin, services, endpoints):
    """Whether the Envoy holds every svcK cluster with `endpoints` hosts each."""
    try:
        text = admin.get(f"/stats?usedonly&filter={MEMBERSHIP}")
    except (OSError, http.client.HTTPException, RuntimeError):
        return False
    totals = re.findall(r"^cluster\.svc\d+\.membership_total: (\d+)$", text, re.M)
    return len(totals) == services and all(int(t) == endpoints for t in totals)


def start_batch(procs, args, ads, workdir, first_n, count, timeout):
    """Start `count` Envoys; their admins once all are synced (TimeoutError otherwise)."""
    started = [spawn_envoy(procs, args.envoy, first_n + i, ads, workdir, args.delta)
               for i in range(count)]
    admins = [(p, envoy_admin(p, f)) for p, f in started]
    deadline = time.monotonic() + timeout
    for p, a in admins:
        left = max(1.0, deadline - time.monotonic())
        wait_until(f"{p.bench_name} synced",
                   lambda a=a: envoy_synced(a, args.services, args.endpoints), left, every=0.25)
    return admins


def ramp_envoys(procs, args, ads, workdir):
    """Start Envoys in batches while memory and time allow: (admins, procs, reason or None)."""
    admins, eprocs, per_envoy_mb, reason = [], [], None, None
    t_start = time.monotonic()
    while len(admins) < args.envoys:
        count = 1 if not admins else min(args.batch, args.envoys - len(admins))
        if per_envoy_mb is not None:
            need = count * per_envoy_mb * 1.2 + args.reserve_mb
            if mem_available_mb() < need:
                reason = (f"memory: MemAvailable {mem_available_mb()} MB < {need:.0f} MB "
                          f"needed for {count} more Envoys at ~{per_envoy_mb:.0f} MB each plus "
                          f"the {args.reserve_mb} MB reserve")
                break
        if time.monotonic() - t_start > args.ramp_limit:
            reason = f"time: the ramp-up passed --ramp-limit {args.ramp_limit} s"
            break
        t0 = time.monotonic()
        batch = start_batch(procs, args, ads, workdir, len(admins), count, timeout=300)
        eprocs += [p for p, _ in batch]
        admins += [a for _, a in batch]
        if per_envoy_mb is None:
            per_envoy_mb = proc_rss_kb(eprocs[0].pid) / 1024
        log(f"{len(admins)} Envoys synced (batch of {count} in {time.monotonic() - t0:.1f} s, "
            f"MemAvailable {mem_available_mb()} MB)")
    return admins, eprocs, reason


def envoy_stat(admin, svc, stat, kind):
    """Envoy's cluster.svcK.STAT (`usedonly` and one `type`: about 1 ms with 100 clusters,
    where a /stats filter over every stat takes 4-8 ms)."""
    q = urllib.parse.quote(rf"^cluster\.svc{svc}\.{stat}$")
    body = admin.get(f"/stats?usedonly&type={kind}&filter={q}")
    m = re.search(rf"{stat}: (\d+)", body)
    return int(m.group(1)) if m else 0


CACHE_CHANGE = re.compile(r"^(\S+Z)\s+INFO xds: resources changed service=(\S+)", re.M)


def cache_changes(log_path):
    """lbkit xds's "resources changed" lines (LBKIT_LOG=info; logged as the service's new
    resources enter the cache, just before the streams are woken): [(epoch ms, service)]."""
    out = []
    for m in CACHE_CHANGE.finditer(log_path.read_text(errors="replace")):
        stamp = m.group(1).replace("Z", "+00:00")
        out.append((datetime.datetime.fromisoformat(stamp).timestamp() * 1000, m.group(2)))
    return out


def cache_delays(log_path, rounds):
    """For each (t0 as epoch ms, service), in order: ms from t0 to lbkit xds's first cache
    change of that service before the next round's t0 (5 ms early allowed: lbkit may hear of
    a ZooKeeper write before the writer does), or None."""
    seen = cache_changes(log_path)
    out = []
    for i, (t0, name) in enumerate(rounds):
        end = rounds[i + 1][0] if i + 1 < len(rounds) else t0 + 10_000
        hits = sorted(t - t0 for t, svc in seen if svc == name and t0 - 5 <= t < end)
        out.append(round(hits[0], 2) if hits else None)
    return out


def add_cache_times(change, log_path):
    """Per round, ms from the rename to lbkit's cache change for that service (the file
    watch's 50 ms debounce, the reload and the new resources)."""
    rows = change["per_round"]
    delays = cache_delays(log_path, [(r["rename_epoch_ms"], f"svc{r['svc']}") for r in rows])
    for row, d in zip(rows, delays):
        if d is not None:
            row["to_cache_change"] = d
    change["to_cache_change"] = summary([d for d in delays if d is not None])


def poll_envoys(admins, before, svc, t0_epoch_ms, timeout):
    """ms from t0 to each Envoy's cluster.svcK.update_time (epoch ms, set when Envoy has
    applied the assignment: exact to 1 ms however late it is read, so the Envoys are first
    read 0.3 s after the change and then every 50 ms, to keep the polling (50 admin requests
    a sweep, about 1 ms of an Envoy each) off the CPU while the change spreads); None if not
    seen within timeout."""
    pending = dict(enumerate(admins))
    took = [None] * len(admins)
    deadline = time.monotonic() + timeout
    time.sleep(0.3)
    while pending and time.monotonic() < deadline:
        for i, a in list(pending.items()):
            stamp = envoy_stat(a, svc, "update_time", "Gauges")
            if stamp > before[i]:
                took[i] = stamp - t0_epoch_ms
                del pending[i]
        time.sleep(0.05)
    return took


def one_change(args, workdir, admins, svc, variant, timeout=60):
    """Rewrite svc's file with endpoint 0 changed. Returns the rename's wall-clock time (epoch
    ms), ms to each Envoy, and how many Envoys' membership_change did not move."""
    before = [envoy_stat(a, svc, "update_time", "Gauges") for a in admins]
    changes = [envoy_stat(a, svc, "membership_change", "Counters") for a in admins]
    path = endpoint_path(workdir, svc, args.dir_per_service)
    write_atomically(path, endpoint_file_text(svc, args.endpoints, variant))
    t0_epoch_ms = time.time() * 1000
    took = poll_envoys(admins, before, svc, t0_epoch_ms, timeout)
    unchanged = sum(envoy_stat(a, svc, "membership_change", "Counters") <= c
                    for a, c in zip(admins, changes))
    return t0_epoch_ms, took, unchanged


def change_rounds(args, workdir, admins):
    """--rounds changes, each of ONE endpoint of one service (the service varies by round):
    the time to the median and to the last Envoy, and each round's figures (`per_round`)."""
    variants, per_round, missed, unchanged = {}, [], 0, 0
    for r in range(args.rounds):
        svc = (7 + 37 * r) % args.services
        variants[svc] = 2 if variants.get(svc) == 1 else 1
        t0_ms, took, unch = one_change(args, workdir, admins, svc, variants[svc])
        unchanged += unch
        seen = [t for t in took if t is not None]
        missed += len(took) - len(seen)
        row = {"svc": svc, "rename_epoch_ms": round(t0_ms, 1)}
        if seen and len(seen) == len(took):
            row.update(to_median_envoy=round(summary(seen)["median_ms"], 2),
                       to_all_envoys=round(max(seen), 2))
        per_round.append(row)
        time.sleep(0.5)
    keys = ("to_median_envoy", "to_all_envoys")
    out = {k: summary([r[k] for r in per_round if k in r]) for k in keys}
    out.update(envoys_missed=missed, envoys_membership_unchanged=unchanged, per_round=per_round)
    return out


def start_perf(out, pid):
    """--perf FILE: `perf record -g` of lbkit xds over the change rounds alone."""
    if not out:
        return None
    perf = subprocess.Popen(["perf", "record", "--call-graph", "dwarf,32768", "-F", "499",
                             "-o", out, "-p", str(pid)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)  # perf attaches
    return perf


def stop_perf(perf):
    if perf is not None:
        perf.send_signal(signal.SIGINT)
        perf.wait(timeout=60)


def cpu_s(pids):
    total = 0.0
    for pid in pids:
        try:
            total += proc_cpu_s(pid)
        except OSError:
            pass
    return total


def scale_measure_rounds(args, workdir, xds, xadmin, admins, epids):
    """Idle CPU, then the change rounds: their timing, lbkit's and the Envoys' CPU and the
    bytes pushed per change."""
    c0, e0, t0 = proc_cpu_s(xds.pid), cpu_s(epids), time.monotonic()
    time.sleep(5)
    idle_s = time.monotonic() - t0
    idle_cpu_per_s = (proc_cpu_s(xds.pid) - c0) / idle_s
    envoys_idle_per_s = (cpu_s(epids) - e0) / idle_s
    log(f"{args.rounds} change rounds")
    m0 = xds_counters(xds_metrics(xadmin))
    perf = start_perf(args.perf, xds.pid)
    c0, e0, t0 = proc_cpu_s(xds.pid), cpu_s(epids), time.monotonic()
    change = change_rounds(args, workdir, admins)
    cpu, ecpu, wall = proc_cpu_s(xds.pid) - c0, cpu_s(epids) - e0, time.monotonic() - t0
    stop_perf(perf)
    m1 = xds_counters(xds_metrics(xadmin))
    add_cache_times(change, workdir / "xds.log")
    per = lambda k: {t: round((m1[k][t] - m0[k][t]) / args.rounds, 1) for t in m1[k]}  # noqa: E731
    change.update({
        "xds_cpu_s_per_change": round(cpu / args.rounds, 4),
        "xds_idle_cpu_s_per_s": round(idle_cpu_per_s, 5),
        "xds_cpu_s_per_change_minus_idle": round((cpu - idle_cpu_per_s * wall) / args.rounds, 4),
        "envoys_idle_cpu_s_per_s": round(envoys_idle_per_s, 4),
        "envoys_cpu_s_per_change_minus_idle": round(
            (ecpu - envoys_idle_per_s * wall) / args.rounds, 4),
        "pushed_bytes_per_change": per("pushed_bytes"),
        "pushes_per_change": per("pushes"),
        "push_latency_during_changes": push_latency_delta(m0, m1),
        "nacks": m1["nacks"] - m0["nacks"],
    })
    return change, m1


def push_latency_delta(m0, m1):
    """lbkit_xds_push_latency_seconds over the rounds only: count, mean and the buckets."""
    a, b = m0["push_latency"], m1["push_latency"]
    count = b["count"] - a["count"]
    total = b["sum_s"] - a["sum_s"]
    buckets = {le: n - a["buckets_le_s"].get(le, 0) for le, n in b["buckets_le_s"].items()}
    return {"count": count, "mean_ms": round(1000 * total / count, 3) if count else None,
            "buckets_le_s": buckets}


def run_scale(procs, args, workdir):
    try:
        config = scale_config(workdir, args.services, args.endpoints, args.dir_per_service)
        xds, ads, admin_port = start_xds(procs, args.lbkit, config, workdir, "info")
        xadmin = Admin(admin_port)
        time.sleep(2)  # let every file source load before the first Envoy asks
        rss_before = proc_rss_kb(xds.pid)
        log(f"lbkit xds up, RSS {rss_before / 1024:.1f} MB; starting Envoys")
        t_ramp = time.monotonic()
        admins, eprocs, reason = ramp_envoys(procs, args, ads, workdir)
        ramp_s = time.monotonic() - t_ramp
        time.sleep(2)
        initial = xds_counters(xds_metrics(xadmin))
        rss_synced = proc_rss_kb(xds.pid)
        envoy_rss = [proc_rss_kb(p.pid) / 1024 for p in eprocs]
        rounds, final = scale_measure_rounds(args, workdir, xds, xadmin, admins,
                                             [p.pid for p in eprocs])
        rounds["envoys_still_synced"] = sum(
            envoy_synced(a, args.services, args.endpoints) for a in admins)
        rss_after = proc_rss_kb(xds.pid)
    finally:
        procs.stop_all()
    n = len(admins)
    one_cla = initial["pushed_bytes"]["eds"] / n / args.services
    return {
        "mode": "scale", "services": args.services, "endpoints_per_service": args.endpoints,
        "dir_per_service": args.dir_per_service,
        "delta": args.delta,
        "envoys_asked": args.envoys, "envoys_run": n, "envoys_short_reason": reason,
        "ramp_up_s": round(ramp_s, 1),
        "xds_rss_mb_before_envoys": round(rss_before / 1024, 1),
        "xds_rss_mb_all_synced": round(rss_synced / 1024, 1),
        "xds_rss_mb_after_changes": round(rss_after / 1024, 1),
        "envoy_rss_mb": {"mean": round(sum(envoy_rss) / n, 1), "max": round(max(envoy_rss), 1)},
        "initial_push": {"pushed_bytes": initial["pushed_bytes"], "pushes": initial["pushes"],
                         "eds_bytes_per_envoy": round(initial["pushed_bytes"]["eds"] / n),
                         "cds_bytes_per_envoy": round(initial["pushed_bytes"]["cds"] / n),
                         "nacks": initial["nacks"]},
        "one_assignment_bytes": round(one_cla),
        "o_change_eds_bytes": round(one_cla * n),
        "change": rounds,
        "xds_metrics": final,
    }


def print_scale(res):
    log(f"Envoys: {res['envoys_run']} of {res['envoys_asked']}"
        + (f" -- fewer because {res['envoys_short_reason']}" if res["envoys_short_reason"] else ""))
    log(f"ramp-up {res['ramp_up_s']} s; lbkit xds RSS {res['xds_rss_mb_before_envoys']} MB "
        f"before Envoys, {res['xds_rss_mb_all_synced']} MB with all synced; Envoy RSS "
        f"mean {res['envoy_rss_mb']['mean']} MB")
    ip = res["initial_push"]
    log(f"initial push: {ip['pushed_bytes']} bytes in all; per Envoy EDS "
        f"{ip['eds_bytes_per_envoy']} B, CDS {ip['cds_bytes_per_envoy']} B; one assignment "
        f"{res['one_assignment_bytes']} B")
    c = res["change"]
    log("one-endpoint change, from the rename to:")
    for k, what in (("to_cache_change", "lbkit xds's cache change (its log)"),
                    ("to_median_envoy", "the median Envoy"), ("to_all_envoys", "all Envoys")):
        log(f"  {what}: {fmt(c.get(k, {}))}")
    pl = c["push_latency_during_changes"]
    log(f"lbkit xds push latency (cache change -> handed to a stream): mean {pl['mean_ms']} ms "
        f"over {pl['count']} pushes; buckets {pl['buckets_le_s']}")
    log(f"per change: lbkit xds CPU {c['xds_cpu_s_per_change']} s "
        f"({c['xds_cpu_s_per_change_minus_idle']} s over idle), bytes "
        f"{c['pushed_bytes_per_change']} (O(change) EDS = {res['o_change_eds_bytes']} B), "
        f"pushes {c['pushes_per_change']}; "
        f"NACKs {c['nacks']}; all Envoys' CPU {c['envoys_cpu_s_per_change_minus_idle']} s per "
        f"change over idle ({c['envoys_idle_cpu_s_per_s']} CPU s/s idle); Envoys missed "
        f"{c['envoys_missed']}, membership unchanged {c['envoys_membership_unchanged']}")


# === main ===


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["latency", "scale"])
    ap.add_argument("--rounds", type=int, help="latency: Envoy rounds (100); scale: changes (20)")
    ap.add_argument("--grpc-rounds", type=int, default=30, help="latency: gRPC rounds")
    ap.add_argument("--out", help="write the JSON here instead of stdout")
    ap.add_argument("--lbkit", default=str(REPO / "target" / "release" / "lbkit"))
    ap.add_argument("--envoys", type=int, default=50)
    ap.add_argument("--services", type=int, default=100)
    ap.add_argument("--endpoints", type=int, default=1000)
    ap.add_argument("--delta", action="store_true",
                    help="Envoys speak incremental ADS (DELTA_GRPC) instead of state of the world")
    ap.add_argument("--perf", metavar="FILE",
                    help="scale: `perf record -g` lbkit xds over the change rounds into FILE")
    ap.add_argument("--dir-per-service", action="store_true",
                    help="scale: each endpoints file in its own directory")
    ap.add_argument("--batch", type=int, default=5, help="scale: Envoys started at once")
    ap.add_argument("--reserve-mb", type=int, default=2048, help="scale: memory kept free")
    ap.add_argument("--ramp-limit", type=float, default=1200, help="scale: ramp-up time limit, s")
    args = ap.parse_args()
    if args.rounds is None:
        args.rounds = 100 if args.mode == "latency" else 20
    args.zk = os.environ.get("LBKIT_ZK")
    args.envoy = os.environ.get("LBKIT_ENVOY")
    if not args.envoy or (args.mode == "latency" and not args.zk):
        sys.exit("bench-xds: set LBKIT_ENVOY (scripts/envoy.sh) and, for latency, LBKIT_ZK "
                 "(scripts/zookeeper.sh start)")
    if not Path(args.lbkit).is_file():
        sys.exit(f"bench-xds: no {args.lbkit}: cargo build --release -p lbkit")
    return args


def main():
    args = parse_args()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    workdir = SCRATCH / f"{args.mode}-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    log(f"scratch files in {workdir}")
    procs = Procs()
    try:
        if args.mode == "latency":
            res = run_latency(procs, args, workdir)
            print_latency(res)
        else:
            res = run_scale(procs, args, workdir)
            print_scale(res)
    finally:
        procs.stop_all()
    text = json.dumps(res, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
