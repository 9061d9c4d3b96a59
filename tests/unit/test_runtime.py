"""The production runtime (NodeRuntime executing the NodeMachine's effects) in one
event loop, its nodes connected by the in-memory transport: a crash, a handoff and a
leave with exact counts, without gRPC or processes."""

import re

from floering.node.core.batch import Batch, encode_payload, encode_seqs
from floering.node.core.handoff import HandoffState
from floering.node.runtime.inbound import StreamState
from tests.support.helpers import wait_until
from tests.support.runtime_shared import MemoryCluster, WORDS


async def test_a_crashed_node_is_taken_over_and_nothing_is_lost(tmp_path):
    c = MemoryCluster(tmp_path, nodes=3, replication=1)
    await c.start()
    try:
        await c.push(WORDS[:150])
        c.crash("n1")
        await wait_until(lambda: "n1" not in c.ring().nodes, 5.0)
        await c.push(WORDS[150:])
        await wait_until(lambda: all(r.core.ring.stamp == c.ring().stamp for r in c.live()), 5.0)
        assert c.counts() == c.sent
        events = c.events()
        assert ("n0", "detected") in events or ("n2", "detected") in events, events
        assert any(kind == "taken_over" for _, kind in events), events
        # every protocol record names the machine event that caused it
        caused = [e for e in c.records() if e["kind"] in ("detected", "taken_over")]
        assert all(re.fullmatch(r"n\d:\d+:(ProbeAnswered|RingSeen|ExchangeRing)", e["stimulus"])
                   for e in caused), caused
    finally:
        await c.stop()


async def test_a_handoff_and_a_leave_keep_every_count(tmp_path):
    c = MemoryCluster(tmp_path, nodes=3, replication=1)
    await c.start()
    try:
        await c.push(WORDS[:100])
        giver = c.runtimes["n0"]
        token = giver.core.ring.tokens_of("n0")[0]
        h = await giver.hand_off({token: "n2"})
        assert h.state == HandoffState.COMMITTED, h.reason
        assert c.ring().owner_of_token(token) == "n2"
        await c.push(WORDS[100:200])
        await c.runtimes["n2"].leave()
        assert c.runtimes["n2"].left.is_set()
        c.network.down.add(c.members["n2"])
        await wait_until(lambda: "n2" not in c.ring().nodes
                       and all(r.core.ring.stamp == c.ring().stamp for r in c.live()), 5.0)
        await c.push(WORDS[200:])
        assert c.counts() == c.sent
    finally:
        await c.stop()


async def test_durable_runtimes_stopped_and_started_on_their_directories_come_back_exact(
        tmp_path):
    data = str(tmp_path / "data" / "{node}")
    c = MemoryCluster(tmp_path, nodes=3, replication=1, data_dir=data)
    await c.start()
    await c.push(WORDS[:150])
    # One more batch, logged but not synced yet when the nodes stop: stopping syncs
    # it, and it comes back.
    for runtime in c.runtimes.values():
        runtime.durable.interval = 5.0
    ring, c.seq = c.ring(), c.seq + 1
    c.sent["late"] += 1
    token = ring.token_for_key("late")
    batch = Batch(ring.stamp, token, "m", c.seq, c.seq, 1, encode_payload(["late"], [1]),
                  encode_seqs([c.seq]))
    for node in ring.destinations(token):
        await c.network.services[ring.address(node)].submit([batch], StreamState())
    await wait_until(lambda: all(r.inbound.empty() for r in c.runtimes.values()), 2.0)
    await c.stop()
    again = MemoryCluster(tmp_path, nodes=3, replication=1, data_dir=data)
    again.seq, again.sent = c.seq, c.sent
    await again.start()
    try:
        await wait_until(lambda: all(r.core.ring.stamp == again.ring().stamp
                                     for r in again.live()), 5.0)
        assert again.counts() == c.sent
        await again.push(WORDS[150:])
        assert again.counts() == again.sent
    finally:
        await again.stop()
