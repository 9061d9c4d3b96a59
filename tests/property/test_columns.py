"""Payload format 2 (columns): round trips, every malformed case refused whole, a fuzzed
decoder that never crashes and never accepts garbage, and the mapper's choice of format."""

from array import array
from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from floering.mapper.outbox import Outbox, PendingBatch
from floering.mapper.batching import Batcher
from floering.mapper.routing import Router
from floering.node.core.batch import (Limits, decode_batch, decode_payload, encode_batch,
                                      encode_payload, encode_seqs)
from floering.node.core.columns import (BYTES, STR, Columns, decode_columns,
                                        decode_columns_steps, encode_columns, is_versioned)
from floering.wire.errors import InvalidArgument, InvalidKey
from floering.wire.hashing import position
from floering.wire.pieces import piece_key
from floering.node.core.ranges import PrimaryRange, drain
from floering.node.core.reducers import load_reducer
from floering.wire.ring import Ring
from tests.support.columns_shared import KEYS, MALFORMED, VALUES, fields, pack


@pytest.mark.parametrize("keys, values", [
    (["a", "b", "a"], [1, 2, 3]),
    (["", "é", "日本語", "x" * 1000], [0, -1, 2 ** 63 - 1, -(2 ** 63)]),
    ([b"\x00\xff", b"", b"raw"], [5, 6, 7]),
    (["s", b"b", "t"], [1, 1, 1]),                          # kinds per tuple
    ([piece_key("hot", 3), b"x"], [1, 2]),                  # a well-formed piece
])
def test_round_trip(keys, values):
    payload = encode_batch(keys, values)
    assert is_versioned(payload)
    columns = decode_batch(payload, len(keys))
    assert isinstance(columns, Columns)
    assert columns.to_tuples() == (tuple(keys), tuple(values))
    assert list(columns.positions) == [position(k) for k in keys]
    assert decode_payload(payload, len(keys)) == (tuple(keys), tuple(values))
    assert payload == pack(fields(keys, values, None if len(set(map(type, keys))) == 1
                                  else bytes(STR if type(k) is str else BYTES for k in keys)))


@pytest.mark.parametrize("keys, values", [
    ([1, 2], [1, 1]),                  # int keys
    (["a", 1], [1, 1]),                # mixed kinds
    (["a"], [1.5]),                    # not an int
    (["a"], [True]),                   # a bool is not a count
    (["a"], [2 ** 63]),                # past int64
    (["a"], [[1, 2]]),                 # a state
])
def test_what_does_not_fit_keeps_format_1(keys, values):
    assert encode_columns(keys, values) is None
    payload = encode_batch(keys, values)
    assert payload == encode_payload(keys, values) and not is_versioned(payload)


def test_a_str_that_is_not_utf8_is_not_columns():
    assert encode_columns(["ok", "\udc80"], [1, 1]) is None


def test_a_batch_too_big_as_columns_goes_as_format_1():
    keys = [f"key-{i:020d}" for i in range(100_000)]          # 2.6 MB as format 1
    assert len(encode_columns(keys, [1] * len(keys))) > Limits().max_batch_bytes
    assert not is_versioned(encode_batch(keys, [1] * len(keys)))


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_is_refused_whole_saying_why(name):
    payload, words = MALFORMED[name]
    count = 1 if name in ("invalid UTF-8", "a surrogate", "reserved mark", "malformed piece",
                          "key over the limit") else 2 if name == "key cuts a character" else 3
    with pytest.raises(InvalidArgument) as refused:
        decode_batch(payload, count)
    assert words.lower() in str(refused.value).lower()
    rng = PrimaryRange(1, load_reducer("count"))
    with pytest.raises(InvalidArgument):
        rng.apply("s", 1, count, count, payload, b"")
    assert dict(rng.state.snapshot()) == {} and rng.watermarks == {}


@pytest.mark.parametrize("name", sorted(MALFORMED) + ["good", "good, not ascii"])
def test_decoding_in_steps_reads_or_refuses_as_decoding_whole(name):
    """decode_columns_steps: four steps, the same Columns or the same refusal."""
    if name.startswith("good"):
        keys = KEYS if name == "good" else ["\u00e9t\u00e9", "b", "\u4e2d"]
        payload, count = encode_columns(keys, [1, -2, 3]), 3
    else:
        payload, words = MALFORMED[name]
        count = 1 if name in ("invalid UTF-8", "a surrogate", "reserved mark",
                              "malformed piece", "key over the limit") \
            else 2 if name == "key cuts a character" else 3
    most = Limits().max_key_bytes
    steps = decode_columns_steps(payload, count, most)
    try:
        whole = decode_columns(payload, count, most)
    except InvalidArgument as exc:
        with pytest.raises(type(exc)) as refused:
            drain(steps)
        assert str(refused.value) == str(exc)
    else:
        taken = 0
        while True:
            try:
                next(steps)
            except StopIteration as done:
                assert done.value == whole and taken == 3
                break
            taken += 1


