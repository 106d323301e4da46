# Writes the hand-made seeds of fuzz/corpus: `python3 fuzz/seeds.py` (the files are committed; the
# fuzzer adds its own to the same directories).
import os, pathlib, urllib.parse
root = pathlib.Path(__file__).resolve().parent.parent
corp = root / "fuzz" / "corpus"
def put(target, name, data):
    d = corp / target
    d.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    (d / name).write_bytes(data)

put("endpoints_toml", "example", (root/"examples/endpoints.toml").read_text())
put("endpoints_toml", "small", '[[endpoint]]\naddress = "a:1"\nweight = 5\n[[endpoint]]\naddress = "b:1"\nzone = "eu-1"\nmetadata = { tag = "blue" }\n')
put("endpoints_toml", "duplicate", '[[endpoint]]\naddress = "a:1"\n[[endpoint]]\naddress = "a:1"\n')
put("endpoints_toml", "ipv6", '[[endpoint]]\naddress = "[::1]:8080"\nweight = 0\nhealthy = false\n')
put("endpoints_json", "small", '[{"address":"a:1","weight":5},{"address":"b:1"}]')
put("endpoints_json", "stats", '[{"address":"10.0.0.1:80","weight":100,"zone":"z","avg_response_ms":12.5,"ewma_ms":3,"active":4,"failures":1,"consecutive_failures":1,"last_failure_ms":1700000000000,"registered_at_ms":1699999880000,"load_report":{"cpu":0.5}}]')
put("endpoints_json", "bad", '[{"address": 5}]')
java = "dubbo%3A%2F%2F10.0.0.1%3A20880%2Fcom.acme.Greeter%3Fanyhost%3Dtrue%26application%3Ddemo%26interface%3Dcom.acme.Greeter%26methods%3DsayHello%26side%3Dprovider%26timestamp%3D1700000000000%26warmup%3D600000%26weight%3D200"
py = urllib.parse.quote("tri://127.0.0.1:50051?service=org.apache.dubbo.samples.data.Greeter&x=a b~c", safe="")
put("endpoints_dubbo", "lines", "dubbo://10.0.0.1:20880/com.acme.Greeter?weight=200&timestamp=1700000000000\n# a comment\n\ntri://10.0.0.2:50051/com.acme.Greeter?dubbo.tag=grey&group=a&version=1.0\n" + java + "\n")
put("dubbo_url", "java", java)
put("dubbo_url", "python", py)
put("dubbo_url", "plain", "dubbo://10.0.0.1:20880/com.acme.Greeter?weight=200&timestamp=1700000000000&warmup=600000&disabled=false")
put("dubbo_url", "ipv6", "tri://[::1]:50051/a.B?x=1&x=2")
put("zk_node", "dubbo", java.encode())
put("zk_node", "plain", b"10.0.0.1:8080\0" + b'{"weight": 50, "zone": "eu-1", "metadata": {"tag": "blue"}}')
put("zk_node", "plain_empty", b"10.0.0.1:8080")
put("zk_node", "python", py.encode() + b"\x00127.0.0.1:50051")
rule = urllib.parse.quote_plus("override://10.0.0.1:20880/com.acme.Greeter?category=configurators&dynamic=false&enabled=true&weight=200", safe="*")
put("override_rule", "admin", "\n".join([java, rule, "override://0.0.0.0/com.acme.Greeter?disabled=true&priority=2", "absent://web@0.0.0.0/com.acme.Greeter?~application=shop&timeout=5"]))
put("override_rule", "compose", "\n".join(["override://0.0.0.0/com.acme.Greeter?weight=50", "override://10.0.0.1:20880/com.acme.Greeter?weight=300&providerAddresses=10.0.0.1:20880", "override://10.0.0.1:20880/com.acme.Greeter?disabled=false", "empty://0.0.0.0/com.acme.Greeter"]))
put("override_rule", "yaml", "configVersion: v2.7\nscope: service\nkey: com.acme.Greeter\nenabled: true\nconfigs:\n- addresses: [10.0.0.1:20880]\n  side: provider\n  parameters:\n    weight: 200\n- side: consumer\n  applications: [web]\n  providerAddresses: [10.0.0.1:20880]\n  parameters:\n    disabled: true\n")
put("override_rule", "bad", "\n".join(["route://0.0.0.0/x?weight=1", "override://0.0.0.0/x?weight=heavy", "override://[::1]:80/x?weight=4", "override://0.0.0.0:99999/x"]))
put("service_config", "doc", '[defaults]\nstrategy = "weighted-round-robin"\n\n[service."com.acme.Greeter"]\nstrategy = "weighted-response-time"\nparams = { interval_ms = 10000 }\navailability = { max_in_flight = 200 }\n\n[service."com.acme.Greeter".method.sayHello]\nstrategy = "sticky-round-robin"\nparams = { n = 5 }\n')
put("service_config", "hash", '[service.a]\nstrategy = "consistent-hash"\nparams = { replicas = 160, key = "header:x-user" }\n[service.b]\nstrategy = "p2c-ewma"\n[service.b.method.m]\nparams = { decay_ms = 10000 }\n')
put("proxy_config", "full", '''[admin]
bind = "127.0.0.1:9901"
token = "s3cret"
[limits]
max_header_bytes = 65536
header_read_timeout_ms = 10000
idle_timeout_ms = 60000
stream_idle_timeout_ms = 300000
tcp_idle_timeout_ms = 600000
[[listener]]
bind = "127.0.0.1:8080"
[[listener]]
bind = "127.0.0.1:5432"
protocol = "tcp"
service = "db"
[[route]]
host = "api.example.com"
path_prefix = "/api/"
service = "api"
timeout_ms = 15000
per_try_timeout_ms = 2000
hash_key = "header:x-user"
[service.api]
endpoints = ["127.0.0.1:8081=100", "127.0.0.1:8082"]
strategy = "p2c-ewma"
retries = 2
outlier_detection = { enabled = true, interval_ms = 10000, consecutive_failures = 5 }
health_check = { kind = "http", path = "/healthz", interval_ms = 5000 }
[service.db]
zookeeper = { zk = "127.0.0.1:2181", interface = "com.acme.Db", cache = "db.cache.json", watch = "one-shot" }
''')
put("proxy_config", "min", '[[listener]]\nbind = "127.0.0.1:0"\n[[route]]\nservice = "s"\n[service.s]\nendpoints = ["127.0.0.1:1"]\n')
for f in (root/"crates/lbkit-sim/scenarios").glob("*.toml"):
    put("scenario", f.stem, f.read_text())
