"""Seeded simulations of the ring under failures. A failing seed is printed and replays
identically: `pytest tests/simulation/test_simulation.py -k 'seed_123'` or run_seed(123)."""

import os
from pathlib import Path

import pytest

from floering.node.core.folding import pending
from floering.wire.pieces import is_fold_key, is_piece
from tests.support.sim_storm import StormSimulation
from tests.support.simulation import Simulation
from tests.support.simulation_shared import (
    assert_forgery_changed_no_verdict,
    check,
    one_fault,
    random_cluster,
)

SEEDS = int(os.environ.get("FLOE_SIM_SEEDS", "500"))


def scenario(seed: int) -> Simulation:
    pick, sim, names = random_cluster(seed, 7919)
    nodes = len(names)
    faults = []
    victim = pick.randrange(nodes)
    faults.append((pick.uniform(0.2, 1.0), sim.kill, (names[victim],)))
    if pick.random() < 0.4 and nodes >= 5:
        other = (victim + 2) % nodes          # not adjacent: never more than r in a row
        faults.append((pick.uniform(0.2, 1.0), sim.kill, (names[other],)))
    elif pick.random() < 0.4:
        other = (victim + 2) % nodes
        # short pauses are ridden out; those past the suspicion period (~1.2 s) are declared
        faults.append((pick.uniform(0.2, 1.0), sim.pause, (names[other], pick.uniform(0.1, 2.5))))
    elif pick.random() < 0.5:
        # a node cut off from one neighbour: the indirect probe must keep it alive
        a = (victim + 2) % nodes
        faults.append((pick.uniform(0.1, 1.0), sim.partition,
                       (names[a], [names[(a + 1) % nodes]], pick.uniform(0.3, 1.0))))
    sim.run(until=5.0, emit_until=1.5, faults=faults)
    return sim


def run_seed(seed: int) -> None:
    check(scenario(seed), seed)


@pytest.mark.parametrize("seed", range(SEEDS))
def test_seed(seed):
    run_seed(seed)


HANDOFF_SEEDS = int(os.environ.get("FLOE_SIM_HANDOFF_SEEDS", "200"))


def handoff_scenario(seed: int) -> Simulation:
    """Live handoffs (to the first replica, to any member, to a node that just joined)
    interleaved with a kill of either side, a pause or a partition."""
    pick, sim, names = random_cluster(seed, 104729)
    nodes = len(names)
    faults = []
    for _ in range(pick.randint(1, 3)):
        faults.append((pick.uniform(0.1, 1.2), sim.handoff,
                       (pick.choice(names), pick.choice(["heir", "any"]))))
    if pick.random() < 0.5:
        faults.append((pick.uniform(0.1, 1.0), sim.join, ("n9", pick.choice(names))))
    if pick.random() < 0.3:
        faults.append((pick.uniform(0.1, 1.2), sim.leave, (pick.choice(names),)))
    kind = pick.choice(["kill", "kill", "pause", "partition", "none"])
    victim = pick.randrange(nodes)
    faults += one_fault(pick, sim, names, kind, victim, pick.uniform(0.2, 1.3))
    sim.run(until=6.0, emit_until=1.5, faults=faults)
    return sim


def run_handoff_seed(seed: int) -> None:
    check(handoff_scenario(seed), seed)


@pytest.mark.parametrize("seed", range(HANDOFF_SEEDS))
def test_handoff_seed(seed):
    run_handoff_seed(seed)


COMBINE_SEEDS = int(os.environ.get("FLOE_SIM_COMBINE_SEEDS", "40"))


def combine_scenario(seed: int) -> Simulation:
    """Mappers that combine (one tuple per key and batch, merged as a state) through
    a kill, pause or partition, live handoffs and maybe a durable whole-ring setup."""
    pick, sim, names = random_cluster(seed, 15485863, durable=seed % 4 == 3, combining=True)
    faults = []
    for _ in range(pick.randint(0, 2)):
        faults.append((pick.uniform(0.1, 1.2), sim.handoff,
                       (pick.choice(names), pick.choice(["heir", "any"]))))
    kind = pick.choice(["kill", "kill", "pause", "partition"])
    faults += one_fault(pick, sim, names, kind, pick.randrange(len(names)),
                        pick.uniform(0.2, 1.3))
    sim.run(until=6.0, emit_until=1.5, faults=faults)
    return sim


