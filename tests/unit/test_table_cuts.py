"""A table range's whole copy is cut at one point and made a slice at a time while
batches keep applying (a full checkpoint, a disk write, an export), and a received
full copy is built into a new table a few frames at a time: both exact, checked
against a Counter of what was applied."""

import random
from collections import Counter

import pytest

from floering.node.core import columnar
from floering.wire.errors import InvalidArgument
from floering.node.core.ranges import FullStates, PrimaryRange
from floering.node.core.reducers import load_reducer
from floering.node.core.state_wire import StateColumns, StateRun, decode, plan
from floering.node.core.table_state import (CutView, TableCopy, TableState, copy_in_steps,
                                            key_columns)
from floering.node.core.columnar import pytable

compiled = pytest.mark.skipif(columnar.KERNEL != "compiled", reason="extension not built")


def feed(state, rnd, expect, keys=3000, n=500):
    batch = [f"w{rnd.randrange(keys)}" for _ in range(n)]
    state.apply(batch, [1] * n)
    expect.update(batch)


def read_back(pieces) -> dict:
    out: dict = {}
    for piece in pieces:
        out.update(decode(piece.encode()).to_dict())
    return out


@pytest.mark.parametrize("kind", ["compiled", "python"])
def test_a_full_checkpoint_is_the_range_at_its_cut_while_batches_apply(kind):
    """The full copy is planned and encoded a frame at a time, batches applying
    between the frames; it holds the states at the cut, and with the next delta laid
    over it a replica holds the primary's states, key for key."""
    if kind == "compiled" and columnar.KERNEL != "compiled":
        pytest.skip("extension not built")
    rnd, expect = random.Random(3), Counter()
    rng = PrimaryRange(1, load_reducer("count"))
    if kind == "python":
        rng.state = TableState(load_reducer("count"), pytable.StateTable)
    for _ in range(40):
        feed(rng.state, rnd, expect, keys=20_000)
    delta = rng.cut_checkpoint()
    full = rng.full_checkpoint(delta)
    at_cut = dict(expect)
    pieces, got = plan(full.states, 300, 1 << 20), {}
    for piece in pieces:
        got.update(decode(piece.encode()).to_dict())
        feed(rng.state, rnd, expect, keys=25_000, n=200)        # new keys and old ones
    assert got == at_cut
    if kind == "compiled":
        assert isinstance(full.states.layers[0], CutView)
        assert rng.state.table.cut() is not None        # the full copy's cut closed
    rng.checkpoint_shipped()
    copy = TableCopy(load_reducer("count"))
    copy.replace(got)
    nxt = rng.cut_checkpoint()
    copy.apply_fragment(StateRun([decode(p.encode()) for p in plan(nxt.states, 1000, 1 << 20)]))
    assert copy.master == dict(expect)


@compiled
def test_two_readers_of_one_cut_read_the_same_slices_and_a_whole_read_joins_them():
    rnd, expect = random.Random(4), Counter()
    state = TableState(load_reducer("count"))
    for _ in range(20):
        feed(state, rnd, expect)
    view, spill = state.full_layers()
    at_cut = dict(expect)
    first = plan(FullStates(view, spill), 100, 1 << 20)
    got_first = read_back([next(first) for _ in range(3)])
    feed(state, rnd, expect)
    assert read_back(plan(FullStates(view, spill), 100, 1 << 20)) == at_cut
    assert read_back(first) | got_first == at_cut
    kinds, _, offsets, positions, values = view.buffers            # joined
    assert len(kinds) == len(positions) == len(values) == len(at_cut) == len(offsets) - 1
    assert dict(zip(view, values)) == at_cut
    assert dict(FullStates(view, spill)) == at_cut


@compiled
def test_an_export_of_a_range_reads_its_cut_while_batches_apply():
    from floering.node.transport.snapshots import frame_chunks
    rnd, expect = random.Random(5), Counter()
    state = TableState(load_reducer("count"))
    for _ in range(30):
        feed(state, rnd, expect, keys=100_000)
    view, _ = state.full_layers()
    at_cut, got = dict(expect), {}
    for _, frame in frame_chunks(view):
        got.update(decode(frame).to_dict())
        feed(state, rnd, expect, keys=200_000, n=2000)
    assert got == at_cut and len(got) > 10_000


def frames_of(pairs, per_frame):
    out = []
    for lo in range(0, len(pairs), per_frame):
        part = pairs[lo:lo + per_frame]
        kinds, data, offsets, _ = key_columns([k for k, _ in part])
        from array import array
        out.append(StateColumns(kinds, data, offsets, array("q", [v for _, v in part])))
    return out


