"""Bytes of Push messages a node has read but not yet applied are bounded per caller
identity (docs/security.md, *Bytes of requests in flight*): a hostile caller opens
many Push streams of large, valid requests at once, far faster than the applier
takes them. The node's RSS is sampled meanwhile; an honest client pushing at the
same time stays exact, and so do the hostile caller's own tuples."""

import time

import grpc
import pytest

from floering.floe.cluster import LocalCluster
from floering.chaos.hostile import LargePushes
from floering.mapper import RingClient
from floering.node.config import NodeConfig
from floering.node.transport.budget import (MEMBER_READS_PER_CALLER, PUSH_READS_PER_CALLER,
                                            READING_PER_CALLER, READS_PER_CALLER)
from floering.node.transport.server import message_bytes
from floering.v1 import floe_pb2, floe_pb2_grpc
from floering.wire.ring import Ring
from tests.support.helpers import Feeder, diff, wait_for
from tests.support.hostile_push_shared import PeakRss

pytestmark = pytest.mark.multiprocess

# the largest message a node takes with the default flags, as the node computes it
MESSAGE_MIB = message_bytes(NodeConfig(node_id="n0", listen="127.0.0.1:1",
                                       peers=(("n0", "127.0.0.1:1"),))) >> 20
STREAMS, MESSAGES = 8, 12
# What the node may hold for one caller identity (in the clear, a host: here every
# process on loopback): PUSH_READS_PER_CALLER messages read and not yet applied, and
# one more on each stream reading in its turn (at most READING_PER_CALLER, here
# STREAMS) and waiting for room, each up to twice at once (the bytes and the parsed
# request; the tuples of the one applied), plus the allocator's slack.
SHARE_MIB = (2 * (PUSH_READS_PER_CALLER + min(STREAMS, READING_PER_CALLER)) * MESSAGE_MIB
             + 64)
# The budget's peak is of the three budgets together (budget.Budgets), and in the clear
# every process on loopback is one caller: its Push messages read and not yet applied,
# and the members' calls and the clients' (the feeder's GetRing, the Stats here), each
# reserving the largest message until gRPC reads it. A checkpoint round sends a call
# per range and replica at once, so on a loaded node up to the members' whole share
# waits to be read alongside the pushes. Without the pushes' share per caller the
# inbound queue's bound (256 MiB) alone would be past it.
PEAK_BYTES = ((PUSH_READS_PER_CALLER + MEMBER_READS_PER_CALLER + READS_PER_CALLER)
              * (MESSAGE_MIB << 20))


class RingSettled:
    """True once the node at `address` owns ranges of a ring whose version has not
    moved for `quiet` seconds (the ring of a fresh cluster changes while its members
    pull their shares)."""

    def __init__(self, address: str, quiet: float) -> None:
        self.address, self.quiet = address, quiet
        self.version, self.since = None, time.monotonic()

    def __call__(self) -> bool:
        with grpc.insecure_channel(self.address) as channel:
            ring = Ring.from_wire(floe_pb2_grpc.ControlPlaneStub(channel).GetRing(
                floe_pb2.GetRingRequest(), timeout=10).ring)
        if ring.version != self.version:
            self.version, self.since = ring.version, time.monotonic()
        owns = any(a == self.address and ring.tokens_of(n) for n, a in ring.addresses)
        return owns and time.monotonic() - self.since >= self.quiet


