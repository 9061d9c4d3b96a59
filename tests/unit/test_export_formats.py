"""ExportRange's entry formats on real node processes (mutual TLS): a reader naming no
format (one before formats were named) gets msgpack entries it decodes exactly, one
naming frames gets frames, a list of formats the node does not send or an oversized
list is refused INVALID_ARGUMENT; `floe export` then `floe import` into a ring of
another size is exact against a Counter."""

from collections import Counter

import pytest

from floering.node.core.state_wire import decode
from floering.v1 import floe_pb2
from tests.support.snapshot_live_shared import counts


# ------------------------------------------------ the import, one snapshot range at a time

def _file(by_token: dict, *, reducer: str = "count", framed: bool = True) -> bytes:
    """A snapshot of {token: {key: state}} as a node's export writes it (frames, or
    msgpack entries), two chunks a range."""
    import io

    from floering.wire.codec import pack_entries
    from floering.node.core.snapshot_format import Header, Writer
    from floering.node.core.state_wire import encode_pairs
    out = io.BytesIO()
    tokens = tuple(sorted(by_token))
    w = Writer(out, Header(reducer, "none", 1, 1, ("n0",), tokens, 0.0))
    for token in tokens:
        items = list(by_token[token].items())
        halves = (items[:len(items) // 2], items[len(items) // 2:])
        for n, half in enumerate(halves, 1):
            keys, states = [k for k, _ in half], [s for _, s in half]
            entries = encode_pairs(keys, states) if framed else pack_entries(dict(half))
            w.add(token, n, 2, {"src": token % 89} if n == 1 else {}, entries, len(half))
    w.close()
    return out.getvalue()


def _dealt(ring, counts: dict) -> dict:
    by_token: dict = {t: {} for t in ring.tokens}
    for key, state in counts.items():
        by_token[ring.token_for_key(key)][key] = state
    return by_token


def test_an_import_holds_one_snapshot_range_at_a_time_and_is_exact(monkeypatch):
    """A node's export (frames, each range's keys inside it) is imported a snapshot
    range at a time: when a chunk is sent, one scratch table holds states, and the
    target ring (other, more tokens) gets exactly the Counter, each range the
    watermarks of the snapshot range it lies in."""
    import gc
    import io
    import random

    from floering.floe import snapshot as snap
    from floering.wire.ring import Ring
    from floering.node.core.state_wire import decode
    rnd = random.Random(3)
    words = [f"w{rnd.randrange(40_000)}" for _ in range(120_000)] + [b"raw", 7, -3]
    expect = Counter(words)
    expect_states = dict(expect) | {"big": 1 << 70, "half": 2.5}
    source = Ring(1, 1, (1 << 62, 1 << 63, 3 << 62), ("n0",) * 3, (("n0", "a:1"),))
    data = _file(_dealt(source, expect_states), reducer="sum")
    extra = sorted(rnd.getrandbits(64) for _ in range(5))
    target = Ring(2, 2, tuple(sorted({*source.tokens, *extra})), ("n0",) * 8,
                  (("n0", "a:1"),))
    got: dict = {}
    marks: dict = {}
    live: list[int] = []

    class Stub:
        def ImportRange(self, request, timeout):
            live.append(sum(1 for o in gc.get_objects()
                            if isinstance(o, snap.RangeTable) and len(o)))
            for key, state in decode(request.entries).to_dict().items():
                assert target.token_for_key(key) == request.token and key not in got
                got[key] = state
            if request.watermarks:
                marks[request.token] = snap.unpack(request.watermarks)
            return floe_pb2.ImportAck(chunks_held=request.chunk)

    monkeypatch.setattr(snap, "read_ring", lambda seeds, tls: (target, "sum"))
    monkeypatch.setattr(snap, "_calls", lambda ring, tls: (lambda node: Stub(), {}))
    plan = snap.survey(io.BytesIO(data))
    assert plan is not None and plan.keys == len(expect_states)
    out = snap.import_streamed([], io.BytesIO(data), plan, None, into_state=True,
                               resume=False)
    assert got == expect_states and out["keys"] == len(expect_states)
    assert max(live) == 1
    for token in target.tokens:
        if token in marks:
            owner = source.tokens[snap.bisect_left(source.tokens, token) % 3]
            assert marks[token] == {"src": owner % 89}


def test_files_an_import_reads_whole_and_a_file_changed_between_passes(monkeypatch):
    """Entries as msgpack, or a range holding a key outside its bounds: read whole
    (load_recut), as before. A file rewritten after the first pass: the second
    refuses the section that changed."""
    import io

    from floering.floe import snapshot as snap
    from floering.wire.ring import Ring
    from floering.node.core.snapshot_format import SnapshotError
    source = Ring(1, 1, (1 << 62, 1 << 63, 3 << 62), ("n0",) * 3, (("n0", "a:1"),))
    counts = {f"k{i}": i + 1 for i in range(2_000)}
    assert snap.survey(io.BytesIO(_file(_dealt(source, counts), framed=False))) is None
    assert snap.survey(io.BytesIO(_file(_dealt(source, counts), reducer="user"))) is None
    dealt = {t: {k: counts[k] for k in list(counts)[i::3]}
             for i, t in enumerate(source.tokens)}
    assert snap.survey(io.BytesIO(_file(dealt))) is None
    first = _file(_dealt(source, counts))
    plan = snap.survey(io.BytesIO(first))
    assert plan is not None
    changed = _file(_dealt(source, counts | {"k5": 99}))
    with pytest.raises(SnapshotError, match="changed since it was checked"):
        for span, part in zip(plan.spans, plan.parts):
            snap.section_back(io.BytesIO(changed), span, part)
    for span, part in zip(plan.spans, plan.parts):
        snap.section_back(io.BytesIO(first), span, part)
