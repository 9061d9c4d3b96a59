"""One client cannot starve or shut out the others: call slots shared out by caller
identity, source tables with a share per identity, sources bound to the identity that
pushes them. Unit checks on the core, then real node processes with mutual TLS."""

from collections import Counter

import grpc
import pytest

from floering.node.core.batch import encode_payload
from floering.node.core.dedup import bind_source, owner_of
from floering.wire.epochs import floor_key
from floering.wire.errors import Busy, TooLarge
from floering.node.core.ranges import PrimaryRange
from floering.node.core.reducers import load_reducer
from floering.node.core.slots import (CLIENT, HEALTH, MEMBER, OPERATOR, CallSlots, kind_of,
                                      peer_host)
from floering.node.core.streams import StreamGuard


# ------------------------------------------------------------- call slots

def test_one_identity_holds_a_quarter_and_reserved_kinds_get_through_a_full_pool():
    slots = CallSlots(100)
    held = [slots.take(CLIENT, "client:c", f"conn{i % 3}") for i in range(25)]
    with pytest.raises(Busy, match="a quarter of --max-concurrent-rpcs"):
        slots.take(CLIENT, "client:c", "conn9")
    assert slots.refused == 1
    # other identities fill the shared pool ...
    others = [slots.take(CLIENT, f"client:x{i}", f"c{i}") for i in range(slots.shared - 25)]
    with pytest.raises(Busy, match="calls are being served"):
        slots.take(CLIENT, "client:late", "cl")
    # ... and members, health checks and operators still have theirs
    reserved = [slots.take(MEMBER, "node:n1", "p1") for _ in range(slots.reserve[MEMBER])]
    reserved += [slots.take(HEALTH, "client:late", "h")]
    reserved += [slots.take(OPERATOR, "operator:op", "o")
                 for _ in range(slots.reserve[OPERATOR])]
    with pytest.raises(Busy):
        slots.take(MEMBER, "node:n1", "p1")
    with pytest.raises(Busy):
        slots.take(OPERATOR, "operator:op", "o")
    for ticket in held + others + reserved:
        slots.give(ticket)
    assert slots.active == 0 and not slots.by_identity and not slots.by_connection


def test_a_connection_holds_a_quarter_too():
    slots = CallSlots(40)
    for i in range(10):
        slots.take(CLIENT, f"id{i}", "one-connection")
    with pytest.raises(Busy, match="this connection holds 10"):
        slots.take(CLIENT, "id-new", "one-connection")


def test_health_checks_past_their_reserve_count_against_the_callers_quarter():
    slots = CallSlots(100)
    assert slots.reserve[HEALTH] == 2 and slots.per_identity == 25
    held = [slots.take(HEALTH, "ipv4:127.0.0.1", f"c{i}") for i in range(25)]
    assert sum(t.reserved for t in held) == 2       # the reserve's, then its quarter
    with pytest.raises(Busy, match="a quarter of --max-concurrent-rpcs"):
        slots.take(HEALTH, "ipv4:127.0.0.1", "c-new")
    assert slots.in_shared == 23                    # the rest of the pool is others'
    other = slots.take(CLIENT, "ipv4:10.0.0.2", "x")
    for ticket in [*held, other]:
        slots.give(ticket)
    assert slots.active == 0 and not slots.by_identity and not slots.by_connection
    # a caller at its quarter still has its health checks answered from the reserve
    streams = [slots.take(CLIENT, "client:c", f"s{i}") for i in range(25)]
    assert slots.take(HEALTH, "client:c", "h").reserved
    with pytest.raises(Busy):
        slots.take(CLIENT, "client:c", "s-new")
    assert len(streams) == 25


def test_in_the_clear_a_caller_is_its_host_not_its_connection():
    assert peer_host("ipv4:127.0.0.1:50123") == "ipv4:127.0.0.1"
    assert peer_host("ipv6:[::1]:50123") == "ipv6:[::1]"
    assert peer_host("ipv6:%5B::1%5D:50123") == "ipv6:%5B::1%5D"
    assert peer_host("unix:/tmp/sock") == "unix:/tmp/sock"
    assert peer_host("?") == "?"


def test_kinds_by_role_and_method():
    assert kind_of("node", "Push", False) == MEMBER
    assert kind_of(None, "Heartbeat", True) == MEMBER       # in the clear: by method
    assert kind_of("client", "Heartbeat", True) == CLIENT   # refused later, by role
    assert kind_of("client", "Check", False) == HEALTH
    assert kind_of("client", "Watch", False) == CLIENT      # a stream is its caller's
    assert kind_of("operator", "Move", False) == OPERATOR