def test_many_streams_of_large_pushes_hold_a_callers_share_and_stay_exact(tmp_path):
    # Before the bound: +437-466 MiB (the inbound queue, 256 MiB, filled with one caller's
    # requests, and one more read on every stream waiting for room); with the bound
    # +186 to +235; measured again later, +127 to +142 (load 6, every request
    # applied). SHARE_MIB (320) is kept: runs cut short by a ring change
    # under heavier load measured less, so nothing yet shows a tighter bound holds there.
    with LocalCluster.up(3, 1, workdir=tmp_path, tls=False) as cluster:
        node = cluster.node("n0")
        feeder = Feeder([node.address])
        feeder.start()
        feeder.wait_rounds(3)
        wait_for(RingSettled(node.address, quiet=5.0), timeout=120,
                 what=f"{node.node_id} owning ranges of a ring that stopped changing for 5 s")
        hostile = LargePushes(node.address, STREAMS, MESSAGES)
        garbage = LargePushes(node.address, 4, 4, garbage=True)
        rss = PeakRss(node.pid)
        began = time.monotonic()
        hostile.run()
        took = time.monotonic() - began
        grown = rss.stop()
        feeder.wait_rounds(3)
        # streams refused while their requests queue (undecodable, or for a ring
        # that changed meanwhile): their bytes are let go too
        garbage.run()
        with grpc.insecure_channel(node.address) as ch:
            stats = floe_pb2_grpc.QueryPlaneStub(ch).Stats
            wait_for(lambda: stats(floe_pb2.StatsRequest(),
                                   timeout=10).request_budget_bytes == 0,
                     timeout=30, what="every Push message's bytes let go")
            peak = stats(floe_pb2.StatsRequest(), timeout=10).request_budget_peak_bytes
        client = feeder.finish()
        got = client.scan_all()
        client.close()
    print(f"hostile pushes: +{grown} MiB in {took:.1f} s, acked {hostile.acked}, "
          f"refused {hostile.refused}, peak {peak >> 20} MiB")
    # The flooded node keeps answering its peers' probes (a large batch is read and
    # checked over several steps of its loop): no false removal cuts the flood short,
    # as one did at load 5-10 when a batch was one step of 55-80 ms.
    assert not hostile.refused, f"the flood was cut short: {hostile.refused}"
    assert hostile.acked == STREAMS * MESSAGES * 2 * hostile.tuples
    assert sum(garbage.refused.values()) == 4 and garbage.acked == 0, garbage.refused
    assert peak <= PEAK_BYTES, peak >> 20
    assert got.pop(hostile.key) == hostile.acked
    assert got == feeder.acked, diff(got, feeder.acked)
    assert grown < SHARE_MIB, grown


def test_idle_push_streams_past_a_callers_share_hold_no_room(tmp_path):
    """More idle Push streams than a caller's share of messages: its other streams
    still flow (in the clear every process on loopback is one caller)."""
    from floering.chaos.hostile import IdleStreams
    with LocalCluster.up(2, 1, workdir=tmp_path, tls=False) as cluster:
        node = cluster.node("n0")
        with IdleStreams(node.address, None, 4 * PUSH_READS_PER_CALLER) as idle:
            feeder = Feeder([node.address])
            feeder.start()
            feeder.wait_rounds(5)
            client = feeder.finish()
            got = client.scan_all()
            client.close()
            with grpc.insecure_channel(node.address) as ch:
                stats = floe_pb2_grpc.QueryPlaneStub(ch).Stats
                # nothing held but a member's call being read now and then
                wait_for(lambda: stats(floe_pb2.StatsRequest(),
                                       timeout=10).request_budget_bytes == 0,
                         timeout=10, what="no bytes held with the idle streams open")
        assert idle.refused == {}
    assert got == feeder.acked, diff(got, feeder.acked)


def test_a_push_message_that_is_not_a_push_request_is_refused_and_lets_its_room_go(tmp_path):
    """A Push message is taken in as its wire bytes and parsed only once it has room:
    one that does not parse refuses its stream INVALID_ARGUMENT (gRPC's own parse
    failed the call UNKNOWN), and the room it took is let go; the node goes on
    taking a well-formed stream's tuples."""
    with LocalCluster.up(2, 1, workdir=tmp_path, tls=False) as cluster:
        node = cluster.node("n0")
        good = LargePushes(node.address, 1, 1)
        with grpc.insecure_channel(node.address) as ch:
            push = ch.stream_stream("/floering.v1.DataPlane/Push")    # bytes as they are
            with pytest.raises(grpc.RpcError) as refused:
                list(push(iter([b"\x0a\xff\xff\xff\xff\x0f" + b"\x00" * (1 << 20)]),
                          timeout=30))
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value
            stats = floe_pb2_grpc.QueryPlaneStub(ch).Stats
            wait_for(lambda: stats(floe_pb2.StatsRequest(),
                                   timeout=10).request_budget_bytes == 0,
                     timeout=30, what="the refused message's room let go")
        good.run()
        assert good.refused == {} and good.acked == 2 * good.tuples
        with RingClient(cluster.seeds) as client:
            got = client.scan_all()
    assert got == {good.key: good.acked}
