"""The mapper machine (mapper/machine.py), pure, on a fake clock: routing, acks,
stream numbers, which fetched view it adopts (the orphaned-ring rule included), how
long a fetch waits, when refused reads share a fetch, what a failure means, and when
it looks for a newer ring."""

import pytest

from floering.mapper.machine import RING_PATIENCE, WATCH_LIMIT, MapperMachine, OnFailure
from floering.mapper.outbox import PendingBatch
from floering.mapper.ring_watch import RETIRE_EVERY, STALL, Look
from floering.node.core.batch import encode_payload, encode_seqs
from floering.wire.errors import (Fenced, InvalidArgument, Overloaded, ReducerMismatch,
                                       Refused, StaleRing, Unavailable)
from floering.wire.ring import Ring

MEMBERS = {f"n{i}": f"h:{i}" for i in range(3)}
BASE = Ring.initial(MEMBERS, 1, 4)


def view(ring: Ring) -> tuple[Ring, bytes]:
    return ring, ring.to_wire()


def machine_at(ring: Ring = BASE, now: float = 100.0) -> MapperMachine:
    m = MapperMachine(now)
    assert m.adopt(ring, ring.to_wire()) == []        # the first ring re-routes nothing
    return m


def batch(ring: Ring, id: int, born: float = 100.0, n: int = 5) -> PendingBatch:
    """`n` keys of one of `ring`'s tokens, routed with it."""
    token = ring.tokens[id % len(ring.tokens)]
    keys = [k for k in (f"k{id}-{i}" for i in range(5000)) if ring.token_for_key(k) == token][:n]
    seqs = list(range(id * 100, id * 100 + n))
    return PendingBatch(id, token, "src", seqs[0], seqs[-1], n, encode_payload(keys, [1] * n),
                        encode_seqs(seqs), born, tokens=ring.tokens)


def orphaned_pair() -> tuple[Ring, Ring]:
    """Ours, whose only holder died before telling anyone, and the survivors' ring of
    the same version number."""
    ours = BASE.with_owners({BASE.tokens_of("n0")[0]: "n1"})
    theirs = BASE.with_owners({BASE.tokens_of("n0")[1]: "n2"})
    assert ours.version == theirs.version and ours.stamp != theirs.stamp
    return ours, theirs


# ------------------------------------------------------------------ routing

def test_no_ring_yet_is_an_error_not_a_guess():
    m = MapperMachine(0.0)
    with pytest.raises(RuntimeError):
        m.known_ring
    with pytest.raises(RuntimeError):
        m.submit(batch(BASE, 1))


def test_a_batch_goes_to_its_tokens_destinations_and_is_delivered_on_the_last_ack():
    m = machine_at()
    b = batch(BASE, 1, born=100.0)
    [(sent, to)] = m.submit(b)
    assert sent is b and to == BASE.destinations(b.token) and len(to) == 2
    assert m.acked(b, to[0], 100.2) is None and b.id in m.undelivered
    assert m.acked(b, to[1], 100.5) == pytest.approx(0.5)     # seconds since its emit
    assert not m.undelivered
    assert m.acked(b, to[1], 100.6) is None                   # a late repeat counts nothing


def test_a_batch_given_up_is_no_longer_undelivered():
    m = machine_at()
    b = batch(BASE, 1)
    m.submit(b)
    m.give_up(b)
    assert not m.undelivered


def test_stream_numbers_follow_the_wall_clock_and_always_grow():
    m = machine_at()
    assert m.next_stream(1_000) == 1_000
    assert m.next_stream(1_000) == 1_001      # the same microsecond: one more
    assert m.next_stream(500) == 1_002        # a clock stepped back: still one more
    assert m.next_stream(5_000) == 5_000


# --------------------------------------------------------------- the ring

def test_a_newer_view_is_adopted_and_every_undelivered_batch_rerouted():
    m = machine_at()
    batches = [batch(BASE, i) for i in range(1, 4)]
    for b in batches:
        m.submit(b)
    newer = BASE.without(["n2"])
    fetch = m.begin_fetch(101.0)
    adopted = m.fetched(fetch, [view(BASE), view(newer)], [])
    assert adopted.ring is newer and m.ring is newer and m.wire == newer.to_wire()
    # in resend order (a batch the new ring cuts goes as parts, in its place)
    order = [b.sort_key() for b, _ in adopted.sends]
    assert order == sorted(order) and {key[0] for key in order} == {1, 2, 3}
    assert all(to == newer.destinations(b.token) for b, to in adopted.sends)


