"""What a node keeps is bounded and checked: replicas decode what they store and drop
what their primary never applied, sources per range are limited and idle ones
expire, the inbound queue is bounded in bytes, and health says NOT_SERVING while a
node is fenced. The core with a fake clock, then the runtime, then real processes."""

import asyncio
from collections import Counter

import pytest

from floering.node.core.batch import Batch, Limits, encode_payload
from floering.node.core.detector import DetectorConfig, FailureDetector
from floering.node.core.load import LoadMonitor
from floering.node.core.machine import NodeMachine
from floering.wire.errors import InvalidArgument, InvalidKey, Overloaded, TooLarge
from floering.node.core.machine_io import CheckpointDue, Note, ShipCheckpoints, SplitRequested
from floering.node.core.node_core import NodeCore
from floering.node.core.reducers import load_reducer
from floering.wire.ring import Ring
from floering.node.runtime.inbound import Inbound, InboundQueue, StreamState
from floering.node.runtime.peers import Network
from tests.support.helpers import wait_until

RING = Ring.initial({"p": "127.0.0.1:1", "b": "127.0.0.1:2"}, 1, 1)
TOKEN = RING.tokens_of("p")[0]
KEYS = [k for k in (f"k{i}" for i in range(2000)) if RING.token_for_key(k) == TOKEN]
STRAY = next(k for k in (f"s{i}" for i in range(200)) if RING.token_for_key(k) != TOKEN)


def pair(**limits) -> tuple[NodeCore, NodeCore]:
    lim = Limits(**limits)
    return (NodeCore("p", RING, load_reducer("count"), lim),
            NodeCore("b", RING, load_reducer("count"), lim))


def batch(source: str, seq: int, keys=None, values=None, payload=None) -> Batch:
    keys = keys or [KEYS[seq % len(KEYS)]]
    values = values or [1] * len(keys)
    payload = payload if payload is not None else encode_payload(keys, values)
    return Batch(RING.stamp, TOKEN, source, seq, seq + len(keys) - 1, len(keys), payload)


def ship(primary: NodeCore, replica: NodeCore, now: float, shipments=None) -> int:
    """One checkpoint round at `now` (of `shipments` if planned already); returns
    the number of shipments."""
    if shipments is None:
        shipments = primary.plan_checkpoints(now)
    for s in shipments:
        cp = s.checkpoint
        need_full, seq = replica.receive_checkpoint(
            "p", RING.stamp, cp.token, cp.seq, s.base_seq, cp.full, dict(cp.states),
            dict(cp.watermarks), now)
        primary.checkpoint_acked(cp.token, "b", seq, need_full)
        primary.checkpoint_done(cp.token)
    return len(shipments)


# ---------------------------------------------------------- replicas check

@pytest.mark.parametrize("bad, error", [
    (dict(payload=b"\xc1garbage"), InvalidArgument),                 # not msgpack
    (dict(payload=encode_payload(["k"], [1, 2])), InvalidArgument),  # counts disagree
    (dict(keys=[KEYS[0]], values=["text"]), InvalidArgument),        # not a count
    (dict(payload=encode_payload([1.5], [1])), InvalidKey),          # not a key type
])
def test_a_replica_refuses_what_its_primary_would_and_stores_nothing(bad, error):
    _, replica = pair()
    with pytest.raises(error):
        replica.receive_batch(batch("s", 1, **bad), now=1.0)
    assert replica.replicas.backups.bytes == 0
    assert replica.receive_batch(batch("s", 1), now=1.0).applied == 1     # still serving


def test_a_replica_stores_a_column_batch_without_a_python_key_and_replays_it_exactly(
        monkeypatch):
    from floering.node.core.columns import Columns, encode_columns
    keys = KEYS[:50] + KEYS[:10]
    payload = encode_columns(keys, [1] * len(keys))
    assert payload is not None
    _, replica = pair()

    def no_keys(self):
        raise AssertionError("a stored batch's keys were decoded")
    monkeypatch.setattr(Columns, "keys", no_keys)
    assert replica.receive_batch(batch("s", 1, payload=payload, keys=keys),
                                 now=1.0).applied == len(keys)
    monkeypatch.undo()
    with pytest.raises(InvalidArgument):      # counts that disagree: refused, as before
        replica.receive_batch(batch("s", 100, payload=payload, keys=keys[:-1]), now=1.0)
    assert replica.replicas.backups.tuples == len(keys)
    assert replica.adopt_ring(RING.without(["p"])).taken_over == (TOKEN,)
    assert dict(replica.items()) == Counter(keys)


