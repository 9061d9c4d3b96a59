"""A fenced member keeps what it held until the ring holds each of its ranges on r+1
others at or past the kept copy's watermarks (node.core.retired). Pure rules here;
real processes in tests/cluster/test_retired_ring.py."""

from collections import Counter

import pytest

from floering.node.core.batch import Batch
from floering.wire.errors import RangeLost
from floering.node.core.reducers import load_reducer
from floering.node.core.restore import DiskCopy
from floering.node.core.retired import (Held, RetainingCore, RetiredRange, RetiredSet, decode,
                                        encode, held, pieces, restore_chunk, retire_directory)
from floering.node.core.snapshots import HoldsState
from tests.support.helpers import CoreCluster, fail
from tests.support.retired_shared import WORDS, cluster


def fence(c: CoreCluster, node: str):
    """`node` learns it was removed; the others adopt the same ring."""
    ring = c.ring.without([node])
    gone = c.cores.pop(node)
    gone.adopt_ring(ring)
    for core in c.cores.values():
        core.adopt_ring(ring)
    c.ring = ring
    return gone


def answers(c: CoreCluster, kept: RetiredSet) -> dict:
    """Every member's answer to every question, as RangeHeld gives it."""
    return {(a.key, a.token, a.node): held(c.cores[a.node], a.token, a.want)
            for a in kept.asks(c.ring)}


def test_a_fenced_core_keeps_its_ranges_whole_with_their_watermarks():
    c = cluster()
    c.push("s1", WORDS)
    c.checkpoint()
    c.push("s1", WORDS, first_seq=len(WORDS) + 1)     # past the checkpoint: backups only
    n1, ring = c.cores["n1"], c.ring
    primaries = {t: (dict(r.state.snapshot()), dict(r.watermarks))
                 for t, r in n1.primaries.items()}
    owners = {t: c.cores[ring.owner_of_token(t)].primaries[t] for t in n1.replicas.ranges}
    fence(c, "n1")
    assert n1.fenced and not n1.primaries and not n1.replicas.ranges
    kept = {r.token: r for r in n1.retired}
    assert {t for t, r in kept.items() if r.role == "primary"} == set(primaries)
    for token, (states, marks) in primaries.items():
        assert kept[token].states == states and kept[token].watermarks == marks
    # a replica's copy is kept as a takeover rebuilds it: checkpoint plus backups
    assert {t for t, r in kept.items() if r.role == "replica"} == set(owners)
    for token, rng in owners.items():
        assert kept[token].states == dict(rng.state.snapshot())
        assert kept[token].watermarks == rng.watermarks
    assert sum((Counter(r.states) for r in kept.values() if r.role == "primary"),
               Counter()) == Counter({k: v for k, v in Counter(WORDS * 2).items()
                                      if ring.owner_of_token(ring.token_for_key(k)) == "n1"})


def test_retired_ranges_go_only_once_r_plus_1_members_hold_them():
    c = cluster()
    c.push("s1", WORDS)
    c.checkpoint()
    kept = RetiredSet()
    kept.add(fence(c, "n1").retired)
    total = len(kept.ranges)
    assert total
    # taken over, but the new replicas have no full copy yet: nothing is deleted
    assert kept.confirmed_by(c.ring, answers(c, kept)) == []
    # without the answer of one of the r+1, nothing is deleted either
    c.checkpoint()
    full = answers(c, kept)
    missing = next(iter(full))            # one member's answer about one range
    partial = {k: v for k, v in full.items() if k != missing}
    done = kept.confirmed_by(c.ring, partial)
    assert missing[0] in kept.ranges and missing[0] not in {r.key for r in done}
    kept.confirmed_by(c.ring, full)
    assert not kept.ranges and kept.confirmed == total


def test_a_copy_ahead_of_the_ring_waits_for_the_mapper_to_resend():
    c = cluster()
    c.push("s1", WORDS)
    c.checkpoint()
    # n1 applied a batch its replica never backed up (the mapper did not count it)
    token = c.ring.tokens_of("n1")[0]
    extra = [w for w in WORDS if c.ring.token_for_key(w) == token][:5]
    c.push("s1", extra, first_seq=len(WORDS) + 1, only={"n1"})
    kept = RetiredSet()
    kept.add(fence(c, "n1").retired)
    c.checkpoint()
    kept.confirmed_by(c.ring, answers(c, kept))
    assert set(kept.ranges) == {("n1", token)}
    # the mapper resends to the new owners; after a checkpoint round the ring holds it
    c.push("s1", extra, first_seq=len(WORDS) + 1)
    c.checkpoint()
    kept.confirmed_by(c.ring, answers(c, kept))
    assert not kept.ranges


