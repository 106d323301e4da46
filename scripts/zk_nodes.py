"""The children of one znode as an independent ZooKeeper client (kazoo) sees them.

    python scripts/zk_nodes.py ZK_HOST:PORT PATH                 # list
    python scripts/zk_nodes.py ZK_HOST:PORT PATH --create NAME   # a persistent child (parents made)
    python scripts/zk_nodes.py ZK_HOST:PORT PATH --delete NAME
    python scripts/zk_nodes.py ZK_HOST:PORT PATH --put DATA      # PATH itself holds DATA (made, or set)
    python scripts/zk_nodes.py ZK_HOST:PORT PATH --remove        # PATH itself deleted

`--create` writes a node as dubbo-admin writes an override rule: NAME is the rule URL, stored
URL-encoded as Java's URLEncoder encodes it (letters, digits and `.-*_` kept, a space as `+`,
everything else %XX). `--delete` takes the same NAME. `--put` writes a config-center node as
dubbo-admin writes a Dubbo 3 rule (a YAML tag rule or configurator document as PATH's data).

Listing prints one JSON object per line, one per child of PATH, sorted by name:
  name        the child's node name as stored
  ephemeral   whether the node is ephemeral (its owner session is not 0)
  data        the node's data, as text
  url         for a Dubbo provider node, the name percent-decoded as Java's
              URLDecoder does ('+' is a space), then parsed: scheme, host, port, path,
              params (a provider's query parameters)
Prints nothing when PATH has no children; exits 1 when PATH does not exist.
"""

import json
import sys
from urllib.parse import parse_qsl, quote_plus, unquote_plus, urlsplit

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError


def java_url_encode(text: str) -> str:
    """Java's URLEncoder.encode(text, "UTF-8")."""
    return quote_plus(text, safe="*").replace("~", "%7E")


def main() -> int:
    hosts, path = sys.argv[1], sys.argv[2]
    zk = KazooClient(hosts=hosts, timeout=10)
    zk.start(timeout=10)
    if len(sys.argv) in (4, 5) and sys.argv[3] in ("--put", "--remove"):
        try:
            if sys.argv[3] == "--remove":
                zk.delete(path)
            elif zk.exists(path):
                zk.set(path, sys.argv[4].encode())
            else:
                zk.create(path, sys.argv[4].encode(), makepath=True)
            print(path, flush=True)
        finally:
            zk.stop()
        return 0
    if len(sys.argv) == 5 and sys.argv[3] in ("--create", "--delete"):
        node = f"{path.rstrip('/')}/{java_url_encode(sys.argv[4])}"
        try:
            if sys.argv[3] == "--create":
                zk.create(node, b"", makepath=True)
            else:
                zk.delete(node)
            print(node, flush=True)
        finally:
            zk.stop()
        return 0
    try:
        children = sorted(zk.get_children(path))
        for name in children:
            data, stat = zk.get(f"{path.rstrip('/')}/{name}")
            decoded = unquote_plus(name)
            parts = urlsplit(decoded)
            url = None
            if parts.scheme and parts.netloc:
                url = {
                    "scheme": parts.scheme,
                    "host": parts.hostname,
                    "port": parts.port,
                    "path": parts.path.lstrip("/"),
                    "params": dict(parse_qsl(parts.query, keep_blank_values=True)),
                }
            print(
                json.dumps(
                    {
                        "name": name,
                        "ephemeral": stat.ephemeralOwner != 0,
                        "data": data.decode("utf-8", "replace"),
                        "url": url,
                    },
                    sort_keys=True,
                ),
                flush=True,
            )
    except NoNodeError:
        print(f"{path}: no such node", file=sys.stderr)
        return 1
    finally:
        zk.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
