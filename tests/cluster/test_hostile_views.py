"""Ring views of the most tokens, and past them, pushed by a member's certificate to
a real TLS ring (docs/security.md, *What a node checks in every message*): a view
over the token cap is refused from msgpack's headers before any token is built, and
one at the cap costs time linear in its size. Once, one view of 70,000 tokens held a
node at 100% CPU for minutes, until it was declared dead and came back empty. The
node must stay the member it was, spend little CPU on them, and an honest client
feeding meanwhile must count exactly."""

import time
from collections import Counter

import grpc
import msgpack
import psutil
import pytest

from floering.floe.cluster import LocalCluster
from floering.mapper import RingClient
from floering.wire.hashing import HASH_SPACE
from floering.wire.ring_wire import MAX_RING_TOKENS
from floering.v1 import floe_pb2, floe_pb2_grpc
from tests.support.helpers import Feeder, diff

pytestmark = pytest.mark.multiprocess


def view(n: int, version: int, owners=("n2",)) -> bytes:
    """A view of `n` tokens spread over the hash space, each owned in turn by
    `owners` (one owner: no token finds a replica, the walk that was quadratic)."""
    tokens = [(i + 1) * HASH_SPACE // n - 1 for i in range(n)]
    return msgpack.packb({"version": version, "replication": 1, "tokens": tokens,
                          "owners": [owners[i % len(owners)] for i in range(n)],
                          "addresses": [[o, f"127.0.0.1:{1 + i}"]
                                        for i, o in enumerate(owners)]})


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def test_views_of_the_most_tokens_and_past_them_cost_a_member_little(tmp_path):
    with LocalCluster.up(3, 1, workdir=tmp_path) as cluster:
        node = cluster.node("n0")
        feeder = Feeder(cluster.seeds, tls=cluster.tls("client"))
        feeder.start()
        feeder.wait_rounds(3)
        with cluster.channel(node.address, "n2", options=[
                ("grpc.max_send_message_length", 64 << 20)]) as ch:    # n2's own key
            control = floe_pb2_grpc.ControlPlaneStub(ch)
            exchange = control.ExchangeRing
            version = control.GetRing(floe_pb2.GetRingRequest(), timeout=10).version
            codes, took = Counter(), []
            before = cpu_seconds(node.pid)
            for n in (MAX_RING_TOKENS + 1, 70_000, MAX_RING_TOKENS):
                began = time.monotonic()
                try:
                    exchange(floe_pb2.RingView(version=version + 1, sender="n2",
                                               ring=view(n, version + 1)), timeout=30)
                    codes[(n, "OK")] += 1
                except grpc.RpcError as exc:
                    codes[(n, exc.code().name)] += 1
                took.append(time.monotonic() - began)
            spent = cpu_seconds(node.pid) - before
        feeder.wait_rounds(3)
        client = feeder.finish()
        got = client.scan_all()
        client.close()
        with RingClient(cluster.seeds, tls=cluster.tls("client")) as reader:
            members = set(reader.ring.nodes)
        with cluster.channel(node.address) as ch:
            serves_as = floe_pb2_grpc.QueryPlaneStub(ch).Stats(
                floe_pb2.StatsRequest(), timeout=10).node_id
    print(f"views of {MAX_RING_TOKENS + 1}, 70,000 and {MAX_RING_TOKENS} tokens: "
          f"{dict(codes)}, {[round(t, 2) for t in took]} s, n0 spent {spent:.2f} s of CPU")
    # over the cap: refused before a token is built
    assert codes[(MAX_RING_TOKENS + 1, "INVALID_ARGUMENT")] == 1, codes
    assert codes[(70_000, "INVALID_ARGUMENT")] == 1, codes
    # at the cap: answered, whatever the answer
    assert sum(c for (n, _), c in codes.items() if n == MAX_RING_TOKENS) == 1
    assert max(took) < 10, took
    assert spent < 10, spent
    assert serves_as == "n0" and members == {"n0", "n1", "n2"}, (serves_as, members)
    assert got == feeder.acked, diff(got, feeder.acked)
