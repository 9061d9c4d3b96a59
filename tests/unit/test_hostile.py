"""Hostile and careless input: forged ring views, poisoned stream numbers, counts past
64 bits. Unit checks on the core, then real node processes fed through the client."""

from dataclasses import replace

import msgpack
import pytest

from floering.node.core.batch import Batch, encode_payload
from floering.wire.codec import pack, pack_entries, unpack, unpack_entries
from floering.wire.errors import InvalidArgument, StaleRing
from floering.node.core.node_core import NodeCore
from floering.node.core.reducers import load_reducer
from floering.wire.ring import MAX_VERSION, Ring
from floering.wire.ring_merge import MAX_VERSION_STEP
from tests.support.hostile_shared import MEMBERS, ring


# ------------------------------------------------------------- big integers

@pytest.mark.parametrize("value", [2 ** 64, -(2 ** 63) - 1, 3 ** 200, (1, 2 ** 70, "x")])
def test_states_past_64_bits_travel_exactly(value):
    assert unpack(pack(value)) == value
    assert unpack_entries(pack_entries({"k": value})) == {"k": value}


def test_an_unknown_extension_or_an_endless_number_is_refused():
    with pytest.raises(InvalidArgument):
        unpack(msgpack.packb(msgpack.ExtType(9, b"x")))
    with pytest.raises(InvalidArgument):
        unpack(msgpack.packb(msgpack.ExtType(1, b"9" * 100_000)))


# ----------------------------------------------------------- forged ring views

def test_a_view_with_another_replication_factor_is_refused():
    with pytest.raises(InvalidArgument, match="r=1"):
        ring().merge(replace(ring(), replication=0, version=2))


def test_a_view_moving_a_member_elsewhere_is_refused():
    forged = Ring.initial({**MEMBERS, "n1": "10.6.6.6:7000"}, 1, 2).with_version(5)
    with pytest.raises(InvalidArgument, match="moves member 'n1'"):
        ring().merge(forged)


def test_a_view_far_ahead_is_absorbed_a_step_at_a_time_and_no_version_overflows_the_stamp():
    # Refusing it would split the ring for good (its peers would refuse the node it
    # was pushed to); merged as MAX_VERSION_STEP ahead, every node converges.
    assert ring().merge(ring().with_version(MAX_VERSION_STEP + 5)).version == MAX_VERSION_STEP + 1
    far = ring().merge(ring().without(["n2"]).with_version(MAX_VERSION_STEP))
    assert far.version == MAX_VERSION_STEP and "n2" not in far.nodes   # far, but plausible
    wire = msgpack.unpackb(ring().to_wire())
    wire["version"] = MAX_VERSION             # its stamp would not fit the wire's uint64
    with pytest.raises(InvalidArgument):
        Ring.from_wire(msgpack.packb(wire))


def test_losses_are_accepted_only_with_the_removals_that_cause_them():
    r = ring()
    with pytest.raises(InvalidArgument, match="lost"):
        r.merge(replace(r, lost=frozenset(r.tokens[:1])).with_version(r.version + 1))
    both = r.without(["n0", "n1"])                 # a range and its replica both gone
    assert both.lost and r.merge(both).lost == both.lost
    split = both.split_token(next(iter(both.lost)), next(iter(both.lost)) - 1000)
    assert len(r.merge(split).lost) == len(both.lost) + 1     # its split-off part too


def test_a_refused_view_changes_nothing_on_the_node():
    core = NodeCore("n0", ring(), load_reducer("count"))
    with pytest.raises(InvalidArgument):
        core.adopt_ring(replace(ring(), replication=0, version=9))
    assert core.ring == ring() and not core.fenced


# ------------------------------------------------------- poisoned stream numbers

def test_a_refused_batch_does_not_retire_its_sources_stream():
    key = next(k for k in (f"k{i}" for i in range(100)) if ring().owner(k) == "n0")
    core = NodeCore("n0", ring(), load_reducer("count"))
    token = ring().token_for_key(key)
    with pytest.raises(StaleRing):      # a wrong ring stamp: refused...
        core.receive_batch(Batch(12345, token, "s", 1, 1, 1, encode_payload([key], [1]),
                                 stream=2 ** 64 - 1))
    # ...so the source's real stream still delivers
    ok = Batch(ring().stamp, token, "s", 1, 1, 1, encode_payload([key], [1]), stream=7)
    assert core.receive_batch(ok).applied == 1


