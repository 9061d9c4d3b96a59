"""Partitions in the simulation: a minority cut off from the rest of the ring, for a
moment or for long, healed at once or link by link, maybe with a short pause of a
majority node just as it heals. The majority declares the minority dead and counts
on; the minority declares nobody (it never has a quorum of the ring behind a
suspicion), and once healed it hears it was removed, is fenced and rejoins empty.

The focused cases replay, on the simulation's virtual clock, the two faults the
network-namespace tests found (docs/chaos.md, "What the harness found"): two
neighbours cut off together (r=2) confirming each other's suspicions and declaring
the majority, and a node cut off for long declaring a healthy peer right after the
heal, before it heard that it had been removed itself.

A failing seed replays identically: run_partition_seed(N)."""

from __future__ import annotations

import os

import pytest

from floering.node.core.membership import base_name
from tests.support.simulation import Simulation
from tests.support.simulation_shared import check, random_cluster


def converged(sim: Simulation) -> set[int]:
    """The ring stamps the usable processes hold (one when the ring converged)."""
    return {p.core.ring.stamp for p in sim.procs if sim._usable(p)}


def names_now(sim: Simulation) -> set[str]:
    return {p.name for p in sim.procs if sim._usable(p)}


def cut_off(sim: Simulation, group: list[str], others: list[str], seconds: float) -> list:
    """Faults cutting every node of `group` from every node of `others`."""
    return [(1.0, sim.partition, (node, others, seconds)) for node in group]


# ------------------------------------------------------------ the focused cases

@pytest.mark.parametrize("seed", [1, 2, 3])
def test_two_neighbours_cut_off_with_r2_declare_nobody_and_are_fenced_after_the_heal(seed):
    """Five nodes, r=2, n0 and n1 (neighbours: n1 backs up n0, both back up n4) cut
    off from the other three for 4 s. Each can still reach the other, and the other
    answers that it cannot reach the suspect either; but two members of five are no
    quorum, so neither declares anyone. The three declare both; healed, the two hear
    they were removed, are fenced and rejoin empty, and the ring is one again."""
    sim = Simulation(seed, nodes=5, replication=2, tokens=1)
    names = sorted(sim.nodes)
    minority, majority = names[:2], names[2:]
    sim.run(until=9.0, emit_until=2.0, faults=cut_off(sim, minority, majority, 4.0))
    context = "; ".join(sim.log)
    assert {whom for _, _, whom in sim.declared} == set(minority), context
    assert all(by in majority for _, by, _ in sim.declared), context
    assert all(1.0 < t < 5.0 for t, _, _ in sim.declared), context
    assert names_now(sim) == set(majority) | {f"{n}#1" for n in minority}, context
    assert len(converged(sim)) == 1, context
    check(sim, seed)


def test_a_node_cut_off_for_long_and_partly_healed_declares_nobody():
    """Four nodes, r=2: n1 cut off from everyone for 20 s (the others declare it after
    ~1.2 s). The link to n0 comes back first; those to n2 and n3 (n1's replicas, the
    peers its heartbeats would tell it was removed) 3 s later. Just as n0's link heals
    n3 pauses for 0.5 s (a hiccup the ring rides out), so n0, asked by n1, cannot reach
    n3 either. n1 has suspected n3 for 20 s: with one third node to confirm it (n0),
    it used to declare n3 dead at once; n0 merged that view, and the healthy n3 was
    fenced. Now n1 and n0 are two of four, no quorum: nobody is declared but n1."""
    sim = Simulation(1, nodes=4, replication=2, tokens=1)
    n0, n1, n2, n3 = sorted(sim.nodes)
    faults = [(1.0, sim.partition, (n1, [n0], 20.0)),
              (1.0, sim.partition, (n1, [n2, n3], 23.0)),
              (21.0, sim.pause, (n3, 0.5))]
    sim.run(until=27.0, emit_until=2.0, faults=faults)
    context = "; ".join(sim.log)
    assert [whom for _, _, whom in sim.declared] == [n1], context
    assert names_now(sim) == {n0, n2, n3, f"{n1}#1"}, context
    assert len(converged(sim)) == 1, context
    check(sim, 1)


