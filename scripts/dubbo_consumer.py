"""A Dubbo consumer built with the official Python implementation (apache-dubbo 3.0.0b1).

    python scripts/dubbo_consumer.py (--zk HOST:PORT [--root ROOT] | --url tri://HOST:PORT)
        --service SERVICE --method METHOD [--codec raw|echo] [--calls N] [MESSAGE]

Calls METHOD of SERVICE over Triple N times (default 1), one call after another, and prints
one line per call: `ok REPLY` or `error EXCEPTION`. With --zk it discovers the providers the
way Dubbo's Python registry does (the children of /ROOT/SERVICE/providers, ROOT `dubbo` by
default) and lets Dubbo pick one per call; with --url it calls that one address (for example
an `lbkit proxy` listener).

Codecs: `raw` sends MESSAGE's bytes and prints the reply's bytes (the `greet` method of
scripts/dubbo_provider.py); `echo` speaks the protobuf messages of lbkit's `echo.Echo/Say`
(crates/lbkit-tower/proto/echo.proto), encoded by hand so no generated code is needed, and
prints `SERVER: MESSAGE`. Exits 0 when every call succeeded, 1 otherwise, 2 on bad arguments.
"""

import argparse
import sys

import dubbo
from dubbo.configs import ReferenceConfig, RegistryConfig


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(number: int, value: str) -> bytes:
    data = value.encode()
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def encode_say_request(message: str, user: str) -> bytes:
    """echo.SayRequest { message = 1; user = 2 }"""
    return _field(1, message) + _field(2, user)


def _read_varint(data: bytes, i: int) -> tuple:
    """The varint at data[i:], and the index after it."""
    n, shift = 0, 0
    while True:
        b = data[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def decode_strings(data: bytes) -> dict:
    """The length-delimited fields of a protobuf message, by field number, as text."""
    fields, i = {}, 0
    while i < len(data):
        key, i = _read_varint(data, i)
        if key & 7 != 2:
            raise ValueError(f"field {key >> 3}: wire type {key & 7}, expected 2")
        length, i = _read_varint(data, i)
        fields[key >> 3] = data[i : i + length].decode()
        i += length
    return fields


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--zk", help="ZooKeeper HOST:PORT")
    where.add_argument("--url", help="a provider's URL, tri://HOST:PORT")
    parser.add_argument("--root", default="dubbo", help="root znode (Dubbo's registry group)")
    parser.add_argument("--service", required=True)
    parser.add_argument("--method", required=True)
    parser.add_argument("--codec", choices=["raw", "echo"], default="raw")
    parser.add_argument("--calls", type=int, default=1)
    parser.add_argument("message", nargs="?", default="hello")
    args = parser.parse_args()

    if args.zk:
        registry = RegistryConfig.from_url(f"zookeeper://{args.zk}?group={args.root}")
        bootstrap = dubbo.Dubbo(registry_config=registry)
        client = bootstrap.create_client(ReferenceConfig(protocol="tri", service=args.service))
    else:
        client = dubbo.Client(ReferenceConfig.from_url(f"{args.url}/{args.service}"))

    if args.codec == "raw":
        call = client.unary(method_name=args.method)

        def once(i: int) -> str:
            return call(f"{args.message} {i}".encode()).decode()

    else:
        call = client.unary(
            method_name=args.method,
            request_serializer=encode_say_request,
            response_deserializer=decode_strings,
        )

        def once(i: int) -> str:
            reply = call(f"{args.message} {i}", "python")
            return f"{reply.get(2, '')}: {reply.get(1, '')}"

    failed = 0
    for i in range(args.calls):
        try:
            print("ok", once(i), flush=True)
        except Exception as e:  # every failure is reported, and counted
            failed += 1
            print("error", repr(e), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
