"""A retired copy given back to a lost range as frames of column states (RestoreRange):
the sender cuts a built-in reducer's copy into frames of at most CHUNK_BYTES, the
range checks each frame whole (key bytes, no key twice, every key in the range,
states the reducer takes) and merges it in one call; a bad frame is refused and the
range is left as it was. Each range kind a node runs: the compiled table, the
pure-Python table, and dicts (FLOE_PURE=1, user-defined reducers); msgpack chunks are
still taken."""

import asyncio
from collections import Counter
from types import SimpleNamespace

import grpc
import pytest

from floering.wire.codec import pack
from floering.node.core.columnar import pytable
from floering.wire.errors import InvalidArgument
from floering.wire.pieces import RESERVED
from floering.node.core.reducers import Count
from floering.node.core.retired import pieces, restore_chunk
from floering.node.core.state_store import LayeredState
from floering.node.core.state_wire import decode, encode_pairs, is_frame
from floering.node.core.table_state import KERNEL, TableState
from floering.node.core import retiring
from floering.node.transport.snapshots import Snapshots
from floering.v1 import floe_pb2
from tests.support.hostile_restore_shared import snapshot
from tests.support.retired_shared import cluster

WORDS = [f"w{i % 2003}" for i in range(20_000)] + [f"long-{i:06d}" * 4 for i in range(3000)]
KINDS = ["compiled", "pure", "dict"]


def lost_range(kind: str):
    """n0's lost range (its state of `kind`, empty), n1's retired copy of it, and the
    words of that range counted independently."""
    c = cluster()
    c.push("s1", WORDS)
    ring = c.ring.without(["n1", "n2"])     # n1 and n2 removed at r=1: n0's ranges lost
    n1, n0 = c.cores["n1"], c.cores["n0"]
    n1.adopt_ring(ring)
    n0.adopt_ring(ring)
    c.ring = ring
    token = max(n0.lost_tokens, key=lambda t: sum(ring.token_for_key(w) == t for w in WORDS))
    r = next(r for r in n1.retired if token in pieces(ring, r.lo, r.token))
    part = {k: v for k, v in r.states.items() if ring.token_for_key(k) == token}
    rng = n0.primaries[token]
    assert not len(rng.state) and not rng.watermarks
    if kind == "compiled":
        if KERNEL != "compiled":
            pytest.skip("the compiled table is not built")
        rng.state = TableState(Count())
    elif kind == "pure":
        rng.state = TableState(Count(), table_class=pytable.StateTable)
    else:
        rng.state = LayeredState(Count())
    want = Counter(w for w in WORDS if c.ring.token_for_key(w) == token)
    return c, n0, token, r, part, want


def counts(rng) -> Counter:
    return Counter(dict(rng.state.snapshot()))


@pytest.mark.parametrize("kind", KINDS)
def test_a_retired_copy_sent_as_frames_is_restored_exactly(kind, monkeypatch):
    monkeypatch.setattr(retiring, "CHUNK_BYTES", 4 << 10)
    c, n0, token, r, part, want = lost_range(kind)
    assert dict(part) == dict(want) and len(want) > 300
    chunks = retiring.restore_chunks(part, frames=True)
    assert len(chunks) > 3 and all(is_frame(chunk) for chunk in chunks)
    assert all(len(chunk) <= 4 << 10 for chunk in chunks)
    for n, chunk in enumerate(chunks, 1):
        held = restore_chunk(n0, c.ring.stamp, token, "n1", r.token, n, len(chunks),
                             decode(chunk), None, r.watermarks if n == 1 else {}, 1.0)
        assert held == n
    rng = n0.primaries[token]
    assert counts(rng) == want
    assert token not in n0.lost_tokens
    assert rng.watermarks["s1"] == r.watermarks["s1"]
    # a chunk sent again changes nothing
    restore_chunk(n0, c.ring.stamp, token, "n1", r.token, 1, len(chunks),
                  decode(chunks[0]), None, r.watermarks, 2.0)
    assert counts(rng) == want