def run_combine_seed(seed: int) -> None:
    check(combine_scenario(seed), seed)


@pytest.mark.parametrize("seed", range(COMBINE_SEEDS))
def test_combine_seed(seed):
    run_combine_seed(seed)


SPLIT_SEEDS = int(os.environ.get("FLOE_SIM_SPLIT_SEEDS", "200"))


def split_scenario(seed: int) -> Simulation:
    """Ranges cut by splits (most followed by handing the tail to the first replica),
    interleaved with whole-range handoffs, a join, and a kill, pause or partition."""
    pick, sim, names = random_cluster(seed, 32452843)
    nodes = len(names)
    faults = []
    for _ in range(pick.randint(1, 4)):
        faults.append((pick.uniform(0.05, 1.2), sim.split,
                       (pick.choice(names), pick.random() < 0.7)))
    for _ in range(pick.randint(0, 2)):
        faults.append((pick.uniform(0.1, 1.2), sim.handoff,
                       (pick.choice(names), pick.choice(["heir", "any"]))))
    if pick.random() < 0.3:
        faults.append((pick.uniform(0.1, 1.0), sim.join, ("n9", pick.choice(names))))
    kind = pick.choice(["kill", "kill", "kill_splitter", "pause", "partition", "none"])
    victim = pick.randrange(nodes)
    when = pick.uniform(0.1, 1.3)
    if kind == "kill_splitter":
        # the owner dies right after its split, before or during the tail's handoff
        at, _, (splitter, _) = faults[0]
        faults.append((at + pick.choice([0.0, 0.001, 0.01, 0.05]), sim.kill, (splitter,)))
    else:
        faults += one_fault(pick, sim, names, kind, victim, when)
    sim.run(until=6.0, emit_until=1.5, faults=faults)
    return sim


def run_split_seed(seed: int) -> None:
    check(split_scenario(seed), seed)


@pytest.mark.parametrize("seed", range(SPLIT_SEEDS))
def test_split_seed(seed):
    run_split_seed(seed)


RESTART_SEEDS = int(os.environ.get("FLOE_SIM_RESTART_SEEDS", "150"))


def restart_scenario(seed: int) -> Simulation:
    """A node's process restarts (inside its peers' detection window or after it),
    maybe while some peers do not answer its start-up question, maybe twice, mixed
    with a handoff and another kill, pause or partition."""
    pick, sim, names = random_cluster(seed, 2750159)
    nodes = len(names)
    victim = pick.randrange(nodes)
    when = pick.uniform(0.2, 1.0)
    answering = pick.choice([1.0, 1.0, 0.5])
    faults = [(when, sim.restart, (names[victim], answering))]
    if pick.random() < 0.3:
        # the restarted process, now a member of its own, restarts again later
        faults.append((when + pick.uniform(0.3, 1.0), sim.restart_latest, (names[victim],)))
    moved = pick.random() < 0.4
    if moved:
        faults.append((pick.uniform(0.1, 1.2), sim.handoff,
                       (pick.choice(names), pick.choice(["heir", "any"]))))
    # A second death only where no handoff can have made it the restarted one's
    # neighbour (two neighbours down at once is more than r=1 failures in a row).
    kind = pick.choice(["pause", "partition", "none"] + ([] if moved else ["kill", "kill"]))
    other = (victim + 2) % nodes
    if other != victim:
        faults += one_fault(pick, sim, names, kind, other, pick.uniform(0.2, 1.3))
    sim.run(until=6.0, emit_until=1.5, faults=faults)
    return sim


def run_restart_seed(seed: int) -> None:
    sim = restart_scenario(seed)
    check(sim, seed)
    context = f"seed {seed}: " + "; ".join(sim.log)
    # Never a member served by a process other than its own: every restarted id is removed.
    ring = max((n.core.ring for name, n in sim.nodes.items() if sim.usable(name)),
               key=lambda r: r.version)
    restarted = [line.split()[2] for line in sim.log if " restart " in line]
    assert all(name not in ring.nodes for name in restarted), context


