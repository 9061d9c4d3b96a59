"""The mapper's combiner kernel, compiled (mapper/ccombine.pyx) and pure Python
(mapper/pycombine.py): exact against a Counter, byte for byte the same payloads, and a
client that sends format 2 to nodes that say they decode it."""

from __future__ import annotations

import os
import random
from array import array
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from floering.mapper import pycombine
from floering.mapper.batching import MAX_KEY_BYTES, batcher_for
from floering.mapper.combining import COMBINE_KERNEL, CombiningBatcher, ColumnBuffer
from floering.node.core.batch import Columns, decode_batch, formats_said, is_versioned
from floering.wire.errors import InvalidKey
from floering.wire.hashing import position
from floering.wire.pieces import COMBINED_SOURCE
from floering.node.core.reducers import reducer_identity
from floering.wire.ring import Ring

try:
    from floering.mapper import ccombine
except ImportError:
    ccombine = None

KERNELS = [pycombine] + ([ccombine] if ccombine is not None else [])
PURE = os.environ.get("FLOE_PURE", "") not in ("", "0")
FOLD = {"count": lambda a, b: a + b, "sum": lambda a, b: a + b, "min": min, "max": max}
WORDS = [f"w{i}" for i in range(300)] + ["héllo", "日本語", "", "ß" * 40, "x" * 300]


def test_the_compiled_kernel_runs_unless_asked_for_pure_python():
    assert COMBINE_KERNEL == ("python" if PURE or ccombine is None else "compiled")
    if not PURE:
        assert ccombine is not None, "the compiled combiner is not built (bash scripts/setup.sh)"


def fold_all(kernel, op, tokens, keys, value, values, size, most, form):
    """Fold keys through a combiner as the batcher does: (token index, payload, keys,
    tuples) of every part taken, full ones as they fill, then the rest."""
    combiner = kernel.Combiner(op, tokens, MAX_KEY_BYTES)
    out, i = [], 0
    while True:
        i, t, status = combiner.fold(keys, i, value, values, size, most)
        if status == kernel.DONE:
            break
        assert status in (kernel.FULL, kernel.OVERFLOW)
        out.append((t,) + combiner.take(t, form))
    for t in combiner.opened:
        if combiner.count(t)[0]:
            out.append((t,) + combiner.take(t, form))
    return out


@pytest.mark.parametrize("op", sorted(FOLD))
@pytest.mark.parametrize("form", [1, 2])
def test_both_kernels_fold_exactly_and_give_the_same_bytes(op, form):
    rng = random.Random(f"{op}{form}")
    tokens = sorted({rng.getrandbits(64) for _ in range(7)})
    for trial in range(6):
        keys = [rng.choice(WORDS) for _ in range(rng.randrange(1, 4000))]
        values = None if trial % 2 else array("q", [rng.randrange(-10**6, 10**6)
                                                    for _ in keys])
        value = rng.randrange(-5, 6)
        size, most = rng.choice([1, 3, 50, 10_000]), rng.choice([1, 7, 1000, 1 << 40])
        runs = [fold_all(k, op, tokens, keys, value, values, size, most, form)
                for k in KERNELS]
        assert all(run == runs[0] for run in runs[1:])      # the very same payloads
        expect: dict = {}
        for i, key in enumerate(keys):
            v = values[i] if values is not None else value
            expect[key] = FOLD[op](expect[key], v) if key in expect else v
        got: dict = {}
        inputs = 0
        for t, payload, count, folded in runs[0]:
            assert is_versioned(payload) == (form == 2) and 0 < count <= size
            assert folded <= most
            inputs += folded
            decoded = decode_batch(payload, count)
            assert isinstance(decoded, Columns) == (form == 2)
            batch_keys, states = decoded.to_tuples() if form == 2 else decoded
            for key, state in zip(batch_keys, states):
                index = next((j for j, tok in enumerate(tokens) if tok >= position(key)), 0)
                assert index == t                 # routed to its token
                got[key] = FOLD[op](got[key], state) if key in got else state
        assert got == expect and inputs == len(keys)


def test_a_combining_batcher_counts_exactly_and_seals_a_sum_before_it_leaves_int64():
    ring = Ring.initial({"a": "h:1", "b": "h:2"}, 1, 4, reducer=reducer_identity("sum", {}))
    batcher = batcher_for(_Delivery(ring, columns=True), "m", False, 100, 1)
    assert isinstance(batcher, CombiningBatcher)
    big = (1 << 62) + 12345
    keys = ["a", "b", "a", "c"] * 5
    batcher.emit_many(keys, big)
    batcher.emit_many(["a"] * 3, -7)
    assert all(type(b) is ColumnBuffer for b in batcher.buffers.values())
    batcher.seal_all()
    got: Counter = Counter()
    for batch in batcher.sealed:
        assert batch.source.startswith(COMBINED_SOURCE) and is_versioned(batch.payload)
        batch_keys, states = decode_batch(batch.payload, batch.count).to_tuples()
        for key, state in zip(batch_keys, states):
            got[key] += state
    expect = Counter({k: n * big for k, n in Counter(keys).items()})
    expect["a"] -= 21
    assert got == expect


def test_keys_the_kernel_cannot_take_are_refused_as_the_dict_path_refuses_them():
    ring = Ring.initial({"a": "h:1"}, 0, 4, reducer=reducer_identity("count", {}))
    batcher = batcher_for(_Delivery(ring, columns=True), "m", False, 100, 1)
    with pytest.raises(InvalidKey, match="UTF-8"):
        batcher.emit_many(["ok", "bad\ud800"], 1)
    with pytest.raises(InvalidKey, match="over the limit"):
        batcher.emit_many(["x" * (MAX_KEY_BYTES + 1)], 1)
    assert not batcher.buffers and not batcher.sealed       # nothing folded
    batcher.emit_many([1, 2, 1], 1)         # an int key: the dict path, the other sealed
    assert {type(b).__name__ for b in batcher.buffers.values()} == {"StateBuffer"}


