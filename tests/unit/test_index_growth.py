"""A state table's index grown a share at a time (StateTable.grow_index), the table
read and changed between the shares: every key found, exact against a Counter, the
compiled table and the pure one alike; and a replica's delta whose frames are larger
than its step goes in in pieces, its copy's index grown in steps of their own."""

from __future__ import annotations

from array import array
from collections import Counter

import pytest

from floering.node.core import columnar
from floering.node.core.columnar import pytable
from floering.node.core.reducers import load_reducer
from floering.node.core.state_wire import StateColumns, StateRun, decode, plan
from floering.node.core.table_state import TableCopy, index_room, key_columns
from floering.wire.hashing import position

TABLES = [pytable.StateTable] + ([columnar._compiled.StateTable]
                                 if columnar._compiled is not None else [])


def columns(keys, value=1):
    return (*key_columns(keys), array("q", [value] * len(keys)))


@pytest.mark.parametrize("make", TABLES)
def test_an_index_grown_a_share_a_call_while_the_table_changes_finds_every_key(make):
    table, ref = make("count"), Counter()

    def add(keys, value=1):
        table.apply(*columns(keys, value))
        for key in keys:
            ref[key] += value
    add([f"k{i}" for i in range(20_000)])
    calls, fresh = 0, 0
    while not table.grow_index(30_000, 1_000):
        calls += 1
        if calls % 4 == 1:            # new keys (placed by a later share) and held ones
            add([f"n{fresh + i}" for i in range(300)] + [f"k{calls}"])
            fresh += 300
        elif calls % 4 == 2:          # a batch that overflows changes nothing
            with pytest.raises(OverflowError):
                table.apply(*columns([f"x{calls}", "k0", "k0"], 1 << 62))
        elif calls % 4 == 3 and calls < 30:   # removed keys: the growth starts again
            lo, hi = 0, 1 << 58
            table.discard(lo, hi)
            for key in [k for k in ref if lo < position(k) <= hi]:
                del ref[key]
        assert calls < 500
    if make is pytable.StateTable:
        assert calls == 0                       # a dict grows as it goes
    else:
        assert calls > 20                       # cleared, then placed, a share a call
    assert table.grow_index(30_000 - fresh, 1_000)   # it holds them now: nothing to do
    assert len(table) == len(ref)
    assert all(table.get(key) == n for key, n in ref.items())
    assert dict(table.items()) == dict(ref)
    add([f"k{i}" for i in range(0, 20_000, 3)] + [f"m{i}" for i in range(9_000)])
    assert dict(table.items()) == dict(ref) and len(table) == len(ref)


@pytest.mark.parametrize("make", TABLES)
def test_grow_index_refuses_a_negative_count_or_share(make):
    table = make("sum")
    for keys, most in ((-1, 10), (10, 0)):
        with pytest.raises(ValueError):
            table.grow_index(keys, most)


@pytest.mark.skipif(columnar.KERNEL != "compiled", reason="extension not built")
def test_the_growing_index_counts_in_nbytes_until_it_takes_over():
    table = columnar.StateTable("count")
    table.apply(*columns([f"k{i}" for i in range(5_000)]))
    before = table.nbytes
    assert not table.grow_index(100_000, 4_096)
    assert table.nbytes > before                  # the larger index, cleared in part
    steps = list(index_room(table, 100_000, 4_096))
    assert steps and table.grow_index(100_000, 4_096)
    assert dict(table.items()) == {f"k{i}": 1 for i in range(5_000)}


def test_a_delta_of_frames_larger_than_its_step_goes_in_pieces_exactly():
    first = Counter({f"w{i}": 1 + i % 4 for i in range(30_000)})
    copy = TableCopy(load_reducer("count"))
    copy.apply_fragment(StateRun([decode(p.encode()) for p in plan(dict(first), 16_384,
                                                                   1 << 22)]))
    delta = {**{f"w{i}": 9 for i in range(0, 30_000, 3)},
             **{f"n{i}": 2 for i in range(40_000)}, "float": 1.5}
    frames = [decode(p.encode()) for p in plan(delta, 16_384, 1 << 22)]
    assert any(len(f.kinds) > 4_096 for f in frames if isinstance(f, StateColumns))
    steps = sum(1 for _ in copy.fragment_in_steps(StateRun(frames), 4_096))
    assert steps >= len(delta) // 4_096
    assert copy.master == {**first, **delta}
    assert len(copy) == len(first) + 40_001