@pytest.mark.parametrize("seed", range(RESTART_SEEDS))
def test_restart_seed(seed):
    run_restart_seed(seed)


SLOW_SEEDS = int(os.environ.get("FLOE_SIM_SLOW_SEEDS", "80"))


def slow_scenario(seed: int) -> tuple[Simulation, set[str]]:
    """One or two starved nodes (alive, but everything they do runs up to 0.2-0.7 s
    late, far past the first probe deadline) for 1-3 s; sometimes another node is
    killed meanwhile. Returns the simulation and the nodes that really failed."""
    pick, sim, names = random_cluster(seed, 15485863)
    nodes = len(names)
    victim = pick.randrange(nodes)
    faults = [(pick.uniform(0.1, 0.8), sim.slow,
               (names[victim], pick.uniform(1.0, 3.0), pick.uniform(0.2, 0.7)))]
    if pick.random() < 0.5:
        other = (victim + pick.randint(1, nodes - 1)) % nodes
        faults.append((pick.uniform(0.1, 1.0), sim.slow,
                       (names[other], pick.uniform(1.0, 3.0), pick.uniform(0.2, 0.7))))
    failed = set()
    if pick.random() < 0.5:
        dead = (victim + 2) % nodes
        faults.append((pick.uniform(0.3, 1.5), sim.kill, (names[dead],)))
        failed.add(names[dead])
    sim.run(until=6.0, emit_until=2.0, faults=faults)
    return sim, failed


@pytest.mark.parametrize("seed", range(SLOW_SEEDS))
def test_slow_seed_a_slow_node_is_never_declared_dead(seed):
    run_slow_seed(seed)


def run_slow_seed(seed: int) -> None:
    sim, failed = slow_scenario(seed)
    context = f"seed {seed}: " + "; ".join(sim.log)
    wrongly = [(t, by, whom) for t, by, whom in sim.declared if whom not in failed]
    assert not wrongly, f"{context}: live nodes declared dead: {wrongly}"
    assert {whom for _, _, whom in sim.declared} == failed, f"{context}: a dead node stayed"
    check(sim, seed)


SHED_SEEDS = int(os.environ.get("FLOE_SIM_SHED_SEEDS", "120"))


def shed_scenario(seed: int) -> Simulation:
    """Skewed keys and an overloaded node (the owner of the hottest key) that sheds:
    whole ranges to its neighbours, a range cut at the measured point, or, when its
    heir is overloaded too, a request that the heir shed first (the cascade); mixed
    with a kill, pause or partition. One seed in three runs the Ray paper's halving,
    one in three its doubling (many cuts and a handoff to several nodes at once)."""
    policy = ("none", "halving", "doubling")[seed % 3]
    pick, sim, names = random_cluster(seed, 49979687, skew=pick_skew(seed), policy=policy)
    nodes = len(names)
    hot = sim.nodes[names[0]].core.ring.owner("w0")
    faults = [(pick.uniform(0.2, 0.6), sim.overload, (hot, pick.uniform(1.0, 2.5)))]
    if pick.random() < 0.5:
        heir = sim.nodes[hot].core.ring.heir(sim.nodes[hot].core.ring.token_for_key("w0"))
        if heir is not None:
            faults.append((faults[0][0], sim.overload, (heir, pick.uniform(1.0, 2.5))))
    kind = pick.choice(["kill", "pause", "partition", "none", "none"])
    victim = pick.randrange(nodes)
    if names[victim] != hot:
        faults += one_fault(pick, sim, names, kind, victim, pick.uniform(0.3, 1.5))
    sim.run(until=7.0, emit_until=2.5, faults=faults)
    return sim


def pick_skew(seed: int) -> float:
    return 0.3 + 0.4 * ((seed * 7) % 10) / 10


def run_shed_seed(seed: int) -> None:
    check(shed_scenario(seed), seed)


@pytest.mark.parametrize("seed", range(SHED_SEEDS))
def test_shed_seed(seed):
    run_shed_seed(seed)


