"""A node declared dead on timeouts alone must not take with it the only complete copy
of ranges: after a takeover (or a handoff) the new owner is the only node holding them
until its checkpoints have filled its replicas. A starved node (the overloaded one,
doubling its tokens) falsely declared, then its heir starved in turn before its first
checkpoint round, lost every range the first one owned ("n2 owns 16 ranges whose every
copy was lost", with r = 1 and nobody killed). Such a declaration now waits for the
much longer lossy suspicion; a refused probe still declares at once."""

from dataclasses import replace

from floering.node.core.detector import (DEAD, HELD, REFUSED, SUSPECT, TIMED_OUT,
                                         DetectorConfig, FailureDetector)
from floering.node.core.load import LoadMonitor
from floering.node.core.machine import NodeMachine
from floering.node.core.machine_io import MonitorDue, ProbeFinished, Record, RingSeen, StartProbe
from floering.node.core.membership import removal_losses
from floering.node.core.node_core import NodeCore
from floering.node.core.reducers import load_reducer
from floering.wire.ring import Ring

MEMBERS = {f"n{i}": f"a:{i}" for i in range(4)}
INCARNATIONS = {n: 100 + i for i, n in enumerate(MEMBERS)}
CFG = DetectorConfig(min_timeout=0.2, probe_timeout=0.15, suspicion=1.0, lossy_suspicion=5.0)


def founding() -> Ring:
    return replace(Ring.initial(MEMBERS, 1, 2), incarnations=tuple(sorted(INCARNATIONS.items())))


def make_core(node_id, ring):
    return NodeCore(node_id, ring, load_reducer("count"))


def machine(name: str) -> NodeMachine:
    m = NodeMachine(make_core(name, founding()), INCARNATIONS[name], FailureDetector(CFG),
                    LoadMonitor(), make_core, listen=MEMBERS[name])
    m.watch_peers(0.0, 0.0)
    return m


def after_n0_died(name: str) -> NodeMachine:
    """`name` once n0 was declared dead: n1 took n0's ranges over, and n2 (the next
    node clockwise) is now their replica, with no copy of them yet."""
    m = machine(name)
    effects = m.handle(RingSeen(m.core.ring.without(["n0"])), 0.0)
    for e in effects:               # a removal is adopted once our own probe agrees
        if isinstance(e, StartProbe):
            m.handle(ProbeFinished(e.probe, REFUSED, (), e.epoch), 0.01)
    return m


def kinds(effects) -> list[str]:
    return [e.kind for e in effects if isinstance(e, Record)]


def probe_rounds(m: NodeMachine, start: float, end: float, direct=TIMED_OUT):
    """Probe rounds of n1 every 0.2 s from `start` until `end` or a declaration, each
    timing out with the other member behind it (a quorum)."""
    effects, now = [], start
    while now < end and "detected" not in kinds(effects):
        starts = [e for e in m.handle(MonitorDue(now), now) if isinstance(e, StartProbe)]
        for s in starts:
            assert s.probe.node == "n1"
            effects += m.handle(ProbeFinished(s.probe, direct, (TIMED_OUT,) * len(s.vias),
                                              s.epoch), now + 0.15)
        now += 0.2
    return effects, now


def test_the_heir_without_a_complete_copy_knows_what_a_declaration_would_lose():
    ring = founding()
    taken = sorted(ring.tokens_of("n0"))
    n2, n3 = after_n0_died("n2"), after_n0_died("n3")
    assert all(n2.core.ring.owner_of_token(t) == "n1" for t in taken)
    assert all(n2.core.ring.heir(t) == "n2" for t in taken)
    assert removal_losses(n2.core, "n1") == taken
    # n1's own ranges n2 backed up from the start: complete, nothing lost for them
    assert not set(removal_losses(n2.core, "n1")) & set(ring.tokens_of("n1"))
    assert removal_losses(n3.core, "n1") == []          # n3 would take none of them over
    assert removal_losses(n2.core, "n2") == [] and removal_losses(n2.core, "n0") == []


def test_a_full_checkpoint_from_the_new_owner_makes_the_declaration_lossless():
    n1, n2 = after_n0_died("n1"), after_n0_died("n2")
    for s in n1.core.plan_checkpoints(0.1):
        if s.replica == "n2":
            cp = s.checkpoint
            n2.core.receive_checkpoint("n1", n1.core.ring.stamp, cp.token, cp.seq, s.base_seq,
                                       cp.full, dict(cp.states), dict(cp.watermarks), 0.1)
    assert removal_losses(n2.core, "n1") == []
    effects, now = probe_rounds(n2, 5.0, 20.0)
    assert "detected" in kinds(effects) and now <= 6.6        # the usual suspicion


def test_timeouts_alone_do_not_declare_a_node_whose_removal_would_lose_ranges():
    n2 = after_n0_died("n2")
    effects, now = probe_rounds(n2, 5.0, 9.0)
    assert "detected" not in kinds(effects) and "n1" in n2.core.ring.nodes
    assert kinds(effects).count("declaration_held") == 1
    held = next(e for e in effects if isinstance(e, Record) and e.kind == "declaration_held")
    assert dict(held.fields)["tokens"] == sorted(founding().tokens_of("n0"))
    # silent for the whole lossy suspicion: dead after all, its ranges reported lost
    effects, now = probe_rounds(n2, now, 20.0)
    assert "detected" in kinds(effects) and 10.0 <= now <= 10.8
    assert "lost" in kinds(effects)


def test_a_refused_probe_still_declares_at_once():
    n2 = after_n0_died("n2")
    effects, now = probe_rounds(n2, 5.0, 9.0, direct=REFUSED)
    assert "detected" in kinds(effects) and now <= 5.3


def test_the_detector_holds_a_lossy_declaration_until_the_lossy_suspicion():
    d = FailureDetector(CFG)
    d.watch({"a"}, now=0.0)
    verdicts, now = [], 0.3
    while True:
        (probe,) = d.due_probes(now)
        assert probe.deadline <= CFG.suspicion + 1e-9     # rounds stay short meanwhile
        now += probe.deadline
        verdicts.append(d.probe_result(probe, TIMED_OUT, now, lossy=True))
        if verdicts[-1] == DEAD:
            break
    assert now - 0.3 >= CFG.lossy_suspicion
    assert verdicts.count(HELD) == 1 and set(verdicts) == {SUSPECT, HELD, DEAD}
    # once nothing would be lost any more, the usual period counts again
    d.watch({"b"}, now=0.0)
    (probe,) = d.due_probes(0.3)
    assert d.probe_result(probe, TIMED_OUT, 0.45, lossy=True) == SUSPECT
    now = 0.45
    while True:
        (probe,) = d.due_probes(now)
        now += probe.deadline
        if d.probe_result(probe, TIMED_OUT, now, lossy=now < 1.0) == DEAD:
            break
    assert now < 2.0


def test_a_sign_of_life_ends_a_held_suspicion():
    d = FailureDetector(CFG)
    d.watch({"a"}, now=0.0)
    now = 0.3
    for _ in range(6):
        (probe,) = d.due_probes(now)
        now += probe.deadline
        assert d.probe_result(probe, TIMED_OUT, now, lossy=True) in (SUSPECT, HELD)
    assert "a" in d.suspected
    d.heard("a", now)
    assert "a" not in d.suspected
