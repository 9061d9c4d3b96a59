"""A large batch is read, checked and verified over several steps and applied whole in
the last (NodeCore.receive_batch_steps): nothing of it shows before, a malformed one
is refused whole, and one whose ring or range changed between steps is refused
StaleRing with nothing of it applied."""

from collections import Counter

import msgpack
import pytest

from floering.node.core.batch import (Batch, encode_batch, encode_payload, unpack_payload,
                                      unpack_payload_steps)
from floering.node.core.node_core import NodeCore
from floering.node.core.ranges import STEP_TUPLES, drain
from floering.node.core.reducers import Count
from floering.node.core.table_state import state_kernel
from floering.wire.errors import InvalidArgument, InvalidKey, StaleRing
from tests.support.helpers import CoreCluster

N = 3 * STEP_TUPLES + 17           # a few steps, the last one short


def keys_of(c: CoreCluster, token: int, n: int, distinct: bool = True) -> list[str]:
    found, i = [], 0
    while len(found) < (n if distinct else 1):
        key = f"k{i}"
        if c.ring.token_for_key(key) == token:
            found.append(key)
        i += 1
    return found if distinct else found * n


def batch(c: CoreCluster, token: int, keys, values=None, source="s", first=1,
          payload=None) -> Batch:
    values = [1] * len(keys) if values is None else values
    return Batch(c.ring.stamp, token, source, first, first + len(keys) - 1, len(keys),
                 payload if payload is not None else encode_payload(keys, values))


def owned(c: CoreCluster, node: str = "n0") -> int:
    return c.ring.tokens_of(node)[0]


class DictCount(Count):
    """Count in dicts (a subclass of a built-in keeps the dict path)."""


@pytest.mark.parametrize("kind", ["table", "dicts"])
@pytest.mark.parametrize("distinct", [True, False])
def test_a_large_batch_applies_whole_in_its_last_step(kind, distinct):
    c = CoreCluster(nodes=2, replication=1)
    if kind == "dicts":
        c.cores = {n: NodeCore(n, c.ring, DictCount()) for n in c.cores}
    core, token = c.cores["n0"], owned(c)
    assert type(core.primaries[token].state).__name__ == \
        ("LayeredState" if kind == "dicts" or state_kernel(Count()) != "compiled"
         else "TableState")
    keys = keys_of(c, token, N, distinct)
    expect = Counter(keys)
    steps = core.receive_batch_steps(batch(c, token, keys))
    taken = 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result = done.value
            break
        taken += 1
        assert dict(core.items()) == {}, f"applied before the last step ({taken})"
    assert taken > N // STEP_TUPLES                    # in several steps
    assert (result.applied, result.duplicates) == (N, 0)
    assert dict(core.items()) == expect
    assert core.primaries[token].watermarks == {"s": N}
    core.check_invariants()


def test_format_2_large_batch_also_steps():
    c = CoreCluster(nodes=2, replication=1)
    core, token = c.cores["n0"], owned(c)
    keys = keys_of(c, token, N)
    steps = core.receive_batch_steps(batch(c, token, keys, payload=encode_batch(keys, [2] * N)))
    next(steps)
    assert dict(core.items()) == {}
    assert drain(steps).applied == N
    assert dict(core.items()) == {k: 2 for k in keys}


@pytest.mark.parametrize("bad_at", [0, N - 1])
@pytest.mark.parametrize("bad", ["float", "foreign key"])
def test_a_malformed_large_batch_is_refused_whole(bad_at, bad):
    c = CoreCluster(nodes=2, replication=1)
    core, token = c.cores["n0"], owned(c)
    keys, values = keys_of(c, token, N), [1] * N
    if bad == "float":
        values[bad_at] = 1.5
    else:
        keys[bad_at] = next(k for k in (f"x{i}" for i in range(1000))
                            if c.ring.token_for_key(k) != token)
    with pytest.raises(InvalidArgument):
        core.receive_batch(batch(c, token, keys, values))
    assert dict(core.items()) == {} and core.primaries[token].watermarks == {}