def test_a_cut_off_node_that_reaches_a_quorum_again_hears_it_was_removed_first():
    """Five nodes, r=1: n1 cut off from everyone for 20 s; its links to n3 and n4 come
    back first, those to n0 (the primary it backs up, and suspects) and n2 (its
    replica) 3 s later, and n0 pauses for 0.5 s just as the first links heal. n1's
    next probe round of n0 reaches n3 and n4, which cannot reach n0 either: three of
    five, a quorum. After being cut off, such a round is not taken as evidence: n1
    first exchanges ring views with everyone it reaches, hears that it was removed,
    and is fenced, long before the rest of its links heal. n0 is never declared."""
    sim = Simulation(1, nodes=5, replication=1, tokens=1)
    n0, n1, n2, n3, n4 = sorted(sim.nodes)
    faults = [(1.0, sim.partition, (n1, [n3, n4], 20.0)),
              (1.0, sim.partition, (n1, [n0, n2], 23.0)),
              (21.0, sim.pause, (n0, 0.5))]
    sim.run(until=27.0, emit_until=2.0, faults=faults)
    context = "; ".join(sim.log)
    assert [whom for _, _, whom in sim.declared] == [n1], context
    (fenced,) = [float(line.split()[0]) for line in sim.log if " fenced " in line]
    assert 21.0 < fenced < 22.0, context
    assert names_now(sim) == {n0, n2, n3, n4, f"{n1}#1"}, context
    assert len(converged(sim)) == 1, context
    check(sim, 1)


# ------------------------------------------------------------------ seed family

PARTITION_SEEDS = int(os.environ.get("FLOE_SIM_PARTITION_SEEDS", "30"))


def partition_scenario(seed: int) -> tuple[Simulation, set[str]]:
    """A strict minority (one node, or two: neighbours only when r=2, since with r=1
    two neighbours hold every copy of a range between them) cut off from the rest
    for 0.2-0.9 s (ridden out), 1.5-4 s, or 8 s; each of its links to the majority
    heals at the end or up to 2 s later; in three runs of ten a majority node pauses
    for 0.2-0.6 s just as the first links heal. Returns the simulation and the
    minority."""
    pick, sim, names = random_cluster(seed, 433494437)
    nodes, r = len(names), sim.founding.replication
    size = pick.randint(1, (nodes - 1) // 2)
    first = pick.randrange(nodes)
    if size == 1:
        group = [names[first]]
    elif r >= 2 and pick.random() < 0.6:
        group = [names[first], names[(first + 1) % nodes]]
    else:
        group = [names[first], names[(first + pick.randint(2, nodes - 2)) % nodes]]
    others = [n for n in names if n not in group]
    start = pick.uniform(0.2, 1.2)
    length = pick.choice([pick.uniform(0.2, 0.9), pick.uniform(1.5, 4.0),
                          pick.uniform(1.5, 4.0), 8.0])
    faults, last = [], start + length
    for node in group:
        late = [o for o in others if pick.random() < 0.4]
        early = [o for o in others if o not in late]
        extra = pick.uniform(0.3, 2.0)
        if early:
            faults.append((start, sim.partition, (node, early, length)))
        if late:
            faults.append((start, sim.partition, (node, late, length + extra)))
            last = max(last, start + length + extra)
    if pick.random() < 0.3:
        faults.append((start + length, sim.pause,
                       (pick.choice(others), pick.uniform(0.2, 0.6))))
    sim.run(until=last + 3.5, emit_until=1.5, faults=faults)
    return sim, set(group)


def run_partition_seed(seed: int) -> None:
    sim, group = partition_scenario(seed)
    context = f"seed {seed}: " + "; ".join(sim.log)
    wrongly = [(t, by, whom) for t, by, whom in sim.declared
               if base_name(whom) not in group or base_name(by) in group]
    assert not wrongly, f"{context}: declared outside the minority, or by it: {wrongly}"
    assert len(converged(sim)) == 1, f"{context}: the ring did not converge"
    declared = {whom for _, _, whom in sim.declared}
    for node in group:
        if node in declared:      # fenced, rejoined empty under a new name
            assert node not in names_now(sim), f"{context}: {node} was never fenced"
    check(sim, seed)


@pytest.mark.parametrize("seed", range(PARTITION_SEEDS))
def test_partition_seed(seed):
    run_partition_seed(seed)
