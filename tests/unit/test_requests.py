"""Requests from outside as machine events (node.core.requests): one Reply each, its
value or the refusal, decided by the machine alone."""

import math

import pytest

from floering.node.core.machine_io import Gossip, Record, Reply, Requested
from floering.node.core.requests import (EXCHANGE_RING, GET_RING, HEARTBEAT, PROBE, PROBED,
                                         SCAN, SHED, STARTED, TIMEOUT, TOP, RequestLimits)
from floering.wire.errors import (Fenced, InvalidArgument, ReducerMismatch, StaleRing, Starting,
                                  TooLarge)
from tests.support.machine_shared import INCARNATIONS, MEMBERS, machine, probe_of


def ask(m, kind, now=1.0, **fields):
    effects = m.handle(Requested(kind, fields, request_id=7), now)
    replies = [e for e in effects if isinstance(e, Reply)]
    assert len(replies) == 1 and replies[0].request_id == 7, effects
    return replies[0], effects


def test_a_starting_node_refuses_but_shows_a_starting_peer_the_ring_it_would_found():
    m = machine()
    m.core.starting = True
    m.started_as = "n0-configured"
    reply, _ = ask(m, HEARTBEAT, sender="n1", ring_stamp=m.core.ring.stamp,
                   incarnation=INCARNATIONS["n1"])
    assert isinstance(reply.error, Starting) and "n0-configured is starting" in str(reply.error)
    assert isinstance(ask(m, STARTED)[0].error, Starting)
    assert ask(m, GET_RING, starting_ok=True)[0].value == (m.core.ring, True)
    assert isinstance(ask(m, GET_RING)[0].error, Starting)


def test_the_ring_is_refused_to_a_caller_expecting_another_reducer():
    m = machine()
    name = m.core.reducer.name
    assert ask(m, GET_RING, expect_reducer=name)[0].value == (m.core.ring, False)
    refused = ask(m, GET_RING, expect_reducer="\x1bother")[0].error
    assert isinstance(refused, ReducerMismatch) and "\x1b" not in str(refused)
    assert f"runs reducer {name!r}" in str(refused)


def test_a_fenced_node_refuses_heartbeats_and_a_heard_peer_with_another_ring_is_gossiped():
    m = machine()
    stamp = m.core.ring.stamp
    reply, effects = ask(m, HEARTBEAT, sender="n1", ring_stamp=stamp + 1,
                         incarnation=INCARNATIONS["n1"])
    assert reply.value == (stamp, m.incarnation)
    assert Gossip("a:1") in effects
    m.core.fenced = True       # as a core removed from the ring is, until it rejoins
    assert isinstance(ask(m, HEARTBEAT, sender="n1", ring_stamp=stamp, incarnation=0)[0].error,
                      Fenced)


def test_an_exchanged_view_is_adopted_and_its_records_name_the_request():
    m = machine()
    view = m.core.ring.without(["n2"])
    reply, effects = ask(m, EXCHANGE_RING, 5.0, sender="n1", ring=view, caller="n1")
    assert reply.error is None and reply.value is m.core.ring
    # the removal of a member we hold live waits for our own probe: nothing adopted yet
    assert "n2" in m.core.ring.nodes
    records = [e for e in effects if isinstance(e, Record)]
    assert all(r.stimulus == f"n0:{m.stimuli}:ExchangeRing" for r in records)


def test_reads_and_operations_are_bounded_as_configured():
    m = machine()
    m.limits = RequestLimits(max_top=5, max_scan_chunk=100, max_handoff_timeout=60.0)
    assert ask(m, TOP, k=5)[0].value == 5
    assert ask(machine(), TOP, k=0)[0].value == 10              # the default
    assert ask(machine(), SCAN, asked=0)[0].value == 5000       # the default, within the limit
    assert ask(m, SCAN, asked=0)[0].value == 100
    assert isinstance(ask(m, TOP, k=6)[0].error, TooLarge)
    assert ask(m, SCAN, asked=0, default=1000)[0].value == 100
    assert ask(m, SCAN, asked=40, default=1000)[0].value == 40
    assert isinstance(ask(m, SCAN, asked=101, default=10)[0].error, TooLarge)
    stale = ask(m, SCAN, ring_stamp=m.core.ring.stamp + 1)[0].error
    assert isinstance(stale, StaleRing)
    assert ask(m, SCAN, ring_stamp=m.core.ring.stamp)[0].error is None
    assert ask(m, TIMEOUT, asked=0.0)[0].value is None
    assert ask(m, TIMEOUT, asked=60.0)[0].value == 60.0
    for bad in (-1.0, 60.5, math.nan, math.inf):
        refused = ask(m, TIMEOUT, asked=bad)[0].error
        assert isinstance(refused, InvalidArgument) and "--max-handoff-timeout" in str(refused)


