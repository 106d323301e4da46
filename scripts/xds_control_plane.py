#!/usr/bin/env python3
"""An xDS control plane written apart from lbkit (grpcio + the xds-protos messages), for
crates/lbkit-xds/tests/python_control_plane.rs: lbkit's xDS source must agree with it.

    xds_control_plane.py

Serves the Aggregated Discovery Service (state of the world: CDS and EDS) on a free loopback
port and prints "serving PORT". Then reads one JSON command per line on stdin:

    {"cluster": "web", "endpoints": [["10.0.0.1", 80, 5, "eu-1"], ...]}
        Set EDS cluster "web" (ROUND_ROBIN) to these endpoints (address, port, weight, zone),
        as version N+1, and push it to every stream subscribed.
    {"raw_cluster": "web", "lb_policy": 99}
        Push a Cluster "web" with this lb_policy number (what a broken control plane sends).

Every request received is printed as one JSON line:
    {"type": "cds"|"eds", "names": [...], "version": ..., "nonce": ..., "error": ... or null}
"""
import json
import queue
import sys
import threading
from concurrent import futures

import grpc
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import config_source_pb2, health_check_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import any_pb2, wrappers_pb2

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
LABEL = {CDS: "cds", EDS: "eds"}


def packed(message):
    any_ = any_pb2.Any()
    any_.Pack(message)
    return any_


def cluster(name, lb_policy=0):
    c = cluster_pb2.Cluster(name=name, type=cluster_pb2.Cluster.EDS, lb_policy=lb_policy)
    c.eds_cluster_config.eds_config.CopyFrom(
        config_source_pb2.ConfigSource(
            ads=config_source_pb2.AggregatedConfigSource(),
            resource_api_version=config_source_pb2.V3,
        )
    )
    return c


def assignment(name, endpoints):
    cla = endpoint_pb2.ClusterLoadAssignment(cluster_name=name)
    by_zone = {}
    for address, port, weight, zone in endpoints:
        by_zone.setdefault(zone, []).append((address, port, weight))
    for zone, members in sorted(by_zone.items()):
        group = cla.endpoints.add()
        group.locality.zone = zone
        group.load_balancing_weight.value = sum(w for _, _, w in members)
        for address, port, weight in members:
            lb = group.lb_endpoints.add()
            lb.endpoint.address.socket_address.address = address
            lb.endpoint.address.socket_address.port_value = port
            lb.load_balancing_weight.CopyFrom(wrappers_pb2.UInt32Value(value=weight))
            lb.health_status = health_check_pb2.HEALTHY
    return cla


class State:
    """The served resources: type URL → name → packed resource; a version per change."""

    def __init__(self):
        self.lock = threading.Lock()
        self.version = 0
        self.resources = {CDS: {}, EDS: {}}
        self.streams = []

    def set(self, type_url, name, message):
        with self.lock:
            self.version += 1
            self.resources[type_url][name] = packed(message)
            for events in self.streams:
                events.put(("push", type_url))

    def response(self, type_url, names, nonce):
        with self.lock:
            held = self.resources[type_url]
            wanted = [held[n] for n in names if n in held] if names else list(held.values())
            return discovery_pb2.DiscoveryResponse(
                version_info=str(self.version), resources=wanted, type_url=type_url, nonce=nonce
            )


class Ads(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    def __init__(self, state):
        self.state = state

    def StreamAggregatedResources(self, request_iterator, context):
        events = queue.Queue()
        with self.state.lock:
            self.state.streams.append(events)

        def read():
            try:
                for request in request_iterator:
                    events.put(("request", request))
            except grpc.RpcError:
                pass
            events.put(("end", None))

        threading.Thread(target=read, daemon=True).start()
        subscribed, nonces = {}, 0
        try:
            while True:
                kind, item = events.get()
                if kind == "end":
                    return
                if kind == "request":
                    log(item)
                    type_url = item.type_url
                    if type_url not in LABEL:
                        continue
                    names = list(item.resource_names)
                    new = subscribed.get(type_url) != names
                    subscribed[type_url] = names
                    if not new:
                        continue
                else:
                    type_url = item
                    if type_url not in subscribed:
                        continue
                nonces += 1
                yield self.state.response(type_url, subscribed[type_url], str(nonces))
        finally:
            with self.state.lock:
                self.state.streams.remove(events)


def log(request):
    error = request.error_detail.message if request.HasField("error_detail") else None
    line = {
        "type": LABEL.get(request.type_url, request.type_url),
        "names": list(request.resource_names),
        "version": request.version_info,
        "nonce": request.response_nonce,
        "error": error,
    }
    print(json.dumps(line), flush=True)


def main():
    state = State()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(Ads(state), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"serving {port}", flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        if "raw_cluster" in command:
            state.set(CDS, command["raw_cluster"], cluster(command["raw_cluster"], command["lb_policy"]))
        else:
            name = command["cluster"]
            state.set(CDS, name, cluster(name))
            state.set(EDS, name, assignment(name, command["endpoints"]))
    server.stop(0)


if __name__ == "__main__":
    main()