def test_a_user_defined_reducers_copy_is_sent_as_msgpack():
    part = {"a": (1, 2), "b": (3,)}
    chunks = retiring.restore_chunks(part, frames=False)
    assert chunks and not any(is_frame(chunk) for chunk in chunks)
    assert retiring.restore_chunks({}, frames=True) == [encode_pairs([], [])]


def _bad_frames(c, token, part) -> dict:
    mine = sorted(part)
    other = next(f"x{i}" for i in range(10_000) if c.ring.token_for_key(f"x{i}") != token)
    bad_key = next(k for k in (RESERVED + b"junk%d" % i for i in range(10_000))
                   if c.ring.token_for_key(k) == token)
    return {
        "key twice": encode_pairs([mine[0], mine[1], mine[0]], [1, 1, 1]),
        "key of another range": encode_pairs(mine[:5] + [other], [1] * 6),
        "state the reducer refuses": encode_pairs(mine[:5], [1, 1, 1, 1, "x"]),
        "bad key bytes": encode_pairs(mine[:5] + [bad_key], [1] * 6),
    }


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bad", ["key twice", "key of another range",
                                 "state the reducer refuses", "bad key bytes"])
def test_a_bad_frame_is_refused_and_the_range_is_unchanged(kind, bad):
    c, n0, token, r, part, want = lost_range(kind)
    frame = decode(_bad_frames(c, token, part)[bad])
    before = snapshot(n0)
    with pytest.raises(InvalidArgument):
        restore_chunk(n0, c.ring.stamp, token, "n1", r.token, 1, 2, frame, None,
                      r.watermarks, 1.0)
    assert snapshot(n0) == before
    # a good first chunk, then a bad second: the second merges nothing
    mine = sorted(part)
    half = encode_pairs(mine[:100], [part[k] for k in mine[:100]])
    assert restore_chunk(n0, c.ring.stamp, token, "n1", r.token, 1, 2, decode(half), None,
                         r.watermarks, 1.0) == 1
    before = snapshot(n0)
    with pytest.raises(InvalidArgument):
        restore_chunk(n0, c.ring.stamp, token, "n1", r.token, 2, 2, frame, None, {}, 1.0)
    assert snapshot(n0) == before
    assert counts(n0.primaries[token]) == Counter({k: part[k] for k in mine[:100]})


class _Aborted(Exception):
    pass


class _Context:
    def __init__(self) -> None:
        self.code = None

    async def abort(self, code, details):
        self.code = code
        raise _Aborted(details)


def _restore_call(n0, request):
    service = SimpleNamespace(runtime=SimpleNamespace(core=n0, clock=lambda: 1.0),
                              check_started=lambda: None)
    context = _Context()
    try:
        reply = asyncio.run(Snapshots(service).RestoreRange(request, context))
    except _Aborted:
        return None, context.code
    return reply, None


@pytest.mark.parametrize("kind", KINDS)
def test_restore_range_takes_frames_and_msgpack_and_refuses_bad_frames(kind):
    c, n0, token, r, part, want = lost_range(kind)
    mine = sorted(part)
    fields = dict(ring_stamp=c.ring.stamp, token=token, member="n1", retired=r.token,
                  chunk=1, chunks=2, watermarks=pack(r.watermarks))
    good = encode_pairs(mine[:50], [part[k] for k in mine[:50]])
    refused = list(_bad_frames(c, token, part).values()) + [good[:-1], good + b"\x00"]
    for entries in refused:
        before = snapshot(n0)
        reply, code = _restore_call(n0, floe_pb2.RestoreChunk(entries=entries, **fields))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert snapshot(n0) == before
    reply, code = _restore_call(n0, floe_pb2.RestoreChunk(entries=good, **fields))
    assert code is None and reply.chunks_held == 1
    rest = mine[50:]                       # an older sender's msgpack chunk
    reply, code = _restore_call(n0, floe_pb2.RestoreChunk(
        entries=pack([rest, [part[k] for k in rest]]), **dict(fields, chunk=2,
                                                               watermarks=b"")))
    assert code is None and reply.chunks_held == 2
    assert counts(n0.primaries[token]) == want
    assert token not in n0.lost_tokens