def test_a_stream_numbered_far_past_the_nodes_clock_is_refused_and_retires_nothing():
    key = next(k for k in (f"k{i}" for i in range(100)) if ring().owner(k) == "n0")
    core = NodeCore("n0", ring(), load_reducer("count"))
    token = ring().token_for_key(key)
    wall = 1_800_000_000.0
    now_us = int(wall * 1e6)

    def batch(seq, stream):
        return Batch(ring().stamp, token, "s", seq, seq, 1, encode_payload([key], [1]),
                     stream=stream)
    with pytest.raises(InvalidArgument, match="ahead of this node's clock"):
        core.receive_batch(batch(1, 2 ** 64 - 1), wall=wall)
    with pytest.raises(InvalidArgument):
        core.receive_batch(batch(1, now_us + 3601 * 10 ** 6), wall=wall)
    # the real stream, numbered by a clock a few minutes fast, still delivers
    assert core.receive_batch(batch(1, now_us + 300 * 10 ** 6), wall=wall).applied == 1
    assert core.receive_batch(batch(2, now_us + 301 * 10 ** 6), wall=wall).applied == 1
    assert core.items() and dict(core.items())[key] == 2


def test_the_sources_a_node_tracks_are_bounded_and_idle_ones_make_room():
    from floering.node.core.batch import Limits
    from floering.wire.errors import TooLarge
    key = next(k for k in (f"k{i}" for i in range(100)) if ring().owner(k) == "n0")
    token = ring().token_for_key(key)
    core = NodeCore("n0", ring(), load_reducer("count"),
                    Limits(max_sources_per_node=3, source_expiry=60.0))

    def batch(source, seq=1):
        return Batch(ring().stamp, token, source, seq, seq, 1, encode_payload([key], [1]),
                     stream=5)
    for i in range(3):
        core.receive_batch(batch(f"s{i}"), now=0.0)
    with pytest.raises(TooLarge, match="max-sources-per-node"):
        core.receive_batch(batch("s3"), now=30.0)
    assert len(core.streams.newest) == 3
    core.receive_batch(batch("s0", 2), now=40.0)    # s0 is active again; s1, s2 idle
    assert core.receive_batch(batch("s4"), now=90.0).applied == 1
    assert set(core.streams.newest) == {"s0", "s4"}
    assert dict(core.items())[key] == 5             # every accepted batch counted once


# ------------------------------------------------------------ real processes


@pytest.mark.parametrize("seqs", [[1, 3, 2], [1, 2, 2], [1, "x", 3], [2, 3, 4]])
def test_bad_explicit_seqs_are_refused_even_in_a_batch_that_is_all_new(seqs):
    from tests.support.helpers import CoreCluster
    c = CoreCluster(nodes=2, replication=1, tokens_per_node=1)
    token, fields = c.batches("s", ["a", "b", "c"])[0]
    fields.update(first_seq=1, last_seq=3, seqs=msgpack.packb(seqs), count=3,
                  payload=encode_payload(["a"] * 3, [1] * 3))
    fields["token"] = c.ring.token_for_key("a")
    for node in c.ring.destinations(fields["token"]):     # the primary and the replica
        with pytest.raises(InvalidArgument):
            c.cores[node].receive_batch(Batch(**fields))


def test_hostile_text_in_statuses_is_escaped_and_cut():
    from tests.support.helpers import CoreCluster
    c = CoreCluster(nodes=2, replication=0, tokens_per_node=2)
    key = "evil\n" + "x" * 100_000
    token = c.ring.token_for_key(key)
    other = next(t for t in c.ring.tokens if t != token
                 and c.ring.owner_of_token(t) == c.ring.owner_of_token(token))
    batch = Batch(c.ring.stamp, other, "s", 1, 1, 1, encode_payload([key], [1]))
    with pytest.raises(InvalidArgument) as refused:
        c.cores[c.ring.owner_of_token(other)].receive_batch(batch)
    message = str(refused.value)
    assert len(message) < 200 and "\n" not in message and "\\n" in message
    with pytest.raises(InvalidArgument) as refused:
        load_reducer("count").check_values(("1\n2" * 1000,))
    assert len(str(refused.value)) < 200 and "\n" not in str(refused.value)

    def inert_text(message: str) -> None:
        assert len(message) < 300, message[:300]
        assert not any(ord(ch) < 32 or ch == "\x7f" for ch in message), message
        assert "characters)" in message           # cut, and says how long it was

    # A source id with control characters, of any length the node was told to take:
    # echoed in the status of a batch from one of its replaced streams.
    from floering.node.core.batch import Limits
    source = "mapper\n2024-01-01 INFO forged line\r\x1b[2J\x00" + "s" * 100_000
    core = NodeCore("n0", ring(), load_reducer("count"), Limits(max_source_bytes=200_000))
    key = next(k for k in (f"k{i}" for i in range(100)) if ring().owner(k) == "n0")
    token = ring().token_for_key(key)
    payload = encode_payload([key], [1])
    core.receive_batch(Batch(ring().stamp, token, source, 1, 1, 1, payload, stream=9))
    with pytest.raises(StaleRing) as refused:
        core.receive_batch(Batch(ring().stamp, token, source, 2, 2, 1, payload, stream=8))
    inert_text(str(refused.value))
    # A sender with control characters and a megabyte of text: in the status of a
    # checkpoint for a range it does not own, and in a shed request's reason.
    sender = "n1\nWARNING forged\x1b[31m\x00" + "x" * 1_000_000
    with pytest.raises(StaleRing) as refused:
        core.receive_checkpoint(sender, ring().stamp, token, 1, 0, True, {}, {})
    inert_text(str(refused.value))

    import asyncio
    from types import SimpleNamespace
    from floering.node.runtime.service import NodeService
    reasons = []

    async def shed_load(reason, depth=0, share=None, member=""):
        reasons.append(reason)
    asyncio.run(NodeService(SimpleNamespace(shed_load=shed_load, ask=_ask)).shed(sender, 1))
    inert_text(reasons[0])


