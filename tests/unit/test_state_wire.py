"""Frames of column states (node.core.state_wire): what a range's full copy and a
checkpoint's delta travel as. Round trips, a decoder fed hostile frames, the pure and
the compiled node writing and reading the same bytes, and a range cut by the table
over its positions."""

from __future__ import annotations

import hashlib
import json
import os
import random
import struct
import subprocess
import sys
from collections import Counter

import pytest

from floering.node.core.columnar import KERNEL
from floering.wire.errors import InvalidArgument
from floering.node.core.ranges import FullStates, PrimaryRange
from floering.node.core.reducers import load_reducer
from floering.node.core.state_wire import (HEADER_BYTES, MAGIC, StateColumns, StateRun,
                                           decode, encode_frame, encode_pairs, is_frame,
                                           plan)
from floering.node.core.table_state import TableCopy, TableState
from floering.node.transport.chunking import Reassembly, whole_states

compiled = pytest.mark.skipif(KERNEL != "compiled", reason="the state table is not built")


def frames_of(states, entries=100, nbytes=1 << 20) -> list[bytes]:
    return [piece.encode() for piece in plan(states, entries, nbytes)]


def read_back(frames) -> dict:
    out: dict = {}
    for frame in frames:
        out.update(decode(frame).to_dict())
    return out


def test_entries_of_every_kind_go_round_the_frame():
    keys = ["a", "é", b"\x00raw", 7, -12, 10 ** 30, (1, "t"), "f", "big", "none"]
    states = [1, 2, 3, 4, 5, 6, 7, 1.5, 1 << 70, None]
    frame = encode_pairs(keys, states)
    assert is_frame(frame) and frame[:3] == MAGIC
    got = decode(frame)
    assert got.to_dict() == dict(zip(keys, states))
    assert len(got.kinds) == 6 and len(got.rest_keys) == 4    # rest: tuple key, float, big, None
    for width, value in ((1, -128), (2, 300), (4, -(1 << 31)), (8, 1 << 40)):
        frame = encode_pairs(["a", "b"], [0, value])
        assert frame[4] == width and decode(frame).to_dict() == {"a": 0, "b": value}
    assert decode(encode_pairs([], [])).to_dict() == {}


def test_a_plan_cuts_by_entries_and_bytes_and_reads_back_whole():
    rnd = random.Random(4)
    states = {f"k{rnd.randrange(10 ** 9)}": rnd.randrange(1 << 40) for _ in range(5000)}
    states["x" * 5000] = 3                      # larger than a chunk on its own
    frames = frames_of(states, entries=700, nbytes=4096)
    assert all(len(f) <= 4096 for f in frames if b"x" * 5000 not in f)
    assert read_back(frames) == states
    assert [p.count for p in plan({}, 10, 100)] == [0]


@compiled
def test_a_tables_full_copy_is_cut_by_its_offsets_and_installed_by_frames():
    rnd = random.Random(5)
    rng = PrimaryRange(1, load_reducer("count"))
    expect = Counter()
    for _ in range(20):
        keys = [f"w{rnd.randrange(3000)}" for _ in range(500)]
        rng.state.apply(keys, [1] * len(keys))
        expect.update(keys)
    rng.state.put(b"raw", 5)
    rng.state.put("float", 2.5)                 # in spill: the frames' rest
    expect.update({b"raw": 5})
    expect["float"] = 2.5
    full = FullStates(*rng.state.full_layers())
    frames = frames_of(full, entries=256, nbytes=1 << 20)
    assert len(frames) > 5
    assert read_back(frames) == dict(expect)
    box = Reassembly(window=len(frames))
    for i, frame in enumerate(frames, 1):
        _, done = box.add("p", 1, 1, i, len(frames), decode(frame), 0.0)
    run = whole_states(done)
    assert isinstance(run, StateRun) and dict(run) == dict(expect)
    copy = TableCopy(load_reducer("count"))
    copy.replace(run)
    assert copy.master == dict(expect) and len(copy.state.table) == len(expect) - 1


