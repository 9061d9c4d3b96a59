"""What one member's certificate can do to the ring with ring views the protocol could
have produced: not split it (a version far ahead is absorbed a step at a time, so
every node converges), not erase it (a removal of live members waits for the
receiver's own probe, which finds them answering; a removal of the receiver itself
counts only as the answer of a member it called). Pure rules, the seeded simulation,
and real TLS processes."""

import os
from collections import Counter

import pytest

from floering.node.core.detector import ALIVE, REFUSED, TIMED_OUT
from floering.node.core.evidence import MAX_PENDING, ViewGuard, removal_claims
from floering.node.core.machine_io import (Gossip, MonitorDue, ProbedFor, ProbeFinished, Record,
                                          RingSeen, StartProbe)
from floering.node.core.ring import Ring
from floering.node.core.ring_merge import MAX_VERSION_STEP
from tests.test_simulation import check, random_cluster

MEMBERS = {"n0": "h:0", "n1": "h:1", "n2": "h:2"}


def machine(me="n0"):
    from tests.test_machine import machine as make
    return make(me)


def verifying(m, effects):
    """The probes verifying a held view (not the failure detector's own)."""
    return [e for e in effects if isinstance(e, StartProbe)
            and m.guard.verifying.get(e.probe.node) is e.probe]


def kinds(effects):
    return [e.kind for e in effects if isinstance(e, Record)]


# ------------------------------------------------------------------ pure rules

def test_claims_are_the_live_members_a_view_would_remove():
    ring = Ring.initial(MEMBERS, 1, 2)
    assert removal_claims(ring, ring.without(["n1", "n2"])) == {"n1", "n2"}
    assert removal_claims(ring.without(["n1"]), ring.without(["n1"])) == frozenset()
    heard = ring.with_incarnation("n1", 5)
    assert removal_claims(heard, ring.with_incarnation("n1", 6)) == {"n1"}   # a restart
    assert removal_claims(ring, heard) == frozenset()                         # first heard