@pytest.mark.parametrize("sender,identity,member", [
    ("n2#1", "n2", "n2#1"), ("n2#1", "n3", ""), ("n2", "", "n2")])
def test_a_share_is_asked_in_a_members_name_only_by_its_certificate(sender, identity, member):
    assert ask(machine(), SHED, sender=sender, identity=identity)[0].value[0] == member


def test_an_unknown_request_is_refused():
    assert isinstance(ask(machine(), "Nonsense")[0].error, InvalidArgument)


def test_a_shedding_request_of_a_member_short_of_its_share_is_answered_with_its_ranges():
    from floering.node.core.machine_io import Note, RingSeen
    from floering.node.core.shares import pull_plan
    m, other = machine("n3"), machine("n0")
    assert ask(m, SHED, sender="n1")[0].value == ("n1", None)    # ordinary shedding
    empty = m.core.ring.add_node("n4", "a:4", (), 5)             # owns nothing
    m.handle(RingSeen(empty), 2.0)
    other.handle(RingSeen(empty), 2.0)
    donor, moves = pull_plan(m.core.ring, "n4")
    assert moves and donor == "n3"
    assert ask(other, SHED, sender="n4")[0].value == ("n4", {})  # not the donor
    assert ask(m, SHED, sender="n4")[0].value == ("n4", {})      # its copies owed first
    for token, rng in m.core.primaries.items():                  # now held by the replicas
        rng.replica_seq.update({r: 1 for r in m.core.ring.replicas_of_token(token)})
    reply, effects = ask(m, SHED, now=3.0, sender="n4", identity="n4")
    assert reply.value == ("n4", moves)
    assert any(isinstance(e, Note) and e.text.startswith(f"share: handing {len(moves)} ranges to n4")
               for e in effects)
    assert ask(m, SHED, sender="n4", identity="n1")[0].value == ("", None)   # not its name


@pytest.mark.parametrize("asked, wait", [
    (0.3, 0.3), (0.0, 0.01), (-1.0, 0.01), (math.nan, 0.01), (-math.inf, 0.01),
    (5.0, 5.0), (60.0, 5.0), (math.inf, 5.0)])
def test_a_probe_for_a_peer_waits_within_bounds_whatever_the_caller_asks(asked, wait):
    assert ask(machine(), PROBE, target="n2", timeout=asked)[0].value == (MEMBERS["n2"], wait)


@pytest.mark.parametrize("target", ["n9", "", "\x1bn2", "n2#1"])
def test_a_probe_for_no_member_of_our_ring_calls_nobody(target):
    assert ask(machine(), PROBE, target=target, timeout=1.0)[0].value == (None, 1.0)


def test_a_probe_for_a_peer_reaches_the_target_only_if_its_process_answered():
    m = machine()
    node = probe_of(m, 5.0).probe.node           # suspected by us too
    inc = INCARNATIONS[node]
    for failure, incarnation, member in [
            ("unavailable", inc, node), ("refused", 0, ""), ("fenced", 0, ""),
            (None, inc + 1, node),                # restarted: another process
            (None, inc, f"{node}#1")]:            # rejoined under another name
        reply, effects = ask(m, PROBED, 5.1, target=node, failure=failure,
                             incarnation=incarnation, member=member)
        assert reply.value is False and effects == [reply]
        assert m.guard.gone.pop(node) == 5.1 and node in m.detector.suspected
    reply, effects = ask(m, PROBED, 5.2, target=node, failure=None, incarnation=inc,
                         member=node)
    assert reply.value is True and effects == [reply]
    assert node not in m.guard.gone and node not in m.detector.suspected   # a sign of life
    assert ask(m, PROBED, 5.3, target="n9", failure="refused")[0].value is False
    assert "n9" not in m.guard.gone              # not a member: nothing to hold against it