def test_a_ring_change_between_steps_refuses_the_batch_with_nothing_applied():
    c = CoreCluster(nodes=3, replication=1)
    core, token = c.cores["n0"], owned(c)
    keys = keys_of(c, token, N)
    steps = core.receive_batch_steps(batch(c, token, keys))
    for _ in range(3):
        next(steps)
    core.adopt_ring(c.ring.without(["n2"]))              # another member removed
    with pytest.raises(StaleRing):
        drain(steps)
    assert dict(core.items()) == {} and core.primaries[token].watermarks == {}
    c.ring = core.ring                                   # resent with the new ring
    assert core.receive_batch(batch(c, token, keys)).applied == N
    assert dict(core.items()) == Counter(keys)


def test_a_checkpoint_between_steps_holds_none_of_the_batch_and_the_next_all_of_it():
    c = CoreCluster(nodes=2, replication=1)
    core, token = c.cores["n0"], owned(c)
    keys = keys_of(c, token, N, distinct=False)
    b = batch(c, token, keys)
    c.cores["n1"].receive_batch(b)                       # the replica's backup
    steps = core.receive_batch_steps(b)
    for _ in range(4):
        next(steps)
    c.checkpoint()                                       # cut between two steps
    replica = c.cores["n1"].replicas
    assert replica.ranges[token].watermarks == {} and replica.backups.tuples == N
    assert dict(replica.ranges[token].copy.master) == {}
    assert drain(steps).applied == N
    c.checkpoint()
    assert replica.ranges[token].watermarks == {"s": N} and replica.backups.tuples == 0
    assert c.cores["n1"].inspect_range(token) == ("replica", {keys[0]: N})


def test_a_resend_applied_between_steps_makes_the_batch_all_duplicates():
    c = CoreCluster(nodes=2, replication=1)
    core, token = c.cores["n0"], owned(c)
    keys = keys_of(c, token, N)
    first = core.receive_batch_steps(batch(c, token, keys))
    for _ in range(3):
        next(first)
    assert core.receive_batch(batch(c, token, keys)).applied == N
    result = drain(first)
    assert (result.applied, result.duplicates) == (0, N)
    assert dict(core.items()) == Counter(keys)


PAYLOADS = [                                             # (payload, count said)
    (encode_payload(["a", "b"] * (N // 2), list(range(N // 2 * 2))), N // 2 * 2),
    (encode_payload([b"x", 7, "\u00e9"] * 5, [1, 2.5, None] * 5), 15),
    (encode_payload(["a"] * 5, [1] * 5), 4),             # not the count said
    (encode_payload(["a"] * 5, [1] * 4), 5),             # counts that disagree
    (encode_payload(["a"] * 5, [1] * 5) + b"\x01", 5),   # bytes past the arrays
    (encode_payload(["a"] * 5, [1] * 5)[:-2], 5),        # cut short
    (msgpack.packb([["a"], [1], [2]]), 1),               # three arrays
    (msgpack.packb({"a": 1}), 1),                        # not an array
    (b"\x92\x91\xa2\xff\xfe\x91\x01", 1),               # a str key not UTF-8
]


@pytest.mark.parametrize("payload,count", PAYLOADS)
@pytest.mark.parametrize("size", [1, 3, STEP_TUPLES])
def test_unpacking_in_steps_reads_or_refuses_as_unpacking_whole(payload, count, size):
    try:
        whole = unpack_payload(payload, count)
    except InvalidArgument as exc:
        with pytest.raises(type(exc)):
            drain(unpack_payload_steps(payload, count, size))
    else:
        assert drain(unpack_payload_steps(payload, count, size)) == whole


def test_unpacking_in_steps_refuses_a_str_that_is_not_utf8_as_a_key_error():
    with pytest.raises(InvalidKey):
        drain(unpack_payload_steps(b"\x92\x91\xa2\xff\xfe\x91\x01", 1, 4))
