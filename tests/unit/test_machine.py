"""The node machine alone: events in, effects out, with an explicit clock."""

import logging

import pytest

from floering.node.core.detector import ALIVE, REFUSED, TIMED_OUT, UNASKED, Isolation
from floering.wire.errors import InvalidArgument
from floering.node.core.handoff import HandoffState
from floering.node.core.machine import NodeMachine
from floering.node.core.machine_io import CheckpointDue, CheckpointRoundDone, Exit, Gossip, HandoffAbandoned, HandoffEnded, HandoffRequested, HeardFrom, LeaveRing, LoadSampled, ProbeFinished, Record, Note, RingSeen, SendHeartbeat, ShipCheckpoints, StartShed, HeartbeatDue, NextRound, RoundEnded, RoundNow
from floering.node.core.handoff_driver import REPAIR_SLACK
from tests.support.machine_shared import INCARNATIONS, MEMBERS, kinds, machine, probe_of


def test_heartbeats_go_to_the_replicas_of_our_ranges_with_our_stamp():
    m = machine()
    sent = m.handle(HeartbeatDue(), 0.0)
    assert sent and all(isinstance(e, SendHeartbeat) and e.ring_stamp == m.core.ring.stamp
                        for e in sent)
    assert {e.node for e in sent} == m.core.heartbeat_targets()


def test_a_refused_probe_declares_the_node_dead_and_tells_everyone():
    m = machine()
    start = probe_of(m, 5.0)
    effects = m.handle(ProbeFinished(start.probe, REFUSED, (TIMED_OUT, TIMED_OUT),
                                     start.epoch), 5.1)
    assert "detected" in kinds(effects) and Gossip() in effects
    assert start.probe.node not in m.core.ring.nodes


def test_a_probe_answered_by_another_process_counts_as_refused():
    m = machine()
    start = probe_of(m, 5.0)
    node = start.probe.node
    effects = m.handle(ProbeFinished(start.probe, ALIVE, (TIMED_OUT, TIMED_OUT), start.epoch,
                                     incarnation=INCARNATIONS[node] + 1), 5.1)
    assert "detected" in kinds(effects) and node not in m.core.ring.nodes


def test_a_probe_begun_as_an_earlier_member_is_discarded():
    m = machine()
    start = probe_of(m, 5.0)
    m.handle(RingSeen(m.core.ring.without(["n0"]), pulled=True), 5.05)    # fenced: rejoins as n0#1
    assert m.node_id == "n0#1" and m.epoch == start.epoch + 1
    effects = m.handle(ProbeFinished(start.probe, REFUSED, (TIMED_OUT, TIMED_OUT),
                                     start.epoch), 5.1)
    assert effects == [] and start.probe.node in m.core.ring.nodes


def test_being_removed_rejoins_empty_under_a_new_name():
    m = machine()
    effects = m.handle(RingSeen(m.core.ring.without(["n0"]), pulled=True), 1.0)
    assert kinds(effects)[-1] == "fenced" and Gossip() in effects
    assert m.core.ring.tokens_of("n0#1") == () and not m.core.primaries and m.rejoined == 1


def test_a_restarted_peer_is_declared_dead_at_once():
    m = machine()
    effects = m.handle(HeardFrom("n1", m.core.ring.stamp, INCARNATIONS["n1"] + 7), 1.0)
    assert kinds(effects)[0] == "detected" and "n1" not in m.core.ring.nodes


def rounds(m: NodeMachine, start: float, end: float, indirect) -> tuple[list, float]:
    """Probe rounds every 0.2 s from `start` until `end` (or a declaration), each timing
    out directly and ending with `indirect` from the members asked."""
    effects, now = [], start
    while now < end and "detected" not in kinds(effects):
        s = probe_of(m, now)
        effects += m.handle(ProbeFinished(s.probe, TIMED_OUT, indirect, s.epoch), now + 0.15)
        now += 0.2
    return effects, now


def test_a_probe_asks_every_other_member():
    m = machine()
    start = probe_of(m, 5.0)
    others = tuple(n for n in sorted(MEMBERS) if n not in ("n0", start.probe.node))
    assert sorted(start.vias) == list(others)
    assert start.via_addresses == tuple(MEMBERS[v] for v in start.vias)


def test_a_timeout_is_declared_only_with_a_quorum_behind_it():
    m = machine()
    effects, _ = rounds(m, 5.0, 10.0, (TIMED_OUT, UNASKED))     # 2 of 4: no majority
    assert "detected" not in kinds(effects)
    assert effects.count(Note(Isolation.NOTE, logging.WARNING)) == 1
    m = machine()
    effects, now = rounds(m, 5.0, 10.0, (TIMED_OUT, TIMED_OUT))  # 3 of 4
    assert "detected" in kinds(effects) and 6.0 <= now <= 6.6


