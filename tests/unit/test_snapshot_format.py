"""The snapshot file and the core's side of export/import, without processes: every
damaged file refused whole, a range read with its watermarks, chunks merged once each
and in order, a range holding state refused, hostile fields refused."""

import io
from collections import Counter

import pytest

from floering.node.core.batch import Limits
from floering.wire.codec import pack_entries, unpack_columns
from floering.wire.errors import InvalidArgument, ReducerMismatch, StaleRing
from floering.node.core.snapshot_format import Header, SnapshotError, Writer, sections, verify
from floering.node.core.snapshots import HoldsState, export_range, import_chunk, import_mark
from tests.support.helpers import CoreCluster

SNAP = "ab" * 32


def write(ranges: dict[int, list[tuple[dict, dict]]]) -> bytes:
    out = io.BytesIO()
    w = Writer(out, Header("count", "none", 3, 77, ("n0", "n1"), tuple(sorted(ranges)), 1.0))
    for token in sorted(ranges):
        parts = ranges[token]
        for n, (states, marks) in enumerate(parts, 1):
            w.add(token, n, len(parts), marks, pack_entries(states), len(states))
    w.close()
    return out.getvalue()


def good() -> bytes:
    return write({10: [({"a": 1, "b": 2}, {"s": 5}), ({"c": 3}, {})],
                  20: [({}, {"s": 7, "t": 1})]})


def test_a_whole_file_reads_back_exactly():
    data = good()
    header, snap, entries = verify(io.BytesIO(data))
    assert header.reducer == "count" and header.tokens == (10, 20) and entries == 3
    assert len(snap) == 64 and snap == verify(io.BytesIO(data))[1]
    got = [(s.token, s.chunk, s.chunks, s.watermarks, dict(zip(*unpack_columns(s.entries))))
           for s in sections(io.BytesIO(data))]
    assert got == [(10, 1, 2, {"s": 5}, {"a": 1, "b": 2}), (10, 2, 2, {}, {"c": 3}),
                   (20, 1, 1, {"s": 7, "t": 1}, {})]


def test_every_truncation_and_every_flipped_byte_is_refused():
    data = good()
    for cut in range(len(data)):
        with pytest.raises(SnapshotError):
            verify(io.BytesIO(data[:cut]))
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= 0x40
        with pytest.raises(SnapshotError):
            verify(io.BytesIO(bytes(bad)))
    with pytest.raises(SnapshotError, match="after the trailer"):
        verify(io.BytesIO(data + b"x"))


def test_a_range_missing_or_out_of_order_is_refused_even_with_good_checksums():
    with pytest.raises(SnapshotError):     # the header names 10 and 20; only 10 is there
        out = io.BytesIO()
        w = Writer(out, Header("count", "none", 1, 1, ("n0",), (10, 20), 0.0))
        w.add(10, 1, 1, {}, pack_entries({"a": 1}), 1)
        w.close()
        verify(io.BytesIO(out.getvalue()))
    out = io.BytesIO()
    w = Writer(out, Header("count", "none", 1, 1, ("n0",), (10,), 0.0))
    w.add(10, 2, 2, {}, pack_entries({"a": 1}), 1)
    w.close()
    with pytest.raises(SnapshotError, match="out of place"):
        verify(io.BytesIO(out.getvalue()))


@pytest.mark.parametrize("marks", [{"s": -1}, {"s": 1.5}, {"": 1}, {"s" * 2000: 1},
                                   {1: 1}, {"s": "1"}, [1]])
def test_hostile_watermarks_are_refused(marks):
    out = io.BytesIO()
    w = Writer(out, Header("count", "none", 1, 1, ("n0",), (10,), 0.0))
    w.add(10, 1, 1, marks, pack_entries({}), 0)
    w.close()
    with pytest.raises(SnapshotError):
        verify(io.BytesIO(out.getvalue()))


# ------------------------------------------------------------- the core's side

