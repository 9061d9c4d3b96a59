"""Channels to peers are bounded by the ring: one to an address the ring has left
and no call took for a while is closed, on nodes and mappers alike."""

from __future__ import annotations

import asyncio
from collections import Counter

import grpc

from floering.node.core.ranges import Checkpoint
from floering.node.runtime import node as node_module
from floering.wire import channels as channels_module
from floering.wire.channels import ChannelPool
from floering.node.transport.peers import PeerPool
from tests.support.helpers import wait_until
from tests.support.event_loop_shared import replica_server  # noqa: F401 (a fixture)
from tests.support.runtime_shared import MemoryCluster, WORDS


class FakeChannel:
    def __init__(self, address: str) -> None:
        self.address = address
        self.closed = False

    async def close(self) -> None:
        self.closed = True


async def test_a_channel_goes_once_the_ring_left_its_address_and_no_call_took_it():
    now = [0.0]
    pool = ChannelPool(FakeChannel, idle=60.0, clock=lambda: now[0])
    a, b, c = pool.get("a:1"), pool.get("b:1"), pool.get("c:1")
    assert pool.get("a:1") is a and len(pool) == 3
    now[0] = 30.0
    pool.get("c:1")                        # c is called again, out of the ring
    assert await pool.retire({"a:1"}) == []            # nobody idle for 60 s yet
    now[0] = 61.0
    assert await pool.retire({"a:1"}) == ["b:1"]       # b: left and idle; c: called at 30
    assert b.closed and not a.closed and not c.closed and "b:1" not in pool
    now[0] = 95.0
    assert await pool.retire({"a:1"}) == ["c:1"] and c.closed
    assert await pool.retire(set()) == ["a:1"]         # the ring left a too
    again = pool.get("b:1")                # calling a departed address opens anew
    assert again is not b and not again.closed
    await pool.close()
    assert again.closed and not pool


async def test_a_call_while_channels_close_gets_a_new_channel_not_a_closing_one():
    class SlowToClose(FakeChannel):
        async def close(self) -> None:
            await asyncio.sleep(0)             # gRPC's close yields to the loop
            self.closed = True
    now = [0.0]
    pool = ChannelPool(SlowToClose, idle=1.0, clock=lambda: now[0])
    a, b = pool.get("a:1"), pool.get("b:1")
    now[0] = 5.0
    retiring = asyncio.create_task(pool.retire(set()))
    await asyncio.sleep(0)                     # retire runs until a close yields
    fresh = pool.get("b:1")
    assert await retiring == ["a:1", "b:1"]
    assert a.closed and b.closed and fresh is not b and not fresh.closed
    assert pool.get("b:1") is fresh


async def test_a_retired_grpc_channel_is_closed_and_the_next_call_opens_a_new_one(
        replica_server):                                    # noqa: F811
    replica, address = replica_server
    peers = PeerPool(timeout=5.0, max_message_bytes=1 << 26)
    peers._channels = ChannelPool(peers._new_channel, idle=0.0)

    async def ship(seq: int) -> None:
        assert await peers.ship_checkpoint(
            address, sender="p", ring_stamp=5, base_seq=0,
            checkpoint=Checkpoint(7, seq, {"k": seq}, {"s": seq}, full=True)) == (False, seq)
    try:
        await ship(1)
        first = peers._channel(address)
        assert await peers.retire_channels({address}) == []      # the ring names it
        assert await peers.retire_channels({"elsewhere:1"}) == [address]
        assert first.get_state() == grpc.ChannelConnectivity.SHUTDOWN
        assert address not in peers._channels
        await ship(2)
        assert peers._channel(address) is not first
    finally:
        await peers.close()
    assert [r[1] for r in replica.received] == [1, 2]


async def test_a_runtime_retires_its_channels_against_the_ring_without_the_crashed_node(
        tmp_path, monkeypatch):
    monkeypatch.setattr(node_module, "RETIRE_EVERY", 0.05)
    cluster = MemoryCluster(tmp_path, nodes=3)
    named: list[set] = []
    survivor = cluster.runtimes["n0"]
    real = survivor.peers.retire_channels

    async def recording(addresses):
        named.append(set(addresses))
        return await real(addresses)
    survivor.peers.retire_channels = recording
    await cluster.start()
    try:
        await cluster.push(WORDS[:50])
        await wait_until(lambda: named and named[-1] == set(cluster.members.values()), 5,
                         "a retire against every member's address")
        cluster.crash("n2")
        for _ in range(200):
            if "n2" not in survivor.core.ring.nodes and named[-1] == {"mem:0", "mem:1"}:
                break
            await asyncio.sleep(0.05)
        assert named[-1] == {"mem:0", "mem:1"}
        await cluster.push(WORDS[50:100])
        assert cluster.counts() == Counter(WORDS[:100])
    finally:
        await cluster.stop()