def test_shedding_moves_splits_and_cascades_across_seeds():
    # The shedding seeds must exercise what they claim to: moves, splits, cascades.
    sims = [shed_scenario(seed) for seed in range(20)]
    logs = [line for sim in sims for line in sim.log]
    assert sum(" sheds " in line for line in logs) >= 10, logs
    assert any(" split " in line for line in logs), logs
    assert any("asked by" in line for line in logs), logs
    # and the Ray paper's policies move ranges (doubling after cutting them)
    for policy in ("halving", "doubling"):
        runs = [sim.log for sim in sims if sim.founding.balancer == policy]
        moved = [log for log in runs if any("shed (" in x and "committed" in x for x in log)]
        assert len(moved) >= 2, (policy, runs)
        if policy == "doubling":
            assert all(any(" split " in x for x in log) for log in moved), moved


FORGED_SEEDS = int(os.environ.get("FLOE_SIM_FORGED_SEEDS", "60"))


def forged_scenario(seed: int) -> Simulation:
    """Forged ring views (another replication factor, a member moved elsewhere, a
    version far ahead), forged whole checkpoints (from a member not owning the range,
    or under another ring stamp) sent to random nodes while tuples flow, and heartbeats
    another member forges as the victim of a kill, pause or partition: every one is
    refused and nothing else changes (a killed node is still detected)."""
    pick, sim, names = random_cluster(seed, 86028121)
    faults = [(pick.uniform(0.05, 1.5), sim.forge,
               (pick.choice(names), pick.choice(["replication", "moved member", "version far ahead",
                                                 "every range lost"])))
              for _ in range(pick.randint(2, 6))]
    faults += [(pick.uniform(0.05, 1.5), sim.forge_checkpoint,
                (pick.choice(names), pick.choice(["not the owner", "another ring stamp"])))
               for _ in range(pick.randint(1, 4))]
    kind = pick.choice(["kill", "pause", "partition", "none"])
    victim, when = pick.randrange(len(names)), pick.uniform(0.2, 1.3)
    faults += one_fault(pick, sim, names, kind, victim, when)
    # another member claims to be the victim around the fault, to hide a kill or to
    # have a live node taken for restarted
    forger = names[(victim + pick.randrange(1, len(names))) % len(names)]
    faults.append((max(0.05, when - 0.1), sim.forge_heartbeats,
                   (forger, names[victim], pick.uniform(0.3, 1.2))))
    sim.run(until=5.0, emit_until=1.5, faults=faults)
    return sim


def run_forged_seed(seed: int) -> None:
    sim = forged_scenario(seed)
    check(sim, seed)
    assert any("forged view" in line for line in sim.log), sim.log
    assert any("refused a forged checkpoint" in line for line in sim.log), sim.log
    assert any("forged heartbeat" in line for line in sim.log), sim.log
    assert_forgery_changed_no_verdict(sim.log)


@pytest.mark.parametrize("seed", range(FORGED_SEEDS))
def test_forged_seed(seed):
    run_forged_seed(seed)


BALANCER_SEEDS = int(os.environ.get("FLOE_SIM_BALANCER_SEEDS", "40"))


def balancer_scenario(seed: int) -> Simulation:
    """A ring running a balancer that shares keys (pkg, dkg reviewing its pools every
    20 tuples, or smalops deciding every 30, so that they act within the run) under a skewed stream, with a
    handoff or a split and a kill, pause or partition: the pieces of a key are
    ordinary ring state, so every count, merged over its pieces, must be exact."""
    import random
    policy = random.Random(seed).choice(["pkg", "dkg", "smalops", "dchoices", "wchoices"])
    pick, sim, names = random_cluster(seed, 15485863, skew=0.6, policy=policy)
    act_soon(sim, policy)
    faults = [(pick.uniform(0.1, 1.2), sim.handoff, (pick.choice(names), "heir"))
              if pick.random() < 0.5 else
              (pick.uniform(0.1, 1.2), sim.split, (pick.choice(names), True))]
    kind = pick.choice(["kill", "kill", "pause", "partition"])
    faults += one_fault(pick, sim, names, kind, pick.randrange(len(names)),
                        pick.uniform(0.2, 1.3))
    sim.run(until=5.0, emit_until=1.5, faults=faults)
    return sim


