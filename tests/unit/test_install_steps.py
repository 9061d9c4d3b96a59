"""A full copy of a range that arrives as frames and is kept as a dict (user-defined
reducers, FLOE_PURE=1) is made that dict a few thousand entries per turn of the event
loop, not in one step: exact against the frames' entries and a Counter, the loop's
steps counted and the longest timed in the loop's own CPU time; and a real ring
hands ranges of dict states over while batches keep coming, exact afterwards."""

from __future__ import annotations

import asyncio
import gc
from collections import Counter

import pytest

from floering.wire.codec import unpack_entries
from floering.wire.errors import InvalidArgument
from floering.node.core.reducers import load_reducer
from floering.node.core.state_store import LayeredState, copy_pairs
from floering.node.core.state_wire import StateColumns, StateRun, decode, plan
from floering.node.runtime.service import COPY_STEP, DICT_STEP, dict_in_steps
from floering.v1 import floe_pb2, floe_pb2_grpc
from tests.support.install_steps_shared import Steps

KEYS = 120_000


def frames_of(states: dict, entries: int = 16_384) -> list[StateColumns]:
    return [decode(piece.encode()) for piece in plan(states, entries, 1 << 20)]


def test_a_full_copy_of_frames_becomes_its_dict_in_steps_exactly():
    words = [f"w{i % KEYS}" for i in range(KEYS * 2)] + [str(i) for i in range(500)]
    counts = Counter(words)
    # int states travel in the frames' columns, tuples in their rest; one key in both
    states = {k: (n if i % 3 else (n, "x")) for i, (k, n) in enumerate(counts.items())}
    frames = frames_of(states)
    layer = {"w1": 99, b"raw": (1, 2)}               # a later dict layer wins
    run = StateRun([*frames, layer])
    steps = Steps()
    got = asyncio.run(steps.run(dict_in_steps(run)))
    assert got == run.to_dict() == {**states, **layer}
    assert asyncio.run(dict_in_steps(frames[1])) == frames[1].to_dict()      # a delta
    assert {k: (s if isinstance(s, int) else s[0]) for k, s in got.items()
            if k not in layer} == {k: n for k, n in counts.items() if k not in layer}
    # every DICT_STEP entries the loop ran the ticker; no step took the whole copy
    assert steps.turns >= len(states) // DICT_STEP
    assert steps.longest < 0.05, steps.longest


def test_a_frame_with_a_bad_int_key_is_refused_in_steps_as_whole():
    frame = frames_of({i: i for i in range(10_000)})[0]
    data = bytearray(frame.key_data)
    data[frame.offsets[9_000]] = ord("x")          # key 9000 no longer a decimal
    bad = StateColumns(frame.kinds, bytes(data), frame.offsets, frame.value_column)
    with pytest.raises(InvalidArgument):
        bad.to_dict()
    with pytest.raises(InvalidArgument):
        asyncio.run(dict_in_steps(StateRun([bad])))


def layered(reducer: str, counts: Counter) -> LayeredState:
    state = LayeredState(load_reducer(reducer))
    keys = list(counts.elements())
    for i in range(0, len(keys), 50_000):
        state.apply(keys[i:i + 50_000], [1] * len(keys[i:i + 50_000]))
    state.swap()
    state.merge_inactive()
    return state


def test_a_copy_in_steps_is_the_state_as_it_began_whatever_merges_meanwhile():
    base = Counter({f"k{i}": 1 + i % 5 for i in range(30_000)})
    state = layered("count", base)
    state.apply(["k1", "fresh"], [10, 1])                     # in active as it begins
    expect = state.snapshot()
    keys, states, fixed = [], [], {}
    steps = state.copy_in_steps(keys, states, fixed, 1_000)
    for r, _ in enumerate(steps):
        # keys master has (values overwritten by the merge) and new ones (master grows)
        state.apply([f"k{r * 7}", f"new{r}", "k1"], [1, 1, 1])
        if r % 2:
            state.swap()
            state.merge_inactive()
    out = dict(copy_pairs(keys, states, fixed))
    assert r >= 29 and out == expect and not state.pins
    assert len(out) == len(list(copy_pairs(keys, states, fixed)))        # each key once
    assert out["k1"] == base["k1"] + 10 and out["fresh"] == 1