def _ask(kind, **fields):
    """A runtime's request to a machine of a ring of three (n0..n2)."""
    from floering.node.core.requests import answer
    from tests.support.machine_shared import machine
    return answer(machine(), kind, fields, 0.0, [])


def test_a_share_is_asked_for_only_by_the_member_the_certificate_names():
    # A member short of its share is handed ranges by name; another member's
    # certificate asking in its name makes an ordinary shedding request.
    import asyncio
    from types import SimpleNamespace
    from floering.node.runtime.service import NodeService
    asked = []

    async def shed_load(reason, depth=0, share=None, member=""):
        asked.append(member)
    service = NodeService(SimpleNamespace(shed_load=shed_load, ask=_ask))
    asyncio.run(service.shed("n2#1", 0, identity="n2"))
    asyncio.run(service.shed("n2#1", 0, identity="n3"))
    asyncio.run(service.shed("n2", 0, identity="n2"))
    assert asked == ["n2#1", "", "n2"]


def test_every_key_of_a_batch_is_checked_against_its_token_not_only_the_first():
    from tests.support.helpers import CoreCluster
    c = CoreCluster(nodes=2, replication=0, tokens_per_node=2)
    token = c.ring.token_for_key("a")
    owner = c.ring.owner_of_token(token)
    mine = [k for k in (f"k{i}" for i in range(200)) if c.ring.token_for_key(k) == token][:3]
    stray = next(k for k in (f"s{i}" for i in range(200)) if c.ring.token_for_key(k) != token)
    keys = [mine[0], mine[1], stray, mine[2]]          # the stray key is not the first
    batch = Batch(c.ring.stamp, token, "s", 1, 4, 4, encode_payload(keys, [1] * 4))
    with pytest.raises(InvalidArgument, match="does not belong"):
        c.cores[owner].receive_batch(batch)
    assert c.state() == {}                              # nothing of it was applied
    ok = Batch(c.ring.stamp, token, "s", 1, 3, 3, encode_payload(mine, [1] * 3))
    assert c.cores[owner].receive_batch(ok).applied == 3


def test_a_full_backup_store_refuses_batches_until_checkpoints_make_room():
    from floering.node.core.batch import Limits
    from floering.wire.errors import Overloaded
    r = Ring.initial({"p": "a:1", "b": "a:2"}, 1, 1)
    token = r.tokens_of("p")[0]
    key = next(k for k in (f"k{i}" for i in range(1000)) if r.token_for_key(k) == token)
    primary = NodeCore("p", r, load_reducer("count"))
    replica = NodeCore("b", r, load_reducer("count"), Limits(max_backup_bytes=100))
    batches = [Batch(r.stamp, token, "s", i, i, 1, encode_payload([key], [1]))
               for i in range(1, 40)]
    taken = 0
    for b in batches:
        try:
            replica.receive_batch(b)
        except Overloaded as exc:
            assert "--max-backup-bytes" in str(exc)
            break
        primary.receive_batch(b)
        taken += 1
    assert 0 < taken < len(batches)           # the replica filled up and said so
    for s in primary.plan_checkpoints():      # a checkpoint covers what it holds...
        need_full, seq = replica.receive_checkpoint(
            "p", r.stamp, s.checkpoint.token, s.checkpoint.seq, s.base_seq,
            s.checkpoint.full, dict(s.checkpoint.states), dict(s.checkpoint.watermarks))
        primary.checkpoint_acked(s.checkpoint.token, "b", seq, need_full)
        primary.checkpoint_done(s.checkpoint.token)
    assert replica.replicas.backups.bytes == 0
    replica.receive_batch(batches[taken])     # ...and it takes batches again


def test_a_source_ids_limit_counts_bytes_not_characters():
    from floering.node.core.batch import Limits
    from floering.wire.errors import TooLarge
    key = next(k for k in (f"k{i}" for i in range(100)) if ring().owner(k) == "n0")
    token = ring().token_for_key(key)
    core = NodeCore("n0", ring(), load_reducer("count"), Limits(max_source_bytes=16))

    def batch(source):
        return Batch(ring().stamp, token, source, 1, 1, 1, encode_payload([key], [1]))
    with pytest.raises(TooLarge, match="24 bytes"):
        core.receive_batch(batch("\u20ac" * 8))           # 8 characters, 24 bytes
    assert core.receive_batch(batch("\u20ac" * 5)).applied == 1