def act_soon(sim: Simulation, policy: str) -> None:
    """dkg, dchoices and wchoices review every 20 tuples, smalops decides every 30:
    within a run."""
    for mapper in sim.mappers:
        if policy == "dkg":
            mapper.chooser.warm_up, mapper.chooser.review_every = 40, 20
        elif policy == "smalops":
            mapper.chooser.window, mapper.chooser.heavy = 30, 0.1
        elif policy in ("dchoices", "wchoices"):
            mapper.chooser.review_every = 20


def run_balancer_seed(seed: int) -> None:
    sim = balancer_scenario(seed)
    check(sim, seed)
    assert sim.pieces_sent, "no tuple went to a piece of a shared key"


@pytest.mark.parametrize("seed", range(BALANCER_SEEDS))
def test_balancer_seed(seed):
    run_balancer_seed(seed)


FOLD_SEEDS = int(os.environ.get("FLOE_SIM_FOLD_SEEDS", "40"))


class FoldSimulation(Simulation):
    """`kill_sender`: the first node to send a fold (a piece merged back into its key,
    node.core.folding) is killed up to `delay` later: before, while or after its
    destinations take it."""
    kill_sender = False
    delay = 0.01

    def _send_folds(self, proc, e) -> None:
        super()._send_folds(proc, e)
        if self.kill_sender:
            self.kill_sender = False
            self.at(self.now + self.rng.uniform(0, self.delay), self.kill, proc.name)


def fold_scenario(seed: int) -> Simulation:
    """A dkg, smalops, dchoices or wchoices ring whose pools shrink when the stream stops: each piece idle
    for half a second is merged back into its key, while a node is killed just after
    sending a fold, or killed, paused or cut off at a random moment of the merging,
    maybe during a handoff. Every count must stay exact and every piece end merged."""
    import random
    policy = random.Random(seed).choice(["dkg", "smalops", "dchoices", "wchoices"])
    pick = random.Random(seed * 15485867)
    nodes = pick.randint(3, 5)
    sim = FoldSimulation(seed, nodes=nodes, replication=pick.choice([1, 1, 2]),
                         tokens=pick.choice([1, 2, 4]), skew=0.6, policy=policy,
                         mappers=pick.choice([1, 2]), durable=pick.random() < 0.25)
    names = sorted(sim.nodes)
    act_soon(sim, policy)
    faults = []
    if pick.random() < 0.3:
        faults.append((pick.uniform(1.5, 2.5), sim.handoff, (pick.choice(names), "heir")))
    kind = pick.choice(["sender", "sender", "kill", "pause", "partition"])
    if kind == "sender":
        sim.kill_sender, sim.delay = True, pick.choice([0.0005, 0.003, 0.02])
    else:
        faults += one_fault(pick, sim, names, kind, pick.randrange(nodes),
                            pick.uniform(1.6, 2.6))
    sim.run(until=7.0, emit_until=1.5, faults=faults)
    return sim


def run_fold_seed(seed: int) -> None:
    sim = fold_scenario(seed)
    check(sim, seed)
    assert any(p.core.folds.folded for p in sim.procs), "no piece was merged back"
    ring = sim._latest()
    for p in sim.procs:
        if sim._usable(p) and p.core.ring.stamp == ring.stamp:
            for token, rng in p.core.primaries.items():
                outs = sim_outgoing(p.core, token)
                for key, state in rng.state.snapshot().items():
                    assert not (is_fold_key(key) and pending(state)), \
                        f"seed {seed}: a fold never arrived: {sim.log}"
                    assert not is_piece(key) or state == 0 or outs.get(key, 1) is None, \
                        f"seed {seed}: piece {key!r} of {p.name} holds {state}: {sim.log}"


def sim_outgoing(core, token) -> dict:
    """piece -> its outgoing key in the range of `token` (None: none was found)."""
    book = core.folds.ranges.get(token)
    return book.outs if book is not None else {}


@pytest.mark.parametrize("seed", range(FOLD_SEEDS))
def test_fold_seed(seed):
    run_fold_seed(seed)


STORM_SEEDS = int(os.environ.get("FLOE_SIM_STORM_SEEDS", "40"))