async def test_a_dropped_channel_is_replaced_at_once_and_closed_once_idle():
    now = [0.0]
    pool = ChannelPool(FakeChannel, idle=60.0, clock=lambda: now[0])
    a = pool.get("a:1")
    await pool.drop("a:1")
    fresh = pool.get("a:1")
    assert fresh is not a and not a.closed          # calls still on it end by deadline
    now[0] = 30.0
    assert await pool.retire({"a:1"}) == [] and not a.closed
    now[0] = 61.0
    await pool.retire({"a:1"})
    assert a.closed and not fresh.closed and pool.get("a:1") is fresh
    for _ in range(channels_module.MAX_DROPPED + 5):  # bounded however often asked
        await pool.drop("a:1")
        pool.get("a:1")
    assert len(pool._dropped) == channels_module.MAX_DROPPED
    await pool.close()
    assert not pool._dropped


async def test_a_refused_probe_asks_again_on_a_new_connection_before_it_counts():
    """A channel in reconnect backoff repeats the refusal it saw before a member's new
    process bound the address; the probe takes a refusal only from a new connection."""
    from floering.node.core.calls import Failure
    from floering.node.core.detector import Probe
    from floering.wire.errors import Refused
    from floering.node.core.machine_io import StartProbe
    from floering.node.runtime.probing import probe_round

    class Peers:
        def __init__(self, answers):
            self.answers, self.reconnected = list(answers), []

        async def heartbeat(self, address, **_):
            answer = self.answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer

        async def reconnect(self, address):
            self.reconnected.append(address)

    class Runtime:
        incarnation = 1
        machine = type("M", (), {"node_id": "n1"})()

        def __init__(self, peers):
            self.peers, self.finished = peers, []

        def _handle(self, event):
            self.finished.append(event)

    start = StartProbe(Probe("n0#4", 0.2, 0.0, 0, 0.0), "127.0.0.1:9", (), (), 5, 0)
    stale = Runtime(Peers([Refused("connection refused"), (5, 7, "n0#4")]))
    await probe_round(stale, start)
    assert stale.peers.reconnected == ["127.0.0.1:9"]
    # the probe reports how its calls ended; the machine judges (node.core.calls)
    assert (stale.finished[0].direct, stale.finished[0].member) == (None, "n0#4")
    gone = Runtime(Peers([Refused("connection refused")] * 2))
    await probe_round(gone, start)
    assert gone.finished[0].direct == Failure.REFUSED
    assert gone.peers.reconnected == ["127.0.0.1:9"]


async def test_an_indirect_probe_calls_where_and_as_long_as_the_machine_says():
    """Serving a peer's Probe: the machine names the address and bounds the wait, and
    judges the call's end (node.core.requests); the runtime only makes the call."""
    import math

    from floering.node.core.machine_io import Reply, Requested
    from floering.node.runtime.probing import probe_for
    from floering.wire.errors import Refused
    from tests.support.machine_shared import INCARNATIONS, machine

    class Peers:
        def __init__(self, answers):
            self.answers, self.calls = list(answers), []

        async def heartbeat(self, address, *, timeout, **_):
            self.calls.append((address, timeout))
            answer = self.answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer

    class Runtime:
        incarnation = 100

        def __init__(self, *answers):
            self.machine = machine()
            self.core, self.peers = self.machine.core, Peers(answers)

        def ask(self, kind, **fields):
            (reply,) = [e for e in self.machine.handle(Requested(kind, fields), 5.0)
                        if isinstance(e, Reply)]
            assert reply.error is None
            return reply.value

    inc = INCARNATIONS["n2"]
    live = Runtime((1, inc, "n2"))
    assert await probe_for(live, "n2", math.nan) is True
    assert live.peers.calls == [("a:2", 0.01)] and "n2" not in live.machine.guard.gone
    for answer in (Refused("connection refused"), (1, inc + 1, "n2"), (1, inc, "n2#1")):
        gone = Runtime(answer)
        assert await probe_for(gone, "n2", 60.0) is False
        assert gone.peers.calls == [("a:2", 5.0)] and gone.machine.guard.gone == {"n2": 5.0}
    nobody = Runtime()
    assert await probe_for(nobody, "n9", 1.0) is False and nobody.peers.calls == []
