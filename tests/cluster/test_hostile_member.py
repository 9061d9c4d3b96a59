"""A member's requests are bounded in bytes too (docs/security.md, *Bytes of requests
in flight*): members have a budget of their own, larger than the other callers', so
one member firing large checkpoints at once makes the node read sixteen messages'
worth at most, not its calls times the message limit. In the clear a checkpoint is
a member's call whoever makes it, so a caller on loopback plays the member."""

import grpc
import pytest

from floering.floe.cluster import LocalCluster
from floering.node.transport.budget import MEMBER_READS_PER_CALLER
from floering.v1 import floe_pb2, floe_pb2_grpc
from tests.support.helpers import outcome_codes
from tests.support.hostile_push_shared import PeakRss

pytestmark = pytest.mark.multiprocess

CALLS, MIB = 160, 7
# The member's share of the members' budget (sixteen of the largest messages, 8 MiB),
# each request held up to four times at once (gRPC's frames, the assembled bytes,
# the parsed request, what its decode made before it failed), plus the allocator's
# slack.
BOUND_MIB = 4 * MEMBER_READS_PER_CALLER * 8 + 64


def flood(address: str) -> dict:
    """CALLS checkpoints of MIB MiB of garbage at once on one connection: the status
    codes they got, by name."""
    with grpc.insecure_channel(address, options=[
            ("grpc.max_send_message_length", 64 << 20)]) as channel:
        ship = floe_pb2_grpc.ControlPlaneStub(channel).ShipCheckpoint
        futures = [ship.future(floe_pb2.CheckpointFragment(
            sender="n1", token=1, checkpoint_seq=i + 1, full=True,
            states=b"\x01" * (MIB << 20)), timeout=120) for i in range(CALLS)]
        return outcome_codes(futures)


def test_a_members_flood_of_large_checkpoints_is_read_a_share_at_a_time(tmp_path):
    # Before the members' budget: +857-1135 MiB (every checkpoint read at once), and
    # the node was once declared dead meanwhile; now +403-471.
    with LocalCluster.up(3, 1, workdir=tmp_path, tls=False) as cluster:
        node = cluster.node("n0")
        rss = PeakRss(node.pid)
        codes = flood(node.address)
        grown = rss.stop()
        with grpc.insecure_channel(node.address) as ch:
            stats = floe_pb2_grpc.QueryPlaneStub(ch).Stats(floe_pb2.StatsRequest(),
                                                           timeout=10)
    print(f"member flood: +{grown} MiB, {codes}, budget peak "
          f"{stats.request_budget_peak_bytes >> 20} MiB")
    assert sum(codes.values()) == CALLS and "OK" not in codes, codes
    assert stats.node_id == "n0" and not stats.fenced
    assert stats.request_budget_peak_bytes <= (MEMBER_READS_PER_CALLER + 4) * (8 << 20)
    assert grown < BOUND_MIB, grown