def test_a_lost_range_is_answered_as_lost_and_never_confirms():
    c = cluster()
    c.push("s1", WORDS)
    c.checkpoint()
    ring = c.ring.without(["n1", "n2"])
    n0 = c.cores["n0"]
    n0.adopt_ring(ring)
    lost = sorted(n0.lost_tokens)
    assert lost
    answer = held(n0, lost[0], {})
    assert answer == Held("primary", False, True)


def test_pieces_are_the_current_ranges_a_retired_range_overlaps():
    c = cluster()
    ring = c.ring
    token = ring.tokens[3]
    lo = ring.range_of_token(token)[0]
    assert pieces(ring, lo, token) == [token]
    mid = lo + (token - lo) // 2
    assert pieces(ring.split_token(token, mid), lo, token) == [mid, token]
    # a range that now lies inside a larger one is that one's
    wider = ring.without([ring.owner_of_token(token)])
    assert pieces(wider, lo, token) == [token]


def test_the_file_holds_the_ranges_exactly():
    ranges = [RetiredRange("n2", 7, 3, "primary", {"a": 1, b"b": 2, 3: (1, 2)}, {"s": 9}),
              RetiredRange("n2", 11, 7, "replica", {}, {"g#": 1 << 40})]
    back = decode(encode(ranges))
    assert back == ranges
    assert [(r.states, r.watermarks) for r in back] == [(r.states, r.watermarks) for r in ranges]


def test_a_directory_of_a_removed_member_keeps_its_copies_with_their_logged_batches():
    from floering.node.core.batch import Limits
    c = cluster()
    ring = c.ring
    mine, theirs = ring.tokens_of("n1")[0], ring.tokens_of("n0")[0]
    key = next(w for w in WORDS if ring.token_for_key(w) == mine)
    (token, fields), = c.batches("s", [key, key], first_seq=4)
    from floering.node.core.batch import Batch
    copies = {mine: DiskCopy(mine, "n1", {"s": 3}, True, {key: 3}),
              theirs: DiskCopy(theirs, "n0", {"s": 2}, False, {"b": 1})}
    kept = retire_directory("n1", ring, load_reducer("count"), Limits(), copies,
                            [(token, Batch(**fields))], 1.0)
    # the logged batch past the copy counts; a copy that was never whole is not kept
    by_token = {r.token: r for r in kept}
    assert (by_token[mine].role, by_token[mine].states, by_token[mine].watermarks) == (
        "primary", {key: 5}, {"s": 5})
    assert theirs not in by_token


def hand_over(core, kept: RetiredSet) -> int:
    """What node.runtime.retiring does for a primary that answers lost: each retired
    range's part of each lost range, in one chunk."""
    ring, merged = core.ring, 0
    for a in kept.asks(ring):
        if a.node != core.node_id or not held(core, a.token, a.want).lost:
            continue
        r = kept.ranges[a.key]
        if r.role == "partial":
            continue
        part = {k: v for k, v in r.states.items() if ring.token_for_key(k) == a.token}
        try:
            restore_chunk(core, ring.stamp, a.token, r.member, r.token, 1, 1, list(part),
                          list(part.values()), r.watermarks, 1.0)
        except HoldsState:
            continue
        merged += 1
    return merged


