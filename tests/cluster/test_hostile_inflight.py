"""How many bytes of requests a node holds before its handlers run: a caller's share of
a byte budget taken before gRPC reads a request, not its calls times the message
limit (docs/security.md, *Bytes of requests in flight*). One connection of a client's
certificate fires large malformed calls at once; the node's RSS is sampled while they
are in flight, and the node must stay the member it was."""

import threading
import time

import psutil
import pytest

from floering.floe.cluster import LocalCluster
from floering.node.config import NodeConfig
from floering.node.transport.budget import READS_PER_CALLER
from floering.node.transport.server import message_bytes
from floering.v1 import floe_pb2, floe_pb2_grpc
from tests.support.helpers import outcome_codes

pytestmark = pytest.mark.multiprocess


def peak_rss_growth(tmp_path, calls: int, mib: int) -> tuple[int, dict, str]:
    """(peak RSS growth in MiB, status codes, the member n0's process serves as
    after) under `calls` Get calls of a `mib` MiB key at once on one connection."""
    with LocalCluster.up(3, 1, workdir=tmp_path) as cluster:
        node = cluster.node("n0")
        proc = psutil.Process(node.pid)
        base = peak = proc.memory_info().rss
        done = threading.Event()

        def watch():
            nonlocal peak
            while not done.is_set():
                peak = max(peak, proc.memory_info().rss)
                time.sleep(0.02)
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        with cluster.channel(node.address, "client", options=[
                ("grpc.max_send_message_length", 64 << 20)]) as ch:
            stub = floe_pb2_grpc.QueryPlaneStub(ch)
            futures = [stub.Get.future(floe_pb2.GetRequest(key=b"\x01" * (mib << 20)),
                                       timeout=120) for _ in range(calls)]
            codes = outcome_codes(futures)
        done.set()
        watcher.join()
        member = member_of(cluster)
    return (peak - base) >> 20, codes, member


def member_of(cluster) -> str:
    with cluster.channel(cluster.node("n0").address) as ch:
        return floe_pb2_grpc.QueryPlaneStub(ch).Stats(floe_pb2.StatsRequest(),
                                                      timeout=10).node_id


# What the node may hold for one caller: READS_PER_CALLER requests of the largest
# message (as the node computes it from its default flags) being read, each held up
# to three times at once (gRPC's frames, the assembled bytes, the parsed request),
# and the streams waiting their turn, 64 KiB each; plus the allocator's slack.
MESSAGE_MIB = message_bytes(NodeConfig(node_id="n0", listen="127.0.0.1:1",
                                       peers=(("n0", "127.0.0.1:1"),))) >> 20
SHARE_MIB = 3 * READS_PER_CALLER * MESSAGE_MIB


def test_large_calls_at_once_on_one_connection_hold_a_callers_share_not_their_sum(tmp_path):
    # Before the budget: +653 MiB for these 192 MiB of requests (every request read at
    # once, and kept after its refusal until the garbage collector ran); now +93.
    grown, codes, member = peak_rss_growth(tmp_path, 48, 4)
    assert codes == {"INVALID_ARGUMENT": 48}
    assert grown < SHARE_MIB + 64, grown
    assert member == "n0"


@pytest.mark.slow
def test_two_hundred_calls_of_7_mib_on_one_connection(tmp_path):
    """The figure docs/security.md gives. Before the budget the node read them all
    at once (+1.9 to 2.1 GiB RSS) and its heartbeats could starve (seen: declared
    dead and fenced, rejoined as n0#3); now it holds its share of one caller."""
    grown, codes, member = peak_rss_growth(tmp_path, 200, 7)
    print(f"200 calls x 7 MiB on one connection: peak RSS +{grown} MiB, {codes}, "
          f"n0 now serves as {member}")
    assert codes == {"INVALID_ARGUMENT": 200}
    assert grown < SHARE_MIB + 224, grown
    assert member == "n0"
