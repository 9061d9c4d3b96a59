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
import time
import urllib.request
from collections import Counter
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from chaos.cluster import node_env
from mapper import RingClient
from tests.helpers import wait_for

pytestmark = pytest.mark.multiprocess

HOST = "127.0.0.1"
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


def health(address: str) -> int | None:
    """The node's health status, or None while it does not answer."""
    try:
        with grpc.insecure_channel(address) as channel:
            return health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=0.5).status
    except grpc.RpcError:
        return None


def scrape(port: int) -> dict:
    """{(sample name, labels as a sorted tuple): value} from GET /metrics."""
    with urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=5) as reply:
        assert reply.status == 200
        text = reply.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict, name: str, **labels) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


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
        cmd = [sys.executable, "-m", "node", "--node-id", node, "--listen", addresses[node],
               "--peers", peers, "--replication", "1", "--insecure", "--startup-grace", "60",
               "--metrics-port", str(metrics_ports[i]), "--log-format", "json"]
        with open(logs[node], "wb") as log:
            processes[node] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL, env=node_env())

    try:
        start(0)
        wait_for(lambda: health(addresses["n0"]) is not None, 30, "n0 answers health checks")
        seen = {"before_join": health(addresses["n0"]),
                "metrics_before_join": scrape(metrics_ports[0])}
        start(1)
        for node, address in addresses.items():
            wait_for(lambda: health(address) == health_pb2.HealthCheckResponse.SERVING, 30,
                     f"{node} serving")
        yield dict(seen, addresses=addresses, metrics_ports=metrics_ports, logs=logs)
    finally:
        for process in processes.values():
            stop(process)


def test_health_is_not_serving_until_the_node_joined_then_serving(ring):
    assert ring["before_join"] == health_pb2.HealthCheckResponse.NOT_SERVING
    assert value(ring["metrics_before_join"], "floe_serving") == 0
    for address in ring["addresses"].values():
        assert health(address) == health_pb2.HealthCheckResponse.SERVING


def test_metrics_count_what_was_fed(ring):
    with RingClient(list(ring["addresses"].values())) as client:
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
        assert value(samples, "floe_node_info", node_id=node,
                     address=ring["addresses"][node], reducer="count") == 1
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
