"""A range's table-backed state (node.core.table_state) against the layered dicts, with
the compiled table and the pure-Python one: the same states after any sequence of
batches (format 1 and columns), merges, fold steps, checkpoints and replacements."""

from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from floering.node.core import columnar
from floering.node.core.batch import decode_batch, encode_batch
from floering.node.core.columnar import pytable
from floering.wire.codec import pack_entries, unpack_entries
from floering.wire.errors import InvalidArgument, InvalidKey
from floering.wire.pieces import FOLD_MARK
from floering.node.core.ranges import FullStates
from floering.node.core.reducers import load_reducer
from floering.node.core.state_store import LayeredState
from floering.node.core.table_state import (ColumnKeys, TableState, check_positions,
                                            marked_keys)

TABLES = [pytable.StateTable]
if columnar.KERNEL == "compiled":
    TABLES.append(columnar.StateTable)

KEYS = st.sampled_from(["a", "b", "ü", b"x", 7, -3, "k" * 40])
INTS = st.integers(-1000, 1000)
VALUES = {"count": INTS, "sum": st.one_of(INTS, st.floats(-1e3, 1e3)),
          "min": st.one_of(INTS, st.floats(-1e3, 1e3)),
          "max": st.one_of(INTS, st.floats(-1e3, 1e3))}


def ops(op):
    batch = st.lists(st.tuples(KEYS, VALUES[op]), min_size=1, max_size=8)
    return st.lists(st.one_of(
        st.tuples(st.just("apply"), batch),
        st.tuples(st.just("merge"), batch),
        st.tuples(st.just("columns"), st.lists(st.tuples(st.sampled_from(["a", "b", "ü", b"x"]),
                                                         INTS), min_size=1, max_size=8)),
        st.tuples(st.just("big"), KEYS),
        st.tuples(st.just("put"), st.tuples(KEYS, INTS)),
        st.tuples(st.just("fold"), INTS),
        st.tuples(st.just("swap"), st.none()),
        st.tuples(st.just("merge_inactive"), st.none()),
        st.tuples(st.just("replace"), st.none()),
    ), max_size=25)


def run(state, steps, op):
    fragments = []
    for kind, arg in steps:
        if kind in ("apply", "merge", "columns"):
            keys, values = tuple(k for k, _ in arg), tuple(v for _, v in arg)
            if kind == "columns":
                cols = decode_batch(encode_batch(list(keys), list(values)), len(keys))
                if hasattr(state, "apply_columns"):
                    state.apply_columns(cols, 0)
                else:
                    state.apply(*cols.to_tuples())
            else:
                (state.apply if kind == "apply" else state.merge_in)(keys, values)
        elif kind == "big" and op in ("count", "sum"):
            state.apply((arg, arg), (2 ** 62, 2 ** 62))      # past int64 together
        elif kind == "put":
            state.put(*arg)
        elif kind == "fold":
            state.put(FOLD_MARK + b"out", [arg, arg])
        elif kind == "swap" and state.inactive is None:
            fragments.append(dict(state.swap()))
        elif kind == "merge_inactive":
            state.merge_inactive()
        elif kind == "replace":
            state.replace(state.snapshot())
    return fragments


@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.__module__.rsplit(".", 1)[-1])
@pytest.mark.parametrize("op", ["count", "sum", "min", "max"])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_table_state_holds_what_layered_dicts_hold(table, op, data):
    steps = data.draw(ops(op))
    reducer = load_reducer(op)
    want, got = LayeredState(reducer), TableState(reducer, table)
    # A fragment holds the keys changed; the dicts' merge of a min or max also lists a
    # key whose state it left as it was.
    for mine, theirs in zip(run(got, steps, op), run(want, steps, op), strict=True):
        assert mine.items() <= theirs.items()
    assert got.snapshot() == want.snapshot()
    assert dict(got.items()) == want.snapshot() and len(got) == len(want)
    assert got.active.items() <= want.active.items() and got.changed() <= want.changed()
    for key in ["a", "b", "ü", b"x", 7, -3, "nope"]:
        assert got.get(key, "absent") == want.get(key, "absent")
        assert got.lookup(key) == want.lookup(key)
    assert got.unknown(["a", "zz", 7]) == want.unknown(["a", "zz", 7])
    full = FullStates(*got.full_layers())
    assert dict(full) == want.snapshot()
    assert unpack_entries(pack_entries(full)) == unpack_entries(pack_entries(want.snapshot()))
    got.check_invariants()