def fed() -> tuple[CoreCluster, Counter]:
    c = CoreCluster(nodes=2, replication=1, tokens_per_node=3)
    words = [f"w{i % 37}" for i in range(500)]
    c.push("src", words)
    return c, Counter(words)


def test_export_reads_each_range_with_its_watermarks_and_import_merges_once():
    c, expect = fed()
    core = c.cores["n0"]
    ring = core.ring
    for token in ring.tokens_of("n0"):
        states, marks = export_range(core, ring.stamp, token)
        assert all(ring.token_for_key(k) == token for k in states)
        assert marks.get("src") if states else True
    with pytest.raises(StaleRing):
        export_range(core, ring.stamp + 1, ring.tokens_of("n0")[0])
    with pytest.raises(StaleRing):
        export_range(core, ring.stamp, ring.tokens_of("n1")[0])

    fresh, _ = CoreCluster(nodes=2, replication=1, tokens_per_node=3), None
    target = fresh.cores["n1"]
    token = target.ring.tokens_of("n1")[0]
    mine = {k: v for k, v in expect.items() if target.ring.token_for_key(k) == token}
    keys, states = list(mine), list(mine.values())
    args = (target, "count", target.ring.stamp, token, SNAP)
    assert import_chunk(*args, 1, 2, keys[:3], states[:3], {"src": 500}, False, 0.0) == 1
    with pytest.raises(InvalidArgument, match="the next is 2"):
        import_chunk(*args, 3, 3, [], [], {}, False, 0.0)
    assert import_chunk(*args, 2, 2, keys[3:], states[3:], {}, False, 0.0) == 2
    # sent again: merged once
    assert import_chunk(*args, 2, 2, keys[3:], states[3:], {}, False, 0.0) == 2
    assert import_chunk(*args, 1, 2, keys[:3], states[:3], {"src": 500}, False, 0.0) == 2
    rng = target.primaries[token]
    assert dict(rng.state.items()) == mine
    assert rng.watermarks["src"] == 500
    assert rng.watermarks[import_mark(SNAP, target.ring.range_of_token(token))] == 2
    # a resume on other bounds (a range split meanwhile would skip keys): refused
    with pytest.raises(HoldsState, match="other bounds"):
        _at_another_ring(target, token)
    # another snapshot into a range holding state: refused unless asked
    other = (target, "count", target.ring.stamp, token, "cd" * 32)
    with pytest.raises(HoldsState):
        import_chunk(*other, 1, 1, [], [], {}, False, 0.0)
    assert import_chunk(*other, 1, 1, keys[:1], [1], {}, True, 0.0) == 1
    assert rng.state.get(keys[0]) == mine[keys[0]] + 1


def _at_another_ring(core, token):
    rng = core.primaries[token]
    lo, hi = core.ring.range_of_token(token)
    now, before = import_mark(SNAP, (lo, hi)), import_mark(SNAP, (lo - 1, hi))
    rng.watermarks[before] = rng.watermarks.pop(now)
    try:
        import_chunk(core, "count", core.ring.stamp, token, SNAP, 1, 2, [], [], {}, True, 0.0)
    finally:
        rng.watermarks[now] = rng.watermarks.pop(before)


