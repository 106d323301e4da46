"""A Dubbo provider built with the official Python implementation (apache-dubbo 3.0.0b1).

    python scripts/dubbo_provider.py SERVICE PORT ZK_HOST:PORT NAME [DELAY_MS]

Serves SERVICE over Triple (gRPC on HTTP/2) on 127.0.0.1:PORT with one unary method, `greet`,
which answers `NAME: ` followed by the request's bytes (no serialisation: raw bytes in and
out) after DELAY_MS milliseconds (default 0), and registers in ZooKeeper as Dubbo's Python
registry does (an ephemeral node under /dubbo/SERVICE/providers). Prints `serving PORT` once
exported; exits on SIGTERM or SIGINT.

One fix to apache-dubbo 3.0.0b1 is applied here (`_one_stream_table_per_connection`): its server
shares one HTTP/2 stream table among all client connections, and each new connection empties the
table and takes over the sending side, so with two client connections at once (two consumers, or
one `lbkit proxy` with two workers, each with its own upstream connection) streams of the first
get answers on the second, the peer resets, and the first connection hangs. Found by
crates/lbkit/tests/dubbo_python.rs; two consumers calling one provider at once show it too.
"""

import signal
import sys
import time

import dubbo
from dubbo.configs import RegistryConfig, ServiceConfig
from dubbo.proxy.handlers import RpcMethodHandler, RpcServiceHandler


def _one_stream_table_per_connection() -> None:
    """Give each server connection its own stream table (see the module's docs)."""
    from dubbo.remoting.aio.http2.protocol import Http2ServerProtocol
    from dubbo.remoting.aio.http2.stream_handler import StreamServerMultiplexHandler

    shared_init = Http2ServerProtocol.__init__

    def init(self, url) -> None:
        shared_init(self, url)
        self._stream_handler = StreamServerMultiplexHandler(self._stream_handler._listener_factory)

    Http2ServerProtocol.__init__ = init


def main() -> None:
    _one_stream_table_per_connection()
    service, port, zk, name = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    delay = int(sys.argv[5]) / 1000 if len(sys.argv) > 5 else 0.0

    def greet(request: bytes) -> bytes:
        if delay:
            time.sleep(delay)
        return name.encode() + b": " + request

    handler = RpcServiceHandler(
        service_name=service,
        method_handlers=[RpcMethodHandler.unary(greet, method_name="greet")],
    )
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM, signal.SIGINT])
    bootstrap = dubbo.Dubbo(registry_config=RegistryConfig.from_url(f"zookeeper://{zk}"))
    server = bootstrap.create_server(ServiceConfig(handler, host="127.0.0.1", port=port))
    server.start()
    print("serving", port, flush=True)
    signal.sigwait([signal.SIGTERM, signal.SIGINT])


if __name__ == "__main__":
    main()
