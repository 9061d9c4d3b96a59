"""The failure detector's timing rules, with an explicit clock."""

import pytest

from floering.node.core.detector import (ALIVE, DEAD, REFUSED, STALE, SUSPECT, TIMED_OUT, UNASKED,
                                UNCONFIRMED, DetectorConfig, FailureDetector, combine)


def suspects(d: FailureDetector, now: float) -> list[str]:
    return [p.node for p in d.due_probes(now)]


def test_silent_primary_is_suspected_after_min_timeout():
    d = FailureDetector(DetectorConfig(min_timeout=0.2))
    d.watch({"a"}, now=0.0)
    assert suspects(d, 0.19) == []
    assert suspects(d, 0.21) == ["a"]
    assert suspects(d, 0.3) == []          # already being probed


def test_startup_grace_covers_a_peer_never_heard_from():
    d = FailureDetector(DetectorConfig(min_timeout=0.2))
    d.watch({"slow", "fast"}, now=0.0, grace=5.0)
    assert suspects(d, 4.0) == []          # "slow" may still be starting
    d.heard("fast", 1.0)                  # the grace ends at the first heartbeat
    assert suspects(d, 1.25) == ["fast"]
    assert suspects(d, 5.1) == []
    assert suspects(d, 5.25) == ["slow"]   # never came up: suspected after the grace


def test_grace_applies_only_to_nodes_new_to_the_watch():
    d = FailureDetector(DetectorConfig(min_timeout=0.2))
    d.watch({"a"}, now=0.0)
    d.watch({"a", "b"}, now=0.1, grace=5.0)
    assert suspects(d, 0.25) == ["a"]


CFG = DetectorConfig(min_timeout=0.2, probe_timeout=0.15, suspicion=1.0)


def suspected(now=0.3):
    """A detector watching "a", silent since 0, whose first probe round starts at `now`."""
    d = FailureDetector(CFG)
    d.watch({"a"}, now=0.0)
    (probe,) = d.due_probes(now)
    assert probe.deadline == pytest.approx(0.15) and probe.round == 0
    return d, probe


def test_a_refused_probe_is_conclusive_the_node_is_dead_at_once():
    d, probe = suspected()
    assert d.probe_result(probe, REFUSED, 0.301) == DEAD
    assert "a" not in d.watched


def test_timed_out_probes_keep_a_node_suspected_until_the_suspicion_period_has_passed():
    d, probe = suspected(0.3)
    now, deadlines = 0.3, []
    while True:
        deadlines.append(probe.deadline)
        now += probe.deadline
        verdict = d.probe_result(probe, TIMED_OUT, now)
        if verdict == DEAD:
            break
        assert verdict == SUSPECT and "a" in d.suspected
        assert now - 0.3 < 1.0                        # never before the suspicion period
        (probe,) = d.due_probes(now)
    assert now - 0.3 >= 1.0 and "a" not in d.watched  # declared once it has passed
    # growing deadlines, the last one ending with the suspicion period
    assert deadlines == pytest.approx([0.15, 0.3, 0.55])


def test_a_suspicion_that_lasted_long_enough_still_needs_a_failed_round():
    d, probe = suspected(0.3)
    assert d.due_probes(5.0) == []                    # one round in flight at a time
    assert d.probe_result(probe, TIMED_OUT, 5.0) == DEAD


@pytest.mark.parametrize("sign_of_life", ["heard", "probe answered"])
def test_any_sign_of_life_clears_the_suspicion(sign_of_life):
    d, probe = suspected(0.3)
    assert d.probe_result(probe, TIMED_OUT, 0.45) == SUSPECT
    (probe,) = d.due_probes(0.46)
    if sign_of_life == "heard":
        d.heard("a", 0.5)                              # a heartbeat or checkpoint
        # the round still in flight no longer counts, even if it ends in a timeout
        assert d.probe_result(probe, TIMED_OUT, 0.76) == STALE
    else:
        assert d.probe_result(probe, ALIVE, 0.5) == ALIVE
    assert d.suspected == set() and d.watched == {"a"}
    # a new silence starts a new suspicion, with the full period and first deadline again
    assert d.due_probes(0.69) == []
    (probe,) = d.due_probes(0.75)
    assert probe.round == 0 and probe.deadline == pytest.approx(0.15)
    assert d.probe_result(probe, TIMED_OUT, 1.5) == SUSPECT


def test_a_refusal_during_a_suspicion_ends_it_at_once():
    d, probe = suspected(0.3)
    assert d.probe_result(probe, TIMED_OUT, 0.45) == SUSPECT
    (probe,) = d.due_probes(0.46)
    assert d.probe_result(probe, REFUSED, 0.47) == DEAD    # paused, then killed


def test_an_abandoned_round_is_started_again_with_the_same_deadline():
    d, probe = suspected(0.3)
    assert d.probe_result(probe, TIMED_OUT, 0.45) == SUSPECT
    (probe,) = d.due_probes(0.46)
    d.abandon(probe)
    (again,) = d.due_probes(0.5)
    assert again.deadline == probe.deadline and d.probe_result(probe, TIMED_OUT, 0.8) == STALE


def test_a_node_no_longer_watched_makes_its_rounds_stale():
    d, probe = suspected(0.3)
    d.watch(set(), now=0.35)
    assert d.probe_result(probe, REFUSED, 0.36) == STALE


def test_unknown_outcome_is_an_error():
    d, probe = suspected()
    with pytest.raises(ValueError):
        d.probe_result(probe, "maybe", 0.4)