@compiled
def test_a_full_copy_is_built_in_steps_and_taken_over_whole():
    """The frames go into a new table a step at a time (the table grown once first);
    a key in two frames takes the later state; the copy equals one built in one call,
    and the replica's copy is the built table itself."""
    pairs = [(f"k{i}", i) for i in range(50_000)] + [("k7", -1)]
    frames = frames_of(pairs, 4096)
    frames.append({"float": 2.5})
    steps = list(copy_in_steps(load_reducer("sum"), StateRun(frames), step=10_000))
    built = steps[-1]
    assert all(s is None for s in steps[:-1]) and len(steps) >= 5
    want = dict(pairs)
    want["float"] = 2.5
    assert built.snapshot() == want
    copy = TableCopy(load_reducer("sum"))
    copy.replace(built)
    assert copy.state.table is built.table and copy.master == want
    other = TableCopy(load_reducer("sum"))
    other.replace(StateRun(frames))
    assert other.master == want


@compiled
def test_a_bad_frame_in_a_copy_built_in_steps_changes_nothing():
    copy = TableCopy(load_reducer("count"))
    copy.replace({"a": 1})
    good = frames_of([(f"k{i}", 1) for i in range(9000)], 3000)
    kinds, data, offsets, values = good[1].kinds, good[1].key_data, good[1].offsets, \
        good[1].value_column
    bad = StateColumns(b"\x07" + kinds[1:], data, offsets, values)
    with pytest.raises(InvalidArgument):
        for built in copy_in_steps(load_reducer("count"), StateRun([good[0], bad, good[2]]),
                                   step=1000):
            if built is not None:
                copy.replace(built)
    assert copy.master == {"a": 1}


@compiled
def test_a_checkpoint_delta_is_its_changed_keys_at_the_cut_while_batches_apply():
    """A delta's changed keys are cut at the swap and read frame by frame while
    batches apply; what changes meanwhile is the next delta's: the two laid over the
    first copy equal the range."""
    rnd, expect = random.Random(6), Counter()
    rng = PrimaryRange(1, load_reducer("count"))
    for _ in range(20):
        feed(rng.state, rnd, expect, keys=20_000)
    copy = TableCopy(load_reducer("count"))
    copy.replace(read_back(plan(rng.full_checkpoint(rng.cut_checkpoint()).states, 500, 1 << 20)))
    rng.checkpoint_shipped()
    for _ in range(10):
        feed(rng.state, rnd, expect, keys=30_000)
    at_cut = dict(expect)
    delta = rng.cut_checkpoint()
    assert isinstance(delta.states.layers[0], CutView) and rng.state.table.dirty_count == 0
    got = {}
    for piece in plan(delta.states, 200, 1 << 20):
        got.update(decode(piece.encode()).to_dict())
        feed(rng.state, rnd, expect, keys=30_000, n=300)
    assert got == {k: at_cut[k] for k in got} and len(got) == len(delta.states.layers[0])
    copy.apply_fragment(got)
    assert copy.master == at_cut
    rng.checkpoint_shipped()
    nxt = rng.cut_checkpoint()
    copy.apply_fragment(read_back(plan(nxt.states, 1000, 1 << 20)))
    assert copy.master == dict(expect)


@compiled
def test_one_delta_read_on_two_threads_while_batches_apply_is_exact_on_both():
    """A checkpoint's delta is shipped from the event loop and written from the
    disk's thread at once: both read every slice, each made once, as of the cut."""
    import threading
    rnd, expect = random.Random(7), Counter()
    rng = PrimaryRange(1, load_reducer("count"))
    for _ in range(100):
        feed(rng.state, rnd, expect, keys=400_000, n=2000)
    at_cut = dict(expect)
    delta = rng.cut_checkpoint()
    got: list[dict] = [{}, {}]
    failed: list = []

    def read(i, entries):
        try:
            for piece in plan(delta.states, entries, 1 << 20):
                got[i].update(decode(piece.encode()).to_dict())
        except Exception as exc:        # noqa: BLE001 - reported below
            failed.append(exc)

    readers = [threading.Thread(target=read, args=(0, 1 << 16)),
               threading.Thread(target=read, args=(1, 4096))]
    for reader in readers:
        reader.start()
    while any(reader.is_alive() for reader in readers):
        feed(rng.state, rnd, expect, keys=500_000, n=2000)
    for reader in readers:
        reader.join()
    assert not failed
    assert got[0] == got[1] == at_cut and len(at_cut) > 100_000