def test_import_refuses_hostile_chunks_changing_nothing():
    c = CoreCluster(nodes=2, replication=1, tokens_per_node=3)
    core = c.cores["n0"]
    ring = core.ring
    token, other = ring.tokens_of("n0")[0], ring.tokens_of("n1")[0]
    key = next(f"k{i}" for i in range(10_000) if ring.token_for_key(f"k{i}") == token)
    far = next(f"k{i}" for i in range(10_000) if ring.token_for_key(f"k{i}") != token)
    base = (core, "count", ring.stamp, token, SNAP)
    with pytest.raises(ReducerMismatch):
        import_chunk(core, "max", ring.stamp, token, SNAP, 1, 1, [key], [1], {}, False, 0.0)
    with pytest.raises(StaleRing):
        import_chunk(core, "count", ring.stamp, other, SNAP, 1, 1, [], [], {}, False, 0.0)
    with pytest.raises(InvalidArgument, match="64 lowercase hex"):
        import_chunk(core, "count", ring.stamp, token, "x", 1, 1, [], [], {}, False, 0.0)
    with pytest.raises(InvalidArgument, match="belongs to token"):
        import_chunk(*base, 1, 1, [key, far], [1, 1], {}, False, 0.0)
    with pytest.raises(InvalidArgument):
        import_chunk(*base, 1, 1, [key], ["not a count"], {}, False, 0.0)
    with pytest.raises(InvalidArgument):
        import_chunk(*base, 0, 1, [key], [1], {}, False, 0.0)
    with pytest.raises(InvalidArgument):
        import_chunk(*base, 1, 1, [key], [1], {"import:" + SNAP: 9}, False, 0.0)
    with pytest.raises(InvalidArgument, match="sources"):
        import_chunk(*base, 1, 1, [key], [1],
                     {f"s{i}": 1 for i in range(Limits().max_sources_per_range)}, False, 0.0)
    rng = core.primaries[token]
    assert len(rng.state) == 0 and not rng.watermarks


def test_the_importer_refuses_bad_keys_and_states_before_the_first_write(tmp_path):
    from floering.floe.snapshot import check_states, load_recut
    from floering.wire.codec import pack
    ring = CoreCluster(nodes=2).ring
    for entries, why in ((pack(((1.5,), (1,))), "str, bytes or int"),
                         (pack(((b"\x00floe:x",), (1,))), "reserved mark")):
        path = tmp_path / "bad.snap"
        out = io.BytesIO()
        w = Writer(out, Header("count", "none", 1, 1, ("n0",), (10,), 0.0))
        w.add(10, 1, 1, {}, entries, 1)
        w.close()
        path.write_bytes(out.getvalue())
        with pytest.raises(SnapshotError, match=why):
            load_recut(str(path), ring)
    with pytest.raises(SnapshotError, match="nothing was loaded"):
        check_states("count", {1: {"a": 1, "b": "two"}})
    check_states("count", {1: {"a": 1, "b": 2}})


def test_an_export_of_a_ring_changing_under_it_is_read_again_three_times(monkeypatch):
    from floering.floe import snapshot as snapshot_mod
    tries = []

    def once(seeds, path, tls):
        tries.append(1)
        if len(tries) < 3:
            raise StaleRing("the ring moved")
        return {"ok": True}
    monkeypatch.setattr(snapshot_mod, "_export_once", once)
    assert snapshot_mod.export_ring([], "f", None) == {"ok": True} and len(tries) == 3
    tries.clear()
    monkeypatch.setattr(snapshot_mod, "_export_once",
                        lambda *a: tries.append(1) or (_ for _ in ()).throw(StaleRing("x")))
    with pytest.raises(StaleRing):
        snapshot_mod.export_ring([], "f", None)
    assert len(tries) == 3


def test_an_imports_marks_never_expire_so_a_late_resume_merges_nothing_twice():
    from floering.wire.epochs import check_source
    target = CoreCluster(nodes=2, replication=1, tokens_per_node=3).cores["n1"]
    token = target.ring.tokens_of("n1")[0]
    keys = [f"k{i}" for i in range(20_000) if target.ring.token_for_key(f"k{i}") == token][:4]
    args = (target, "count", target.ring.stamp, token, SNAP)
    assert import_chunk(*args, 1, 2, keys[:2], [1, 1], {"src": 9}, True, 0.0) == 1
    later = target.limits.source_expiry * 3
    expired = target.expire_idle_sources(later)
    assert expired == ["src"]                               # a pusher's mark goes ...
    mark = import_mark(SNAP, target.ring.range_of_token(token))
    rng = target.primaries[token]
    assert rng.watermarks[mark] == 1                        # ... the import's stays
    # `floe import --resume --into-state` long after: chunk 1 held, merged once
    assert import_chunk(*args, 1, 2, keys[:2], [1, 1], {"src": 9}, True, later) == 1
    assert import_chunk(*args, 2, 2, keys[2:], [1, 1], {}, True, later) == 2
    assert dict(rng.state.items()) == dict.fromkeys(keys, 1)
    # and no pusher can take an import's mark as its source
    with pytest.raises(InvalidArgument, match="reserved for the marks of snapshot imports"):
        check_source(mark)


