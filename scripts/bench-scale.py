#!/usr/bin/env python3
"""Scale of configuration (issue 18, part 5): run by scripts/bench-scale.sh, which builds the
binaries, makes the Python environment (psutil, kazoo) and starts ZooKeeper.

proxy  `lbkit proxy` with SERVICES x ENDPOINTS (default 1 000 x 100): for each size in
       --sizes, start-up time (process start until a request routed by the LAST route is
       answered), RSS and CPU idle, memory per endpoint (RSS over the one-service size, per
       endpoint);
       at the largest size: reload time (SIGHUP; the proxy logs the time from reading the
       file to the swap) when one service changes and when every service changes, throughput
       and p99 (wrk) through the first and the last route (routes are matched in file order),
       and the effect of reloads on in-flight requests: wrk while a reload happens every
       --reload-every seconds, errors and non-2xx answers counted.
       Services s0 and the last one have the three real backends (the backend example); every
       other service has ENDPOINTS addresses that nothing serves (never called: a reload's and
       the memory's cost do not depend on it).
zk     `lbkit watch` following PROVIDERS Dubbo providers (ephemeral nodes under
       /dubbo/com.acme.Scale/providers, as Dubbo writes them) while --churn of them change per
       second (half removed, half added, evenly spread): time to the first full listing, then
       each change's latency from the write being sent to `lbkit watch` printing it (p50, p99,
       max, lost), and the watcher's CPU and RSS during the churn.
       --via proxy: the same, followed by `lbkit proxy` with one ZooKeeper service (--strategy)
       instead, each change timed to its Controller's debug line for the publish (logged once
       the strategy has prepared the new set: what a pick sees). --via pool: the same with the
       tower `Pool` of crates/lbkit/examples/zk_pool.rs (built by scripts/bench-scale.sh).
files  `lbkit proxy` with SERVICES services of --endpoints (default 1 000) endpoints each, every
       service from a file source of its own (one JSON file in a directory of its own, as
       Dubbo-less fleets and `scripts/bench-xds.py scale --dir-per-service` keep them), for
       each size in --services (default 1,100: 1 000 and 100 000 endpoints): start-up (process
       start until every service has published its set), RSS and memory per endpoint, idle
       CPU, then --changes one-endpoint changes (one file rewritten, a second apart, in a
       service that varies): each one's latency from the rename to the Controller's debug
       line naming the new address, and the CPU per change above idle. Issue 44's target: a
       change at 100 000 endpoints within 2x of the same change at 1 000.

Every wait is bounded; everything listens on 127.0.0.1.
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import http.client
import json
import shutil

import psutil


def rss_mb(proc):
    p = psutil.Process(proc.pid)
    total = p.memory_info().rss
    for c in p.children(recursive=True):
        total += c.memory_info().rss
    return total / 2**20


def median(xs):
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def cpu_seconds(ps):
    t = ps.cpu_times()
    return t.user + t.system


def idle_share(ps, seconds):
    """The share of a core `ps` uses while left alone for `seconds` (after 2 s to settle)."""
    time.sleep(2.0)
    c0 = cpu_seconds(ps)
    time.sleep(seconds)
    return (cpu_seconds(ps) - c0) / seconds


def quantile(xs, q):
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


class Lines:
    """A child's output, read by a thread: every line with the monotonic time it arrived."""

    def __init__(self, stream):
        self.lines = []
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream):
        for raw in stream:
            now = time.monotonic()
            with self.cond:
                self.lines.append((now, raw.decode(errors="replace").rstrip("\n")))
                self.cond.notify_all()

    def wait_for(self, pred, start, timeout):
        """The first line from index `start` on for which pred(line) holds: (index, time, line)."""
        deadline = time.monotonic() + timeout
        i = start
        with self.cond:
            while True:
                while i < len(self.lines):
                    t, line = self.lines[i]
                    if pred(line):
                        return i, t, line
                    i += 1
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no matching line within {timeout} s")
                self.cond.wait(left)

    def count(self):
        with self.cond:
            return len(self.lines)


# === proxy ===