def test_a_node_that_says_no_formats_is_sent_format_1():
    assert formats_said(None) == formats_said(()) == {1}
    assert formats_said((("floe-payload-formats", "1,2"),)) == {1, 2}
    assert formats_said((("floe-payload-formats", "junk"),)) == {1}


class _Delivery:
    def __init__(self, ring, columns: bool) -> None:
        self.ring = ring
        self.on_ring_change = None
        self.columns = columns

    def speaks_columns(self) -> bool:
        return self.columns


@pytest.mark.parametrize("columns", [False, True])
def test_every_tuple_sent_through_the_append_kernel_makes_the_batches_the_dict_path_makes(
        columns):
    """The same tuples emitted as a list (the append kernel) and as a tuple (Python
    lists per token): the very same batches, seqs and payload bytes."""
    from floering.mapper.batching import AppendBuffer, Batcher
    from floering.mapper.routing import Router

    rng = random.Random(3)
    ring = Ring.initial({"a": "h:1", "b": "h:2", "c": "h:3"}, 1, 8)
    keys = [rng.choice(WORDS) for _ in range(5000)]
    made = []
    for bulk in (list, tuple):
        batcher = Batcher(Router(ring), None, "m", 64, first_seq=7, columnar=columns)
        for i in range(0, len(keys), 700):
            batcher.emit_many(bulk(keys[i:i + 700]), 3)
            if bulk is list:
                batcher.emit("one", -2)
            else:
                batcher.emit_many(("one",), -2)
            if bulk is list:
                assert all(type(b) is AppendBuffer for b in batcher.buffers.values())
        batcher.seal_all()
        made.append([(b.token, b.first_seq, b.last_seq, b.count, b.payload, b.seqs)
                     for b in batcher.sealed])
    assert made[0] == made[1]
    assert all(is_versioned(b[4]) == columns for b in made[0])


KEYS = st.one_of(st.text(max_size=12), st.sampled_from(["bad\ud800", "\udfff", "ß" * 5]),
                 st.integers(), st.binary(max_size=4), st.none(), st.booleans())


@settings(max_examples=300, deadline=None)
@given(st.lists(KEYS, max_size=30), st.integers(min_value=0, max_value=12))
def test_both_kernels_find_the_same_first_key_they_refuse(keys, most):
    """check_keys: the first key that is not a str, not UTF-8 or over `most` bytes, as
    fold stops at it, alike compiled and pure (and nothing past it looked at)."""
    said = {kernel.__name__: kernel.check_keys(keys, most) for kernel in KERNELS}
    expect = (len(keys), pycombine.DONE)
    for i, key in enumerate(keys):
        if type(key) is not str:
            expect = (i, pycombine.NOT_STR)
        elif not key.encode(errors="surrogatepass").decode(errors="ignore") == key:
            expect = (i, pycombine.BAD_KEY)
        elif len(key.encode()) > most:
            expect = (i, pycombine.LONG_KEY)
        else:
            continue
        break
    assert set(said.values()) == {expect}, said


@pytest.mark.parametrize("columns", [False, True])
def test_a_list_is_folded_in_place_in_chunks_as_an_iterator_of_it_is(monkeypatch, columns):
    """emit_many of a list (folded where it lies, CHUNK keys a call) and of an
    iterator over the same keys (copied out CHUNK at a time): the same batches, byte
    for byte, exact against a Counter; the caller's list is left as it was."""
    from floering.mapper import combining

    monkeypatch.setattr(combining, "CHUNK", 97)
    rng = random.Random(5)
    ring = Ring.initial({"a": "h:1", "b": "h:2"}, 1, 4, reducer=reducer_identity("count", {}))
    keys = [rng.choice(WORDS) for _ in range(3000)]
    made = []
    for bulk in (list, iter):
        batcher = batcher_for(_Delivery(ring, columns=columns), "m", False, 50, 1)
        given_keys = bulk(list(keys))
        for _ in range(2):
            batcher.emit_many(given_keys if bulk is list else iter(keys), 2)
        assert bulk is iter or given_keys == keys
        batcher.seal_all()
        made.append([(b.token, b.first_seq, b.count, b.inputs, b.payload)
                     for b in batcher.sealed])
    assert made[0] == made[1]
    got: Counter = Counter()
    for token, first, count, inputs, payload in made[0]:
        decoded = decode_batch(payload, count)
        batch_keys, states = decoded.to_tuples() if isinstance(decoded, Columns) else decoded
        got.update(dict(zip(batch_keys, states)))
    assert got == Counter({k: 4 * n for k, n in Counter(keys).items()})


def test_every_tuple_sent_a_list_with_a_key_the_kernel_refuses_buffers_none_of_it():
    from floering.mapper.batching import AppendBuffer, Batcher, Buffer
    from floering.mapper.routing import Router

    batcher = Batcher(Router(Ring.initial({"a": "h:1"}, 0, 4)), None, "m", 100)
    with pytest.raises(InvalidKey, match="UTF-8"):
        batcher.emit_many(["ok", "bad\ud800"], 1)
    with pytest.raises(InvalidKey, match="over the limit"):
        batcher.emit_many(["ok", "x" * (MAX_KEY_BYTES + 1)], 1)
    assert not batcher.buffers and not batcher.sealed
    batcher.emit_many(["ok", "fine"], 1)
    assert {type(b) for b in batcher.buffers.values()} == {AppendBuffer}
    batcher.emit_many(["ok", 7], 1)         # an int key: Python lists, the other sealed
    assert {type(b) for b in batcher.buffers.values()} == {Buffer}
