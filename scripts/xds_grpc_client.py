#!/usr/bin/env python3
"""A proxyless gRPC client (grpcio, xDS from GRPC_XDS_BOOTSTRAP) for crates/lbkit/tests/xds.rs.

    xds_grpc_client.py TARGET INTERVAL_MS [KEY=VALUE]

Calls /lbkit.Deadline/Call (scripts/grpc_deadline.py's servers) on TARGET, `xds:///NAME`,
every INTERVAL_MS on one channel until killed, printing one line per call on stdout:
"answer NAME" (the server that answered) or "failed CODE DETAILS". KEY=VALUE: metadata every
call carries (what a route's header hash policy hashes).
"""
import sys
import time

import grpc


def main(target, interval_ms, metadata):
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary("/lbkit.Deadline/Call")
        while True:
            try:
                body = call(b"ping", timeout=5, metadata=metadata).decode()
                print(f"answer {body.split(' ')[0]}", flush=True)
            except grpc.RpcError as e:
                print(f"failed {e.code().name} {e.details()}", flush=True)
            time.sleep(interval_ms / 1000.0)


if __name__ == "__main__":
    pairs = [tuple(a.split("=", 1)) for a in sys.argv[3:4]]
    main(sys.argv[1], int(sys.argv[2]), pairs or None)