def storm_scenario(seed: int) -> Simulation:
    """Every node of a 4-node ring (r = 1, 2 to 8 tokens each) halving or doubling on a
    hair trigger while a node is killed: at a random moment, just after a handoff was
    committed to it, or just after it prepared one (tests/support/sim_storm.py)."""
    import random
    pick = random.Random(seed * 7777)
    sim = StormSimulation(seed, nodes=4, replication=1, tokens=pick.choice([2, 3, 4, 8]),
                          policy=pick.choice(["doubling", "doubling", "halving"]),
                          skew=0.5, mappers=pick.choice([1, 2]))
    sim.kill_after = pick.choice(["time", "target", "giver"])
    sim.armed_at, sim.delay = pick.uniform(0.3, 2.0), pick.choice([0.005, 0.03, 0.1])
    faults = [(4.5, sim.calm_down, ())]
    if sim.kill_after == "time":
        faults.append((pick.uniform(0.4, 2.5), sim.kill, (pick.choice(sorted(sim.nodes)),)))
    sim.run(until=6.0, emit_until=3.0, faults=faults)
    return sim


def check_nothing_lost(sim, seed: int) -> None:
    """check(), and no range was ever lost on the way."""
    check(sim, seed)
    assert not [line for line in sim.log if " lost " in line], sim.log


def run_storm_seed(seed: int) -> None:
    check_nothing_lost(storm_scenario(seed), seed)


@pytest.mark.parametrize("seed", range(STORM_SEEDS))
def test_storm_seed(seed):
    run_storm_seed(seed)


STARVED_SEEDS = int(os.environ.get("FLOE_SIM_STARVED_SEEDS", "40"))


class StarvedChainSimulation(Simulation):
    """After `armed_at`, the node that prepares a handoff (the overloaded one, doubling)
    is paused or starved long enough to be declared dead, falsely; the node that then
    takes its ranges over is paused 0-100 ms after the takeover, before a checkpoint
    round of its own has filled their new replicas."""
    armed_at = 0.5
    first = "pause"
    first_fired = second_fired = False

    def _record(self, e) -> None:
        super()._record(e)
        uniform = self.rng.uniform
        if self.first_fired and not self.second_fired and e.kind == "taken_over" \
                and self.declared:
            self.second_fired = True
            self.at(self.now + uniform(0, 0.1), self.pause, e.node, uniform(1.3, 3.0))
        elif not self.first_fired and self.now >= self.armed_at \
                and e.kind == "handoff_prepared":
            self.first_fired = True
            if self.first == "slow":
                self.at(self.now, self.slow, e.node, uniform(1.3, 3.0), uniform(0.5, 2.0))
            else:
                self.at(self.now + uniform(0, 0.05), self.pause, e.node, uniform(1.3, 3.0))


def starved_chain_scenario(seed: int) -> Simulation:
    """A doubling ring (r = 1, 3 or 4 nodes, 2 to 8 tokens each) whose overloaded node
    is starved in the middle of a handoff and declared dead, and whose heir is paused
    right after taking its ranges over. Nobody is killed: the heir holds the only
    complete copy of those ranges until it fills their replicas, so declaring it on
    timeouts would lose them (RangeLost in chaos.balance with the doubling policy on a
    loaded machine); the declaration must wait for it to come back."""
    import random
    pick = random.Random(seed * 7777 + 8)
    sim = StarvedChainSimulation(seed, nodes=pick.choice([3, 3, 4]), replication=1,
                                 tokens=pick.choice([2, 4, 8]), mappers=pick.choice([1, 2]),
                                 skew=pick.uniform(0.5, 0.8), policy="doubling")
    ring = sim.founding
    start = pick.uniform(0.2, 0.5)
    faults = [(start, sim.overload, (ring.owner("w0"), pick.uniform(2.0, 4.0)))]
    sim.first = pick.choice(["pause", "slow"])
    sim.armed_at = pick.uniform(0.2, 2.0)
    sim.run(until=13.0, emit_until=3.0, faults=faults)
    return sim


def run_starved_chain_seed(seed: int) -> None:
    check_lost_restored(starved_chain_scenario(seed), seed)


