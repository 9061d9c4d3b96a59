"""RangeHeld and RestoreRange, the members' calls about retired ranges
(node.core.retired), fed hostile input: every field is refused with a clear status,
in bounded memory, and nothing changes. Pure rules first, then a real TLS ring."""

from collections import Counter

import pytest

from floering.wire.codec import pack
from floering.wire.errors import FloeError, InvalidArgument, StaleRing
from floering.node.core.retired import (Held, RetiredSet, held, pieces, restore_chunk)
from floering.node.core.snapshot_format import MAX_CHUNKS
from tests.support.retired_shared import WORDS, cluster
from tests.support.hostile_restore_shared import snapshot

GOOD_MARKS = {"s1": 600}


def lost(c):
    """n1 and n2 removed at r=1: n0 owns lost ranges; n1's retired copy of one."""
    c.push("s1", WORDS)
    ring = c.ring.without(["n1", "n2"])
    n1, n0 = c.cores["n1"], c.cores["n0"]
    n1.adopt_ring(ring)
    n0.adopt_ring(ring)
    c.ring = ring
    token = sorted(n0.lost_tokens)[0]
    r = next(r for r in n1.retired if token in pieces(ring, r.lo, r.token))
    part = {k: v for k, v in r.states.items() if ring.token_for_key(k) == token}
    return n0, token, r, part


HOSTILE_MARKS = [
    ["s1", 1],                              # not a map
    {"s1": "600"},                          # a seq that is not a number
    {"s1": -1},                             # below zero
    {"s1": 1 << 64},                        # past 64 bits
    {7: 600},                               # a source that is not text
    {"x" * 5000: 1},                        # a source past any limit
    {f"s{i}": 1 for i in range(70_000)},    # more sources than any range tracks
]


@pytest.mark.parametrize("marks", HOSTILE_MARKS, ids=lambda m: type(m).__name__ + str(len(m)))
def test_hostile_watermarks_are_refused_by_range_held_and_restore(marks):
    c = cluster()
    n0, token, r, part = lost(c)
    before = snapshot(n0)
    with pytest.raises(InvalidArgument):
        held(n0, token, marks)
    with pytest.raises(InvalidArgument):
        restore_chunk(n0, c.ring.stamp, token, "n1", r.token, 1, 1, list(part),
                      list(part.values()), marks, 1.0)
    assert snapshot(n0) == before


@pytest.mark.parametrize("fields, error", [
    (dict(member="n" * 300), InvalidArgument),              # a name no member has
    (dict(member=""), InvalidArgument),
    (dict(chunk=0), InvalidArgument),
    (dict(chunk=3, chunks=2), InvalidArgument),
    (dict(chunk=2, chunks=3), InvalidArgument),             # not the next chunk
    (dict(chunks=MAX_CHUNKS + 1), InvalidArgument),
    (dict(token=12345), StaleRing),                         # no such range
    (dict(ring_stamp=1), StaleRing),
    (dict(keys="other token"), InvalidArgument),            # a key of another range
    (dict(states="wrong type"), InvalidArgument),           # not a count's state
])
def test_a_hostile_restore_chunk_is_refused_and_changes_nothing(fields, error):
    c = cluster()
    n0, token, r, part = lost(c)
    call = dict(ring_stamp=c.ring.stamp, token=token, member="n1", retired=r.token,
                chunk=1, chunks=1, keys=list(part), states=list(part.values()),
                watermarks=r.watermarks)
    if fields.get("keys") == "other token":
        other = next(w for w in WORDS if c.ring.token_for_key(w) != token)
        fields = dict(keys=[*part, other], states=[*part.values(), 1])
    elif fields.get("states") == "wrong type":
        fields = dict(states=["x"] * len(part))
    call.update(fields)
    before = snapshot(n0)
    with pytest.raises(error):
        restore_chunk(n0, call["ring_stamp"], call["token"], call["member"], call["retired"],
                      call["chunk"], call["chunks"], call["keys"], call["states"],
                      call["watermarks"], 1.0)
    assert snapshot(n0) == before


