"""What the end of a call means (node.core.calls), and the machine judging a probe
round from how its calls ended, on a fake clock."""

import pytest

from floering.node.core.calls import (Failure, ask_again_fresh, direct_evidence, failure_of,
                                      refreshes, via_evidence)
from floering.node.core.detector import ALIVE, REFUSED, TIMED_OUT, UNASKED
from floering.wire.errors import (Busy, Fenced, InvalidArgument, Refused, StaleRing,
                                       Starting, Unavailable)
from floering.node.core.machine_io import Gossip, HeartbeatFailed, ProbeAnswered
from tests.support.machine_shared import kinds, machine, probe_of


@pytest.mark.parametrize("exc, failure, direct, heartbeat_refreshes", [
    (Fenced("gone"), Failure.FENCED, REFUSED, True),          # it knows it was removed
    (StaleRing("v"), Failure.STALE, ALIVE, True),              # it answered
    (Refused("rst"), Failure.REFUSED, REFUSED, False),         # nothing listens
    (Unavailable("deadline"), Failure.UNAVAILABLE, TIMED_OUT, False),
    (Starting("starting"), Failure.UNAVAILABLE, TIMED_OUT, False),
    (Busy("slots"), Failure.ERROR, ALIVE, False),              # answered, with an error
    (InvalidArgument("bad"), Failure.ERROR, ALIVE, False),
])
def test_each_error_means_one_thing(exc, failure, direct, heartbeat_refreshes):
    assert failure_of(exc) == failure
    assert direct_evidence(failure) == direct
    assert refreshes(failure) == heartbeat_refreshes
    assert via_evidence(failure, True) == UNASKED     # a member that failed confirms nothing


def test_answers_and_the_fresh_retry():
    assert direct_evidence(None) == ALIVE
    assert via_evidence(None, True) == ALIVE and via_evidence(None, False) == TIMED_OUT
    assert ask_again_fresh(Failure.REFUSED, fresh=False)
    assert not ask_again_fresh(Failure.REFUSED, fresh=True)
    assert not ask_again_fresh(Failure.UNAVAILABLE, fresh=False)


def test_a_heartbeat_refused_as_stale_or_fenced_asks_for_an_exchange():
    m = machine()
    assert m.handle(HeartbeatFailed("a:1", Failure.STALE), 1.0) == [Gossip("a:1")]
    assert m.handle(HeartbeatFailed("a:1", Failure.FENCED), 1.0) == [Gossip("a:1")]
    assert m.handle(HeartbeatFailed("a:1", Failure.UNAVAILABLE), 1.0) == []


def test_the_machine_judges_a_probe_round_from_its_calls():
    m = machine()
    start = probe_of(m, 5.0)
    vias = tuple((None, False) for _ in start.vias)            # nobody reaches it either
    effects = m.handle(ProbeAnswered(start.probe, Failure.REFUSED, vias, start.epoch,
                                     why="connection refused"), 5.1)
    assert "detected" in kinds(effects) and start.probe.node not in m.core.ring.nodes
    (record,) = [e for e in effects if getattr(e, "kind", "") == "detected"]
    assert "connection refused" in dict(record.fields)["why"]


def test_a_probe_that_answers_as_the_member_clears_the_suspicion():
    m = machine()
    start = probe_of(m, 5.0)
    node = start.probe.node
    inc = m.core.ring.incarnation_of(node)
    effects = m.handle(ProbeAnswered(start.probe, None, (), start.epoch, inc, "", node), 5.1)
    assert "detected" not in kinds(effects) and node in m.core.ring.nodes
    assert node not in m.detector.suspected