def test_two_members_removed_at_r1_give_back_every_lost_range_exactly():
    c = cluster()
    c.push("s1", WORDS)
    c.checkpoint()
    c.push("s2", WORDS[:100])                 # past the checkpoint: backups only
    ring = c.ring.without(["n1", "n2"])
    kept = RetiredSet()
    for node in ("n1", "n2"):
        c.cores[node].adopt_ring(ring)
        kept.add(c.cores.pop(node).retired)
    n0 = c.cores["n0"]
    n0.adopt_ring(ring)
    c.ring = ring
    assert n0.lost_tokens
    with pytest.raises(RangeLost):
        list(n0.range_snapshots())
    c.push("s3", WORDS[:50])                  # a new source, while the ranges are lost
    assert hand_over(n0, kept)
    assert not n0.lost_tokens and n0.restored
    assert Counter(dict(n0.items())) == Counter(WORDS + WORDS[:100] + WORDS[:50])
    # every chunk once: the same copies again change nothing
    assert hand_over(n0, kept) == 0
    resent = 0
    for a in kept.asks(ring):
        r = kept.ranges[a.key]
        try:                                  # merged: a no-op; else: not lost any more
            restore_chunk(n0, ring.stamp, a.token, r.member, r.token, 1, 1, [], [], {}, 2.0)
            resent += 1
        except HoldsState:
            pass
    assert resent
    assert Counter(dict(n0.items())) == Counter(WORDS + WORDS[:100] + WORDS[:50])
    # a resend of what the copies held is a duplicate now
    assert c.push("s1", WORDS) == 0
    assert all(held(n0, a.token, a.want).holds for a in kept.asks(ring) if a.node == "n0")


def lost_after_resend(c: CoreCluster):
    """n1 and n2 removed at r=1; n0's lost range of `token` then applied a resend of
    a batch n1 had applied (the same seqs) and a new batch of the same source."""
    c.push("s1", WORDS)
    ring = c.ring.without(["n1", "n2"])
    n1 = c.cores["n1"]
    n1.adopt_ring(ring)
    n0 = c.cores["n0"]
    n0.adopt_ring(ring)
    c.ring = ring
    token = sorted(n0.lost_tokens)[0]
    keys = [w for w in WORDS if ring.token_for_key(w) == token]
    (resend,) = [f for t, f in c.batches("s1", WORDS) if t == token]
    assert n0.receive_batch(Batch(**resend)).applied == len(keys)   # lost: applied again
    c.push("s1", keys[:3], first_seq=10_000)
    r = next(r for r in n1.retired if token in pieces(ring, r.lo, r.token))
    part = {k: v for k, v in r.states.items() if ring.token_for_key(k) == token}
    return n0, token, r, part, keys


def test_a_lost_range_that_applied_a_resend_merges_the_copy_exactly():
    c = cluster()
    n0, token, r, part, keys = lost_after_resend(c)
    restore_chunk(n0, c.ring.stamp, token, "n1", r.token, 1, 1, list(part),
                  list(part.values()), r.watermarks, 1.0)
    assert token not in n0.lost_tokens
    assert Counter(dict(n0.primaries[token].state.snapshot())) == Counter(keys + keys[:3])
    assert held(n0, token, r.watermarks).holds


def test_a_lost_range_that_no_longer_keeps_its_batches_is_not_merged():
    c = cluster()
    n0, token, r, part, _ = lost_after_resend(c)
    n0.lost_log_bytes -= n0.lost_logs[token].drop()       # past LOST_LOG_BYTES
    before = Counter(dict(n0.primaries[token].state.snapshot()))
    with pytest.raises(HoldsState):
        restore_chunk(n0, c.ring.stamp, token, "n1", r.token, 1, 1, list(part),
                      list(part.values()), r.watermarks, 1.0)
    assert Counter(dict(n0.primaries[token].state.snapshot())) == before
    assert token in n0.lost_tokens


def test_the_fuller_of_two_retired_copies_replaces_the_older_one_exactly():
    """n1 removed: n2 takes its range over from its copy and applies more; then n2 is
    removed too, and the range is lost on n3. n1's copy (older) and n2's (fuller)
    both come back, in either order: the range ends up holding n2's, exactly."""
    for order in ((0, 1), (1, 0)):
        c = CoreCluster(nodes=4, replication=1)
        c.cores = {n: RetainingCore(n, c.ring, load_reducer("count")) for n in c.cores}
        c.push("s1", WORDS)
        c.checkpoint()
        token = next(t for t in c.ring.tokens if c.ring.destinations(t) == ("n1", "n2"))
        copies = [fence(c, "n1").retired]
        keys = [w for w in WORDS if c.ring.token_for_key(w) == token]
        c.push("s1", keys, first_seq=5_000)          # applied by n2 only
        copies.append(fence(c, "n2").retired)
        owner = c.cores[c.ring.owner_of_token(token)]
        assert token in owner.lost_tokens
        # the lost range goes on: n2's last batch again (applied, never acknowledged)
        # and a new one
        c.push("s1", keys, first_seq=5_000)
        c.push("s1", keys[:2], first_seq=9_000)
        for i in order:
            r = next(r for r in copies[i] if r.token == token)
            answer = held(owner, token, r.watermarks)
            if answer.lost:
                restore_chunk(owner, c.ring.stamp, token, r.member, r.token, 1, 1,
                              list(r.states), list(r.states.values()), r.watermarks, 1.0)
        assert Counter(dict(owner.primaries[token].state.snapshot())) == \
            Counter(keys + keys + keys[:2]), order
        assert token not in owner.lost_tokens
        assert all(held(owner, token, next(r for r in rs if r.token == token).watermarks).holds
                   for rs in copies)