reqs = {
 "get": b"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
 "post": b"POST /api/x?y=1 HTTP/1.1\r\nHost: api.test:8080\r\nContent-Length: 5\r\nConnection: keep-alive\r\n\r\nhello",
 "pipelined": b"GET /a HTTP/1.1\r\nHost: a\r\n\r\nGET /b HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
 "chunked": b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
 "smuggle": b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /x HTTP/1.1\r\n\r\n",
 "two_lengths": b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
 "h2c": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
 "upgrade": b"GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
 "dots": b"GET /public/../secret HTTP/1.1\r\nHost: a\r\n\r\n",
 "conn_listed": b"GET / HTTP/1.1\r\nHost: a\r\nConnection: x-foo, close\r\nX-Foo: 1\r\n\r\n",
 "http10": b"GET / HTTP/1.0\r\n\r\n",
 "absolute": b"GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n",
}
for k, v in reqs.items():
    put("h1_request", k, v)
    put("h1_differential", k, v)
resps = {
 "length": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
 "chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n0\r\nTrailer: x\r\n\r\n",
 "close": b"HTTP/1.0 200 OK\r\n\r\nuntil close",
 "no_content": b"HTTP/1.1 204 No Content\r\n\r\n",
 "hints": b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
 "te_not_chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nContent-Length: 3\r\n\r\nabc",
}
for k, v in resps.items():
    put("h1_response", k, bytes([0]) + v)
    put("h1_response", k + "_split3", bytes([4]) + v)