def test_the_count_must_agree():
    payload = encode_batch(KEYS, VALUES)
    for count in (2, 4):
        with pytest.raises(InvalidArgument, match="tuples need"):
            decode_batch(payload, count)


def test_format_1_key_and_value_limits():
    limits = Limits(max_key_bytes=100, max_value_bytes=200)
    assert decode_payload(encode_payload(["é" * 50, 7], [1, 2]), 2, limits)
    with pytest.raises(InvalidKey, match="of 101 bytes,? is over the limit of 100"):
        decode_payload(encode_payload(["é" * 50 + "x", 7], [1, 2]), 2, limits)
    with pytest.raises(InvalidKey, match="limit"):
        decode_payload(encode_payload([b"k" * 101], [1]), 1, limits)
    assert decode_payload(encode_payload(["k"], [[1] * 150]), 1, limits)
    with pytest.raises(InvalidArgument, match="value of .* bytes is over the limit of 200"):
        decode_payload(encode_payload(["k"], [[1] * 250]), 1, limits)
    with pytest.raises(InvalidKey, match="limit"):
        decode_batch(encode_batch(["k" * 101], [1]), 1, limits)


@pytest.mark.parametrize("at", [0, 1, 37, 99, 100])
def test_one_key_over_the_limit_anywhere_among_many_is_found(at):
    limits = Limits(max_key_bytes=100)
    keys = [("k" * (i % 101)) for i in range(101)]          # up to exactly the limit
    assert decode_batch(encode_batch(keys, [1] * 101), 101, limits).to_tuples()[0] == \
        tuple(keys)
    keys[at] = "é" * 50 + "x"                                # 101 bytes
    with pytest.raises(InvalidKey, match="of 101 bytes,? is over the limit of 100"):
        decode_batch(encode_batch(keys, [1] * 101), 101, limits)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(1, 8))
def test_random_bytes_after_the_mark_are_refused(body, count):
    with pytest.raises(InvalidArgument):
        decode_batch(b"\xc1\x02" + body, count)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=8), st.binary(max_size=8)), min_size=1,
                max_size=20),
       st.data())
def test_a_flipped_byte_is_refused_or_decodes_to_consistent_columns(keys, data):
    """Any one byte of a good payload changed: the decoder refuses it, or what it
    accepts is well formed: positions are the keys' hashes, and with one kind for the
    batch it is exactly the encoding of the tuples it decodes to (a value or a kind
    changed, never a key cut differently)."""
    keys = [k for k in keys if not (type(k) is bytes and k.startswith(b"\x00floe:"))] or ["k"]
    values = data.draw(st.lists(st.integers(-(2 ** 63), 2 ** 63 - 1), min_size=len(keys),
                                max_size=len(keys)))
    payload = bytearray(encode_batch(keys, values))
    at = data.draw(st.integers(0, len(payload) - 1))
    payload[at] ^= data.draw(st.integers(1, 255))
    try:
        columns = decode_batch(bytes(payload), len(keys))
    except InvalidArgument:
        return
    assert isinstance(columns, Columns)        # a flipped mark is never a format 1 batch
    got_keys, got_values = columns.to_tuples()
    assert len(got_keys) == len(got_values) == len(keys)
    assert list(columns.positions) == [position(k) for k in got_keys]
    if len(columns.kinds) == 1:
        assert encode_batch(list(got_keys), list(got_values)) == bytes(payload)


# ------------------------------------------------------------------- mapper

RING = Ring.initial({"a": "127.0.0.1:1", "b": "127.0.0.1:2"}, 1, 4)


def sealed(keys, value=1):
    batcher = Batcher(Router(RING), None, "src", batch_size=50, columnar=True)
    batcher.emit_many(keys, value)
    batcher.seal_all()
    return list(batcher.sealed)


def test_the_mapper_sends_str_keys_and_int_values_as_columns():
    words = [f"w{i % 37}" for i in range(500)]
    batches = sealed(words)
    assert batches and all(is_versioned(b.payload) for b in batches)
    got = Counter()
    for b in batches:
        keys, values = decode_payload(b.payload, b.count)
        assert all(RING.token_for_key(k) == b.token for k in keys)
        for k, v in zip(keys, values):
            got[k] += v
    assert got == Counter(words)
    assert not any(is_versioned(b.payload) for b in sealed([1, 2, 3]))
    assert not any(is_versioned(b.payload) for b in sealed(words, 1.5))