def test_after_being_cut_off_a_quorum_round_exchanges_views_before_anything_counts():
    m = machine()
    effects, _ = rounds(m, 5.0, 25.0, (UNASKED, UNASKED))        # 20 s cut off from all
    assert "detected" not in kinds(effects)
    effects, now = rounds(m, 25.0, 28.0, (TIMED_OUT, TIMED_OUT))  # a quorum; no view yet
    assert "detected" not in kinds(effects) and Gossip() in effects
    m.handle(RingSeen(m.core.ring), now)                         # a peer's view: as ours
    effects, end = rounds(m, now, now + 3.0, (TIMED_OUT, TIMED_OUT))
    assert "detected" in kinds(effects) and end - now >= 1.0    # a full period after it


def test_after_being_cut_off_the_view_that_removed_us_comes_before_any_declaration():
    m = machine()
    rounds(m, 5.0, 25.0, (UNASKED, UNASKED))
    effects, now = rounds(m, 25.0, 25.2, (TIMED_OUT, TIMED_OUT))
    assert Gossip() in effects
    effects = m.handle(RingSeen(m.core.ring.without(["n0"]), pulled=True), now)
    assert "fenced" in kinds(effects) and m.node_id == "n0#1" and not m.isolation.state


def test_a_different_stamp_asks_for_an_exchange_with_that_peer():
    m = machine()
    assert m.handle(HeardFrom("n1", 12345, INCARNATIONS["n1"]), 1.0) == [Gossip("a:1")]
    assert m.handle(HeardFrom("n1", m.core.ring.stamp, INCARNATIONS["n1"]), 1.0) == []


def test_a_handoff_commits_after_a_round_the_targets_acknowledged():
    m = machine()
    token = m.core.ring.tokens_of("n0")[0]
    heir = m.core.ring.heir(token)
    effects = m.handle(HandoffRequested({token: heir}, 5.0, request=1), 1.0)
    assert kinds(effects) == ["handoff_prepared"] and RoundNow() in effects
    assert kinds(m.handle(HandoffRequested({token: heir}, 5.0, request=2), 1.0)) == []
    assert len(m.driver.waiting) == 1                        # one at a time: it waits
    (ship,) = [e for e in m.handle(CheckpointDue(), 1.1) if isinstance(e, ShipCheckpoints)]
    for s in ship.shipments:       # every replica acknowledges the final checkpoint
        m.core.checkpoint_acked(s.checkpoint.token, s.replica, s.checkpoint.seq, False)
    effects = m.handle(CheckpointRoundDone(ship.tokens, ship.behind_before, ship.epoch), 1.2)
    ended = [e for e in effects if isinstance(e, HandoffEnded)]
    assert ended[0].request == 1 and ended[0].handoff.state == HandoffState.COMMITTED
    assert m.core.ring.owner_of_token(token) == heir
    # the one in line starts now: it waits for the range's extras to retire, then
    # ends without moving anything, the token being no longer ours
    assert m.handoff.state == HandoffState.NEW and not m.driver.waiting
    effects = m.handle(CheckpointRoundDone((), False, m.epoch), 6.5)
    (ended,) = [e for e in effects if isinstance(e, HandoffEnded)]
    assert ended.request == 2 and ended.handoff.state == HandoffState.ABORTED
    assert "does not own" in ended.handoff.reason
    assert m.handoff is None and m.driver.state == "idle"


def test_an_abandoned_handoff_clears_its_extras_and_frees_the_next():
    m = machine()
    token = m.core.ring.tokens_of("n0")[0]
    target = next(n for n in MEMBERS if n not in ("n0", m.core.ring.heir(token)))
    m.handle(HandoffRequested({token: target}, 5.0), 1.0)
    assert m.core.ring.extras_of(token)
    effects = m.handle(HandoffAbandoned("stopped"), 1.1)
    assert kinds(effects)[0] == "handoff_aborted" and not m.core.ring.extras_of(token)
    m.handle(HandoffRequested({token: target}, 5.0), 1.2)     # not refused as busy


def test_leaving_removes_us_and_exits():
    m = machine()
    effects = m.handle(LeaveRing(), 1.0)
    assert "n0" not in m.core.ring.nodes and Exit() in effects and "left" in kinds(effects)


@pytest.mark.parametrize("balance", [False, True])
def test_overload_is_recorded_and_sheds_only_when_balancing(balance):
    m = machine(balance=balance)
    effects = []
    for i in range(6):
        effects += m.handle(LoadSampled(20, 0.1 * (i + 1), 0.0), 0.1 * (i + 1))
    assert "overloaded" in kinds(effects)
    assert any(isinstance(e, StartShed) for e in effects) == balance


def test_the_cooldown_after_shedding_counts_from_the_end_of_its_handoff():
    from floering.node.core.machine_io import ShedMoved
    m = machine(balance=True)
    cooldown = m.load.config.cooldown
    assert m.load.may_move(100.0)
    assert m.handle(ShedMoved(), 100.0) == []
    assert not m.load.may_move(100.0 + cooldown - 0.01) and m.load.may_move(100.0 + cooldown)