def test_a_full_copy_in_msgpack_chunks_is_still_taken():
    from floering.wire.codec import pack
    box = Reassembly(window=2)
    box.add("p", 1, 1, 1, 2, dict([("a", 1)]), 0.0)
    _, done = box.add("p", 1, 1, 2, 2, {"b": 2}, 0.0)
    assert whole_states(done) == {"a": 1, "b": 2}
    assert not is_frame(pack((["a"], [1])))


# ------------------------------------------------------------------ hostile frames

def _header(n, nkeys, nrest, version=1, width=8):
    return struct.pack("<3sBBIQI", MAGIC, version, width, n, nkeys, nrest)


def _frame(kinds, keys, offsets, values, rest=b"", version=1, width=8):
    body = bytes(kinds) + struct.pack(f"<{len(offsets)}I", *offsets) + keys + \
        struct.pack(f"<{len(values)}q", *values) + rest
    return _header(len(kinds), len(keys), len(rest), version, width) + body


@pytest.mark.parametrize("frame, says", [
    (b"\xc1FS", "shorter than the 21-byte header"),
    (_frame([0], b"ab", [0, 2], [1], width=3), "value width 3"),
    (_frame([0], b"ab", [0, 2], [1], width=4), "the header says"),  # 8 bytes, not 4
    (_frame([0], b"ab", [0, 2], [1], version=2), "version 2"),
    (_header(1 << 31, 0, 0), "the header says"),                 # a huge count
    (_header(3, 1 << 62, 0) + b"\x00" * 40, "the header says"),   # huge key bytes
    (_frame([0, 0], b"abcd", [0, 3, 2], [1, 2]), "without decreasing"),
    (_frame([0, 0], b"abcd", [0, 2, 9], [1, 2]), "offsets"),
    (_frame([0], b"ab", [1, 2], [1]), "offsets"),
    (_frame([3], b"ab", [0, 2], [1]), "kind"),
    (_frame([0], b"ab", [0, 2], [1], rest=b"\x92\x91"), "msgpack"),
    (_frame([0], b"ab", [0, 2], [1], rest=b"\x92\x91\x01\x90"), "equal length"),
    (_frame([0], b"ab", [0, 2], [1], rest=b"\x92\x91\x81\x01\x02\x91\x03"), "a map"),
])
def test_a_hostile_frame_is_refused_naming_what_is_wrong(frame, says):
    with pytest.raises(InvalidArgument, match=says):
        decode(frame)


@pytest.mark.parametrize("kind, key", [(0, b"\xff\xfe"), (2, b"\x00i 12"), (2, b"\x00i012"),
                                       (2, b"12")])
def test_a_key_that_is_not_what_its_kind_encodes_is_refused_by_both_readers(kind, key):
    got = decode(_frame([kind], key, [0, len(key)], [1]))
    with pytest.raises(InvalidArgument):
        got.to_dict()
    if KERNEL == "compiled":
        state = TableState(load_reducer("count"))
        with pytest.raises(InvalidArgument):
            state.install(got, mark_dirty=False)
        assert len(state.table) == 0


def test_every_truncation_and_random_damage_is_refused_or_read_never_crashes():
    frame = encode_pairs(["a", "bb", b"c", 5, 1.5], [1, 2, 3, 4, 5])
    for cut in range(len(frame)):
        with pytest.raises(InvalidArgument):
            decode(frame[:cut])
    rnd = random.Random(11)
    for _ in range(3000):
        bad = bytearray(frame)
        for _ in range(rnd.randrange(1, 4)):
            bad[rnd.randrange(len(bad))] = rnd.randrange(256)
        try:
            got = decode(bytes(bad))
            got.to_dict()
            if KERNEL == "compiled":
                TableState(load_reducer("count")).install(got, mark_dirty=False)
        except InvalidArgument:
            pass


# ------------------------------------------------------- pure and compiled alike

