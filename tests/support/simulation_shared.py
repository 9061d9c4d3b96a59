"""Helpers of tests/simulation/test_simulation.py that other test files use too:
assert_forgery_changed_no_verdict, check, one_fault, random_cluster.
"""

from floering.node.core.membership import base_name
from tests.support.simulation import Simulation


def random_cluster(seed: int, salt: int, skew: float = 0.0, durable: bool = False,
                   policy: str = "none", combining: bool = False):
    """A seeded random Simulation (4-6 nodes, r 1 or 2, 1-3 tokens each, maybe lossy,
    one to three mappers), the generator that drew it, to draw the faults from, and
    the sorted node names."""
    import random
    pick = random.Random(seed * salt)
    nodes = pick.randint(4, 6)
    replication = pick.choice([1, 1, 2])
    sim = Simulation(seed, nodes=nodes, replication=replication, tokens=pick.randint(1, 3),
                     loss=pick.choice([0.0, 0.0, 0.002]), mappers=pick.choice([1, 1, 2, 3]),
                     skew=skew, durable=durable, policy=policy, combining=combining)
    return pick, sim, sorted(sim.nodes)


def one_fault(pick, sim: Simulation, names: list[str], kind: str, victim: int,
              when: float) -> list:
    """A kill, a short pause, or a cut from the clockwise neighbour of `victim`."""
    node = names[victim]
    if kind == "kill":
        return [(when, sim.kill, (node,))]
    if kind == "pause":
        return [(when, sim.pause, (node, pick.uniform(0.1, 0.8)))]
    if kind == "partition":
        return [(when, sim.partition,
                 (node, [names[(victim + 1) % len(names)]], pick.uniform(0.3, 1.0)))]
    return []


def check(sim: Simulation, seed: int) -> None:
    state, lost = sim.final_state()
    context = f"seed {seed}: " + "; ".join(sim.log)
    assert not lost, f"{context}: ranges lost with at most r failures in a row"
    assert not sim.undelivered, f"{context}: {len(sim.undelivered)} batches never delivered"
    assert not sim.under_replicated(), f"{context}: not re-replicated: {sim.under_replicated()}"
    for key in sim.sent:
        assert state[key] == sim.sent[key] == sim.acked[key], (
            f"{context}: {key} holds {state[key]}, sent {sim.sent[key]}, acked {sim.acked[key]}")


def assert_forgery_changed_no_verdict(log: list[str]) -> None:
    """No member is fenced unless a fault hit it (a forged later incarnation would
    have it taken for restarted), and a killed one is detected as soon as ever (a
    heartbeat forged as it would hide it)."""
    faulted: dict[str, float] = {}
    for line in log:
        when, what, *rest = line.split(" ")
        if what in ("kill", "pause", "cut"):
            for name in [rest[0]] + (rest[2].split(",") if what == "cut" else []):
                faulted.setdefault(base_name(name), float(when))
        if rest[:1] == ["fenced"]:
            assert float(when) >= faulted.get(base_name(what), float("inf")), line
    for line in log:
        when, what, *rest = line.split(" ")
        if what == "kill":
            assert any(x.split(" ")[2:4] == ["detected", f"about={rest[0]}"]
                       and float(when) <= float(x.split(" ")[0]) <= float(when) + 2.0
                       for x in log), f"{line}: not detected within 2 s"