def test_sections_are_given_only_once_the_trailer_is_checked():
    data = bytearray(good())
    data[-1] ^= 0x01                                        # the trailer's sha256
    with pytest.raises(SnapshotError, match="sha256"):
        next(iter(sections(io.BytesIO(bytes(data)))))


def test_an_import_uses_exactly_the_bytes_it_checked_when_the_file_changes(monkeypatch,
                                                                          tmp_path):
    from floering.floe import snapshot as snapshot_mod
    ring = CoreCluster(nodes=2).ring
    first = good()
    second = write({10: [({"a": 100, "b": 200}, {"s": 99})], 20: [({"z": 1}, {})]})
    path = tmp_path / "s.snap"
    path.write_bytes(first)

    class Rewritten(io.BytesIO):
        """The file as a reader sees it when another process rewrites it after the
        reader's first pass: a second pass reads the new bytes."""

        def seek(self, pos, whence=0):
            if pos == 0 and whence == 0 and self.tell():
                self.__init__(second)
            return super().seek(pos, whence)

    monkeypatch.setattr(snapshot_mod, "open", lambda *a, **k: Rewritten(first),
                        raising=False)
    header, snapshot_id, ranges, marks = snapshot_mod.load_recut(str(path), ring)
    assert snapshot_id == verify(io.BytesIO(first))[1]
    assert {k: v for r in ranges.values() for k, v in r.items()} == {"a": 1, "b": 2, "c": 3}
    assert marks == {"s": 7, "t": 1}


# ------------------------------------------------ frames of column states (format 2)

def _frame(keys, states) -> bytes:
    from floering.node.core.state_wire import encode_pairs
    return encode_pairs(list(keys), list(states))


def _columns(data: bytes):
    from floering.node.core.state_wire import decode
    return decode(data)


def test_a_frame_merges_into_the_range_as_its_entries_do():
    c, expect = fed()
    core = c.cores["n0"]
    ring = core.ring
    target = CoreCluster(nodes=2, replication=1, tokens_per_node=3).cores["n1"]
    token = target.ring.tokens_of("n1")[0]
    mine = {k: v for k, v in expect.items() if target.ring.token_for_key(k) == token}
    keys = list(mine)
    args = (target, "count", target.ring.stamp, token, SNAP)
    first = _columns(_frame(keys[:3], [mine[k] for k in keys[:3]]))
    assert import_chunk(*args, 1, 2, first, None, {"src": 500}, False, 0.0) == 1
    rest = _columns(_frame(keys[3:], [mine[k] for k in keys[3:]]))
    assert import_chunk(*args, 2, 2, rest, None, {}, False, 0.0) == 2
    assert import_chunk(*args, 2, 2, rest, None, {}, False, 0.0) == 2     # merged once
    rng = target.primaries[token]
    assert dict(rng.state.items()) == mine
    # merged into state explicitly: the reducer's merge (a count adds)
    other = (target, "count", target.ring.stamp, token, "cd" * 32)
    assert import_chunk(*other, 1, 1, _columns(_frame(keys, [1] * len(keys))), None, {},
                        True, 0.0) == 1
    assert dict(rng.state.items()) == {k: v + 1 for k, v in mine.items()}
    # an export of a table's range is frames of its columns, read back exactly
    from floering.node.core.snapshots import export_columns
    from floering.node.transport.snapshots import frame_chunks
    for t in ring.tokens_of("n0"):
        columns, marks = export_columns(core, ring.stamp, t)
        states = export_range(core, ring.stamp, t)[0]
        if columns is None:                  # FLOE_PURE=1: ranges of dicts, no table
            assert marks is None
            continue
        frames = [data for _, data in frame_chunks(columns)]
        got = {}
        for data in frames:
            got.update(_columns(data).to_dict())
        assert got == dict(states) and marks.get("src")