def test_an_older_or_equal_view_is_kept_out():
    newer = BASE.without(["n2"])
    m = machine_at(newer)
    adopted = m.fetched(m.begin_fetch(101.0), [view(BASE), view(newer)], [])
    assert adopted.ring is None and adopted.sends == [] and m.ring is newer


def test_orphaned_ring_is_given_up_for_the_survivors_one_of_the_same_version():
    ours, theirs = orphaned_pair()
    m = machine_at(ours)
    m.submit(batch(ours, 1))
    adopted = m.fetched(m.begin_fetch(101.0), [view(theirs), view(theirs)], [])
    assert adopted.ring is theirs and m.ring.stamp == theirs.stamp
    assert [b.id for b, _ in adopted.sends] == [1]


def test_a_ring_one_answering_node_still_holds_is_not_orphaned():
    ours, theirs = orphaned_pair()
    m = machine_at(ours)
    adopted = m.fetched(m.begin_fetch(101.0), [view(theirs), view(ours)], [])
    assert adopted.ring is None and m.ring is ours


def test_a_fetch_begun_before_another_adopted_a_ring_cannot_roll_it_back():
    """Its views are older than the ring adopted meanwhile, and hold no copy of it:
    only a fetch begun at our current ring may call that ring orphaned."""
    m = machine_at()
    slow = m.begin_fetch(101.0)
    newer = BASE.without(["n2"])
    assert m.fetched(m.begin_fetch(101.1), [view(newer)], []).ring is newer
    assert m.fetched(slow, [view(BASE)], []).ring is None
    assert m.ring is newer


def test_a_fetch_no_node_answered_is_unavailable_and_changes_nothing():
    m = machine_at()
    with pytest.raises(Unavailable, match="no ring node reachable at h:0, h:1: .*down"):
        m.fetched(m.begin_fetch(101.0), [], [Unavailable("down"), ConnectionError()],
                  "h:0, h:1")
    with pytest.raises(Unavailable, match="no reply"):
        m.fetched(m.begin_fetch(101.0), [], [])
    assert m.ring is BASE


def test_an_error_retrying_cannot_help_fails_the_fetch_even_with_views():
    m = machine_at()
    with pytest.raises(ReducerMismatch):
        m.fetched(m.begin_fetch(101.0), [view(BASE.without(["n2"]))],
                  [Unavailable("down"), ReducerMismatch("wrong reducer")])
    assert m.ring is BASE


def test_a_fetch_waits_for_slow_nodes_only_a_while_after_the_first_view():
    m = machine_at()
    assert m.fetch_wait(None, 101.0) is None             # nothing yet: wait for one
    assert m.fetch_wait(101.0, 101.05) == pytest.approx(RING_PATIENCE - 0.05)
    assert m.fetch_wait(101.0, 102.0) == 0.0
    assert not m.has_news([BASE.version, BASE.version - 1])
    assert m.has_news([BASE.version + 1])


def test_reads_refused_together_share_one_fetch_begun_after_their_refusal():
    m = machine_at()
    assert m.share_fetch(refused_at=101.0, running=False, now=101.0)      # the first begins
    assert not m.share_fetch(refused_at=101.0, running=True, now=101.01)  # the others wait
    # refused after the running fetch began: that fetch may hold the refused ring
    assert m.share_fetch(refused_at=101.02, running=True, now=101.02)
    assert not m.share_fetch(refused_at=101.02, running=True, now=101.03)
    # the fetch ended (failed or not): the next refusal asks again
    assert m.share_fetch(refused_at=101.0, running=False, now=101.5)


def test_a_watch_polls_until_the_ring_changes_or_its_time_is_up():
    m = machine_at()
    m.submit(batch(BASE, 1))
    since, deadline = m.ring, 101.0 + WATCH_LIMIT
    assert m.watching(since, deadline, 101.5)
    assert not m.watching(since, deadline, deadline)
    ours, theirs = orphaned_pair()
    m.adopt(theirs)                          # even another ring of the same version
    assert not m.watching(since, deadline, 101.5)


