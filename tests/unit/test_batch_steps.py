"""A large batch is read, checked and verified over several steps and applied whole in
the last (NodeCore.receive_batch_steps): nothing of it shows before, a malformed one
is refused whole, and one whose ring or range changed between steps is refused
StaleRing with nothing of it applied. A replica reads and checks a large backup so,
and keeps it in the last step."""

from collections import Counter
from dataclasses import replace

import msgpack
import pytest

from floering.node.core.batch import (Batch, encode_batch, encode_payload, unpack_payload,
                                      unpack_payload_steps)
from floering.node.core.node_core import NodeCore
from floering.node.core.ranges import EACH_TUPLES, STEP_TUPLES, drain
from floering.node.core.reducers import Count
from floering.node.core.table_state import state_kernel
from floering.wire.errors import InvalidArgument, InvalidKey, Overloaded, StaleRing
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


def steps_of(gen, between=None) -> tuple[int, object]:
    """(the steps a generator yielded, its value), run to its end; `between(taken)`
    after each step it yields."""
    taken = 0
    while True:
        try:
            next(gen)
        except StopIteration as done:
            return taken, done.value
        taken += 1
        if between is not None:
            between(taken)


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

    def nothing_yet(taken: int) -> None:
        assert dict(core.items()) == {}, f"applied before the last step ({taken})"
    taken, result = steps_of(core.receive_batch_steps(batch(c, token, keys)), nothing_yet)
    assert taken > N // STEP_TUPLES                    # in several steps
    assert taken > N // EACH_TUPLES                    # its keys verified a slice a step
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


@pytest.mark.parametrize("bad_at", [0, STEP_TUPLES + 2 * EACH_TUPLES + 5, N - 1])
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


# ------------------------------------------------- a replica's backup of a large batch

def backed_up(c: CoreCluster, node: str = "n1") -> int:
    """A token `node` backs up (of another member's range)."""
    return next(t for t in c.ring.tokens if c.ring.role_of(node, t) == "replica")


@pytest.mark.parametrize("fmt", [1, 2])
@pytest.mark.parametrize("distinct", [True, False])
def test_a_large_backup_is_kept_whole_in_its_last_step_and_replays_exactly(fmt, distinct):
    c = CoreCluster(nodes=2, replication=1)
    replica, token = c.cores["n1"], backed_up(c)
    keys = keys_of(c, token, N, distinct)
    values = [i % 5 + 1 for i in range(N)]
    payload = encode_payload(keys, values) if fmt == 1 else encode_batch(keys, values)

    def nothing_yet(taken: int) -> None:
        assert replica.replicas.backups.tuples == 0, f"kept before the last step ({taken})"
    taken, result = steps_of(replica.receive_batch_steps(
        batch(c, token, keys, values, payload=payload)), nothing_yet)
    assert taken > N // STEP_TUPLES                    # in several steps
    assert (result.applied, result.duplicates) == (N, 0)
    assert replica.replicas.backups.tuples == N
    expect = Counter()
    for k, v in zip(keys, values):
        expect[k] += v
    state, marks = replica.replicas.rebuild(token)      # what a takeover would serve
    assert state == expect and marks == {"s": N}
    resent = replica.receive_batch(batch(c, token, keys, values, payload=payload))
    assert (resent.applied, replica.replicas.backups.tuples) == (N, N)   # held once
    assert replica.replicas.rebuild(token)[0] == expect
    replica.check_invariants()


@pytest.mark.parametrize("fmt", [1, 2])
@pytest.mark.parametrize("bad_at", [0, N - 1])
def test_a_malformed_large_backup_is_refused_whole(fmt, bad_at):
    c = CoreCluster(nodes=2, replication=1)
    replica, token = c.cores["n1"], backed_up(c)
    keys, values = keys_of(c, token, N), [1] * N
    if fmt == 1:
        values[bad_at] = 1.5                             # count takes no float
        payload = encode_payload(keys, values)
    else:                                                # a key not its position's
        payload = bytearray(encode_batch(keys, values))
        key = keys[bad_at].encode()
        at = (payload.find if bad_at == 0 else payload.rfind)(key) + len(key) - 1
        payload[at] = ord("9") if payload[at] != ord("9") else ord("8")
        payload = bytes(payload)
    with pytest.raises(InvalidArgument):
        replica.receive_batch(batch(c, token, keys, values, payload=payload))
    assert replica.replicas.backups.tuples == 0 and replica.counters["backed_up"] == 0


def test_a_ring_change_between_steps_refuses_the_backup_with_nothing_kept():
    c = CoreCluster(nodes=3, replication=1)
    replica, token = c.cores["n1"], backed_up(c)
    primary = c.ring.owner_of_token(token)
    gone = next(n for n in c.cores if n not in (primary, "n1"))
    keys = keys_of(c, token, N)
    steps = replica.receive_batch_steps(batch(c, token, keys))
    for _ in range(3):
        next(steps)
    replica.adopt_ring(c.ring.without([gone]))           # another member removed
    with pytest.raises(StaleRing):
        drain(steps)
    assert replica.replicas.backups.tuples == 0
    c.ring = replica.ring                                # resent with the new ring
    assert replica.ring.role_of("n1", token) == "replica"
    assert replica.receive_batch(batch(c, token, keys)).applied == N
    assert replica.replicas.backups.tuples == N
    assert replica.replicas.rebuild(token)[0] == Counter(keys)


def test_a_checkpoint_covering_the_backup_between_steps_makes_it_all_duplicates():
    c = CoreCluster(nodes=2, replication=1)
    primary, replica, token = c.cores["n0"], c.cores["n1"], backed_up(c)
    keys = keys_of(c, token, N, distinct=False)
    b = batch(c, token, keys)
    steps = replica.receive_batch_steps(b)
    for _ in range(4):
        next(steps)
    assert primary.receive_batch(b).applied == N
    c.checkpoint()                                       # covers the batch, between steps
    assert replica.replicas.ranges[token].watermarks == {"s": N}
    result = drain(steps)
    assert (result.applied, result.duplicates) == (0, N)
    assert replica.replicas.backups.tuples == 0
    assert replica.inspect_range(token) == ("replica", {keys[0]: N})


def test_a_backup_past_the_room_taken_between_steps_is_refused_overloaded():
    c = CoreCluster(nodes=2, replication=1)
    replica, token = c.cores["n1"], backed_up(c)
    keys = keys_of(c, token, N)
    big = batch(c, token, keys, source="big")
    small = batch(c, token, keys[:10], source="small")
    replica.limits = replace(replica.limits,
                             max_backup_bytes=len(big.payload) + len(small.payload) - 1)
    steps = replica.receive_batch_steps(big)
    next(steps)
    assert replica.receive_batch(small).applied == 10    # takes the room meanwhile
    with pytest.raises(Overloaded):
        drain(steps)
    assert replica.replicas.backups.tuples == 10


def test_a_small_backup_is_kept_in_one_step():
    c = CoreCluster(nodes=2, replication=1)
    replica, token = c.cores["n1"], backed_up(c)
    keys = keys_of(c, token, STEP_TUPLES)
    taken, result = steps_of(replica.receive_batch_steps(batch(c, token, keys)))
    assert (taken, result.applied, result.duplicates) == (0, STEP_TUPLES, 0)
    assert replica.replicas.backups.tuples == STEP_TUPLES
