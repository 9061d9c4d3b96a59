"""What operators' tools see of real node processes on loopback: Prometheus metrics
over HTTP, health NOT_SERVING until the node joined, JSON log lines, and gRPC
server reflection.

Two nodes are founded together; n0 starts alone first, so it waits (serving its
health and metrics) until n1 answers."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from floering.floe.cluster import node_env
from floering.mapper import RingClient
from floering.node.core.columnar import KERNEL
from floering.node.transport.tls import may_call
from tests.support.helpers import wait_for
from tests.support.observability_shared import HOST, scrape, value

KERNEL_SHOWN = "compiled" if KERNEL == "compiled" else "dict"   # what holds a count's states

pytestmark = pytest.mark.multiprocess

WORDS = [f"w{i % 50}" for i in range(1000)]


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind((HOST, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


FLOE_SERVICES = ("floering.v1.DataPlane", "floering.v1.ControlPlane", "floering.v1.QueryPlane")
SERVING, NOT_SERVING = (health_pb2.HealthCheckResponse.SERVING,
                        health_pb2.HealthCheckResponse.NOT_SERVING)


def health(address: str, service: str = "") -> int | None:
    """The node's health status, or None while it does not answer."""
    try:
        with grpc.insecure_channel(address) as channel:
            return health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=0.5).status
    except grpc.RpcError:
        return None


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def ring(tmp_path_factory):
    """Start n0, watch it wait for n1, start n1; yields what was seen and how to reach
    both. Every process is stopped by its own handle."""
    tmp = tmp_path_factory.mktemp("observability")
    grpc_ports, metrics_ports = free_ports(2), free_ports(2)
    addresses = {f"n{i}": f"{HOST}:{p}" for i, p in enumerate(grpc_ports)}
    peers = ",".join(f"{n}={a}" for n, a in addresses.items())
    processes, logs = {}, {}

    def start(i: int) -> None:
        node = f"n{i}"
        logs[node] = tmp / f"{node}.log"
        cmd = [sys.executable, "-m", "floering.node", "--node-id", node, "--listen", addresses[node],
               "--peers", peers, "--replication", "1", "--insecure", "--startup-grace", "60",
               "--metrics-port", str(metrics_ports[i]), "--log-format", "json"]
        with open(logs[node], "wb") as log:
            processes[node] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL, env=node_env())

    try:
        start(0)
        wait_for(lambda: health(addresses["n0"]) is not None, 30, "n0 answers health checks")
        seen = {"before_join": {name: health(addresses["n0"], name)
                                for name in ("", *FLOE_SERVICES)},
                "metrics_before_join": scrape(metrics_ports[0])}
        start(1)
        for node, address in addresses.items():
            wait_for(lambda: health(address) == SERVING, 30, f"{node} serving")
        yield dict(seen, addresses=addresses, metrics_ports=metrics_ports, logs=logs)
    finally:
        for process in processes.values():
            stop(process)


def test_health_is_not_serving_until_the_node_joined_then_serving(ring):
    # n0 answered (its ring, to starting peers) while it waited for n1: not serving
    assert ring["before_join"] == {name: NOT_SERVING for name in ("", *FLOE_SERVICES)}
    assert value(ring["metrics_before_join"], "floe_serving") == 0
    for address in ring["addresses"].values():
        assert {name: health(address, name) for name in ("", *FLOE_SERVICES)} == \
            {name: SERVING for name in ("", *FLOE_SERVICES)}


def test_metrics_count_what_was_fed(ring):
    # every tuple sent as it is: a combining client would send one per key and batch
    with RingClient(list(ring["addresses"].values()), combine=False) as client:
        client.emit_many(WORDS)
        client.flush()
        assert client.get("w7") == 20
        version = client.refresh_ring().version
    ports = ring["metrics_ports"]
    # Replicas hold the batches until a checkpoint covers them, then drop them.
    wait_for(lambda: all(value(scrape(p), "floe_backup_tuples") == 0 for p in ports), 10,
             "checkpoints cover every backed-up tuple")
    scraped = [scrape(p) for p in ports]
    total = lambda name: sum(value(s, name) for s in scraped)   # noqa: E731
    assert total("floe_tuples_applied_total") == len(WORDS)       # each once, at its primary
    assert total("floe_tuples_backed_up_total") == len(WORDS)     # and once at its replica (r=1)
    assert total("floe_duplicate_tuples_dropped_total") == 0
    assert total("floe_keys") == len(set(WORDS))
    assert total("floe_checkpoint_bytes_total") > 0
    for node, samples in zip(ring["addresses"], scraped):
        assert value(samples, "floe_node_info", node_id=node, address=ring["addresses"][node],
                     reducer="count", kernel=KERNEL_SHOWN) == 1
        assert value(samples, "floe_ring_version") == version
        assert value(samples, "floe_serving") == 1
        assert value(samples, "floe_lost_ranges") == 0
        assert value(samples, "floe_under_replicated_ranges") == 0
        assert value(samples, "floe_queue_batches") == 0
        assert value(samples, "floe_checkpoint_round_duration_seconds_count") > 0
    gets = sum(value(s, "floe_rpc_duration_seconds_count", service="floering.v1.QueryPlane",
                     method="Get") for s in scraped
               if ("floe_rpc_duration_seconds_count",
                   (("method", "Get"), ("service", "floering.v1.QueryPlane"))) in s)
    assert gets >= 1
    assert all(value(s, "floe_rpc_duration_seconds_count", service="floering.v1.ControlPlane",
                     method="Heartbeat") > 0 for s in scraped)


def test_metrics_are_only_served_on_the_listen_host(ring):
    port = ring["metrics_ports"][0]
    with socket.socket() as s:            # bound to 127.0.0.1, not every address
        assert s.connect_ex(("127.0.0.2", port)) != 0


def test_reflection_lists_and_describes_the_floe_services(ring):
    with grpc.insecure_channel(ring["addresses"]["n1"]) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = list(stub.ServerReflectionInfo(iter([
            reflection_pb2.ServerReflectionRequest(list_services=""),
            reflection_pb2.ServerReflectionRequest(
                file_containing_symbol="floering.v1.QueryPlane")]), timeout=5))
    names = {s.name for s in replies[0].list_services_response.service}
    assert {*FLOE_SERVICES, "grpc.health.v1.Health"} <= names
    files = [descriptor_pb2.FileDescriptorProto.FromString(raw)
             for raw in replies[1].file_descriptor_response.file_descriptor_proto]
    methods = {m.name for f in files for s in f.service if s.name == "QueryPlane" for m in s.method}
    assert {"Get", "Top", "Scan", "Stats"} <= methods


def test_any_certificate_may_use_reflection():
    assert all(may_call(role, "ServerReflectionInfo") for role in ("node", "client", "operator"))


def test_log_lines_are_json_objects_with_the_node_id(ring):
    lines = [line for line in ring["logs"]["n0"].read_text().splitlines() if line.strip()]
    entries = [json.loads(line) for line in lines if not line.startswith("READY ")]
    assert entries
    for entry in entries:
        assert {"time", "level", "logger", "message", "node_id"} <= set(entry), entry
        assert entry["node_id"] == "n0"
    assert any(e["level"] == "INFO" and e["logger"] == "floe.node"
               and e["message"].startswith("node n0 up on") for e in entries)
    assert all(e["time"].endswith("+00:00") for e in entries)            # ISO 8601, UTC