def test_outcomes_combine_an_answer_on_any_path_and_only_a_direct_refusal_is_conclusive():
    assert combine(TIMED_OUT, (ALIVE,), 3) == ALIVE
    assert combine(REFUSED, (TIMED_OUT, ALIVE), 4) == ALIVE     # a broken link, not a dead node
    assert combine(ALIVE, (TIMED_OUT,), 3) == ALIVE
    assert combine(REFUSED, (TIMED_OUT,), 3) == REFUSED
    assert combine(REFUSED, (UNASKED,), 3) == REFUSED
    assert combine(REFUSED, (), 2) == REFUSED                   # a killed peer of a 2-node ring


def test_a_timeout_is_confirmed_only_by_a_quorum_of_the_ring():
    # we and the members that answered "not me either" must be more than half the ring
    assert combine(TIMED_OUT, (TIMED_OUT,), 3) == TIMED_OUT     # 2 of 3
    assert combine(TIMED_OUT, (UNASKED,), 3) == UNCONFIRMED     # we may be the one cut off
    assert combine(TIMED_OUT, (TIMED_OUT, TIMED_OUT), 4) == TIMED_OUT
    assert combine(TIMED_OUT, (TIMED_OUT, UNASKED), 4) == UNCONFIRMED   # 2 of 4: no majority
    # two neighbours cut off from three (5 nodes): the one that answers is on our side
    assert combine(TIMED_OUT, (TIMED_OUT, UNASKED, UNASKED), 5) == UNCONFIRMED
    assert combine(TIMED_OUT, (UNASKED, TIMED_OUT, TIMED_OUT), 5) == TIMED_OUT
    assert combine(TIMED_OUT, (), 2) == UNCONFIRMED             # 2 nodes: one cannot tell
    assert combine(TIMED_OUT, (UNASKED,) * 5, 7) == UNCONFIRMED  # alone: declares nobody


def test_every_other_member_is_asked_clockwise_from_the_suspect():
    from floering.node.core.detector import indirect_vias
    from floering.wire.ring import Ring
    ring = Ring.initial({f"n{i}": f"a:{i}" for i in range(5)}, 1, 1)
    assert indirect_vias(ring, "n1", "n0") == ("n2", "n3", "n4")
    assert indirect_vias(ring, "n0", "n4") == ("n1", "n2", "n3")
    idle = ring.add_node("n9", "a:9", (), 1)
    assert indirect_vias(idle, "n1", "n0") == ("n2", "n3", "n4", "n9")
    assert indirect_vias(idle, "n1", "n9") == ("n0", "n2", "n3", "n4")


def test_a_node_cut_off_from_the_third_nodes_too_never_declares_until_a_quorum_confirms():
    d, probe = suspected(0.3)
    now = 0.3
    for _ in range(25):                               # 25 rounds, long past the period
        now += probe.deadline
        assert d.probe_result(probe, UNCONFIRMED, now) == SUSPECT
        (probe,) = d.due_probes(now)
        assert probe.deadline == pytest.approx(0.15)  # probed often: we notice the heal
    assert now - 0.3 > 3.0 and "a" in d.suspected
    start = probe.started
    verdicts = []
    while not verdicts or verdicts[-1] == SUSPECT:    # a quorum answers: not it either
        now += probe.deadline
        verdicts.append(d.probe_result(probe, TIMED_OUT, now))
        if verdicts[-1] == SUSPECT:
            (probe,) = d.due_probes(now)
    assert verdicts[-1] == DEAD and now - start >= 1.0  # a full period of evidence


def test_a_round_without_a_quorum_starts_the_suspicion_period_again():
    d, probe = suspected(0.3)
    assert d.probe_result(probe, TIMED_OUT, 0.45) == SUSPECT
    (probe,) = d.due_probes(0.45)
    assert d.probe_result(probe, UNCONFIRMED, 0.75) == SUSPECT   # cut off from the others
    (probe,) = d.due_probes(0.8)
    assert d.probe_result(probe, TIMED_OUT, 0.95) == SUSPECT
    now = 0.95
    while True:
        (probe,) = d.due_probes(now)
        now += probe.deadline
        if d.probe_result(probe, TIMED_OUT, now) == DEAD:
            break
    assert now >= 1.8                                 # 1 s from the round begun at 0.8


def test_own_loop_lag_stretches_timeouts_deadlines_and_the_suspicion():
    d = FailureDetector(CFG)
    d.watch({"a"}, now=0.0)
    d.tick(scheduled=0.0, now=0.04)                    # ordinary scheduling noise
    assert d.lag(0.05) == 0.0 and d.stretch(0.05) == 1.0
    d.tick(scheduled=0.0, now=0.2)                     # our monitor woke 200 ms late
    assert d.lag(0.2) == pytest.approx(0.15) and d.stretch(0.2) == pytest.approx(2.0)
    assert d.timeout("a", 0.2) == pytest.approx(0.35)
    assert suspects(d, 0.34) == []                     # a healthy judge would suspect now
    (probe,) = d.due_probes(0.36)
    assert probe.deadline == pytest.approx(0.3)
    now = 0.36
    while (verdict := d.probe_result(probe, TIMED_OUT, now := now + probe.deadline)) == SUSPECT:
        (probe,) = d.due_probes(now)
    assert verdict == DEAD and now - 0.36 >= 2.0      # the suspicion period doubled too


def test_lag_is_forgotten_after_the_window_and_the_stretch_is_capped():
    d = FailureDetector(DetectorConfig(probe_timeout=0.15, lag_window=5.0, max_stretch=8.0,
                                       lag_floor=0.05))
    d.tick(scheduled=0.0, now=3.0)                     # we were paused for 3 s
    assert d.stretch(3.0) == 8.0
    for i in range(1, 200):
        d.tick(scheduled=3.0 + 0.025 * i, now=3.0 + 0.025 * i + 0.08)
    assert d.lag(8.5) == pytest.approx(0.03)
    assert d.stretch(8.5) == pytest.approx(1.2)