def test_a_restored_range_is_taken_over_from_its_copy_not_as_lost():
    c = CoreCluster(nodes=4, replication=1)
    c.cores = {n: RetainingCore(n, c.ring, load_reducer("count")) for n in c.cores}
    c.push("s1", WORDS)
    c.checkpoint()
    # two neighbours removed: the ranges they alone held are lost
    pair = None
    for t in c.ring.tokens:
        dest = c.ring.destinations(t)
        pair = dest
        break
    ring = c.ring.without(list(pair))
    kept = RetiredSet()
    for node in pair:
        c.cores[node].adopt_ring(ring)
        kept.add(c.cores.pop(node).retired)
    for core in c.cores.values():
        core.adopt_ring(ring)
    c.ring = ring
    for core in c.cores.values():
        hand_over(core, kept)
    assert not any(core.lost_tokens for core in c.cores.values())
    c.checkpoint()                            # the restored ranges reach their replicas
    kept.confirmed_by(ring, answers(c, kept))
    assert not kept.ranges                    # on r+1 members again: deleted
    owner = next(n for n, core in c.cores.items() if core.restored)
    fail(c, owner)
    survivor = next(iter(c.cores.values()))
    assert not survivor.lost_tokens
    assert Counter(dict(survivor.items())) == Counter(WORDS)


def test_kept_ranges_survive_a_restart_and_leave_the_disk_only_once_confirmed(tmp_path):
    from types import SimpleNamespace

    from floering.node.runtime.events import EventLog
    from floering.node.runtime.retiring import Retiring
    runtime = SimpleNamespace(events=EventLog(), core=SimpleNamespace(node_id="n2#1"),
                              clock=lambda: 0.0)
    ranges = [RetiredRange("n2", 7, 3, "primary", {"a": 1}, {"s": 9}),
              RetiredRange("n2", 11, 7, "replica", {"b": 2}, {"s": 4})]
    first = Retiring(runtime, None, tmp_path / "retired")
    first.keep(ranges, "n2 was removed from the ring")
    (path,) = (tmp_path / "retired").iterdir()
    assert path.stat().st_mode & 0o077 == 0            # private, like the data directory
    again = Retiring(runtime, None, tmp_path / "retired")       # the process restarted
    again._load()
    assert sorted(again.kept.ranges) == [("n2", 7), ("n2", 11)]
    assert again.kept.ranges[("n2", 7)].states == {"a": 1}
    del again.kept.ranges[("n2", 7)]                   # one confirmed: the other stays
    again._write("n2")
    assert [r.key for r in decode(path.read_bytes())] == [("n2", 11)]
    del again.kept.ranges[("n2", 11)]
    again._write("n2")
    assert not list((tmp_path / "retired").iterdir())


def test_a_lost_range_a_fenced_member_owned_is_kept_as_partial_and_restores_nothing():
    c = cluster()
    c.push("s1", WORDS)
    c.checkpoint()
    ring = c.ring.without(["n1", "n2"])
    n0 = c.cores["n0"]
    n0.adopt_ring(ring)
    lost = set(n0.lost_tokens)
    c.ring = ring
    c.push("s3", WORDS[:40])                  # applied to the lost ranges since
    n0.adopt_ring(ring.add_node("n9", "h:9", (), 1).without(["n0"]))   # n0 removed too
    assert n0.fenced
    roles = {r.token: r.role for r in n0.retired}
    assert {t for t, role in roles.items() if role == "partial"} == lost
    # what the lost ranges applied since is kept, counted exactly
    partial = Counter()
    for r in n0.retired:
        if r.role == "partial":
            partial.update(r.states)
    assert partial == Counter(w for w in WORDS[:40] if ring.token_for_key(w) in lost)
