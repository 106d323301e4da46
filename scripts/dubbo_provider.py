"""A Dubbo provider built with the official Python implementation (apache-dubbo 3.0.0b1).

    python scripts/dubbo_provider.py SERVICE PORT ZK_HOST:PORT NAME

Serves SERVICE over Triple (gRPC on HTTP/2) on 127.0.0.1:PORT with one unary method, `greet`,
which answers `NAME: ` followed by the request's bytes (no serialisation: raw bytes in and
out), and registers in ZooKeeper as Dubbo's Python registry does (an ephemeral node under
/dubbo/SERVICE/providers). Prints `serving PORT` once exported; exits on SIGTERM or SIGINT.
"""

import signal
import sys

import dubbo
from dubbo.configs import RegistryConfig, ServiceConfig
from dubbo.proxy.handlers import RpcMethodHandler, RpcServiceHandler


def main() -> None:
    service, port, zk, name = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]

    def greet(request: bytes) -> bytes:
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
