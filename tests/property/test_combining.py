"""Combining on the mapper: batches of partial states, pure (no nodes), against the
same tuples sent uncombined."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from floering.mapper.batching import Batcher, batcher_for
from floering.mapper.combining import CombiningBatcher, combiner_for
from floering.mapper.routing import Router
from floering.mapper.sharing import chooser_for
from floering.wire.balancers import balancer
from floering.node.core.batch import decode_payload, decode_seqs
from floering.wire.errors import InvalidArgument, UnknownReducer
from floering.wire.pieces import COMBINED_SOURCE, merge_pieces
from floering.node.core.reducers import (BUILTINS, Reducer, load_reducer, reducer_from_identity,
                                reducer_identity)
from floering.wire.ring import Ring
from tests.support.combining_shared import applied

MEMBERS = {"a": "h:1", "b": "h:2", "c": "h:3"}
ARGS = {"count": {}, "sum": {}, "min": {}, "max": {}, "topk": {"k": 3},
        "window": {"window_seconds": 5.0, "bucket_seconds": 1}}


def ring_of(spec="count", kwargs=None, balancer_name="none"):
    return Ring.initial(MEMBERS, 1, 4, balancer=balancer_name,
                        reducer=reducer_identity(spec, kwargs or {}))


class FakeDelivery:
    def __init__(self, ring):
        self.ring = ring
        self.on_ring_change = None


def combining(ring, batch_size=1000):
    batcher = batcher_for(FakeDelivery(ring), "m1", False, batch_size, 1)
    assert isinstance(batcher, CombiningBatcher)
    return batcher


def sealed(batcher):
    batcher.seal_all()
    out = []
    batcher.drain(out.append)
    return out


def totals(batches, reducer):
    """key -> the merge of every state the batches carry for it."""
    held: dict = {}
    for b in batches:
        keys, states = decode_payload(b.payload, b.count)
        for k, s in zip(keys, states):
            held[k] = reducer.merge(held[k], s) if k in held else s
    return held


class NoMerge(Reducer):
    def initial(self):
        return 0

    def reduce(self, key, value, state):
        return state + value


def test_every_builtin_reducer_loads_back_from_the_identity_a_ring_records():
    for spec, kwargs in ARGS.items():
        reducer = reducer_from_identity(reducer_identity(spec, kwargs))
        assert type(reducer) is BUILTINS[spec]
        assert {k: getattr(reducer, {"window_seconds": "window",
                                     "bucket_seconds": "bucket"}.get(k, k))
                for k in kwargs} == kwargs
    for bad in ("count(k=", "count(1)", "count(k=os.system('x'))", "no.such:Thing()"):
        with pytest.raises(UnknownReducer):
            reducer_from_identity(bad)


def test_only_a_loadable_reducer_with_a_merge_combines():
    assert combiner_for(reducer_identity("count", {})) is not None
    assert combiner_for("") is None
    assert combiner_for("no.such.module:Reducer()") is None
    assert combiner_for(f"{__name__}:NoMerge()") is None
    ring = Ring.initial(MEMBERS, 1, 4, reducer=f"{__name__}:NoMerge()")
    assert type(batcher_for(FakeDelivery(ring), "m1", False, 10, 1)) is Batcher
    # a named source may be replayed by another process: never combined
    assert type(batcher_for(FakeDelivery(ring_of()), "task#1", True, 10, 1)) is Batcher
    assert type(batcher_for(FakeDelivery(ring_of()), "m1", False, 10, 1,
                            combine=False)) is Batcher


def test_a_combined_batch_holds_one_state_per_key_under_fresh_contiguous_seqs():
    ring = ring_of()
    batcher = combining(ring)
    words = ["the", "a", "the", "of", "the", "a"] * 100 + [f"w{i}" for i in range(50)]
    batcher.emit_many(words, 1)
    batcher.emit("the", 5)
    batches = sealed(batcher)
    assert all(b.source.startswith(COMBINED_SOURCE) for b in batches)
    expect = Counter(words)
    expect["the"] += 5
    assert totals(batches, load_reducer("count")) == expect
    assert sum(b.inputs for b in batches) == len(words) + 1
    assert sum(b.count for b in batches) < len(words) // 5
    seqs = [s for b in batches for s in decode_seqs(b.first_seq, b.last_seq, b.count, b.seqs)]
    assert len(set(seqs)) == len(seqs)
    for b in batches:             # each batch's keys are its token's
        keys, _ = decode_payload(b.payload, b.count)
        assert {ring.token_for_key(k) for k in keys} == {b.token}
    later = sealed(batcher) or (batcher.emit("x", 1), sealed(batcher))[1]
    assert later[0].first_seq > max(seqs)


def test_buffers_are_sealed_at_batch_size_keys_or_at_their_tuple_bound():
    batcher = combining(ring_of(), batch_size=4)
    assert batcher.emit_many([f"k{i}" for i in range(400)], 1)
    assert all(b.count <= 4 for b in sealed(batcher))
    # one hot key: sealed after max_inputs tuples, not held back for ever
    for _ in range(3):
        assert not batcher.emit("hot", 1)
    assert batcher.emit_many(["hot"] * batcher.max_inputs, 1)
    # sealed already, before any linger, at the bound; the 3 tuples past it wait
    assert [(b.count, b.inputs) for b in batcher.sealed] == [(1, batcher.max_inputs)]
    assert [(b.count, b.inputs) for b in sealed(batcher)] == [(1, batcher.max_inputs), (1, 3)]


def test_a_bad_value_or_key_is_refused_at_emit_and_folds_nothing():
    batcher = combining(ring_of())
    with pytest.raises(InvalidArgument):
        batcher.emit_many(["a", "b"], "1")          # a count takes integers
    with pytest.raises(InvalidArgument):
        batcher.emit("a", 1.5)
    with pytest.raises(Exception, match="key must be"):
        batcher.emit_many(["a", 1.5], 1)
    assert not sealed(batcher) or True
    batcher.emit("a", 2)
    assert totals(sealed(batcher), load_reducer("count")) == {"a": 2}


def test_rebinding_to_a_named_source_sends_it_uncombined():
    ring = ring_of()
    batcher = combining(ring)
    batcher.emit_many(["x", "x"], 1)
    sealed(batcher)
    batcher.rebind("task#3", 1, ring)
    batcher.emit_many(["x", "x", "y"], 1)
    batches = sealed(batcher)
    assert {b.source for b in batches} == {"task#3"}
    assert sum(b.count for b in batches) == 3


def test_a_sharing_ring_combines_per_piece_and_reads_merge_them_whole():
    ring = ring_of(balancer_name="pkg")
    batcher = combining(ring)
    words = ["hot"] * 5000 + [f"w{i % 300}" for i in range(3000)]
    batcher.emit_many(words, 1)
    reducer = load_reducer("count")
    held = totals(sealed(batcher), reducer)
    assert any(k != "hot" and isinstance(k, bytes) for k in held)   # pieces were used
    assert dict(merge_pieces(held.items(), reducer.merge)) == Counter(words)


VALUES = {"count": st.integers(0, 5), "sum": st.integers(-5, 5),
          "min": st.integers(-50, 50), "max": st.floats(-1e3, 1e3),
          "topk": st.integers(0, 20), "window": st.integers(0, 12)}


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(ARGS)), st.data())
def test_combined_tuples_end_in_the_states_uncombined_ones_reach(spec, data):
    """What the node holds after a combining mapper's batches (each sent twice) equals
    what it holds after the same tuples sent one by one."""
    emits = data.draw(st.lists(st.tuples(st.lists(st.sampled_from("abcdefgh"), min_size=1,
                                                  max_size=30), VALUES[spec]),
                               min_size=1, max_size=12))
    batch_size = data.draw(st.integers(1, 6))
    ring = ring_of(spec, ARGS[spec])
    reducer = load_reducer(spec, **ARGS[spec])
    combined = CombiningBatcher(Router(ring), None, "m1", batch_size, reducer, max_inputs=7)
    plain = Batcher(Router(ring), chooser_for(balancer("none"), replayable=False), "m2",
                    batch_size)
    for keys, value in emits:
        combined.emit_many(keys, value)
        plain.emit_many(keys, value)
    assert applied(sealed(combined), reducer) == applied(sealed(plain), reducer, False)


def test_a_caller_may_not_name_its_source_as_one_that_carries_states():
    from floering.mapper import RingClient
    for source in ("combined:mine", "fold:abc"):
        with pytest.raises(ValueError, match="reserved"):
            RingClient(["127.0.0.1:1"], source=source)


def test_a_combining_client_holds_4096_keys_a_token_by_default_and_1000_tuples_else():
    from floering.mapper.common import BATCH_TUPLES, COMBINED_BATCH_KEYS, ClientBase

    def batch_size(source=None, combine=True, size=None):
        return ClientBase(["127.0.0.1:1"], source, size, 0.05, 8, 8, 1.0, 1.0, None, None,
                          combine).batch_size
    assert (COMBINED_BATCH_KEYS, BATCH_TUPLES) == (4096, 1000)
    assert batch_size() == 4096
    assert batch_size(combine=False) == 1000
    assert batch_size(source="named") == 1000          # a named source is sent uncombined
    assert batch_size(size=300) == batch_size(combine=False, size=300) == 300
    batcher = combining(ring_of(), batch_size=batch_size())
    keys = [f"k{i}" for i in range(20 * 4096)]      # 12 tokens: some fill
    batcher.emit_many(keys + keys[:5000], 1)
    batches = sealed(batcher)
    assert max(b.count for b in batches) == 4096 and len(batches) > 12
    assert totals(batches, load_reducer("count")) == Counter(keys + keys[:5000])
