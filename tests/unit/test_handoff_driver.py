"""The handoff driver (node.core.handoff_driver) alone and inside the node machine, on
a fake clock: one handoff at a time, the rest in line (bounded), abandoned waiters,
deadlines kept while no round ends, and the pace of checkpoint rounds."""

import pytest

from floering.wire.errors import InvalidArgument, Overloaded
from floering.node.core.handoff import HandoffState
from floering.node.core.handoff_driver import (MAX_WAITING, REPAIR_SLACK, ROUND_SECONDS,
                                               DriverState, DriverStateError, HandoffDriver)
from floering.node.core.machine_io import (CheckpointDue, CheckpointRoundDone, HandoffAbandoned,
                                           HandoffEnded, HandoffRequested, MonitorDue,
                                           NextRound, RoundEnded, RoundNow, ShipCheckpoints)
from tests.support.machine_shared import MEMBERS, kinds, machine


def ended_of(effects) -> list[HandoffEnded]:
    return [e for e in effects if isinstance(e, HandoffEnded)]


def test_one_runs_the_rest_wait_in_line_in_order_and_the_line_is_bounded():
    d = HandoffDriver(default_timeout=7.0)
    first = d.request({1: "b"}, 0.0, request=1)
    assert first is not None and first.timeout == 7.0 and d.state == DriverState.RUNNING
    for i in range(MAX_WAITING):
        assert d.request({2: "c"}, 3.0, request=10 + i) is None
    with pytest.raises(Overloaded):
        d.request({3: "d"}, 3.0, request=99)
    done, nxt = d.ended()
    assert done.request == 1 and nxt.request == 10 and d.state == DriverState.RUNNING
    for _ in range(MAX_WAITING - 1):
        d.ended()
    assert d.ended()[1] is None and d.state == DriverState.IDLE
    with pytest.raises(DriverStateError):
        d.ended()


def test_an_abandoned_waiter_is_dropped_from_the_line_the_running_one_is_aborted():
    d = HandoffDriver()
    d.request({1: "b"}, request=1)
    d.request({2: "c"}, request=2)
    d.request({3: "d"}, request=3)
    assert d.abandoned(2) is False and [r.request for r in d.waiting] == [3]
    assert d.abandoned(1) is True and d.abandoned(0) is True
    assert d.abandoned(42) is False and len(d.waiting) == 1


def test_rounds_come_back_to_back_while_a_handoff_runs_else_at_the_interval():
    d = HandoffDriver(interval=1.0)
    assert d.pause(now=10.3, started=10.0, full_copies_in=0.0) == pytest.approx(0.7)
    assert d.pause(now=11.5, started=10.0, full_copies_in=0.0) == 0.0
    assert d.pause(now=10.3, started=10.0, full_copies_in=0.2) == \
        pytest.approx(0.2 + REPAIR_SLACK)
    d.request({1: "b"})
    assert d.pause(now=10.3, started=10.0, full_copies_in=0.2) == ROUND_SECONDS


def _commit(m, now: float) -> list:
    """One checkpoint round every replica acknowledges."""
    (ship,) = [e for e in m.handle(CheckpointDue(), now) if isinstance(e, ShipCheckpoints)]
    for s in ship.shipments:
        m.core.checkpoint_acked(s.checkpoint.token, s.replica, s.checkpoint.seq, False)
    return m.handle(CheckpointRoundDone(ship.tokens, ship.behind_before, ship.epoch), now)


def test_the_machine_runs_requests_in_line_and_tells_each_waiter():
    m = machine()
    a, b = m.core.ring.tokens_of("n0")[:2]
    m.handle(HandoffRequested({a: m.core.ring.heir(a)}, 5.0, request=1), 1.0)
    assert m.handle(RoundEnded(1.0), 1.0) == [NextRound(ROUND_SECONDS)]
    m.handle(HandoffRequested({b: m.core.ring.heir(b)}, 5.0, request=2), 1.0)
    effects = _commit(m, 1.1)
    assert [e.request for e in ended_of(effects)] == [1]
    assert m.handoff is not None and m.handoff.moves == {b: m.core.ring.heir(b)}
    assert RoundNow() in effects            # the next one's steps need rounds
    effects = _commit(m, 1.2)
    (done,) = ended_of(effects)
    assert done.request == 2 and done.handoff.state == HandoffState.COMMITTED
    assert m.driver.state == DriverState.IDLE
    (nxt,) = m.handle(RoundEnded(1.2), 1.2)
    assert nxt.after > ROUND_SECONDS        # idle again: the regular pace


def test_a_request_that_cannot_start_is_refused_at_once_and_frees_the_driver():
    m = machine()
    theirs = m.core.ring.tokens_of("n1")[0]
    with pytest.raises(InvalidArgument):
        m.handle(HandoffRequested({theirs: "n2"}, 5.0, request=1), 1.0)
    assert m.driver.state == DriverState.IDLE and m.handoff is None
    mine = m.core.ring.tokens_of("n0")[0]
    assert "handoff_prepared" in kinds(m.handle(
        HandoffRequested({mine: m.core.ring.heir(mine)}, 5.0, request=2), 1.1))


def test_a_waiting_request_that_cannot_start_is_told_refused():
    m = machine()
    mine = m.core.ring.tokens_of("n0")[0]
    theirs = m.core.ring.tokens_of("n1")[0]
    target = next(n for n in MEMBERS if n not in ("n0", m.core.ring.heir(mine)))
    m.handle(HandoffRequested({mine: target}, 5.0, request=1), 1.0)
    m.handle(HandoffRequested({theirs: "n2"}, 5.0, request=2), 1.0)
    effects = m.handle(HandoffAbandoned("caller gone", request=1), 1.1)
    first, second = ended_of(effects)
    assert first.request == 1 and first.handoff.state == HandoffState.ABORTED
    assert second.request == 2 and second.refused and "does not own" in second.handoff.reason
    assert m.handoff is None and m.driver.state == DriverState.IDLE
    assert not m.core.ring.extras_of(mine)          # the abandoned one's extras cleared


def test_a_handoff_past_its_deadline_ends_even_while_no_round_does():
    m = machine()
    mine = m.core.ring.tokens_of("n0")[0]
    target = next(n for n in MEMBERS if n not in ("n0", m.core.ring.heir(mine)))
    m.handle(HandoffRequested({mine: target}, 2.0, request=1), 1.0)
    assert not ended_of(m.handle(MonitorDue(2.5), 2.5))
    (done,) = ended_of(m.handle(MonitorDue(3.5), 3.5))
    assert done.handoff.state == HandoffState.ABORTED and "timed out" in done.handoff.reason
    assert not m.core.ring.extras_of(mine) and m.driver.state == DriverState.IDLE