def test_a_takeover_does_not_replay_a_batch_its_primary_refused_for_a_stray_key():
    primary, replica = pair()
    stray = batch("s", 1, keys=[KEYS[0], STRAY])
    with pytest.raises(InvalidArgument, match="does not belong"):
        primary.receive_batch(stray)
    replica.receive_batch(stray)                 # stored: keys are checked at replay
    replica.receive_batch(batch("s", 3, keys=[KEYS[1]]))
    change = replica.adopt_ring(RING.without(["p"]))
    assert change.taken_over == (TOKEN,)
    assert dict(replica.items()) == {KEYS[1]: 1}


def test_backups_the_primary_never_applied_expire_and_the_rest_stay_exact():
    primary, replica = pair(backup_expiry=100.0)
    for seq in (1, 2):                                    # both get these
        primary.receive_batch(batch("s", seq), now=0.0)
        replica.receive_batch(batch("s", seq), now=0.0)
    replica.receive_batch(batch("ghost", 1), now=0.0)     # only the replica got it
    replica.receive_batch(batch("s", 3), now=0.0)         # the primary has it queued
    assert ship(primary, replica, now=50.0) == 1
    assert replica.replicas.backups.tuples == 2           # not yet: 50 s < 100 s
    primary.receive_batch(batch("s", 3), now=60.0)        # ... applied late
    assert ship(primary, replica, now=101.0) == 1
    assert replica.replicas.backups.tuples == 0           # s:3 covered, ghost expired
    assert replica.stats()["backups_expired"] == 1
    assert replica.replicas.rebuild(TOKEN)[0] == primary.primaries[TOKEN].state.snapshot()


def test_an_idle_primary_still_checkpoints_now_and_then_so_garbage_goes():
    primary, replica = pair(backup_expiry=100.0)
    assert ship(primary, replica, now=0.0) == 1           # first copy
    replica.receive_batch(batch("ghost", 1), now=1.0)
    assert ship(primary, replica, now=50.0) == 0          # nothing new: nothing shipped
    assert ship(primary, replica, now=150.0) == 1         # a refresh after backup_expiry
    assert replica.replicas.backups.tuples == 0


# -------------------------------------------------------------- sources

def test_a_range_tracks_at_most_max_sources_and_known_ones_keep_flowing():
    primary, _ = pair(max_sources_per_range=3)
    for i in range(3):
        primary.receive_batch(batch(f"src{i}", 1))
    with pytest.raises(TooLarge, match="--max-sources-per-range"):
        primary.receive_batch(batch("src3", 1))
    assert primary.receive_batch(batch("src0", 2)).applied == 1
    assert primary.receive_batch(batch("src1", 1)).duplicates == 1    # dedup intact
    assert len(primary.primaries[TOKEN].watermarks) == 3


def test_idle_sources_expire_through_the_machine_and_reach_the_replicas():
    primary, replica = pair(source_expiry=1000.0, max_sources_per_range=2)
    m = NodeMachine(primary, 1, FailureDetector(DetectorConfig()), LoadMonitor(),
                    lambda node_id, r: NodeCore(node_id, r, load_reducer("count")),
                    listen="127.0.0.1:1")
    primary.receive_batch(batch("old", 1), now=0.0)
    primary.receive_batch(batch("busy", 1), now=0.0)
    ship(primary, replica, now=0.0)
    primary.receive_batch(batch("busy", 2), now=900.0)
    effects = m.handle(CheckpointDue(), 1500.0)
    notes = [e.text for e in effects if isinstance(e, Note)]
    assert any("1 sources idle" in n and "'old'" in n for n in notes), notes
    assert set(primary.primaries[TOKEN].watermarks) == {"busy"}
    planned = next(e for e in effects if isinstance(e, ShipCheckpoints)).shipments
    ship(primary, replica, 1500.0, planned)
    assert set(replica.replicas.ranges[TOKEN].watermarks) == {"busy"}
    primary.receive_batch(batch("new", 1), now=1500.0)    # the slot is free again
    ship(primary, replica, now=1500.0)
    assert set(replica.replicas.ranges[TOKEN].watermarks) == {"busy", "new"}
    assert primary.stats()["sources_expired"] == 1