def fresh_state(state):
    """An empty state of the same kind as `state`."""
    if hasattr(state, "table_class"):
        return type(state)(state.reducer, state.table_class)
    return type(state)(state.reducer)


def test_hostile_frames_are_refused_whole_changing_nothing():
    c = CoreCluster(nodes=2, replication=1, tokens_per_node=3)
    core = c.cores["n0"]
    ring = core.ring
    token = ring.tokens_of("n0")[0]
    near = [f"k{i}" for i in range(10_000) if ring.token_for_key(f"k{i}") == token][:50]
    far = next(f"k{i}" for i in range(10_000) if ring.token_for_key(f"k{i}") != token)
    base = (core, "count", ring.stamp, token, SNAP)
    good = _frame(near, [2] * len(near))
    with pytest.raises(InvalidArgument, match="other ranges|belongs to token"):
        import_chunk(*base, 1, 1, _columns(_frame(near + [far], [1] * 51)), None, {},
                     False, 0.0)
    if getattr(core.primaries[token].state, "table_class", None):   # a table: no key
        with pytest.raises(InvalidArgument, match="twice"):         # twice in a frame
            import_chunk(*base, 1, 1, _columns(_frame(near + near[:1], [1] * 51)), None,
                         {}, False, 0.0)
    with pytest.raises(InvalidArgument):        # a rest state a count does not take
        import_chunk(*base, 1, 1, _columns(_frame(near, [1] * 49 + ["x"])), None, {},
                     False, 0.0)
    # every flipped byte of the header, the kinds and the offsets: refused or, where
    # the frame still reads, its keys in the range; never half installed
    for at in range(len(good) - 1):
        bad = bytearray(good)
        bad[at] ^= 0x5A
        try:
            import_chunk(*base, 1, 1, _columns(bytes(bad)), None, {}, False, 0.0)
        except InvalidArgument:
            assert len(core.primaries[token].state) == 0
            continue
        rng = core.primaries[token]
        assert all(ring.token_for_key(k) == token for k, _ in rng.state.items())
        rng.state = fresh_state(rng.state)
        rng.watermarks.clear()
    rng = core.primaries[token]
    assert len(rng.state) == 0 and not rng.watermarks


def test_a_format_1_file_reads_and_a_newer_one_is_refused_by_name(monkeypatch):
    from floering.node.core import snapshot_format
    monkeypatch.setattr(snapshot_format, "FORMAT_VERSION", 1)
    old = good()
    monkeypatch.undo()
    assert old[8:10] == b"\x00\x01"
    header, snapshot_id, entries = verify(io.BytesIO(old))
    assert entries == sum(len(unpack_columns(s.entries)[0]) for s in sections(io.BytesIO(old)))
    monkeypatch.setattr(snapshot_format, "FORMAT_VERSION", 3)
    newer = good()
    monkeypatch.undo()
    with pytest.raises(SnapshotError, match="newer floe"):
        verify(io.BytesIO(newer))


def test_a_file_of_frames_counts_their_entries_and_refuses_a_bad_frame():
    frame = _frame(["a", "b", "c"], [1, 2, 3])
    out = io.BytesIO()
    w = Writer(out, Header("count", "none", 1, 1, ("x",), (7,), 0.0))
    w.add(7, 1, 1, {"s": 1}, frame, 3)
    w.close()
    assert verify(io.BytesIO(out.getvalue()))[2] == 3
    out = io.BytesIO()
    w = Writer(out, Header("count", "none", 1, 1, ("x",), (7,), 0.0))
    w.add(7, 1, 1, {"s": 1}, frame[:-1], 3)         # its sizes no longer add up
    w.close()
    with pytest.raises(InvalidArgument):
        verify(io.BytesIO(out.getvalue()))