def test_records_name_the_stimulus_that_caused_them():
    m = machine()
    start = probe_of(m, 5.0)
    effects = m.handle(ProbeFinished(start.probe, REFUSED, (TIMED_OUT, TIMED_OUT),
                                     start.epoch), 5.1)
    records = [e for e in effects if isinstance(e, Record)]
    assert len(records) >= 2                    # detected, then what it changed here
    assert {r.stimulus for r in records} == {f"n0:{m.stimuli}:ProbeFinished"}
    later = m.handle(RingSeen(m.core.ring.without(["n0"]), pulled=True), 6.0)
    assert [e.stimulus for e in later if isinstance(e, Record)] == [f"n0:{m.stimuli}:RingSeen"]


def test_a_replica_that_keeps_failing_checkpoints_is_reported_once_then_its_return():
    from floering.node.core.machine import FAILING_ROUNDS
    from floering.node.core.machine_io import CheckpointAcked, CheckpointFailed
    m = machine()
    token = m.core.ring.tokens_of("n0")[0]
    replica = m.core.ring.replicas_of_token(token)[0]
    failed = [m.handle(CheckpointFailed(token, replica, False, 0, "too large"), 1.0 + i)
              for i in range(2 * FAILING_ROUNDS)]
    warned = [i for i, effects in enumerate(failed) if "checkpoints_failing" in kinds(effects)]
    assert warned == [FAILING_ROUNDS - 1]
    assert token in m.core.under_replicated()
    back = m.handle(CheckpointAcked(token, replica, 1, False, 0), 99.0)
    assert kinds(back) == ["checkpoints_resumed"]


def _round(m: NodeMachine, now: float) -> list:
    """One checkpoint round, every shipment acknowledged: [(token, replica, full)]."""
    ships = [e for e in m.handle(CheckpointDue(), now) if isinstance(e, ShipCheckpoints)]
    sent = []
    for ship in ships:
        for s in ship.shipments:
            m.core.checkpoint_acked(s.checkpoint.token, s.replica, s.checkpoint.seq, False)
            m.core.checkpoint_done(s.checkpoint.token)
            sent.append((s.checkpoint.token, s.replica, s.checkpoint.full))
        m.handle(CheckpointRoundDone(ship.tokens, ship.behind_before, ship.epoch), now)
    return sent


def _apply_one(m: NodeMachine, token: int, seq: int) -> None:
    from floering.node.core.batch import Batch, encode_payload, encode_seqs
    key = next(k for k in (f"k{i}" for i in range(10_000))
               if m.core.ring.token_for_key(k) == token)
    m.core.receive_batch(Batch(m.core.ring.stamp, token, "src", seq, seq, 1,
                               encode_payload([key], [1]), encode_seqs([seq])))


@pytest.mark.parametrize("delay", [0.0, 1.0])
def test_after_a_member_dies_full_copies_wait_for_the_repair_delay_and_deltas_do_not(delay):
    m = machine(repair_delay=delay)
    ours = m.core.ring.tokens_of("n0")
    assert {t for t, _, full in _round(m, 1.0) if full} == set(ours)   # first copies
    start = probe_of(m, 5.0)
    m.handle(ProbeFinished(start.probe, REFUSED, (TIMED_OUT, TIMED_OUT), start.epoch), 5.1)
    taken = set(m.core.ring.tokens_of("n0")) - set(ours)
    assert taken, "n0 took over the dead node's ranges"
    _apply_one(m, ours[0], 1)             # a range whose replica is current changes
    sent = _round(m, 5.5)
    assert (ours[0], m.core.ring.replicas_of_token(ours[0])[0], False) in sent
    full = {t for t, _, is_full in sent if is_full}
    assert full == (set() if delay else taken)
    later = {t for t, _, is_full in _round(m, 6.2) if is_full}
    assert later == (taken if delay else set())


def test_the_machine_says_when_held_back_full_copies_may_go():
    m = machine(repair_delay=0.3)
    _round(m, 1.0)
    assert m.full_copies_due_in(1.0) == 0.0          # nobody left: nothing held back
    start = probe_of(m, 5.0)
    m.handle(ProbeFinished(start.probe, REFUSED, (TIMED_OUT, TIMED_OUT), start.epoch), 5.1)
    assert m.full_copies_due_in(5.2) == pytest.approx(0.2)
    assert not any(full for _, _, full in _round(m, 5.3))
    assert m.full_copies_due_in(5.4) == 0.0
    assert any(full for _, _, full in _round(m, 5.4))


def test_the_machine_starts_a_round_when_held_back_full_copies_fall_due():
    """Not at the next tick: with a 0.2 s interval and copies due 0.05 s after a round,
    the next round comes 0.05 s (and a hair) later, then at the usual interval."""
    m = machine(repair_delay=0.3)
    m.driver.interval = 0.2
    assert m.handle(RoundEnded(0.0), 0.0) == [NextRound(pytest.approx(0.2))]
    m.repair_after = 0.25
    (nxt,) = m.handle(RoundEnded(0.2), 0.2)
    assert nxt.after == pytest.approx(0.05 + REPAIR_SLACK)
    assert m.handle(RoundEnded(0.26), 0.3) == [NextRound(pytest.approx(0.16))]
