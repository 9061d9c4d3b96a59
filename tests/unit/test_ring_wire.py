"""A ring view's encoding is bounded before it is decoded, and building a ring from it
costs time linear in its size (wire.ring_wire)."""

import time

import msgpack
import pytest

from floering.wire.errors import InvalidArgument
from floering.wire.hashing import HASH_SPACE
from floering.wire.ring import Ring
from floering.wire.ring_wire import (MAX_RING_TOKENS, MAX_VIEW_BYTES, decode_view,
                                          replica_walks)


def naive_walks(owners, r):
    """The walk as the ring defines it: up to r distinct others, clockwise."""
    n, out = len(owners), []
    for i in range(n):
        chosen = [owners[i]]
        for step in range(1, n):
            if len(chosen) > r:
                break
            if owners[(i + step) % n] not in chosen:
                chosen.append(owners[(i + step) % n])
        out.append(tuple(chosen[1:]))
    return tuple(out)


@pytest.mark.parametrize("seed", range(40))
def test_the_linear_walk_equals_the_walk_by_definition(seed):
    import random
    rng = random.Random(seed)
    nodes = [f"n{i}" for i in range(rng.randint(1, 7))]
    owners = [rng.choice(nodes) for _ in range(rng.randint(1, 60))]
    for r in range(0, 5):
        assert replica_walks(owners, r) == naive_walks(owners, r)


def view(n, owners=("n0",), replication=1, **more):
    tokens = [(i + 1) * HASH_SPACE // n - 1 for i in range(n)]
    return msgpack.packb({"version": 5, "replication": replication, "tokens": tokens,
                          "owners": [owners[i % len(owners)] for i in range(n)],
                          "addresses": [[o, f"h:{i}"] for i, o in enumerate(owners)], **more})


def test_a_ring_of_the_most_tokens_builds_in_linear_time():
    # One owner for every token was quadratic (each token walked the whole ring for
    # replicas it could not find): 70,000 tokens held a node for minutes.
    started = time.process_time()
    ring = Ring.from_wire(view(MAX_RING_TOKENS))
    assert len(ring.tokens) == MAX_RING_TOKENS and ring.replicas_of_token(ring.tokens[0]) == ()
    Ring.from_wire(view(MAX_RING_TOKENS, owners=("a", "b"), replication=2))
    assert time.process_time() - started < 10


def test_oversized_views_are_refused_from_their_headers():
    with pytest.raises(InvalidArgument, match="over the limit"):
        decode_view(b"\x00" * (MAX_VIEW_BYTES + 1))
    started = time.process_time()
    with pytest.raises(InvalidArgument, match="not a valid ring"):
        Ring.from_wire(view(MAX_RING_TOKENS + 1))
    assert time.process_time() - started < 1       # refused before 65,537 tokens exist
    for bad in ({"version": 1, "replication": 10 ** 6}, {"version": 1},
                {"version": 1, "replication": 1, "x" * 2000: 1}):
        with pytest.raises(InvalidArgument):
            Ring.from_wire(msgpack.packb(bad))
    with pytest.raises(InvalidArgument, match="replication"):
        Ring.from_wire(view(4, replication=65))
    with pytest.raises(InvalidArgument):
        Ring.from_wire(view(4, owners=("n" * 2000,)))
    with pytest.raises(InvalidArgument):
        Ring.from_wire(b"\x92\x01\x02")             # not a map


def test_a_view_with_many_retiring_holders_merges_in_linear_time():
    members = {f"m{i}": f"h:{i}" for i in range(2000)}
    ring = Ring.initial(members, 1, 1)
    token = ring.tokens[0]
    held = ring.with_extras({token: list(members)[1:]},
                            holding=[(token, m) for m in list(members)[1:]])
    started = time.process_time()
    merged = ring.merge(Ring.from_wire(held.to_wire()))
    assert len(merged.retiring) == 1999
    merged.remove_node(ring.owner_of_token(token))
    assert time.process_time() - started < 5