def test_a_watch_ends_once_nothing_is_undelivered():
    m = machine_at()
    b = batch(BASE, 1)
    [(_, to)] = m.submit(b)
    for node in to:
        m.acked(b, node, 101.0)
    assert not m.watching(m.ring, 104.0, 101.5)


# ------------------------------------------------------------- failures

@pytest.mark.parametrize("exc, what", [
    (InvalidArgument("bad batch"), OnFailure.GIVE_UP),
    (Unavailable("node gone"), OnFailure.WATCH),
    (Refused("connection refused"), OnFailure.WATCH),
    (StaleRing("not mine"), OnFailure.REFRESH),
    (Fenced("old incarnation"), OnFailure.REFRESH),
    (Overloaded("disk full"), OnFailure.RESEND)])
def test_what_a_streams_failure_means(exc, what):
    assert machine_at().on_failure(exc) is what


def test_a_refresh_that_fails_is_fatal_only_when_retrying_cannot_help():
    m = machine_at()
    assert not m.on_refresh_error(Unavailable("down"))
    assert m.on_refresh_error(ReducerMismatch("wrong reducer"))


# ----------------------------------------------------- when to look again

def test_no_ack_for_a_while_with_batches_waiting_asks_for_the_ring_once():
    m = MapperMachine(100.0)
    m.adopt(BASE, BASE.to_wire())
    assert m.tick(100.0 + STALL + 1, []) == set()           # nothing waits: no look
    m.submit(batch(BASE, 1))
    m.acked(batch(BASE, 2), "n0", 102.0)                    # progress, of any batch
    assert m.tick(102.0 + STALL / 2, []) == set()
    assert m.tick(102.0 + STALL + 0.01, []) == {Look.REFRESH}
    assert m.tick(102.0 + STALL + 0.02, []) == set()       # once per stall


def test_one_silent_node_while_others_ack_is_watched():
    m = machine_at()
    m.submit(batch(BASE, 1))
    m.acked(batch(BASE, 2), "n1", 100.9)
    assert m.tick(101.0, [None, 100.9, 101.0 - STALL - 0.01]) == {Look.WATCH}
    assert m.tick(101.0, [None, 100.9]) == set()


def test_channels_are_retired_every_while():
    m = MapperMachine(0.0)
    assert m.tick(RETIRE_EVERY - 1, []) == set()
    assert m.tick(RETIRE_EVERY + 1, []) == {Look.RETIRE}
    assert m.tick(RETIRE_EVERY + 2, []) == set()


# ------------------------------------------------------------------ batching

def test_the_batcher_takes_its_time_from_the_clock_it_is_given():
    """When a tuple is born and when a busy token's buffer is old enough to go
    (Nagle's rule per token) come from the injected clock."""
    from floering.mapper.batching import Batcher
    from floering.mapper.routing import Router
    now = [50.0]
    batcher = Batcher(Router(BASE), None, "src", batch_size=100, clock=lambda: now[0])
    assert not batcher.emit("word", 1)
    token = BASE.token_for_key("word")
    batcher.seal_older(linger=0.05, busy={token})
    assert not batcher.sealed                       # its token busy, not old enough
    now[0] += 0.06
    batcher.seal_older(linger=0.05, busy={token})
    [sealed] = batcher.sealed
    assert sealed.born == 50.0 and sealed.token == token


def test_the_delivery_keeps_time_only_on_the_clocks_it_is_given():
    from floering.mapper.delivery import Delivery
    d = Delivery(["h:0"], 8, 1.0, None, clock=lambda: 7.0, wall_ns=lambda: 5_000_000)
    assert d.machine.watch.last_progress == 7.0
    assert (d.next_stream(), d.next_stream()) == (5_000, 5_001)
    d.adopt(BASE)
    b = batch(BASE, 1, born=6.5)
    d.machine.submit(b)                 # routed by the machine, no stream opened
    for node in b.waiting_for.copy():
        d.acked(b, node)
    assert list(d.latencies) == [(0.5, 5)] and not d.undelivered