def test_splits_are_limited_per_minute():
    primary, _ = pair()
    m = NodeMachine(primary, 1, FailureDetector(DetectorConfig()), LoadMonitor(),
                    lambda node_id, r: NodeCore(node_id, r, load_reducer("count")),
                    listen="127.0.0.1:1", max_splits_per_minute=2)
    lo, _ = RING.range_of_token(TOKEN)
    m.handle(SplitRequested((lo + 1000) % 2 ** 64), 0.0)
    m.handle(SplitRequested((lo + 2000) % 2 ** 64), 30.0)
    with pytest.raises(Overloaded, match="--max-splits-per-minute"):
        m.handle(SplitRequested((lo + 3000) % 2 ** 64), 59.0)
    m.handle(SplitRequested((lo + 3000) % 2 ** 64), 60.5)    # the first is a minute old
    assert len(m.core.ring.tokens) == len(RING.tokens) + 3


# ---------------------------------------------------------- inbound bytes

def test_the_inbound_queue_holds_senders_back_past_its_byte_bound():
    async def run():
        queue = InboundQueue(max_requests=100, max_bytes=1000)
        loop = asyncio.get_running_loop()

        def request(nbytes):
            b = Batch(0, 0, "s", 1, 1, 1, b"x" * nbytes)
            return Inbound([b], StreamState(), loop.create_future())
        await queue.put(request(600))
        second = asyncio.create_task(queue.put(request(600)))
        await asyncio.sleep(0.05)
        assert not second.done() and queue.nbytes == 600       # waiting: not read
        first = await queue.get()
        await queue.done(first)
        await asyncio.wait_for(second, 1)
        assert queue.nbytes == 600
        big = request(5000)                                     # alone, it still fits
        await queue.done(await queue.get())
        await asyncio.wait_for(queue.put(big), 1)
        stuck = asyncio.create_task(queue.put(request(10)))
        await asyncio.sleep(0.05)
        stuck.cancel()                                          # a sender that gives up
        await asyncio.gather(stuck, return_exceptions=True)
        assert queue.nbytes == 5000
    asyncio.run(run())


# ------------------------------------------------------ health when fenced

async def test_a_fenced_node_is_not_serving_until_a_peer_knows_its_new_member(tmp_path):
    from tests.support.runtime_shared import MemoryCluster
    c = MemoryCluster(tmp_path, nodes=3, replication=1)
    await c.start()
    try:
        await c.push([f"w{i}" for i in range(30)])
        victim = c.runtimes["n1"]
        assert victim.serving
        reachable = victim.peers
        victim.peers = Network(timeout=0.2).peers()   # cut off both ways: it cannot tell
        c.network.down.add(c.members["n1"])           # anyone, nor hear from anyone
        # ...when it learns it was declared dead, in a peer's answer to its own call
        victim.adopt(c.ring().without(["n1"]), pulled=True)
        assert victim.core.fenced is False and victim.machine.rejoined == 1
        assert victim.core.node_id != "n1"        # a new, empty member
        await asyncio.sleep(0.3)
        assert not victim.serving                 # nobody knows that member yet
        victim.peers = reachable
        c.network.down.discard(c.members["n1"])
        for name in ("n0", "n2"):
            c.runtimes[name].adopt(c.ring().without(["n1"]))
        victim.sync_ring()
        await wait_until(lambda: victim.serving, 5.0)
    finally:
        await c.stop()


# ------------------------------------------------------- real processes
