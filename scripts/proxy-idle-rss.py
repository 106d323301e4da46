#!/usr/bin/env python3
"""Memory of idle keep-alive connections in `lbkit proxy` (issue 8).

Starts three backends (crates/lbkit-proxy/examples/backend.rs, release build) and
`BINARY proxy --threads 1` in front of them, opens N client connections that each send one
request and then stay open and idle, and prints the proxy's RSS before and after, and the
difference per connection.

    cargo build --release -p lbkit --bin lbkit -p lbkit-proxy --example backend
    scripts/proxy-idle-rss.py target/release/lbkit 2000

Ports BASE_PORT+1..3 (backends), +10 (proxy), +11 (admin); BASE_PORT defaults to 26080.
N is bounded by the open-file limit (`ulimit -n`) and the configuration's 4 096 connections.
"""
import os
import socket
import subprocess
import sys
import tempfile
import time


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: proxy-idle-rss.py BINARY N")
    binary, n = sys.argv[1], int(sys.argv[2])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(root, "target"))
    base = int(os.environ.get("BASE_PORT", "26080"))
    backend = os.path.join(target, "release", "examples", "backend")
    procs = [
        subprocess.Popen([backend, str(base + p), "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for p in (1, 2, 3)
    ]
    # The benchmark's lbkit configuration (scripts/proxy-configs.sh: up to 4 096 connections),
    # with idle connections kept longer than the default 10 s head/idle timeout.
    ports = [str(base + p) for p in (10, 11, 1, 2, 3)]
    limits = "header_read_timeout_ms = 60000"
    text = subprocess.run(
        ["bash", "-c", '. "$0"; lbkit_conf "$@"', os.path.join(root, "scripts", "proxy-configs.sh"),
         *ports, "round-robin", limits],
        check=True, capture_output=True, text=True,
    ).stdout
    conf = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
    conf.write(text)
    conf.close()
    proxy = subprocess.Popen([binary, "proxy", "--threads", "1", "--config", conf.name],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.append(proxy)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", base + 10)).close()
                break
            except OSError:
                time.sleep(0.1)
        time.sleep(0.5)
        before = rss_kb(proxy.pid)
        conns = []
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", base + 10))
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            data = b""
            while b"\r\n\r\n" not in data or not data.endswith(b"\n"):
                chunk = s.recv(4096)
                if not chunk:
                    raise RuntimeError("connection closed before the answer")
                data += chunk
            conns.append(s)
        time.sleep(0.5)
        after = rss_kb(proxy.pid)
        print(f"{binary}: RSS {before} kB idle, {after} kB with {n} idle keep-alive "
              f"connections: {(after - before) * 1024 / n:.0f} B per connection")
    finally:
        for p in procs:
            p.kill()
        os.unlink(conf.name)


if __name__ == "__main__":
    main()
