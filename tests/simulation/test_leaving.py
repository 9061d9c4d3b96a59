"""Scale-in's state machine (node.core.leaving): every transition, the failures
included; and the simulation, which runs it, reports a failed leave."""

import pytest

from floering.node.core.leaving import (TRANSITIONS, CheckAgain, Checked, Go, HandAway,
                                        HandedAway, HandingRefused, LeaveFailed, LeaveState,
                                        LeaveStateError, Leaving)

pytestmark = pytest.mark.fast


def waiting(deadline: float = 10.0) -> Leaving:
    leave = Leaving(deadline)
    leave.start({1: "b"})
    leave.handle(HandedAway(True))
    return leave


def test_hands_everything_away_waits_for_the_copies_then_goes():
    leave = Leaving(10.0)
    assert leave.start({1: "b", 2: "c"}) == [HandAway({1: "b", 2: "c"})]
    assert leave.state == LeaveState.HANDING
    assert leave.handle(HandedAway(True)) == [CheckAgain()]
    assert leave.handle(Checked(1.0, True, {})) == [CheckAgain()]     # copy still in use
    assert leave.state == LeaveState.WAITING
    assert leave.handle(Checked(2.0, False, {})) == [Go("")]
    assert leave.finished and leave.state == LeaveState.GONE


def test_nothing_to_hand_waits_at_once():
    leave = Leaving(10.0)
    assert leave.start({}) == [CheckAgain()]
    assert leave.handle(Checked(0.0, False, {})) == [Go("")]


def test_ranges_that_came_back_are_handed_on():
    leave = waiting()
    assert leave.handle(Checked(1.0, False, {3: "c"})) == [HandAway({3: "c"}, again=True)]
    assert leave.handle(HandedAway(True)) == [CheckAgain()]


@pytest.mark.parametrize("event,reason", [
    (HandedAway(False, "target died"), "cannot leave: target died"),
    (HandingRefused("a handoff is under way"), "cannot leave: a handoff is under way"),
])
def test_a_refused_or_aborted_handoff_fails_the_leave(event, reason):
    leave = Leaving(10.0)
    leave.start({1: "b"})
    assert leave.handle(event) == [LeaveFailed(reason)]
    assert leave.finished and leave.state == LeaveState.FAILED


def test_moves_refused_at_the_start_or_while_waiting_fail_the_leave():
    assert Leaving(1.0).refused("the last member") == [LeaveFailed("cannot leave: the last member")]
    leave = waiting()
    assert leave.handle(Checked(1.0, False, {}, "n1 was removed from the ring")) == [
        LeaveFailed("cannot leave: n1 was removed from the ring")]


def test_past_the_deadline_it_goes_with_a_warning():
    assert waiting(5.0).handle(Checked(6.0, True, {})) == [
        Go("leaving while other ranges still use our copy")]
    assert waiting(5.0).handle(Checked(6.0, False, {3: "c"})) == [
        Go("leaving with ranges that came back to us")]


@pytest.mark.parametrize("event", [Checked(0.0, False, {}), HandedAway(True)])
def test_unexpected_events_are_refused(event):
    leave = Leaving(1.0)
    leave.start({1: "b"})
    if isinstance(event, HandedAway):
        leave.handle(HandedAway(True))
    with pytest.raises(LeaveStateError):
        leave.handle(event)
    with pytest.raises(LeaveStateError):
        leave.start({})


def test_finished_states_take_nothing():
    assert TRANSITIONS[LeaveState.GONE] == TRANSITIONS[LeaveState.FAILED] == frozenset()
    leave = waiting()
    leave.handle(Checked(1.0, False, {}))
    with pytest.raises(LeaveStateError):
        leave.handle(Checked(2.0, False, {}))


def test_a_leave_behind_a_running_handoff_hands_on_what_is_still_its_own():
    """The leave's handoff waits in line behind the running one, which moves one of
    the leaver's tokens away: when its turn comes it hands the rest, and the node
    leaves (it used to fail on the token the first handoff took)."""
    from tests.support.simulation import Simulation
    sim = Simulation(seed=3, nodes=3)
    proc = sim.process("n0")
    sim.handoff("n0")                      # a handoff under way: the leave's waits
    assert proc.machine.handoff is not None
    sim.leave("n0")
    assert proc.leaving is not None
    sim.run(10.0, 0.0, [])
    assert sim.leave_failures == [], sim.log
    assert "n0" not in sim.process("n1").core.ring.nodes


def test_the_simulation_reports_a_leave_whose_handoff_is_refused():
    from tests.support.simulation import Simulation
    from floering.node.core.handoff_driver import MAX_WAITING
    sim = Simulation(seed=3, nodes=3)
    proc = sim.process("n0")
    for _ in range(MAX_WAITING + 1):       # one running, the line full: the leave's is refused
        sim.handoff("n0")
    sim.leave("n0")
    assert [(who, why[:13]) for _, who, why in sim.leave_failures] == [("n0", "cannot leave:")]
    assert any("n0 leave failed: cannot leave" in line for line in sim.log), sim.log
    assert proc.leaving is None and "n0" in proc.core.ring.nodes
