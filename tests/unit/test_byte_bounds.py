"""Messages are bounded in bytes, not entries: a range of a few keys whose states are
4 MiB each (72 MiB, over the gRPC message limit) is scanned, moved and copied to a
new replica after a SIGKILL, in chunks of about a MiB; scans stream without copying
a node's whole state and are bounded per node and per caller; what a node takes in at
once is bounded. Chunking pure first, then real processes (TLS, durable, loopback)."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import grpc
import pytest

from floering.node.transport import server
from floering.node.core.chunks import (ScanSlots, column_slices, packed_chunks, pair_slices,
                                       range_copy, scan_pairs)
from floering.wire.codec import pack_entries, unpack_entries
from floering.wire.errors import Overloaded
from floering.node.core.reducers import load_reducer
from floering.node.core.state_store import LayeredState
from tests.support.helpers import CoreCluster


# ------------------------------------------------------------------ pure

def entries(n: int, seed: int) -> dict:
    rng = random.Random(seed)
    out = {}
    for i in range(n):
        r = rng.random()
        key = (b"x" * rng.randint(0, 5000) + str(i).encode()) if r < 0.05 else \
            (i if r < 0.3 else f"k{i}\u00e9")
        out[key] = rng.choice([1, 2 ** 70, "s" * rng.randint(0, 3000), (1, 2, 3)])
    return out


@pytest.mark.parametrize("seed", range(40))
def test_chunks_hold_every_entry_once_within_their_bounds(seed):
    rng = random.Random(seed)
    items = entries(rng.choice([0, 1, 5, 100, 3000, 20_000]), seed)
    max_bytes = rng.choice([64, 1000, 10_000, 1 << 20])
    max_entries = rng.choice([1, 7, 1000, 5000, 1 << 30])
    chunks = list(packed_chunks(column_slices(items), max_bytes, max_entries))
    got: dict = {}
    for count, data in chunks:
        part = unpack_entries(data)
        assert len(part) == count <= max_entries
        assert count == 1 or len(data) <= max_bytes + 16   # + the arrays' headers
        got.update(part)
    assert got == unpack_entries(pack_entries(items))
    assert sum(c for c, _ in chunks) == len(items)
    assert len(chunks) == 1 or all(c for c, _ in chunks)
    assert [c for c, _ in packed_chunks(pair_slices(items.items()), max_bytes, max_entries)] \
        == [c for c, _ in chunks]
    plan = list(packed_chunks(column_slices(items), max_bytes, max_entries, keep=1))
    assert plan == chunks[:1] + [(c, b"") for c, _ in chunks[1:]]


def test_a_large_entry_travels_alone_and_small_ones_fill_a_chunk():
    items = {f"k{i}": i for i in range(10)}
    items["big"] = b"\0" * (3 << 20)
    items.update({f"m{i}": i for i in range(10)})
    chunks = list(packed_chunks(column_slices(items), 1 << 20))
    assert [c for c, _ in chunks] == [10, 1, 10]
    assert unpack_entries(chunks[1][1]) == {"big": items["big"]}


def test_scans_are_bounded_per_node_and_per_caller():
    slots = ScanSlots(total=3, per_caller=2)
    slots.take("a")
    slots.take("a")
    with pytest.raises(Overloaded, match="this caller"):
        slots.take("a")
    slots.take("b")
    with pytest.raises(Overloaded, match="scans are open on this node"):
        slots.take("c")
    slots.give("a")
    slots.take("c")
    assert slots.open == Counter(a=1, b=1, c=1)


def test_a_scan_walks_a_range_at_a_time_each_key_once_while_batches_apply():
    c = CoreCluster(nodes=2, replication=1, tokens_per_node=4)
    words = [f"w{i}" for i in range(2000)]
    c.push("s", words)
    core = c.cores["n0"]
    ranges = list(core.primaries.values())
    walk = scan_pairs(core, False)
    first = next(walk)
    c.push("s", words, first_seq=len(words) + 1)   # every count is 2 from now on
    left = next(t for t, rng in core.primaries.items() if rng is ranges[-1])
    core.primaries.pop(left)                        # handed off before the walk got there
    got = [first, *walk]
    keys = [k for k, _ in got]
    assert len(keys) == len(set(keys)) == sum(len(r.state) for r in ranges)
    # The range being read was copied before the second batch; the others after it.
    on_first = {k for k in ranges[0].state.snapshot()}
    assert all(s == (1 if k in on_first else 2) for k, s in got)


def test_a_range_copy_is_its_state_at_the_copy_whatever_applies_swaps_and_merges_after():
    state = LayeredState(load_reducer("count"))
    state.apply([f"m{i}" for i in range(500)], [1] * 500)
    state.swap()
    state.merge_inactive()                          # master: m0..m499
    changed = [f"m{i}" for i in range(0, 500, 7)] + ["i0"]
    state.apply(changed, [5] * len(changed))
    state.swap()                                    # inactive: changed since
    state.apply(["m1", "a0"], [3, 3])               # active: newer still
    expect = state.snapshot()
    copy = range_copy(state)
    state.apply([f"m{i}" for i in range(500)] + ["late"], [1] * 501)
    state.merge_inactive()
    state.swap()
    state.merge_inactive()
    got = list(copy)
    assert len(got) == len(expect) and dict(got) == expect

    class Table:                                    # a store of another kind
        def snapshot(self):
            return {"k": 1}
    assert list(range_copy(Table())) == [("k", 1)]


class Aborted(Exception):
    pass


class StalledReader:
    """A call's context whose reader never takes a chunk."""

    def __init__(self) -> None:
        self.written = 0

    async def write(self, message) -> None:
        self.written += 1
        await asyncio.Event().wait()

    async def abort(self, code, details):
        raise Aborted(code, details)


async def test_a_reader_that_takes_no_chunk_is_cut_off_and_its_scan_closed(monkeypatch):
    monkeypatch.setattr(server, "SCAN_STALL", 0.2)
    slots = ScanSlots(total=1, per_caller=1)
    slots.take("c")

    class Run:
        chunks = iter([(1, b"a"), (1, b"b")])

        def close(self):
            slots.give("c")
    context = StalledReader()
    with pytest.raises(Aborted) as cut:
        await server._stream(context, Run(), lambda entries: entries)
    assert cut.value.args[0] == grpc.StatusCode.UNAVAILABLE
    assert "took no chunk for 0.2s" in cut.value.args[1]
    assert context.written == 1 and not slots.open     # its slot is free again


# ---------------------------------------------------------- real processes