_PURE = """
import hashlib, json, sys
from floering.node.core.columnar import KERNEL
from floering.node.core.ranges import PrimaryRange
from floering.node.core.reducers import load_reducer
from floering.node.core.state_wire import decode, plan
from floering.node.core.batch import encode_payload
rng = PrimaryRange(1, load_reducer("count"))
for b, keys in enumerate(json.loads(sys.argv[1])):
    rng.apply("s", b + 1, b + 1, len(keys), encode_payload(keys, [1] * len(keys)), b"")
cut = rng.cut_checkpoint()
full = rng.full_checkpoint(cut)
frames = [p.encode() for p in plan(full.states, 64, 1 << 20)]
delta = [p.encode() for p in plan(cut.states, 64, 1 << 20)]
small = [p.encode() for p in plan(full.states, 1000, 300)]
other = {}
for f in json.loads(sys.argv[2]):
    other.update(decode(bytes.fromhex(f)).to_dict())
print(json.dumps([KERNEL, hashlib.sha256(b"|".join(frames)).hexdigest(),
                  hashlib.sha256(b"|".join(delta)).hexdigest(), len(frames),
                  sorted(other.items()), hashlib.sha256(b"|".join(small)).hexdigest()]))
"""


@compiled
def test_the_pure_node_writes_and_reads_the_bytes_the_compiled_one_does():
    from floering.node.core.batch import encode_payload
    rnd = random.Random(3)
    batches = [[f"k{rnd.randrange(400)}" for _ in range(50)] for _ in range(12)]
    rng = PrimaryRange(1, load_reducer("count"))
    for b, keys in enumerate(batches):
        rng.apply("s", b + 1, b + 1, len(keys), encode_payload(keys, [1] * len(keys)), b"")
    cut = rng.cut_checkpoint()
    full = rng.full_checkpoint(cut)
    frames = [p.encode() for p in plan(full.states, 64, 1 << 20)]
    delta = [p.encode() for p in plan(cut.states, 64, 1 << 20)]
    env = dict(os.environ, FLOE_PURE="1")
    out = subprocess.run([sys.executable, "-c", _PURE, json.dumps(batches),
                          json.dumps([f.hex() for f in frames])], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    kernel, full_sha, delta_sha, count, other, small_sha = json.loads(out.stdout)
    small = [p.encode() for p in plan(full.states, 1000, 300)]      # cut by bytes
    assert len(small) > len(frames) and small_sha == hashlib.sha256(b"|".join(small)).hexdigest()
    assert kernel == "python" and count == len(frames) > 1
    assert full_sha == hashlib.sha256(b"|".join(frames)).hexdigest()
    assert delta_sha == hashlib.sha256(b"|".join(delta)).hexdigest()
    assert dict(map(tuple, other)) == dict(Counter(k for b in batches for k in b))


# ------------------------------------------------------------- splits by position

@compiled
def test_a_tables_split_by_position_is_the_split_by_key():
    from floering.wire.ring import Ring
    ring = Ring.initial({"a": "h:1", "b": "h:2"}, 1, 2)
    token = ring.tokens[1]
    lo, hi = ring.range_of_token(token)
    mid = lo + (hi - lo) // 2
    rng = PrimaryRange(token, load_reducer("sum"))
    keys = [f"key{i}" for i in range(20000)]
    inside = [k for k in keys if ring.token_for_key(k) == token]
    rng.state.apply(inside, list(range(len(inside))))
    bounds = {mid: (lo, mid), token: (mid, hi)}

    def part_of(key):
        from floering.wire.hashing import position
        return mid if Ring.in_range(position(key), (lo, mid)) else token
    by_key = rng.split((mid, token), part_of)
    by_position = rng.split((mid, token), part_of, bounds)
    for t in (mid, token):
        assert by_position[t].state.snapshot() == by_key[t].state.snapshot()
        assert isinstance(by_position[t].state, TableState)
    assert sum(len(r.state) for r in by_position.values()) == len(inside)
    rng.state.put("float", 1.5)                 # spill holds a key: cut key by key
    assert rng.state.split_ranges(bounds) is None
    assert StateColumns  # exported for the decoder's readers
    assert HEADER_BYTES == 21 and encode_frame


@compiled
def test_a_delta_with_spill_goes_as_frames_and_a_bad_full_copy_changes_nothing():
    rng = PrimaryRange(1, load_reducer("sum"))
    copy = TableCopy(load_reducer("sum"))
    rng.state.apply(["a", "b", "c"], [1, 2, 3])
    cut = rng.cut_checkpoint()
    copy.replace(read_back(frames_of(rng.full_checkpoint(cut).states)))
    rng.checkpoint_shipped()
    rng.state.apply(["b", "d"], [0.5, 4])            # b leaves the table for spill
    delta = rng.cut_checkpoint().states
    assert delta == {"b": 2.5, "d": 4}
    for frame in frames_of(delta):
        copy.apply_fragment(decode(frame))
    rng.checkpoint_shipped()
    assert copy.master == rng.state.snapshot() == {"a": 1, "b": 2.5, "c": 3, "d": 4}
    good = decode(encode_pairs(["x"], [1]))
    bad = decode(_frame([0], b"\xff", [0, 1], [1]))     # not UTF-8: the table refuses it
    with pytest.raises(InvalidArgument):
        copy.replace(StateRun([good, bad]))
    assert copy.master == {"a": 1, "b": 2.5, "c": 3, "d": 4}


def test_planning_a_range_of_large_states_encodes_their_bytes_a_few_times_not_per_halving(
        monkeypatch):
    """18 states of 4 MiB planned into frames of 1 MiB: each frame is sized from a
    few encodes of its own entries, so the plan encodes a small multiple of the
    range's bytes (it once encoded the whole rest of the range per halving: 209 ms
    of the event loop for the first frame alone)."""
    from floering.node.core import state_wire
    encoded = []
    real = state_wire.PairSegment.encode
    monkeypatch.setattr(state_wire.PairSegment, "encode",
                        lambda self, a, b: encoded.append(len(out := real(self, a, b))) or out)
    pad = b"\0" * (4 << 20)
    states = {f"k{i}": (i, bytes(pad)) for i in range(18)}
    pieces = list(state_wire.plan(states, 4096, 1 << 20))
    assert [p.end - p.start for p in pieces] == [1] * 18
    assert sum(encoded) <= 3 * 18 * len(pad)
    small = {f"key{i}": (i, "x" * 100) for i in range(50_000)}
    encoded.clear()
    pieces = list(state_wire.plan(small, 16_384, 1 << 20))
    assert sum(p.end - p.start for p in pieces) == 50_000
    assert all(len(p.encode()) <= 1 << 20 for p in pieces)
    assert sum(encoded) <= 4 * sum(len(p.encode()) for p in pieces)


@compiled
def test_frames_with_a_bad_key_among_them_change_nothing_in_a_copy_that_holds_keys():
    copy = TableCopy(load_reducer("count"))
    held = {f"k{i}": i for i in range(5000)}
    copy.replace(read_back(frames_of(held, entries=1000)))
    changed = {**{f"k{i}": -i for i in range(0, 5000, 2)}, **{f"new{i}": i for i in range(4000)}}
    frames = [decode(f) for f in frames_of(changed, entries=900)]
    bad = decode(_frame([0, 2], b"ok\x00i-0", [0, 2, 6], [1, 2]))   # "-0": no int's key
    for at in (0, len(frames) // 2, len(frames)):
        with pytest.raises(InvalidArgument, match="is not what its kind encodes"):
            copy.apply_fragment(StateRun(frames[:at] + [bad] + frames[at:]))
        assert copy.master == held and len(copy.state.table) == 5000
        assert copy.state.table.dirty_count == 0
    copy.apply_fragment(StateRun(frames))
    assert copy.master == {**held, **changed}
