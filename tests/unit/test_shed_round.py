"""The shedding round's state machine (node.core.shed_round): every transition, the
failures included, and every event its state does not expect refused."""

import pytest

from floering.node.core.shed_round import (TRANSITIONS, AskToShed, CascadeAnswered,
                                           CascadeFailed, Finished, HandoffDone,
                                           HandoffRefused, HandOver, PlanComputed, PlanRound,
                                           ShedOutcome, ShedRound, ShedState, ShedStateError)

pytestmark = pytest.mark.fast


def test_nothing_to_move_finishes_at_once():
    shed = ShedRound("overloaded", 2)
    assert shed.start() == [PlanRound("overloaded", 2, None)]
    assert shed.handle(PlanComputed({}, "")) == [Finished(ShedOutcome("nothing to move"))]
    assert shed.finished and shed.state == ShedState.DONE


@pytest.mark.parametrize("state,reason,moved,detail", [
    ("committed", "", True, "moved 2 ranges: committed"),
    ("aborted", "target died", False, "moved 2 ranges: aborted target died"),
])
def test_moves_are_handed_off_and_their_end_reported(state, reason, moved, detail):
    shed = ShedRound("overloaded")
    shed.start()
    assert shed.handle(PlanComputed({1: "b", 2: "c"}, "b")) == [HandOver({1: "b", 2: "c"})]
    assert shed.state == ShedState.HANDING
    [done] = shed.handle(HandoffDone(moved, state, reason))
    assert done == Finished(ShedOutcome(detail, moved=moved))


def test_a_refused_handoff_finishes_unmoved():
    shed = ShedRound("overloaded")
    shed.start()
    shed.handle(PlanComputed({1: "b"}))
    assert shed.handle(HandoffRefused("a handoff is under way")) == [
        Finished(ShedOutcome("moving 1 ranges refused: a handoff is under way"))]


def test_cascade_unmoved_finishes_with_the_answer():
    shed = ShedRound("overloaded", 1)
    shed.start()
    assert shed.handle(PlanComputed({}, "b")) == [AskToShed("b", 2)]
    assert shed.state == ShedState.ASKING
    assert shed.handle(CascadeAnswered(False, "nothing to move")) == [Finished(ShedOutcome(
        "asked b to shed first: nothing to move", asked="b", asked_moved=False))]


def test_cascade_that_moved_plans_again_with_the_heir_relieved():
    shed = ShedRound("overloaded")
    shed.start()
    shed.handle(PlanComputed({}, "b"))
    assert shed.handle(CascadeAnswered(True, "moved 1 ranges: committed")) == [
        PlanRound("overloaded, after b shed", 0, relieved="b")]
    assert shed.state == ShedState.PLANNING
    # a second plan never asks again: once round the cascade is enough
    assert shed.handle(PlanComputed({}, "c")) == [Finished(ShedOutcome(
        "asked b to shed first: moved 1 ranges: committed; nothing to move"))]


def test_cascade_then_moves_combines_both_details():
    shed = ShedRound("overloaded")
    shed.start()
    shed.handle(PlanComputed({}, "b"))
    shed.handle(CascadeAnswered(True, "x"))
    assert shed.handle(PlanComputed({5: "b"})) == [HandOver({5: "b"})]
    assert shed.handle(HandoffDone(True, "committed")) == [Finished(ShedOutcome(
        "asked b to shed first: x; moved 1 ranges: committed", moved=True))]


def test_cascade_failure_finishes_unmoved():
    shed = ShedRound("overloaded")
    shed.start()
    shed.handle(PlanComputed({}, "b"))
    assert shed.handle(CascadeFailed("deadline exceeded")) == [
        Finished(ShedOutcome("cascade to b failed: deadline exceeded"))]


def test_share_hand_over_and_its_outcomes():
    shed = ShedRound("asked by d")
    assert shed.start_share("d", {7: "d"}) == [HandOver({7: "d"})]
    assert shed.handle(HandoffDone(True, "committed")) == [
        Finished(ShedOutcome("handed 1 ranges to d: committed", moved=True))]
    refused = ShedRound("asked by d")
    refused.start_share("d", {7: "d"})
    assert refused.handle(HandoffRefused("fenced")) == [
        Finished(ShedOutcome("handing 1 ranges to d refused: fenced"))]
    none = ShedRound("asked by d")
    [finished] = none.start_share("d", {})
    outcome = finished.outcome
    assert not outcome.moved and "short of its share" in outcome.detail


@pytest.mark.parametrize("steps,bad", [
    ([], HandoffDone(True, "committed")),
    ([], CascadeAnswered(True, "")),
    ([PlanComputed({1: "b"})], PlanComputed({}, "")),
    ([PlanComputed({1: "b"})], CascadeFailed("x")),
    ([PlanComputed({}, "b")], HandoffRefused("x")),
    ([PlanComputed({}, "")], PlanComputed({}, "")),
])
def test_unexpected_events_are_refused(steps, bad):
    shed = ShedRound("overloaded")
    shed.start()
    for step in steps:
        shed.handle(step)
    with pytest.raises(ShedStateError):
        shed.handle(bad)


def test_starts_once_and_the_table_ends_in_done():
    shed = ShedRound("overloaded")
    shed.start()
    shed.handle(PlanComputed({}, "b"))
    shed.handle(CascadeAnswered(True, ""))
    with pytest.raises(ShedStateError):
        shed.start()
    assert TRANSITIONS[ShedState.DONE] == frozenset()
    assert all(ShedState.DONE in TRANSITIONS[s] for s in ShedState if s != ShedState.DONE)
