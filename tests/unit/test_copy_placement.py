"""A checkpoint cut under an earlier ring lands where it was meant to: a full copy in
flight (in chunks) or a delta survives ring changes that leave its range's primary,
bounds and our place among its replicas as they were, and is refused after a change
that moves, splits or drops the range (node.core.placement)."""

from collections import Counter

import pytest

from floering.wire.errors import StaleRing
from floering.node.core.placement import RECENT_RINGS
from tests.support.helpers import CoreCluster, fail

WORDS = [f"w{i % 997}" for i in range(5000)]


def _copy_owed():
    """A 4-node ring, r=1, counted and checkpointed, then n3 gone: a full copy owed.
    (the cluster, sender, replica, token, the full shipment, its ring stamp)"""
    c = CoreCluster(nodes=4, replication=1)
    c.push("s1", WORDS)
    c.checkpoint()
    fail(c, "n3")
    for name, core in c.cores.items():
        for s in core.plan_checkpoints():
            if s.checkpoint.full and (c.ring.range_of_token(s.checkpoint.token)[0]
                                      < s.checkpoint.token):
                return c, name, s.replica, s.checkpoint.token, s, core.ring.stamp
    raise AssertionError("no full copy owed")


def _adopt(c, ring):
    for core in c.cores.values():
        core.adopt_ring(ring)
    c.ring = ring


def _other_token(c, token, sender, replica):
    """A token whose range is not `token`'s, and a member not among its destinations:
    extra destinations for it are a handoff of another range preparing."""
    for t in c.ring.tokens:
        if t != token:
            spare = [n for n in c.ring.nodes if n not in c.ring.destinations(t)]
            if spare:
                return t, spare[0]
    raise AssertionError("no other token")


def _deliver(c, sender, s, stamp, chunks=3):
    """The full copy `s` arriving at its replica in `chunks` chunks (each checked as
    the transport checks it), then whole."""
    replica = c.cores[s.replica]
    cp = s.checkpoint
    for _ in range(chunks):
        replica.check_copy_chunk(sender, stamp, cp.token)
    return replica.receive_checkpoint(sender, stamp, cp.token, cp.seq, s.base_seq, cp.full,
                                      dict(cp.states), dict(cp.watermarks))


def _finish(c, sender, s, need_full, seq):
    core = c.cores[sender]
    core.checkpoint_acked(s.checkpoint.token, s.replica, seq, need_full)
    core.checkpoint_done(s.checkpoint.token)


def test_full_copy_in_flight_survives_ring_changes_that_keep_its_range():
    c, sender, replica, token, s, stamp = _copy_owed()
    c.cores[replica].check_copy_chunk(sender, stamp, token)          # chunk 1 under S0
    other, spare = _other_token(c, token, sender, replica)
    # More ring changes than the rings a node remembers: extras of another range come
    # and go (a handoff preparing, aborting, preparing again), versions bump.
    for i in range(RECENT_RINGS + 4):
        _adopt(c, c.ring.with_extras({other: [spare] if i % 2 == 0 else []}))
        c.cores[replica].check_copy_chunk(sender, stamp, token)
    assert c.cores[replica].ring.stamp != stamp
    need_full, seq = _deliver(c, sender, s, stamp)
    assert (need_full, seq) == (False, s.checkpoint.seq)
    _finish(c, sender, s, need_full, seq)
    assert c.cores[sender].primaries[token].replica_seq[replica] == seq
    # The deltas that follow compose with the copy exactly.
    c.push("s2", WORDS[:700])
    c.checkpoint()
    c.push("s3", WORDS[:300])
    role, expect = c.cores[sender].inspect_range(token)
    assert role == "primary"
    assert c.cores[replica].inspect_range(token) == ("replica", expect)
    assert c.state() == Counter(WORDS) + Counter(WORDS[:700]) + Counter(WORDS[:300])


def test_delta_cut_before_a_ring_change_that_keeps_its_range_is_merged():
    c = CoreCluster(nodes=4, replication=1)
    c.push("s1", WORDS)
    c.checkpoint()
    c.push("s2", WORDS[:500])
    name, core = "n0", c.cores["n0"]
    shipments = core.plan_checkpoints()
    stamp = core.ring.stamp
    token = shipments[0].checkpoint.token
    other, spare = _other_token(c, token, name, shipments[0].replica)
    _adopt(c, c.ring.with_extras({other: [spare]}))       # while the deltas travel
    for s in shipments:
        assert not s.checkpoint.full
        cp = s.checkpoint
        need_full, seq = c.cores[s.replica].receive_checkpoint(
            name, stamp, cp.token, cp.seq, s.base_seq, cp.full, dict(cp.states),
            dict(cp.watermarks))
        assert not need_full
        _finish(c, name, s, need_full, seq)
    for token in core.primaries:
        assert not core.under_replicated()
        role, expect = core.inspect_range(token)
        for r in c.ring.replicas_of_token(token):
            assert c.cores[r].inspect_range(token) == ("replica", expect)


@pytest.mark.parametrize("change", ["moved", "split", "dropped", "away_and_back"])
def test_full_copy_in_flight_stops_when_its_range_moves(change):
    c, sender, replica, token, s, stamp = _copy_owed()
    c.cores[replica].check_copy_chunk(sender, stamp, token)
    ring = c.ring
    if change == "moved":
        ring = ring.with_token_owner(token, replica)
    elif change == "split":
        lo, hi = ring.range_of_token(token)
        ring = ring.split_token(token, lo + (hi - lo) // 2)
    elif change == "dropped":              # another member becomes its replica
        other = next(n for n in ring.nodes if n not in (sender, replica))
        ring = ring.with_token_owner(token, other)
    else:
        _adopt(c, ring.with_token_owner(token, replica))
        ring = c.ring.with_token_owner(token, sender)
    _adopt(c, ring)
    with pytest.raises(StaleRing):
        c.cores[replica].check_copy_chunk(sender, stamp, token)
    cp = s.checkpoint
    with pytest.raises(StaleRing):
        c.cores[replica].receive_checkpoint(sender, stamp, cp.token, cp.seq, s.base_seq,
                                            cp.full, dict(cp.states), dict(cp.watermarks))


def test_a_chunk_of_a_range_not_ours_to_back_up_is_refused_at_once():
    c, sender, replica, token, s, stamp = _copy_owed()
    stranger = next(n for n in c.ring.nodes if n not in c.ring.destinations(token))
    with pytest.raises(StaleRing):
        c.cores[stranger].check_copy_chunk(sender, stamp, token)
    with pytest.raises(StaleRing):                  # nor from a member not its primary
        c.cores[replica].check_copy_chunk(stranger, stamp, token)


def test_an_ack_of_a_copy_cut_before_the_range_left_does_not_count_once_it_is_back():
    c, sender, replica, token, s, stamp = _copy_owed()
    old_seq = s.checkpoint.seq
    c.cores[sender].checkpoint_done(token)
    _adopt(c, c.ring.with_token_owner(token, replica))
    _adopt(c, c.ring.with_token_owner(token, sender))
    rng = c.cores[sender].primaries[token]
    assert rng.checkpoint_seq >= old_seq
    c.cores[sender].checkpoint_acked(token, replica, old_seq, False)
    assert replica not in rng.replica_seq     # the old copy is no base for a delta


# ---------------------------------------------------------- real processes