def check_lost_restored(sim, seed: int) -> None:
    """check(), and every range the ring marked lost on the way was given back whole
    from a removed member's retired copy (node.core.retiring) afterwards.

    When the heir is paused before any message of its takeover has arrived anywhere
    (seed 36: paused 0.7 ms after its takeover, its first message due 1.4 ms after;
    the simulation drops a message whose sender is paused when it would arrive), no
    peer can know it holds the only complete copies: a peer declares it dead on
    timeouts in good faith, and with r = 1 the two false declarations remove both
    holders, so the merged ring marks those ranges lost. The removed members keep what
    they held and hand it back to the primary that holds the range as lost."""
    check(sim, seed)
    restored = [(float(line.split()[0]), line) for line in sim.log
                if " retired_handed_over " in line]
    for line in (line for line in sim.log if " lost " in line):
        assert " lost token=" in line, (line, sim.log)
        when, token = float(line.split()[0]), line.rsplit("=", 1)[1]
        assert any(t >= when and f" into={token} " in h for t, h in restored), (line, sim.log)


@pytest.mark.parametrize("seed", range(STARVED_SEEDS))
def test_starved_chain_seed(seed):
    run_starved_chain_seed(seed)


DURABLE_SEEDS = int(os.environ.get("FLOE_SIM_DURABLE_SEEDS", "90"))


def durable_scenario(seed: int) -> Simulation:
    """Durable nodes (each with a simulated data directory, driven by the production
    DiskPlan): a node's machine loses power at a seeded moment (what its log had not
    synced and the copy writes not done are lost), or the node a range was just
    handed to does, 0-10 ms after the commit; it starts again on its directory after
    a seeded downtime, inside its peers' detection window or after it; maybe again
    later; mixed with a handoff, a split, a full disk somewhere (batches refused
    until a repair finds space), and another crash, a pause or a partition
    elsewhere."""
    pick, sim, names = random_cluster(seed, 179424673, durable=True)
    nodes = len(names)
    victim = pick.randrange(nodes)
    when = pick.uniform(0.2, 1.3)
    if pick.random() < 0.3:
        # the node a range is handed to crashes just after the commit
        faults = [(when, sim.handoff, (names[victim], pick.choice(["heir", "any"]),
                                       (pick.choice([0.0, 0.001, 0.003, 0.01]),
                                        pick.choice(DOWNTIMES))))]
        moved = True
    else:
        faults = [(when, sim.crash, (names[victim], pick.choice(DOWNTIMES)))]
        if pick.random() < 0.3:
            faults.append((when + pick.uniform(0.1, 1.0), sim.crash,
                           (names[victim], pick.choice(DOWNTIMES))))
        moved = pick.random() < 0.5
        if moved and pick.random() < 0.5:
            faults.append((pick.uniform(0.1, 1.2), sim.handoff,
                           (pick.choice(names), pick.choice(["heir", "any"]))))
        elif moved:
            faults.append((pick.uniform(0.05, 1.2), sim.split,
                           (pick.choice(names), pick.random() < 0.7)))
    if pick.random() < 0.25:
        faults.append((pick.uniform(0.1, 1.3), sim.fill_disk,
                       (pick.choice(names), pick.uniform(0.2, 1.5))))
    # A second failure (a crash past detection is one) only where no move can have
    # made it the first one's neighbour.
    kind = pick.choice(["pause", "partition", "none"] + ([] if moved else ["crash", "crash"]))
    other = (victim + 2) % nodes
    if kind == "crash":
        faults.append((pick.uniform(0.2, 1.3), sim.crash, (names[other], pick.choice(DOWNTIMES))))
    else:
        faults += one_fault(pick, sim, names, kind, other, pick.uniform(0.2, 1.3))
    sim.run(until=6.0, emit_until=1.5, faults=faults)
    return sim


# From back within the detection window (the same member, from its disk) to well
# past it (declared dead: it joins empty).
DOWNTIMES = [0.0, 0.0, 0.01, 0.05, 0.15, 0.4, 1.0]


def run_durable_seed(seed: int) -> None:
    check(durable_scenario(seed), seed)


@pytest.mark.parametrize("seed", range(DURABLE_SEEDS))
def test_durable_seed(seed):
    run_durable_seed(seed)


CLUSTER_CRASH_SEEDS = int(os.environ.get("FLOE_SIM_CLUSTER_CRASH_SEEDS", "50"))