@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.__module__.rsplit(".", 1)[-1])
def test_a_bad_batch_changes_nothing(table):
    state = TableState(load_reducer("count"), table)
    state.apply(("a", "b"), (1, 2))
    with pytest.raises(InvalidArgument):
        state.apply(("a", "c"), (1, 1.5))          # a count takes ints only
    with pytest.raises(InvalidArgument):
        state.apply(("a",), (1, 2))
    with pytest.raises(InvalidKey):
        state.apply(("a", 1.5), (1, 1))
    assert state.snapshot() == {"a": 1, "b": 2}


@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.__module__.rsplit(".", 1)[-1])
def test_columns_count_exactly_in_one_call(table):
    words = [f"w{i % 97}" for i in range(5000)] + ["ü"] * 3
    state = TableState(load_reducer("count"), table)
    for start in range(0, len(words), 1000):
        chunk = words[start:start + 1000]
        state.apply_columns(decode_batch(encode_batch(chunk, [1] * len(chunk)), len(chunk)))
    cols = decode_batch(encode_batch(["w1", "w2", "w3"], [1, 1, 1]), 3)
    state.apply_columns(cols, start=2)                  # the first two: duplicates
    assert state.snapshot() == Counter(words) + Counter(["w3"])
    assert state.swap() == Counter(words) + Counter(["w3"])


def test_column_positions_are_checked_against_the_range():
    cols = decode_batch(encode_batch(["a", "b", "c"], [1, 1, 1]), 3)
    ps = sorted(cols.positions)
    check_positions(cols, (ps[0] - 1, ps[-1]), 5)
    check_positions(cols, (ps[-1], ps[-1]), 5)                  # the whole ring
    check_positions(cols, (ps[1] - 1, ps[0]), 5)                # wrapping, all inside
    with pytest.raises(InvalidArgument, match="does not belong to token 5"):
        check_positions(cols, (ps[0], ps[-1]), 5)
    with pytest.raises(InvalidArgument, match="does not belong"):
        check_positions(cols, (ps[1], ps[0]), 5)                # wrapping, ps[1]'s key out
    assert [ColumnKeys(cols)[i] for i in range(3)] == ["a", "b", "c"]
    assert marked_keys(cols) == ()


@pytest.mark.skipif(columnar.KERNEL != "compiled", reason="ranges keep dicts without the extension")
def test_a_replica_copy_is_a_table_a_takeover_adopts_as_it_is():
    from floering.node.core.batch import encode_payload
    from floering.node.core.backup_store import BackupEntry
    from floering.node.core.ranges import ReplicaSide
    from floering.node.core.table_state import TableCopy, new_state

    side = ReplicaSide(load_reducer("count"))
    side.apply_checkpoint(5, "p", 1, 0, True, {"a": 3, "b": 1}, {"s": 4})
    side.apply_checkpoint(5, "p", 2, 1, False, {"b": 2, "c": 7}, {"s": 6})
    side.store(5, "p", "s", BackupEntry(7, 8, 2, encode_payload(["a", "d"], [1, 1]), b"", 0.0))
    copy = side.ranges[5].copy
    assert isinstance(copy, TableCopy) and copy.master == {"a": 3, "b": 2, "c": 7}
    table = copy.state.table
    state = new_state(load_reducer("count"))
    _, marks = side.rebuild(5, into=state)
    assert state.table is table                       # taken over, not copied
    assert state.snapshot() == {"a": 4, "b": 2, "c": 7, "d": 1} and marks == {"s": 8}
    side.adopt_copy(5, "q", state, marks)             # handed away: kept as the copy
    assert side.ranges[5].copy.state.table is table and side.ranges[5].copy.master == \
        {"a": 4, "b": 2, "c": 7, "d": 1}
