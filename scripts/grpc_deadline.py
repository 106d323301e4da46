#!/usr/bin/env python3
"""grpcio peer for crates/lbkit/tests/grpc_python.rs: deadlines through `lbkit proxy`.

    grpc_deadline.py server PORT NAME DELAY_MS
        Serve /lbkit.Deadline/Call on 127.0.0.1:PORT (raw bytes, no protobuf): after DELAY_MS,
        answer "NAME remaining_ms=<what grpcio says is left of the call's deadline>", the
        deadline being the one the server received in `grpc-timeout`. Every call is logged as
        "call NAME remaining_ms=..." on stdout; "serving" once it listens.

    grpc_deadline.py client TARGET TIMEOUT_S COUNT
        Make COUNT calls to TARGET, each with a deadline of TIMEOUT_S seconds, one after the
        other, and print one JSON line per call: {"code": ..., "body": ..., "elapsed_ms": ...}.
"""
import json
import sys
import time
from concurrent import futures

import grpc

METHOD = "/lbkit.Deadline/Call"


def serve(port, name, delay_ms):
    def call(request, context):
        left = context.time_remaining()
        left_ms = -1 if left is None else int(left * 1000)
        print(f"call {name} remaining_ms={left_ms}", flush=True)
        time.sleep(delay_ms / 1000.0)
        return f"{name} remaining_ms={left_ms}".encode()

    handler = grpc.method_handlers_generic_handler(
        "lbkit.Deadline", {"Call": grpc.unary_unary_rpc_method_handler(call)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print("serving", flush=True)
    server.wait_for_termination()


def client(target, timeout_s, count):
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(METHOD)
        for _ in range(count):
            started = time.monotonic()
            try:
                body = call(b"ping", timeout=timeout_s).decode()
                code = "OK"
            except grpc.RpcError as e:
                body, code = e.details() or "", e.code().name
            elapsed_ms = int((time.monotonic() - started) * 1000)
            print(json.dumps({"code": code, "body": body, "elapsed_ms": elapsed_ms}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "server":
        serve(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
    else:
        client(sys.argv[2], float(sys.argv[3]), int(sys.argv[4]))