put("h1_response", "head", bytes([1]) + resps["length"])
# `pick`: the JSON endpoint seeds, and statistics at the edges of the numbers.
for f in (corp / "endpoints_json").iterdir():
    put("pick", f.name, f.read_bytes())
put("pick", "extreme", '[{"address":"a:1","weight":100,"utilization":1e308,"qps":1e308,"eps":1e308},{"address":"b:1","weight":1,"avg_response_ms":1e300,"ewma_ms":1e-300,"utilization":0,"qps":0,"eps":0}]')
put("tag_rule", "documented", "force: false\nruntime: true\nenabled: true\nkey: governance-tagrouter-provider\ntags:\n  - name: tag1\n    addresses: [\"10.0.0.1:20880\"]\n  - name: tag2\n    addresses: [\"10.0.0.2:20880\"]\n")
put("tag_rule", "dubbo_test", "---\nforce: false\nruntime: true\nenabled: false\npriority: 1\nkey: demo-provider\ntags:\n  - name: tag1\n    addresses: null\n  - name: tag2\n    addresses: [\"30.5.120.37:20880\"]\n  - name: tag3\n    addresses: []\n  - name: tag4\n    addresses: ~\n...")
put("tag_rule", "patterns", "force: true\nkey: shop\ntags:\n  - name: gray\n    addresses: [\"10.0.0.*\", \"192.168.1.1-65:20880\", \"[::1]\", \"0.0.0.0:20880\"]\n  - name: blue\n    addresses: [\"10.0.0.0/8\", \"provider-1\"]\n")
put("tag_rule", "lines", "*.*.*.*:90\n234e:0:4567:0:0:0:3d:*\n192.168.1.192/26:90\n[234e:0:4567::3d:ee]:8090\n10.0.0.1-2\n")

# trace: lbkit-trace's format, version 1 (the table in crates/lbkit-trace/src/lib.rs).
import struct
def tstr(s):
    b = s.encode()
    return struct.pack("<H", len(b)) + b
def trace(streams, endpoints, attempts, version=1):
    out = b"LBKTRACE" + struct.pack("<H", version) + bytes(6)
    for sid, service, strategy, rate in streams:
        out += b"\x01" + struct.pack("<I", sid) + tstr(service) + tstr(strategy) + struct.pack("<d", rate)
    for eid, address in endpoints:
        out += b"\x02" + struct.pack("<I", eid) + tstr(address)
    for (at, lat, req, sid, eid, inflight, attempt, outcome) in attempts:
        flags = 1 if attempt > 0 else 0
        out += b"\x03" + struct.pack("<QQQIIIHBB", at, lat, req, sid, eid, inflight, attempt, outcome, flags)
    return out
t0 = 1_700_000_000_000_000_000
put("trace", "failover", trace([(0, "shop", "round-robin", 1.0)], [(0, "10.0.0.1:80"), (1, "10.0.0.2:80")],
    [(t0, 5_000_000, 7, 0, 0, 0, 0, 3), (t0 + 5_000_000, 7_000_000, 7, 0, 1, 1, 1, 0), (t0 + 1_000_000, 2_000_000, 9, 0, 1, 0, 0, 0)]))
put("trace", "sampled", trace([(0, "cart\n\"x", "p2c-ewma\"]", 0.01)], [(0, "a\nb:1")],
    [(t0 + i * 1_000_000, 1_000_000 + i, i + 2, 0, 0, i % 5, 0, i % 6) for i in range(40)]))
put("trace", "cut", trace([(0, "shop", "round-robin", 1.0)], [(0, "10.0.0.1:80")], [(t0, 1, 2, 0, 0, 0, 0, 0)])[:-5])