# ------------------------------------------------------- sources and owners

def test_a_bound_source_keeps_its_kind_and_its_epoch_group_under_its_owner():
    a, b = bind_source("client:a", "s"), bind_source("client:b", "s")
    assert a != b and owner_of(a) != owner_of(b) and owner_of(a) is not None
    assert owner_of("s") is None and owner_of("fold:xyz") is None
    combined = bind_source("client:a", "combined:s")
    assert combined.startswith("combined:") and owner_of(combined) == owner_of(a)
    group_a = floor_key(bind_source("client:a", "query#3"))
    group_b = floor_key(bind_source("client:b", "query#3"))
    assert group_a != group_b and owner_of(group_a) == owner_of(a)


def push_one(rng, source, seq=1, now=0.0, max_sources=8):
    return rng.apply(source, seq, seq, 1, encode_payload(["k"], [1]), b"", now=now,
                     max_sources=max_sources)


def test_one_identitys_flood_refuses_only_its_own_new_sources():
    rng = PrimaryRange(1, load_reducer("count"))
    flood = [bind_source("client:mallory", f"m{i}") for i in range(2)]
    for source in flood:
        push_one(rng, source)
    with pytest.raises(TooLarge, match="its share"):
        push_one(rng, bind_source("client:mallory", "m2"))
    assert push_one(rng, flood[0], seq=2) == (1, 0)         # its known ones flow on
    for i in range(2):
        assert push_one(rng, bind_source("client:alice", f"a{i}")) == (1, 0)
    assert push_one(rng, "clear0") == (1, 0)                # unbound: the range's bound only
    assert rng.state.snapshot() == {"k": 6}


def test_the_stream_map_gives_an_identity_a_quarter_of_the_node():
    guard = StreamGuard(8, 100.0, 3600.0)
    for i in range(2):
        source = bind_source("client:mallory", f"m{i}")
        guard.check(source, 1, 0.0, None)
        guard.accept(source, 1, 0.0)
    with pytest.raises(TooLarge, match="its share"):
        guard.check(bind_source("client:mallory", "m2"), 1, 0.0, None)
    guard.check(bind_source("client:alice", "a0"), 1, 0.0, None)
    # once idle past the expiry they leave, and the identity may open new ones
    guard.check(bind_source("client:mallory", "m2"), 1, 200.0, None)


# ---------------------------------------------------- real processes, TLS


# ------------------------------------------------------- combining overflow

def test_a_combined_count_past_64_bits_goes_as_several_tuples_none_lost():
    from floering.mapper.batching import batcher_for
    from floering.node.core.batch import decode_payload
    from floering.node.core.reducers import reducer_identity
    from floering.wire.ring import Ring
    from floering.mapper.combining import HIGHEST, LOWEST

    class Delivery:
        ring = Ring.initial({"a": "h:1", "b": "h:2"}, 1, 4,
                            reducer=reducer_identity("count", {}))
        on_ring_change = None
    batcher = batcher_for(Delivery(), "m1", False, 1000, 1)
    sent = Counter()
    for key, value, times in (("big", 2 ** 63, 5), ("neg", -(2 ** 62), 9), ("w", 1, 7),
                              ("big", HIGHEST, 3), ("edge", HIGHEST, 1)):
        batcher.emit_many([key] * times, value)
        sent[key] += value * times
    batcher.seal_all()
    batches = []
    batcher.drain(batches.append)
    got = Counter()
    for b in batches:
        keys, values = decode_payload(b.payload, b.count)
        assert all(LOWEST <= v <= HIGHEST for v in values)
        for k, v in zip(keys, values):
            got[k] += v
    assert got == sent
    seqs = [s for b in batches for s in range(b.first_seq, b.last_seq + 1)]
    assert seqs == list(range(1, len(seqs) + 1))               # no seq lost or reused


def test_a_query_refused_busy_is_called_again_until_it_is_served():
    import asyncio
    import time
    from floering.mapper.queries import query
    from floering.wire.status import details_for

    busy = grpc.aio.AioRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.aio.Metadata(),
                                grpc.aio.Metadata(), details_for(Busy("all taken")))
    calls = []

    class Delivery:
        ring = object()
        clock = staticmethod(time.monotonic)

    async def make_call(ring):
        calls.append(ring)
        if len(calls) < 4:
            raise busy
        return "served"
    assert asyncio.run(query(Delivery(), 10.0, make_call)) == "served"
    assert len(calls) == 4

    async def always_busy(ring):
        raise busy
    with pytest.raises(Busy):
        asyncio.run(query(Delivery(), 0.1, always_busy))