def cluster_crash_scenario(seed: int) -> Simulation:
    """The whole durable cluster loses power at once, at a seeded moment, and every
    node starts again on its directory within 0-0.3 s (they wait for each other, as
    starting founders do); sometimes twice; mixed with a handoff or a split; in
    three runs out of ten one copy on one disk is damaged meanwhile (its range goes
    to its heir, or is rebuilt on it by a full checkpoint)."""
    pick, sim, names = random_cluster(seed, 961748941, durable=True)
    when = pick.uniform(0.2, 1.3)
    faults = [(when, sim.crash_cluster, (pick.choice([0.0, 0.05, 0.3]), pick.random() < 0.3))]
    if pick.random() < 0.3:
        faults.append((when + pick.uniform(0.5, 1.5), sim.crash_cluster,
                       (pick.choice([0.0, 0.05]),)))
    if pick.random() < 0.4:
        faults.append((pick.uniform(0.1, 1.2), sim.handoff,
                       (pick.choice(names), pick.choice(["heir", "any"]))))
    if pick.random() < 0.3:
        faults.append((pick.uniform(0.05, 1.2), sim.split,
                       (pick.choice(names), pick.random() < 0.7)))
    sim.run(until=6.0, emit_until=1.5, faults=faults)
    return sim


def run_cluster_crash_seed(seed: int) -> None:
    sim = cluster_crash_scenario(seed)
    check(sim, seed)
    context = f"seed {seed}: " + "; ".join(sim.log)
    # Every node comes back as itself: nobody is declared dead, nobody rejoins as n#k.
    assert not any(" detected " in line or "#" in line for line in sim.log), context


@pytest.mark.parametrize("seed", range(CLUSTER_CRASH_SEEDS))
def test_cluster_crash_seed(seed):
    run_cluster_crash_seed(seed)


def first_declared(sim: Simulation, node: str) -> float:
    return min(t for t, _, whom in sim.declared if whom == node)


@pytest.mark.parametrize("seed", range(20))
def test_killed_node_is_declared_fast_and_a_long_pause_within_two_seconds(seed):
    # A killed process refuses connections: no confirmation wait (silence timeout, then
    # one round, which waits up to twice its deadline for the third node's view when
    # that node is the paused one). A paused one only times out: declared once the
    # suspicion period has passed, well before 2 s.
    pick, sim, names = random_cluster(seed, 613)
    killed, paused = names[0], names[2]
    sim.run(until=5.0, emit_until=1.5, faults=[(0.5, sim.kill, (killed,)),
                                               (0.6, sim.pause, (paused, 3.0))])
    assert first_declared(sim, killed) - 0.5 < 0.6, sim.log
    assert 1.0 < first_declared(sim, paused) - 0.6 < 2.0, sim.log
    check(sim, seed)


# ------------------------------------------------------------- golden logs
# The simulation's log of a few seeds, stored: any change of behaviour (who declares
# whom when, who takes what over, what is handed where, when a restarted process
# joins, what an overloaded node sheds, who a durable node comes back as, when a full
# disk refuses batches) shows up as a diff of these files, to be reviewed and then
# accepted with FLOE_UPDATE_GOLDEN=1.

GOLDEN = Path(__file__).resolve().parent / "golden"
CASES = {"failure-seed-3": lambda: scenario(3), "handoff-seed-7": lambda: handoff_scenario(7),
         "split-seed-11": lambda: split_scenario(11), "restart-seed-5": lambda: restart_scenario(5),
         "shed-seed-0": lambda: shed_scenario(0), "durable-seed-14": lambda: durable_scenario(14),
         "durable-seed-16": lambda: durable_scenario(16),
         "cluster-crash-seed-2": lambda: cluster_crash_scenario(2)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_simulation_log_matches_its_golden_file(name):
    sim = CASES[name]()
    got = "\n".join(sim.log) + "\n"
    path = GOLDEN / f"{name}.log"
    if os.environ.get("FLOE_UPDATE_GOLDEN"):
        path.write_text(got)
    assert path.exists(), f"no golden file {path.name}: run with FLOE_UPDATE_GOLDEN=1"
    assert got == path.read_text(), (
        f"{name} behaves differently from {path.name}; if intended, accept it with "
        f"FLOE_UPDATE_GOLDEN=1 and review the diff")