def test_a_copy_in_steps_reads_the_master_it_began_with_after_a_replace():
    state = layered("count", Counter({f"k{i}": 2 for i in range(5_000)}))
    expect = state.snapshot()
    keys, states, fixed = [], [], {}
    steps = state.copy_in_steps(keys, states, fixed, 1_000)
    next(steps)
    state.replace({"other": 1})
    state.apply(["k1"], [5])
    state.swap()
    state.merge_inactive()
    for _ in steps:
        pass
    assert dict(copy_pairs(keys, states, fixed)) == expect


def test_a_core_inspects_an_owned_range_of_dicts_in_steps_and_any_other_at_once():
    from tests.support.helpers import CoreCluster
    c = CoreCluster(nodes=2, replication=1, tokens_per_node=1)
    core = c.cores["n0"]
    [token] = core.primaries
    counts = Counter({f"k{i}": 1 + i % 3 for i in range(5_000)})
    core.primaries[token].state = layered("count", counts)
    *steps, (role, states) = core.inspect_steps(token, 1_000)
    assert steps == [None] * len(steps) and len(steps) >= 5
    assert role == "primary" and dict(states) == dict(counts)
    other = c.ring.tokens_of("n1")[0]          # n0 holds n1's range as its replica
    assert list(core.inspect_steps(other, 1_000)) == [core.inspect_range(other)]
    assert list(core.inspect_steps(12345, 1_000)) == [("", {})]


async def test_inspect_range_copies_a_range_of_dicts_in_steps_while_batches_apply():
    """A primary range of 1,000,000 keys in dicts, read by InspectRange over a real
    grpc.aio server while batches apply and checkpoints merge in the same loop: what
    it reads is the range at one moment (every key of a group applied to together has
    one count; the new key of each round before it, none after; the rest exact against
    a Counter), and no turn of the loop took the copy whole."""
    import grpc
    from types import SimpleNamespace
    from floering.node.runtime.service import NodeService
    from floering.node.transport.server import QueryPlane
    base = Counter({f"k{i}": 1 + i % 3 for i in range(1_000_000)})
    state = layered("count", base)
    group = [f"k{i}" for i in range(0, 1_000_000, 1_000)]
    from floering.node.core.node_core import NodeCore
    core = SimpleNamespace(primaries={7: SimpleNamespace(state=state)})
    core.inspect_steps = lambda token, step: NodeCore.inspect_steps(core, token, step)
    service = NodeService(SimpleNamespace(core=core))
    server = grpc.aio.server()
    floe_pb2_grpc.add_QueryPlaneServicer_to_server(QueryPlane(service), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    steps, rounds = Steps(), [0]

    async def apply_meanwhile():
        while not steps.done:
            r = rounds[0]
            state.apply([*group, f"new{r}"], [1] * (len(group) + 1))
            state.swap()
            state.merge_inactive()
            rounds[0] += 1
            await asyncio.sleep(0.01)       # checkpoints merge every 0.2 s by default

    async def inspect_it():
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            await channel.channel_ready()
            asked = steps.turns
            call = floe_pb2_grpc.QueryPlaneStub(channel).InspectRange(
                floe_pb2.RangeRequest(token=7), timeout=60)
            chunks = []
            while (chunk := await call.read()) is not grpc.aio.EOF:
                if not chunks:      # turns of the loop before the first chunk
                    first[0] = steps.turns - asked
                chunks.append(chunk)
            return chunks
    first = [0]
    gc.disable()        # a full collection walks every dict's entries: timed apart
    try:
        applier = asyncio.get_running_loop().create_task(apply_meanwhile())
        chunks = await steps.run(inspect_it())
        await applier
    finally:
        gc.enable()
        await server.stop(None)
    got = {k: s for c in chunks for k, s in unpack_entries(c.entries).items()}
    assert chunks[0].role == "primary" and not service.scans.open
    before = got[group[0]] - base[group[0]]           # rounds applied as it began
    assert 0 < before < rounds[0], (before, rounds[0])
    assert {k: got[k] - base[k] for k in group} == dict.fromkeys(group, before)
    assert {k for k in got if k.startswith("new")} == {f"new{r}" for r in range(before)}
    grouped = set(group)
    assert {k: s for k, s in got.items() if k in base and k not in grouped} == \
        {k: n for k, n in base.items() if k not in grouped}
    # The copy took a turn per COPY_STEP keys (in one turn: a few, the call's own)
    assert first[0] >= len(base) // COPY_STEP // 2, first[0]
    assert steps.longest < 0.05, steps.longest