def test_a_range_not_lost_takes_no_restore():
    c = cluster()
    c.push("s1", WORDS)
    n0 = c.cores["n0"]
    token = next(iter(n0.primaries))
    before = snapshot(n0)
    with pytest.raises(FloeError):
        restore_chunk(n0, c.ring.stamp, token, "n1", token, 1, 1, ["w1"], [5], {"s9": 1}, 1.0)
    assert snapshot(n0) == before


def test_copies_merged_into_one_lost_range_are_bounded():
    """Fuller copies may replace the one merged, a few times: not without end (each
    leaves its mark among the range's watermarks)."""
    c = cluster()
    n0, token, r, part = lost(c)
    marks = dict(r.watermarks)
    merged = 0
    for i in range(20):
        marks = {s: seq + 1 for s, seq in marks.items()}
        if not held(n0, token, marks).lost:
            break
        restore_chunk(n0, c.ring.stamp, token, "n1", r.token + i, 1, 1, [], [], marks, 1.0)
        merged += 1
    assert 1 <= merged <= 4
    assert len(n0.primaries[token].watermarks) <= len(r.watermarks) + 6


def test_a_member_lying_that_it_holds_a_range_cannot_confirm_it_alone():
    """Deleting a retired range takes the answer of every member the ring places each
    of its ranges on: one answering `holds` for everything (its own ranges, or ones
    it does not hold) deletes nothing while another holder has not got it."""
    c = cluster()
    c.push("s1", WORDS)
    ring = c.ring.without(["n2"])
    gone = c.cores.pop("n2")
    gone.adopt_ring(ring)
    kept = RetiredSet()
    kept.add(gone.retired)
    c.ring = ring
    # the survivors never adopted the ring: they hold nothing of n2's ranges yet
    liar = Held("primary", True)
    answers = {}
    for a in kept.asks(ring):
        answers[(a.key, a.token, a.node)] = (
            Held(a.role, True) if a.node == "n1" else Held("", False))
    assert not kept.confirmed_by(ring, answers)
    assert len(kept.ranges) == len(gone.retired)
    # an answer for a node the ring does not place the range on counts for nothing
    forged = {(a.key, a.token, "n9"): liar for a in kept.asks(ring)}
    assert not kept.confirmed_by(ring, {**answers, **forged})


def test_one_copy_is_merged_at_a_time():
    """While one copy's chunks come, another copy's first chunk is refused (merged
    together they would mix two copies of the range)."""
    c = cluster()
    n0, token, r, part = lost(c)
    keys, states = list(part), list(part.values())
    half = len(keys) // 2
    restore_chunk(n0, c.ring.stamp, token, "n1", r.token, 1, 2, keys[:half], states[:half],
                  r.watermarks, 1.0)
    before = snapshot(n0)
    with pytest.raises(StaleRing):                   # HoldsState
        restore_chunk(n0, c.ring.stamp, token, "n2", r.token, 1, 1, keys, states,
                      r.watermarks, 2.0)
    assert snapshot(n0) == before
    assert restore_chunk(n0, c.ring.stamp, token, "n1", r.token, 2, 2, keys[half:],
                         states[half:], {}, 3.0) == 2
    assert token not in n0.lost_tokens
    assert Counter(dict(n0.primaries[token].state.snapshot())) == Counter(part)


# ------------------------------------------------------------ a real TLS ring


def test_too_many_watermarks_are_refused_from_the_header_before_any_is_built():
    import time
    from floering.node.core.batch import Limits
    from floering.node.core.retired import check_marks_header
    data = pack({f"{i:x}": 1 for i in range(700_000)})      # ~4.6 MiB
    started = time.perf_counter()
    with pytest.raises(InvalidArgument):
        check_marks_header(data, Limits())
    assert time.perf_counter() - started < 0.01
    for bad in (pack([1, 2]), b"\xc1", b"\xde\x00"):
        with pytest.raises(InvalidArgument):
            check_marks_header(bad, Limits())
    check_marks_header(pack(GOOD_MARKS), Limits())
    check_marks_header(pack({f"s{i}": i for i in range(4000)}), Limits())