def proxy_config(front, admin, services, endpoints, backends, variant):
    """The configuration: `variant` changes the last service (1) or every service (2)."""
    out = [
        "[admin]",
        f'bind = "127.0.0.1:{admin}"',
        "[limits]",
        "max_connections = 4096",
        "[[listener]]",
        f'bind = "127.0.0.1:{front}"',
    ]
    for s in range(services):
        out += ["[[route]]", f'path_prefix = "/s{s}/"', f'service = "s{s}"']
    real = ", ".join(f'"127.0.0.1:{b}"' for b in backends)
    for s in range(services):
        out.append(f"[service.s{s}]")
        if s == 0 or s == services - 1:
            out.append(f"endpoints = [{real}]")
        else:
            # Addresses nothing serves, one per endpoint: 10.S.x.y:20880 (never called).
            first = 1 if (variant == 1 and s == services - 2) else 0
            addrs = ", ".join(
                f'"10.{s // 250}.{s % 250}.{e + first}:20880"' for e in range(endpoints)
            )
            out.append(f"endpoints = [{addrs}]")
        out.append(f"retries = {3 if variant == 2 else 2}")
    return "\n".join(out) + "\n"


def write_atomically(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def get(port, path, timeout=1.0):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        r.read()
        return r.status
    finally:
        c.close()


def wait_answer(port, path, proc, timeout=180.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the proxy exited with status {proc.returncode}")
        try:
            if get(port, path, 0.5) == 200:
                return time.monotonic()
        except OSError:
            pass
        time.sleep(0.005)
    raise TimeoutError(f"no 200 from :{port}{path} within {timeout} s")


def wrk(args, port, path, seconds, conns):
    out = subprocess.run(
        [args.wrk, "-t1", f"-c{conns}", f"-d{seconds}s", "--latency", f"http://127.0.0.1:{port}{path}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p99 = re.search(r"^\s+99%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
    unit = {"us": 1e-3, "ms": 1.0, "s": 1e3}[p99.group(2)]
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    total = int(re.search(r"(\d+) requests in", out).group(1))
    return {
        "rps": rps,
        "p99_ms": float(p99.group(1)) * unit,
        "errors": sum(int(x) for x in errors.groups()) if errors else 0,
        "non2xx": int(non2xx.group(1)) if non2xx else 0,
        "requests": total,
    }


def start_proxy(args, path, workers):
    env = dict(os.environ, LBKIT_LOG="info", NO_COLOR="1")
    proc = subprocess.Popen(
        [args.lbkit, "proxy", "--threads", str(workers), "--config", path],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    return proc, Lines(proc.stderr)


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


RELOADED = re.compile(r"configuration reloaded.*services=(\d+) started=(\d+) took_ms=([\d.]+)")


def reload_once(proc, log, path, text):
    """Write `text`, send SIGHUP, and return (took_ms, started) from the proxy's log line.
    The file watcher reloads the same file again 100 ms later (its debounce); that second
    reload starts nothing and is waited for too, so the next measurement starts clean."""
    start = log.count()
    write_atomically(path, text)
    proc.send_signal(signal.SIGHUP)
    i, _, line = log.wait_for(lambda l: "configuration reloaded" in l or "rejected" in l, start, 120)
    m = RELOADED.search(line)
    if not m:
        raise RuntimeError(f"reload failed: {line}")
    try:  # the watcher's reload of the same content (a no-op), when it comes
        log.wait_for(lambda l: "configuration reloaded" in l, i + 1, 2)
    except TimeoutError:
        pass
    return float(m.group(3)), int(m.group(2))


def reloads_during_load(args, proc, log, path, texts, every, seconds, port, route):
    """wrk on `route` for `seconds` while the configuration alternates between `texts` every
    `every` seconds; returns wrk's figures and the number of reloads applied."""
    stop_flag = threading.Event()
    applied = [0]

    def reloader():
        k = 0
        while not stop_flag.wait(every):
            k += 1
            before = log.count()
            write_atomically(path, texts[k % 2])
            proc.send_signal(signal.SIGHUP)
            try:
                log.wait_for(lambda l: "configuration reloaded" in l, before, 60)
                applied[0] += 1
            except TimeoutError:
                pass

    t = threading.Thread(target=reloader, daemon=True)
    t.start()
    result = wrk(args, port, route, seconds, args.conns)
    stop_flag.set()
    t.join()
    result["reloads"] = applied[0]
    return result


def proxy_bench(args):
    work = tempfile.mkdtemp(prefix="bench-scale.")
    base = args.base_port
    backends = [base + 1, base + 2, base + 3]
    front, admin = base + 10, base + 11
    procs = [
        subprocess.Popen([args.backend, str(b), "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for b in backends
    ]
    try:
        for b in backends:
            deadline = time.monotonic() + 10
            while True:
                try:
                    get(b, "/")
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        sizes = [int(s) for s in args.sizes.split(",")]
        print(f"# lbkit proxy: services x {args.endpoints} endpoints (s0 and the last: 3 real backends)")
        print(f"{'workers':>7} {'services':>8} {'endpoints':>9} {'start-up s':>10} {'idle RSS MB':>11} {'KiB/endpoint':>12} {'idle CPU %':>10}")
        results = {}
        for workers in [int(w) for w in args.workers.split(",")]:
            base_rss = None
            for n in sizes:
                path = os.path.join(work, f"proxy-{n}.toml")
                text = proxy_config(front, admin, n, args.endpoints, backends, 0)
                write_atomically(path, text)
                endpoints = sum(3 if s in (0, n - 1) else args.endpoints for s in range(n))
                runs = []
                for _ in range(args.rounds):
                    t0 = time.monotonic()
                    proc, log = start_proxy(args, path, workers)
                    try:
                        ready = wait_answer(front, f"/s{n - 1}/", proc)
                        time.sleep(1.0)
                        ps = psutil.Process(proc.pid)
                        c0 = ps.cpu_times()
                        time.sleep(3.0)
                        c1 = ps.cpu_times()
                        idle_cpu = ((c1.user + c1.system) - (c0.user + c0.system)) / 3.0 * 100
                        runs.append((ready - t0, rss_mb(proc), idle_cpu))
                        if n == sizes[-1] and workers == int(args.workers.split(",")[-1]) and not results:
                            results = large_size(args, proc, log, path, n, backends, front)
                    finally:
                        stop(proc)
                startup = median([r[0] for r in runs])
                rss = median([r[1] for r in runs])
                cpu = median([r[2] for r in runs])
                if base_rss is None:
                    base_rss, base_eps = rss, endpoints
                    per = ""
                else:
                    per = f"{(rss - base_rss) * 1024 / (endpoints - base_eps):.2f}"
                print(f"{workers:>7} {n:>8} {endpoints:>9} {startup:>10.3f} {rss:>11.1f} {per:>12} {cpu:>10.1f}")
        print_large(args, results)
    finally:
        for p in procs:
            p.kill()
            p.wait()


def large_size(args, proc, log, path, n, backends, front):
    def config(variant):
        return proxy_config(front, args.base_port + 11, n, args.endpoints, backends, variant)

    base_text, one, every = config(0), config(1), config(2)
    out = {"services": n}
    # Reload: alternate so that each reload changes something.
    for name, changed in (("one", one), ("every", every)):
        took, started = [], []
        for _ in range(args.reloads):
            for text in (changed, base_text):
                ms, st = reload_once(proc, log, path, text)
                took.append(ms)
                started.append(st)
        out[f"reload_{name}"] = (median(took), max(took), median(started))
    out["rss_after_reloads"] = rss_mb(proc)
    # Throughput through the first and the last route, then with reloads going on.
    for name, route in (("first", "/s0/"), ("last", f"/s{n - 1}/")):
        out[f"route_{name}"] = [wrk(args, front, route, args.seconds, args.conns) for _ in range(args.rounds)]
    out["load_rss"] = rss_mb(proc)
    for name, text in (("one", one), ("every", every)):
        out[f"during_{name}"] = [
            reloads_during_load(args, proc, log, path, (base_text, text), args.reload_every, args.seconds, front, "/s0/")
            for _ in range(args.rounds)
        ]
    write_atomically(path, base_text)
    return out


def print_large(args, r):
    if not r:
        return
    n = r["services"]
    print()
    print(f"# {n} services: reloads (median of {2 * args.reloads}; the proxy's own log: file read to swap)")
    for name, what in (("one", "one service changed"), ("every", "every service changed")):
        med, worst, started = r[f"reload_{name}"]
        print(f"reload, {what:<22} {med:8.1f} ms median {worst:8.1f} ms worst, {started:.0f} services started")
    print(f"RSS after the reloads {r['rss_after_reloads']:.1f} MB, after the load runs {r['load_rss']:.1f} MB")
    print()
    print(f"# wrk -t1 -c{args.conns} -d{args.seconds}s, {args.rounds} rounds: median (each round)")
    print(f"{'what':<34} {'req/s':>9} {'p99 ms':>8} {'errors':>7} {'non-2xx':>8} {'reloads':>8}")
    rows = [
        ("route 1 of %d (/s0/)" % n, r["route_first"]),
        ("route %d of %d (/s%d/)" % (n, n, n - 1), r["route_last"]),
        ("/s0/, a reload (one service) every %gs" % args.reload_every, r["during_one"]),
        ("/s0/, a reload (every service) every %gs" % args.reload_every, r["during_every"]),
    ]
    for what, runs in rows:
        rps = median([x["rps"] for x in runs])
        p99 = median([x["p99_ms"] for x in runs])
        errors = sum(x["errors"] for x in runs)
        non2xx = sum(x["non2xx"] for x in runs)
        reloads = sum(x.get("reloads", 0) for x in runs)
        each = " ".join(f"{x['rps']:.0f}" for x in runs)
        print(f"{what:<34} {rps:>9.0f} {p99:>8.2f} {errors:>7} {non2xx:>8} {reloads:>8}   ({each})")


# === zk ===


def provider_node(i, now_ms):
    host = f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"
    url = (
        f"dubbo://{host}:20880/com.acme.Scale?anyhost=true&application=scale-provider"
        f"&deprecated=false&dubbo=2.0.2&dynamic=true&generic=false&interface=com.acme.Scale"
        f"&methods=say,hello&pid={1000 + i}&release=3.2.0&side=provider&timestamp={now_ms}"
    )
    return f"{host}:20880", urllib.parse.quote(url, safe="")


def zk_bench(args):
    if args.params and args.via != "proxy":
        sys.exit("bench-scale.py: --param is for zk --via proxy only")
    from kazoo.client import KazooClient

    zk = KazooClient(hosts=args.zk, timeout=30)
    zk.start(timeout=30)
    providers = "/dubbo/com.acme.Scale/providers"
    if zk.exists("/dubbo/com.acme.Scale"):
        zk.delete("/dubbo/com.acme.Scale", recursive=True)
    zk.ensure_path(providers)
    who = {"watch": "lbkit watch", "proxy": "lbkit proxy", "pool": "a tower Pool"}[args.via]
    who += "" if args.via == "watch" else f" ({args.strategy})"
    print(f"# {who} following N Dubbo providers, {args.churn * 100:g} % of them changing per second "
          f"for {args.seconds} s (half removed, half added)"
          + (f"; the first registered {args.registered_ago:g} s before" if args.registered_ago else
             "; every one in Dubbo's warm-up"))
    print(f"{'providers':>9} {'listing s':>9} {'changes':>7} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} "
          f"{'lost':>5} {'CPU %':>6} {'idle CPU %':>10} {'RSS MB':>7}")
    for n in [int(x) for x in args.providers.split(",")]:
        zk_size(args, zk, providers, n)
        zk.delete("/dubbo/com.acme.Scale", recursive=True)
        zk.ensure_path(providers)
    zk.stop()


def start_follower(args, n):
    """Start what follows the providers (--via): `lbkit watch`, which prints each change, or
    `lbkit proxy` with one ZooKeeper service, or the tower `Pool` of the zk_pool example (both
    with --strategy), whose Controller logs each publish with the endpoints it changed
    (LBKIT_LOG=...controller=debug) after the strategy has prepared the set. Returns the
    process, its lines, and what reads the endpoints a line names as changed."""
    if args.via == "watch":
        proc = subprocess.Popen(
            [args.lbkit, "watch", "--zk", args.zk, "--interface", "com.acme.Scale", "--timeout-ms", "30000"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )

        def changed(line):
            return [line[2:].split()[0]] if line[:2] in ("+ ", "- ") else []

        return proc, Lines(proc.stdout), changed
    env = dict(os.environ, LBKIT_LOG="warn,lbkit_discovery::controller=debug")
    if args.via == "pool":
        example = args.pool or os.path.join(os.path.dirname(args.lbkit), "examples", "zk_pool")
        cmd = [example, args.zk, "com.acme.Scale", args.strategy]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        return proc, Lines(proc.stderr), published_keys
    path = f"/tmp/bench-scale-zk-proxy-{os.getpid()}.toml"
    with open(path, "w") as f:
        f.write(
            f'[[listener]]\nbind = "127.0.0.1:{args.base_port}"\n[admin]\nbind = "127.0.0.1:{args.base_port + 1}"\n'
            f'[[route]]\nservice = "scale"\n[service.scale]\n'
            f'zookeeper = {{ zk = "{args.zk}", interface = "com.acme.Scale", register = false }}\n'
            f'strategy = "{args.strategy}"\n'
            f"params = {{ {', '.join(args.params)} }}\n"
        )
    proc = subprocess.Popen(
        [args.lbkit, "proxy", "--config", path], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
    )
    return proc, Lines(proc.stderr), published_keys


def published_keys(line):
    """The endpoints a Controller's debug line for a publish names as changed."""
    if " published " not in line or " changed=" not in line:
        return []
    return line.split(" changed=", 1)[1].split()


def zk_size(args, zk, providers, n):
    # The first providers registered --registered-ago seconds back: 0 puts every one in Dubbo's
    # 10-minute warm-up for the whole run (a fleet started at once); an hour gives a settled
    # fleet where only the providers the churn adds warm up.
    now_ms = int(time.time() * 1000) - int(args.registered_ago * 1000)
    live = {}
    batch = []
    for i in range(n):
        addr, node = provider_node(i, now_ms)
        live[addr] = node
        batch.append(zk.create_async(f"{providers}/{node}", ephemeral=True))
        if len(batch) >= 500:
            for b in batch:
                b.get(timeout=30)
            batch = []
    for b in batch:
        b.get(timeout=30)
    t0 = time.monotonic()
    proc, out, changed_keys = start_follower(args, n)
    try:
        if args.via == "watch":
            _, t_list, header = out.wait_for(lambda l: l.startswith("# ") and "providers" in l, 0, 120)
            # The table's rows follow the header and its column line: wait for the last one.
            out.wait_for(lambda _: True, n + 1, 60)
        else:
            _, t_list, header = out.wait_for(lambda l: f"published endpoints={n} " in l, 0, 120)
        listing = t_list - t0
        ps = psutil.Process(proc.pid)
        idle_cpu = idle_share(ps, 5.0) * 100
        # Churn: every 1/rate s one operation, alternately a removal and an addition.
        rate = max(1.0, n * args.churn)
        ops = int(rate * args.seconds)
        sent = {}  # ("+" | "-", addr) -> time sent
        next_i = n
        pending = []
        start_line = out.count()
        c0 = ps.cpu_times()
        w0 = time.monotonic()
        addrs = list(live)
        for k in range(ops):
            due = w0 + k / rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if k % 2 == 0:
                addr = addrs[(k // 2) % len(addrs)]
                node = live.pop(addr)
                sent[("-", addr)] = time.monotonic()
                pending.append(zk.delete_async(f"{providers}/{node}"))
            else:
                addr, node = provider_node(next_i, int(time.time() * 1000))
                next_i += 1
                live[addr] = node
                sent[("+", addr)] = time.monotonic()
                pending.append(zk.create_async(f"{providers}/{node}", ephemeral=True))
        for p in pending:
            p.get(timeout=30)
        # Wait (bounded) until every change is printed.
        seen = {}
        deadline = time.monotonic() + 30
        i = start_line
        while len(seen) < len(sent) and time.monotonic() < deadline:
            with out.cond:
                while i < len(out.lines):
                    t, line = out.lines[i]
                    i += 1
                    for addr in changed_keys(line):
                        for key in (("+", addr), ("-", addr)):
                            if key in sent and key not in seen:
                                seen[key] = t
                if len(seen) < len(sent):
                    out.cond.wait(0.2)
        w1 = time.monotonic()
        c1 = ps.cpu_times()
        cpu = ((c1.user + c1.system) - (c0.user + c0.system)) / (w1 - w0) * 100
        lat = [(seen[k] - sent[k]) * 1000 for k in seen]
        lost = len(sent) - len(seen)
        rss = ps.memory_info().rss / 2**20
        print(f"{n:>9} {listing:>9.2f} {len(sent):>7} {quantile(lat, 0.5):>7.1f} {quantile(lat, 0.99):>7.1f} "
              f"{max(lat):>7.1f} {lost:>5} {cpu:>6.1f} {idle_cpu:>10.1f} {rss:>7.1f}")
        if args.verbose:
            print(f"  header: {header}", file=sys.stderr)
    finally:
        proc.kill()
        proc.wait()


# === files ===


def endpoints_json(svc, endpoints, variant):
    """Service svc's endpoints; endpoint 0's address depends on `variant` (0 = the original)."""
    eps = [{"address": f"10.{svc // 250}.{svc % 250}.{e % 250 + 1}:{20000 + e // 250}", "weight": 100}
           for e in range(endpoints)]
    if variant:
        eps[0]["address"] = f"10.{svc // 250}.{svc % 250}.{variant}:30000"
    # In key order, as generated lists usually are: the Controller then patches what a rewrite
    # changed (in any other order it rebuilds the service's set, still O(service)).
    return json.dumps(sorted(eps, key=lambda e: e["address"]))


def files_config(args, workdir, services):
    out = [f'[[listener]]\nbind = "127.0.0.1:{args.base_port}"\n[admin]\nbind = "127.0.0.1:{args.base_port + 1}"\n']
    for s in range(services):
        d = os.path.join(workdir, f"svc{s}")
        os.makedirs(d, exist_ok=True)
        write_atomically(os.path.join(d, "endpoints.json"), endpoints_json(s, args.endpoints, 0))
        out.append(f'[[route]]\npath_prefix = "/s{s}/"\nservice = "svc{s}"\n')
        out.append(f'[service.svc{s}]\nfile = "{d}/endpoints.json"\nstrategy = "{args.strategy}"\n')
    return "\n".join(out)


def files_bench(args):
    print(f"# lbkit proxy ({args.strategy}), services x {args.endpoints} endpoints, each service from a file "
          f"source of its own; {args.changes} one-endpoint changes a second apart")
    print("services endpoints start s  RSS MB  KiB/ep idle CPU % changes  p50 ms  p99 ms  max ms  lost  CPU ms/change")
    for n in [int(x) for x in args.services.split(",")]:
        files_size(args, n)


def files_size(args, n):
    nan = float("nan")
    workdir = tempfile.mkdtemp(prefix="bench-scale-files-")
    path = os.path.join(workdir, "proxy.toml")
    with open(path, "w") as f:
        f.write(files_config(args, workdir, n))
    env = dict(os.environ, LBKIT_LOG="warn,lbkit_discovery::controller=debug")
    t0 = time.monotonic()
    proc = subprocess.Popen([args.lbkit, "proxy", "--config", path], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=env)
    out = Lines(proc.stderr)
    try:
        full = f"published endpoints={args.endpoints} "
        at = 0
        for _ in range(n):
            at, t_up, _ = out.wait_for(lambda l: full in l, at, 300)
            at += 1
        start = t_up - t0
        ps = psutil.Process(proc.pid)
        # Idle CPU (timers, outlier detection) over 20 s: the clock ticks at 10 ms, and what
        # a change costs is the busy time above it.
        idle = idle_share(ps, 20.0)
        rss = ps.memory_info().rss / 2**20
        lat, lost, variants = [], 0, {}
        c0, w0 = cpu_seconds(ps), time.monotonic()
        for r in range(args.changes):
            svc = (7 + 37 * r) % n
            variants[svc] = 2 if variants.get(svc) == 1 else 1
            d = os.path.join(workdir, f"svc{svc}")
            new = f"10.{svc // 250}.{svc % 250}.{variants[svc]}:30000"
            mark = out.count()
            write_atomically(os.path.join(d, "endpoints.json"), endpoints_json(svc, args.endpoints, variants[svc]))
            t_w = time.monotonic()
            try:
                _, t_seen, _ = out.wait_for(lambda l: new in published_keys(l), mark, 10)
                lat.append((t_seen - t_w) * 1000)
            except TimeoutError:
                lost += 1
            time.sleep(max(0.0, t_w + 1.0 - time.monotonic()))
        c1, w1 = cpu_seconds(ps), time.monotonic()
        busy = c1 - c0 - idle * (w1 - w0)
        per_change = max(0.0, busy) / max(1, args.changes) * 1000
        total = n * args.endpoints
        kib = rss * 1024 / total
        print(f"{n:>8} {total:>9} {start:>7.2f} {rss:>7.1f} {kib:>7.2f} {idle * 100:>10.1f} {args.changes:>7} "
              f"{quantile(lat or [nan], 0.5):>7.1f} {quantile(lat or [nan], 0.99):>7.1f} {max(lat or [nan]):>7.1f} {lost:>5} "
              f"{per_change:>14.2f}", flush=True)
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["proxy", "zk", "files"])
    ap.add_argument("--lbkit", required=True)
    ap.add_argument("--backend", help="the backend example (proxy)")
    ap.add_argument("--wrk", default="wrk")
    ap.add_argument("--zk", default=os.environ.get("LBKIT_ZK", "127.0.0.1:2181"))
    ap.add_argument("--sizes", default="1,10,100,1000", help="services, comma-separated (proxy)")
    ap.add_argument("--endpoints", type=int, help="endpoints per service (proxy: 100, files: 1 000)")
    ap.add_argument("--workers", default="1", help="worker threads, comma-separated (proxy)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reloads", type=int, default=5, help="reload pairs measured (proxy)")
    ap.add_argument("--reload-every", type=float, default=1.0, help="seconds between reloads under load (proxy)")
    ap.add_argument("--seconds", type=int, default=10, help="wrk run / churn length")
    ap.add_argument("--conns", type=int, default=64, help="wrk connections (proxy)")
    ap.add_argument("--providers", default="1000,10000", help="providers, comma-separated (zk)")
    ap.add_argument("--churn", type=float, default=0.01, help="share of providers changing per second (zk)")
    ap.add_argument("--via", choices=["watch", "proxy", "pool"], default="watch", help="what follows the providers (zk)")
    ap.add_argument("--strategy", default="round-robin", help="the proxy's or pool's strategy (zk --via proxy|pool)")
    ap.add_argument(
        "--param",
        dest="params",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a strategy parameter for the proxy (zk --via proxy), TOML: rebuild_interval_ms=250; repeatable",
    )
    ap.add_argument("--registered-ago", type=float, default=0.0,
                    help="seconds before now the first providers registered (zk; 0: all warming up)")
    ap.add_argument("--pool", help="the zk_pool example (zk --via pool; default: beside --lbkit, examples/zk_pool)")
    ap.add_argument("--base-port", type=int, default=27080)
    ap.add_argument("--services", default="1,100", help="services, comma-separated (files)")
    ap.add_argument("--changes", type=int, default=30, help="one-endpoint changes measured (files)")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    if args.what == "proxy":
        args.endpoints = args.endpoints or 100
        if not args.backend:
            ap.error("proxy needs --backend")
        proxy_bench(args)
    elif args.what == "files":
        args.endpoints = args.endpoints or 1000
        files_bench(args)
    else:
        zk_bench(args)


if __name__ == "__main__":
    main()