def test_a_split_keeps_columns_and_its_parts_exact():
    words = [f"w{i}" for i in range(40)]
    token = RING.tokens[0]
    batch = PendingBatch(1, token, "s", 1, 40, 40, encode_batch(words, list(range(40))),
                         encode_seqs(list(range(1, 41))), tokens=())
    outbox = Outbox()
    parts = outbox.resplit(batch, RING)
    assert parts and all(is_versioned(p.payload) for p in parts)
    back = {}
    for p in parts:
        keys, values = decode_payload(p.payload, p.count)
        assert all(RING.token_for_key(k) == p.token for k in keys)
        back.update(zip(keys, values))
    assert back == dict(zip(words, range(40)))


def test_a_primary_applies_columns_exactly():
    rng = PrimaryRange(1, load_reducer("count"))
    words = [f"w{i % 11}" for i in range(300)]
    rng.apply("s", 1, 300, 300, encode_batch(words, [1] * 300), b"")
    assert rng.apply("s", 1, 300, 300, encode_batch(words, [1] * 300), b"") == (0, 300)
    assert dict(rng.state.snapshot()) == Counter(words)


@pytest.mark.parametrize("mixed", [False, True])
def test_keys_hashed_in_bulk_route_as_one_by_one(mixed):
    """str keys alone go through the append kernel; with an int key among them, the
    str keys are hashed in bulk into the router's cache."""
    words = [f"w{i}" for i in range(3000)] + ["é", "日本", ""] + [f"w{i}" for i in range(100)]
    words += [7] if mixed else []
    router = Router(RING)
    batcher = Batcher(router, None, "src", batch_size=10_000, columnar=True)
    batcher.emit_many(words, 1)
    if mixed:
        assert len(router.cache) == len(set(words))
        assert all(router.cache[k] == RING.token_for_key(k) for k in words)
    batcher.seal_all()
    got = Counter()
    for b in batcher.sealed:
        keys, values = decode_payload(b.payload, b.count)
        assert all(RING.token_for_key(k) == b.token for k in keys)
        got.update(keys)
    assert got == Counter(words)


def test_a_key_that_cannot_be_hashed_in_bulk_is_refused_as_before():
    batcher = Batcher(Router(RING), None, "src", batch_size=10_000, columnar=True)
    with pytest.raises(InvalidKey):
        batcher.emit_many([f"w{i}" for i in range(200)] + ["\udc80"], 1)


def test_the_mapper_refuses_a_key_over_the_nodes_limit_before_buffering_it():
    batcher = Batcher(Router(RING), None, "src", batch_size=10_000, columnar=True)
    long = "é" * (32 * 1024) + "x"                            # 64 KiB + 1 byte
    with pytest.raises(InvalidKey, match="over the limit"):
        batcher.emit_many(["a", "b", long, "c"], 1)
    with pytest.raises(InvalidKey, match="over the limit"):
        batcher.emit(long.encode(), 1)
    assert not batcher.buffers and batcher.next_seq == 1       # nothing taken
    batcher.emit_many(["a", "é" * (32 * 1024)], 1)             # exactly the limit
    assert batcher.next_seq == 3


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 6), st.data())
def test_well_sized_random_fields_are_refused(count, data):
    """Five bin fields of exactly the sizes `count` needs, with random contents: at
    least one check fails (offsets, positions that are not hashes), unless they happen
    to be well formed (empty keys hash to 0), and then they are exactly the encoding of
    what they decode to."""
    key_data = data.draw(st.binary(max_size=40))
    f = [data.draw(st.sampled_from([b"\x00", b"\x01"])), key_data,
         data.draw(st.binary(min_size=8 * (count + 1), max_size=8 * (count + 1))),
         data.draw(st.binary(min_size=8 * count, max_size=8 * count)),
         data.draw(st.binary(min_size=8 * count, max_size=8 * count))]
    try:
        columns = decode_batch(pack(f), count)
    except InvalidArgument:
        return
    assert encode_batch(*map(list, columns.to_tuples())) == pack(f)
    assert list(columns.positions) == [position(k) for k in columns.keys()]


def test_the_decode_bench_runs_every_case(capsys):
    from floering.chaos.decode_bench import run
    rates = run(3000, 500, 1)
    assert set(rates) == {f"format {f} {what}" for f in (1, 2)
                          for what in ("encode", "decode", "decode+apply dict")} | \
        {"format 2 decode+apply table"}
    assert all(rate > 0 for rate in rates.values())
    assert "payload bytes a tuple" in capsys.readouterr().out


def test_columns_apply_to_the_compiled_table_exactly():
    from floering.node.core.columnar import StateTable
    words = [f"w{i % 97}" for i in range(5000)] + ["é", "日本", ""] * 7
    table = StateTable("count")
    for i in range(0, len(words), 700):
        chunk = words[i:i + 700]
        c = decode_batch(encode_batch(chunk, [1] * len(chunk)), len(chunk))
        table.apply(c.table_kinds(), c.key_data, c.offsets, c.positions, c.values)
    assert {k: table.get(k) for k in set(words)} == Counter(words)
    assert len(table) == len(set(words))