def test_a_far_ahead_view_is_absorbed_a_step_at_a_time_and_converges():
    ring = Ring.initial(MEMBERS, 1, 2)
    far = ring.without(["n2"]).with_version(1 << 22)
    once = ring.merge(far)
    assert once.version == ring.version + MAX_VERSION_STEP and "n2" in once.removed
    # two honest nodes, one pushed far ahead: exchanging views, both reach one ring
    a, b = far, ring
    for _ in range(2 + (1 << 22) // MAX_VERSION_STEP):
        a, b = a.merge(b), b.merge(a)
        if a == b and a.stamp == b.stamp:
            break
    assert a.stamp == b.stamp and a.version == far.version


def test_a_view_removing_live_members_waits_for_our_probe_and_is_refused_if_they_answer():
    m = machine()
    before = m.core.ring
    effects = m.handle(RingSeen(before.without(["n1", "n2"])), 1.0)
    probes = {e.probe.node: e for e in effects if isinstance(e, StartProbe)}
    assert set(probes) == {"n1", "n2"} and m.core.ring == before
    assert all(e.vias == () for e in probes.values())      # our own, direct evidence
    # n1 answers as the process the ring knows: the view is refused, loudly
    inc = m.core.ring.incarnation_of("n1")
    out = m.handle(ProbeFinished(probes["n1"].probe, ALIVE, (), m.epoch, inc), 1.01)
    assert kinds(out) == ["removal_refused"]
    assert m.guard.counters["removals_refused"] == 1
    m.handle(ProbeFinished(probes["n2"].probe, REFUSED, (), m.epoch), 1.02)
    assert m.core.ring == before and not m.core.fenced
    # held, and n1 probed again a second later (it might have learned it was removed)
    again = verifying(m, m.handle(MonitorDue(2.02), 2.02))
    assert [e.probe.node for e in again] == ["n1"]
    m.handle(ProbeFinished(again[0].probe, ALIVE, (), m.epoch, inc), 2.03)
    assert m.guard.counters["removals_refused"] == 1 and m.core.ring == before
    # it answers as fenced at last (declared honestly): now the view is adopted
    later = verifying(m, m.handle(MonitorDue(3.1), 3.1))
    m.handle(ProbeFinished(later[0].probe, REFUSED, (), m.epoch), 3.11)
    assert {"n1", "n2"} <= m.core.ring.removed


def test_a_peer_we_could_not_reach_for_someone_else_is_gone_by_our_evidence():
    m = machine("n1")
    m.handle(ProbedFor("n0"), 1.0)           # a peer asked us; n0 did not answer us
    effects = m.handle(RingSeen(m.core.ring.without(["n0"])), 1.1)
    assert not any(isinstance(e, StartProbe) for e in effects)
    assert "n0" in m.core.ring.removed


def test_a_removal_our_probe_confirms_is_adopted_at_once():
    m = machine("n1")
    effects = m.handle(RingSeen(m.core.ring.without(["n0"])), 1.0)
    (probe,) = [e for e in effects if isinstance(e, StartProbe)]
    out = m.handle(ProbeFinished(probe.probe, REFUSED, (), m.epoch), 1.002)   # killed
    assert "n0" in m.core.ring.removed and "taken_over" in kinds(out)
    # a later view with the same removal needs no new probe while the evidence is fresh
    again = m.handle(RingSeen(m.core.ring.without(["n0"]).with_version(40)), 1.5)
    assert not any(isinstance(e, StartProbe) for e in again)
    # a member that times out on us (cut off, paused) is gone by our evidence too
    m2 = machine("n2")
    (p2,) = [e for e in m2.handle(RingSeen(m2.core.ring.without(["n0"])), 1.0)
             if isinstance(e, StartProbe)]
    m2.handle(ProbeFinished(p2.probe, TIMED_OUT, (), m2.epoch), 1.2)
    assert "n0" in m2.core.ring.removed


def test_our_own_removal_counts_only_as_an_answer_we_asked_for():
    m = machine()
    pushed = m.handle(RingSeen(m.core.ring.without(["n0"])), 1.0)
    assert m.node_id == "n0" and not m.core.fenced
    assert Gossip() in pushed and kinds(pushed) == ["removal_refused"]
    assert kinds(m.handle(RingSeen(m.core.ring.without(["n0"])), 1.1)) == []  # said once
    assert m.guard.counters["own_removal_refused"] == 2
    m.handle(RingSeen(m.core.ring.without(["n0"]), pulled=True), 2.0)
    assert m.node_id == "n0#1" and m.rejoined == 1


def test_held_views_are_bounded():
    guard = ViewGuard()
    ring = Ring.initial(MEMBERS, 1, 2)
    for v in range(3 * MAX_PENDING):
        guard.hold(ring.without(["n1"]).with_version(10 + v), frozenset({"n1"}))
    assert len(guard.pending) == MAX_PENDING


def test_a_far_ahead_view_is_reported_and_absorbed_by_the_machine():
    m = machine()
    before = m.core.ring.version
    out = m.handle(RingSeen(m.core.ring.with_version(before + (1 << 20))), 1.0)
    assert kinds(out) == ["view_absorbed"]
    assert m.core.ring.version == before + MAX_VERSION_STEP
    assert m.guard.counters["views_absorbed"] == 1


# ------------------------------------------------------------------ simulation

MEMBER_SEEDS = int(os.environ.get("FLOE_SIM_MEMBER_SEEDS", "40"))


def member_scenario(seed: int):
    """Forged member views (a version 2^20 ahead; the removal of two live members)
    pushed to random nodes while tuples flow, around a kill, pause or partition."""
    pick, sim, names = random_cluster(seed, 104729)
    faults = [(pick.uniform(0.05, 1.5), sim.forge_as_member,
               (pick.choice(names), pick.choice(["version far ahead", "removes live members"])))
              for _ in range(pick.randint(2, 5))]
    faults.append((pick.uniform(0.05, 1.5), sim.forge_as_member,
                   (pick.choice(names), "removes live members")))
    kind = pick.choice(["kill", "pause", "partition", "none"])
    victim, when = pick.randrange(len(names)), pick.uniform(0.2, 1.3)
    from tests.test_simulation import one_fault
    faults += one_fault(pick, sim, names, kind, victim, when)
    sim.run(until=6.0, emit_until=1.5, faults=faults)
    return sim


@pytest.mark.parametrize("seed", range(MEMBER_SEEDS))
def test_member_forgery_seed(seed):
    sim = member_scenario(seed)
    check(sim, seed)                              # exact counts, nothing lost
    from tests.test_simulation import assert_forgery_changed_no_verdict
    assert_forgery_changed_no_verdict(sim.log)    # nobody fenced but a fault's victim
    live = [p for p in sim.procs if p.alive and not p.core.fenced]
    stamps = {p.core.ring.stamp for p in live}
    assert len(stamps) == 1, (seed, sim.log)      # converged: no split
    faulted = {line.split(" ")[2] for line in sim.log
               if line.split(" ")[1] in ("kill", "pause", "cut")}
    ring = live[0].core.ring
    for _, _, whom in sim.forged_removals:        # never adopted on the forger's word
        assert not (set(whom) - faulted) & ring.removed, (seed, whom, sim.log)
    assert any("forged view" in line for line in sim.log)


# ------------------------------------------------------------ real processes

WORDS = [f"w{i % 131}" for i in range(4000)]


def _ring_of(cluster, node_id):
    from floering.v1 import floe_pb2, floe_pb2_grpc
    with cluster.channel(cluster.node(node_id).address) as ch:
        return Ring.from_wire(floe_pb2_grpc.ControlPlaneStub(ch).GetRing(
            floe_pb2.GetRingRequest(), timeout=5).ring)


@pytest.mark.multiprocess
def test_a_members_certificate_can_neither_split_nor_erase_a_tls_ring(tmp_path):
    import json
    from floering.chaos.durable_faults import kill_all, start_again
    from floering.chaos.cluster import LocalCluster
    from floering.mapper import RingClient
    from floering.v1 import floe_pb2, floe_pb2_grpc
    from tests.test_identity import wait_for
    want = Counter()
    with LocalCluster.up(3, 1, workdir=tmp_path, extra_args=[
            "--data-dir", str(tmp_path / "data" / "{node}")]) as cluster:

        def feed(words):
            with RingClient(cluster.seeds, tls=cluster.tls("client"), timeout=20.0) as c:
                c.emit_many(words)
                c.flush()
            want.update(words)

        def scan():
            with RingClient(cluster.seeds, tls=cluster.tls("client"), timeout=20.0) as c:
                return Counter(dict(c.scan()))

        feed(WORDS)
        view = _ring_of(cluster, "n0")
        members = set(view.nodes)
        with cluster.channel(cluster.node("n0").address, "n2") as ch:   # n2's own key
            as_n2 = floe_pb2_grpc.ControlPlaneStub(ch)

            def push(ring):
                return as_n2.ExchangeRing(floe_pb2.RingView(
                    version=ring.version, ring=ring.to_wire(), sender="n2"), timeout=10)
            for _ in range(2):        # each once split the ring for good
                now = Ring.from_wire(push(view).ring)
                push(now.with_version(now.version + (1 << 20)))
            push(view.without(["n1", "n2"]))   # once fenced both and lost 8 ranges
        with cluster.channel(cluster.node("n1").address, "n2") as ch:
            floe_pb2_grpc.ControlPlaneStub(ch).ExchangeRing(floe_pb2.RingView(
                version=view.version + 1, ring=view.without(["n1"]).to_wire(),
                sender="n2"), timeout=10)

        def converged():
            rings = [_ring_of(cluster, n) for n in ("n0", "n1", "n2")]
            return len({r.stamp for r in rings}) == 1 and set(rings[0].nodes) == members
        wait_for(converged, 30, "every node holds one ring with every member in it")
        assert scan() == want
        feed(WORDS[::3])
        assert scan() == want
        events = [json.loads(line) for n in ("n0", "n1")
                  for line in open(cluster.node(n).events)]
        seen = Counter(e["kind"] for e in events)
        assert seen["view_absorbed"] >= 1 and seen["removal_refused"] >= 2, seen
        assert not seen["fenced"] and not seen["lost"], seen
        # a durable restart of the whole ring, without --wipe
        kill_all(cluster)
        start_again(cluster, [n.node_id for n in cluster.nodes])
        cluster.wait_ready(60)
        wait_for(converged, 30, "the restarted ring is one ring")
        assert scan() == want
        assert all(node.alive() for node in cluster.nodes)