def framed_file(reducer: str, ranges: dict[int, dict]) -> tuple:
    """(header, sections, id) of a format-2 file: each range's entries one frame."""
    from floering.node.core.snapshot_format import read
    from floering.node.core.state_wire import encode_pairs
    out = io.BytesIO()
    w = Writer(out, Header(reducer, "none", 1, 1, ("n0",), tuple(sorted(ranges)), 0.0))
    for token in sorted(ranges):
        keys = list(ranges[token])
        w.add(token, 1, 1, {"s": token % 97}, encode_pairs(keys, [ranges[token][k] for k in keys]),
              len(keys))
    w.close()
    out.seek(0)
    header, parts, snapshot_id, _ = read(out)
    return header, parts, snapshot_id


def test_frames_are_recut_by_position_into_a_ring_of_other_tokens_exactly():
    """A format-2 file of three ranges into a ring of seven other tokens: each target
    range holds exactly the keys whose positions it covers, with their counts (a
    Counter over the words), the states outside the columns (a big int, a float)
    beside them; the chunks sent carry the same entries; the pure table (FLOE_PURE=1)
    gives the same."""
    import random

    from floering.floe.snapshot import ColumnRange, import_chunks, load_recut
    from floering.wire.ring import Ring
    from floering.node.core.state_wire import decode
    rnd = random.Random(7)
    vocabulary = ["w%d" % i for i in range(3000)] + ["é%d" % i for i in range(50)]
    words = [rnd.choice(vocabulary) for _ in range(40_000)] + \
        [b"raw%d" % i for i in range(40)] + list(range(30))
    expect: dict = dict(Counter(words))
    expect.update({"big": 1 << 70, "half": 2.5, -1 << 63: 3})
    source = Ring(1, 1, (1 << 62, 1 << 63, 3 << 62), ("n0",) * 3, (("n0", "a:1"),))
    by_source: dict = {t: {} for t in source.tokens}
    for key, state in expect.items():
        by_source[source.token_for_key(key)][key] = state
    snapshot = framed_file("sum", by_source)
    target = Ring(1, 1, tuple(sorted(rnd.getrandbits(64) for _ in range(7))), ("n0",) * 7,
                  (("n0", "a:1"),))
    assert not set(target.tokens) & set(source.tokens)
    _, _, ranges, marks = load_recut("unused", target, snapshot)
    assert marks == {"s": max(t % 97 for t in source.tokens)}
    assert set(ranges) == set(target.tokens)
    got: dict = {}
    for token, held in ranges.items():
        assert isinstance(held, ColumnRange)
        mine = {k: s for k, s in expect.items() if target.token_for_key(k) == token}
        assert held.to_dict() == mine and len(held) == len(mine)
        sent: dict = {}
        for count, entries in import_chunks("sum", held):
            frame = decode(entries)
            assert frame.count == count
            sent.update(frame.to_dict())
        assert sent == mine
        got.update(mine)
    assert got == expect


def test_frames_recut_refuses_a_key_twice_a_bad_key_or_state_before_the_first_write():
    from floering.floe.snapshot import check_states, load_recut
    from floering.wire.ring import Ring
    ring = Ring(1, 1, (5, 1 << 63), ("n0",) * 2, (("n0", "a:1"),))
    for ranges, why in (({10: {"a": 1, "b": 2}, 20: {"a": 4}}, "two ranges"),
                        ({10: {"a": 1, "x": 2.5}, 20: {"x": 1.5}}, "two ranges"),
                        ({10: {"a": 1}, 20: {b"\x00floe:x": 1}}, "reserved mark")):
        with pytest.raises(SnapshotError, match=why):
            load_recut("unused", ring, framed_file("sum", ranges))
    _, _, ranges, _ = load_recut("unused", ring, framed_file("count", {10: {"a": 1, "b": 0.5}}))
    with pytest.raises(SnapshotError, match="nothing was loaded"):
        check_states("count", ranges)
