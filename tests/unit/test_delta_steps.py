"""A replica installs a large checkpoint delta into its copy a slice per turn of the
event loop, not in one call; until the last slice any read of the copy (a takeover's
rebuild, an export, a split, the next checkpoint) installs the rest first, so nobody
sees the copy half changed. Exact against a Counter, the compiled table's copy and a
dict copy (FLOE_PURE=1's) alike; the loop's turns counted and its longest step timed
in the thread's CPU time."""

from __future__ import annotations

import asyncio
import gc
from collections import Counter

import pytest

from floering.node.core.columnar import KERNEL
from floering.wire.errors import InvalidArgument
from floering.node.core.ranges import DELTA_STEP, DICT_DELTA_STEP, ReplicaRange, ReplicaSide
from floering.node.core.reducers import load_reducer
from floering.node.core.state_store import ReplicaState
from floering.node.core.state_wire import StateColumns, StateRun, decode, plan
from floering.node.core.table_state import TableCopy
from floering.node.runtime.service import install_pending
from tests.support.install_steps_shared import Steps

TOKEN = 7
FIRST = Counter(f"w{i}" for i in range(60_000))
MORE = Counter([f"w{i}" for i in range(0, 60_000, 2)] + [f"n{i}" for i in range(40_000)])
WHOLE = FIRST + MORE
DELTA = {k: WHOLE[k] for k in MORE}          # the primary's states of the keys changed


def frames_of(states: dict) -> StateRun:
    return StateRun([decode(piece.encode()) for piece in plan(states, DELTA_STEP, 1 << 20)])


def replica(kind: str) -> ReplicaSide:
    """A replica of TOKEN with FIRST as of seq 1: a table copy, or a dict copy (which
    is given deltas as dicts, as the node's service makes them)."""
    side = ReplicaSide(load_reducer("count"))
    copy = TableCopy(side.reducer) if kind == "table" else ReplicaState()
    side.ranges[TOKEN] = ReplicaRange(TOKEN, "p", copy)
    side.apply_checkpoint(TOKEN, "p", 1, 0, True, dict(FIRST), {"s": 1})
    return side


def delta(kind: str):
    return frames_of(DELTA) if kind == "table" else dict(DELTA)


def as_dict(side: ReplicaSide) -> dict:
    return dict(side.ranges[TOKEN].copy.master)


KINDS = ["table", "dict"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_large_delta_goes_in_a_slice_per_turn_exactly(kind):
    side = replica(kind)
    assert side.apply_checkpoint(TOKEN, "p", 2, 1, False, delta(kind), {"s": 2},
                                 sliced=True) == (False, 2)
    pending = side.pending_delta(TOKEN)
    assert pending is not None and not pending.finished
    assert side.ranges[TOKEN]._seq == 1           # not yet: seq and copy change together
    steps = Steps()
    gc.collect()
    gc.freeze()         # as the node does after start-up: the test's own heap aside
    try:
        asyncio.run(steps.run(install_pending(side, TOKEN)))
    finally:
        gc.unfreeze()
    assert pending.finished and pending.error is None and side.pending_delta(TOKEN) is None
    assert steps.turns >= len(DELTA) // (DELTA_STEP if kind == "table" else DICT_DELTA_STEP)
    if kind == "dict" or KERNEL == "compiled":  # a node's table copies are compiled ones
        assert steps.longest < 0.05, steps.longest
    rng = side.ranges[TOKEN]
    assert (rng.checkpoint_seq, rng.watermarks) == (2, {"s": 2})
    assert as_dict(side) == dict(WHOLE)


@pytest.mark.parametrize("kind", KINDS)
def test_a_small_delta_or_an_unsliced_call_installs_at_once(kind):
    side = replica(kind)
    small = {k: DELTA[k] for k in list(DELTA)[:100]}
    side.apply_checkpoint(TOKEN, "p", 2, 1, False,
                          frames_of(small) if kind == "table" else small, {"s": 2}, sliced=True)
    assert side.pending_delta(TOKEN) is None
    side.apply_checkpoint(TOKEN, "p", 3, 2, False, delta(kind), {"s": 3})
    assert side.pending_delta(TOKEN) is None and as_dict(side) == dict(WHOLE)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("slices", [0, 1, 3])
def test_a_takeover_while_a_delta_is_pending_sees_the_whole_delta(kind, slices):
    """A replica promoted with a delta half installed rebuilds the range from the
    whole delta, its seq and its watermarks: the tuples it covers are not applied twice."""
    side = replica(kind)
    side.apply_checkpoint(TOKEN, "p", 2, 1, False, delta(kind), {"s": 2}, sliced=True)
    pending = side.pending_delta(TOKEN)
    for _ in range(slices):
        assert side.step_delta(TOKEN, pending)
    master, marks = side.rebuild(TOKEN)
    assert dict(master) == dict(WHOLE) and marks == {"s": 2}
    assert pending.finished and not side.step_delta(TOKEN, pending)   # nothing left


def one_slice_in(kind):
    """A replica with a sliced delta pending after its first slice, and the delta."""
    side = replica(kind)
    side.apply_checkpoint(TOKEN, "p", 2, 1, False, delta(kind), {"s": 2}, sliced=True)
    pending = side.pending_delta(TOKEN)
    side.step_delta(TOKEN, pending)
    return side, pending


@pytest.mark.parametrize("kind", KINDS)
def test_the_next_delta_while_one_is_pending_composes(kind):
    side, first = one_slice_in(kind)
    later = {"w0": 99, "z": 5}
    assert side.apply_checkpoint(TOKEN, "p", 3, 2, False,
                                 frames_of(later) if kind == "table" else later, {"s": 3},
                                 sliced=True) == (False, 3)
    assert first.finished and as_dict(side) == {**WHOLE, **later}
    assert side.ranges[TOKEN].checkpoint_seq == 3


@pytest.mark.parametrize("kind", KINDS)
def test_a_full_copy_while_a_delta_is_pending_drops_its_rest(kind):
    side, pending = one_slice_in(kind)
    full = {"a": 1, "b": 2}
    side.apply_checkpoint(TOKEN, "p", 3, 0, True, full, {"s": 3})
    assert not side.step_delta(TOKEN, pending)    # the service stops stepping it
    asyncio.run(install_pending(side, TOKEN))
    assert as_dict(side) == full and side.ranges[TOKEN].checkpoint_seq == 3


def test_a_bad_frame_mid_delta_leaves_the_copy_incomplete_and_asks_a_full_copy():
    side = replica("table")
    run = frames_of(DELTA)
    last = run.layers[-1]
    kinds = bytearray(last.kinds)
    kinds[0] = 9                                  # no kind of key
    run.layers[-1] = StateColumns(bytes(kinds), last.key_data, last.offsets, last.value_column)
    side.apply_checkpoint(TOKEN, "p", 2, 1, False, run, {"s": 2}, sliced=True)
    with pytest.raises(InvalidArgument):
        asyncio.run(install_pending(side, TOKEN))
    rng = side.ranges[TOKEN]
    assert not rng.complete and rng.watermarks == {"s": 1}
    assert side.apply_checkpoint(TOKEN, "p", 3, 2, False, frames_of({"a": 1}), {"s": 3},
                                 sliced=True) == (True, -1)
