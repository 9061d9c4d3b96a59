"""What one member's certificate can do to the ranges of other live members with ring
views: nothing without their own word (node.core.move_evidence). A view giving away a
range of a member the receiver holds live is merged when that member sent it, or once
that member's answer to an exchange backs the move; else it is refused, loudly.
Pure rules, the seeded simulation, and real TLS processes."""

import os

import pytest

from floering.node.core.machine_io import Gossip, MonitorDue, Record, RingSeen
from floering.node.core.move_evidence import PATIENCE, move_claims
from tests.support.member_attacks_shared import held_against_forgeries
from tests.support.simulation_shared import random_cluster


def machine(me="n0"):
    from tests.support.machine_shared import machine as make
    return make(me)


def kinds(effects):
    return [e.kind for e in effects if isinstance(e, Record)]


def token_of(ring, node):
    return ring.tokens_of(node)[0]


def test_a_move_away_from_a_live_member_is_not_merged_on_a_third_members_word():
    m = machine("n0")
    ring = m.core.ring
    t = token_of(ring, "n1")
    forged = ring.with_owners({t: "n2"})
    assert move_claims(ring, forged) == {"n1": {t: ("n2", forged.generations[ring.token_index(t)])}}
    out = m.handle(RingSeen(forged, sender="n2"), 1.0)
    assert m.core.ring.owner_of_token(t) == "n1"
    assert [e.address for e in out if isinstance(e, Gossip)] == [ring.address("n1")]
    assert m.guard.moves.counters["moves_held"] == 1
    # n1 answers the exchange with its own ring: it still owns the range
    out = m.handle(RingSeen(ring, pulled=True, sender="n1"), 1.1)
    assert m.core.ring.owner_of_token(t) == "n1"
    assert "move_refused" in kinds(out)
    assert m.guard.moves.counters["moves_refused"] == 1 and not m.guard.moves.pending


def test_a_move_the_giver_sent_is_merged_at_once():
    m = machine("n0")
    ring = m.core.ring
    t = token_of(ring, "n1")
    out = m.handle(RingSeen(ring.with_owners({t: "n2"}), sender="n1"), 1.0)
    assert m.core.ring.owner_of_token(t) == "n2"
    assert not [e for e in out if isinstance(e, Gossip) and e.address]


def test_a_relayed_move_is_merged_once_the_giver_answers_it():
    m = machine("n0")
    ring = m.core.ring
    t = token_of(ring, "n1")
    committed = ring.with_owners({t: "n2"})
    m.handle(RingSeen(committed, sender="n3"), 1.0)          # relayed by n3
    assert m.core.ring.owner_of_token(t) == "n1"
    m.handle(RingSeen(committed.with_version(committed.version + 1), pulled=True,
                      sender="n1"), 1.05)
    assert m.core.ring.owner_of_token(t) == "n2"
    assert m.guard.moves.counters["moves_refused"] == 0 and not m.guard.moves.pending


def test_a_move_away_from_us_is_refused_at_once():
    m = machine("n0")
    ring = m.core.ring
    t = token_of(ring, "n0")
    out = m.handle(RingSeen(ring.with_owners({t: "n3"}), sender="n3"), 1.0)
    assert m.core.ring.owner_of_token(t) == "n0" and t in m.core.primaries
    assert "move_refused" in kinds(out)


def test_a_held_move_with_no_answer_is_refused_after_patience():
    m = machine("n0")
    ring = m.core.ring
    t = token_of(ring, "n1")
    m.handle(RingSeen(ring.with_owners({t: "n2"}), sender="n2"), 1.0)
    asked = [e for e in m.handle(MonitorDue(1.5), 1.5) if isinstance(e, Gossip)]
    assert not asked                                          # asked at most every second
    asked = [e for e in m.handle(MonitorDue(2.1), 2.1) if isinstance(e, Gossip)
             and e.address == ring.address("n1")]
    assert asked
    m.handle(MonitorDue(1.0 + PATIENCE + 0.1), 1.0 + PATIENCE + 0.1)
    assert not m.guard.moves.pending and m.guard.moves.counters["moves_refused"] == 1
    assert m.core.ring.owner_of_token(t) == "n1"


def test_a_takeover_of_a_removed_member_is_not_judged_as_a_move():
    ring = machine("n0").core.ring
    taken = ring.without(["n1"])
    assert move_claims(ring, taken) == {}


def test_a_split_is_not_a_move():
    ring = machine("n0").core.ring
    t = token_of(ring, "n1")
    assert move_claims(ring, ring.split_token(t, t - 5)) == {}


def test_an_exchanges_answer_is_the_word_of_the_member_its_certificate_names():
    from floering.node.core.membership import answered_by
    ring = machine("n0").core.ring
    at = ring.address("n1")
    assert answered_by(ring, at, "n1") == "n1"
    assert answered_by(ring, at, "n2") == f"@{at}"        # another node's certificate
    assert answered_by(ring, at, "") == f"@{at}"          # any node's was accepted
    assert answered_by(ring, "h:99", "n1") == "@h:99"     # nobody is placed there
    assert answered_by(ring, at, None) == "n1"            # in the clear: the address's word
    rejoined = ring.without(["n1"]).add_node("n1#1", at, (), 7)
    assert answered_by(rejoined, at, "n1") == "n1#1"      # a later member, same process


def test_server_names_say_whose_certificate_they_accept():
    from floering.wire.channels import ServerNames
    ring = machine("n0").core.ring
    current = [None]
    names = ServerNames(lambda: current[0])
    assert names.node_at(ring.address("n1")) == ""        # a seed: any node's
    current[0] = ring
    assert names.node_at(ring.address("n1")) == "n1"
    current[0] = ring.without(["n1"]).add_node("n1#2", ring.address("n1"), (), 9)
    assert names.node_at(ring.address("n1")) == "n1"


def test_an_answer_under_another_certificate_backs_no_move():
    """A view moving n1's range, then an answer at n1's address that the checked
    certificate does not name n1's: nobody's word, the move stays held."""
    from floering.node.core.membership import answered_by
    m = machine("n0")
    ring = m.core.ring
    t = token_of(ring, "n1")
    moved = ring.with_owners({t: "n2"})
    m.handle(RingSeen(moved, sender="n2"), 1.0)
    sender = answered_by(ring, ring.address("n1"), "n2")
    m.handle(RingSeen(moved.with_version(moved.version + 1), pulled=True, sender=sender), 1.1)
    assert m.core.ring.owner_of_token(t) == "n1" and m.guard.moves.pending
    m.handle(RingSeen(ring, pulled=True, sender=answered_by(ring, ring.address("n1"), "n1")),
             1.2)
    assert m.core.ring.owner_of_token(t) == "n1" and not m.guard.moves.pending
    assert m.guard.moves.counters["moves_refused"] == 2     # the push and that answer


def forged_takeover(ring, gone="n1"):
    """`ring` less `gone`, with each of `gone`'s ranges whose heir is not the forger
    given to the forger instead: (the view, the forger, {token: heir})."""
    taken = ring.without([gone])
    heirs = {t: taken.owner_of_token(t) for t in ring.tokens_of(gone)}
    forger = next(n for n in taken.nodes if any(h != n for h in heirs.values()))
    stolen = {t: h for t, h in heirs.items() if h != forger}
    return taken.with_owners({t: forger for t in stolen}), forger, stolen


def test_a_takeover_giving_a_removed_members_range_to_its_heir_is_no_move():
    ring = machine("n0").core.ring
    assert move_claims(ring, ring.without(["n1"])) == {}
    forged, forger, stolen = forged_takeover(ring)
    claims = move_claims(ring, forged)
    assert {h: set(c) for h, c in claims.items()} == {
        h: {t for t, x in stolen.items() if x == h} for h in set(stolen.values())}
    assert all(o == forger for c in claims.values() for o, _ in c.values())


def _removal_verified(m, node="n1", now=1.0):
    from floering.node.core.machine_io import ProbedFor
    m.handle(ProbedFor(node), now)            # we could not reach it: gone by our evidence


def test_a_takeover_handing_a_removed_members_range_to_another_than_its_heir_is_refused():
    for me in ("n0", "n2", "n3"):
        m = machine(me)
        ring = m.core.ring
        forged, forger, stolen = forged_takeover(ring)
        if me == forger:
            continue
        _removal_verified(m)
        out = m.handle(RingSeen(forged, sender=forger), 1.1)
        now = m.core.ring
        assert all(now.owner_of_token(t) != forger for t in stolen), me
        if me in stolen.values():         # our own range by our takeover rule: at once
            assert "move_refused" in kinds(out) and m.guard.moves.counters["moves_refused"]
            continue
        heirs = sorted(set(stolen.values()))
        assert sorted(e.address for e in out if isinstance(e, Gossip) and e.address) == \
            sorted(ring.address(h) for h in heirs)
        # an heir that has not heard of the takeover yet cannot tell: still held
        m.handle(RingSeen(ring, pulled=True, sender=heirs[0]), 1.2)
        assert m.guard.moves.pending and all(
            m.core.ring.owner_of_token(t) != forger for t in stolen)
        # its answer once it took the range over itself refuses the view
        out = m.handle(RingSeen(ring.without(["n1"]).with_version(ring.version + 3),
                                pulled=True, sender=heirs[0]), 1.3)
        assert "move_refused" in kinds(out) and not m.guard.moves.pending
        assert all(m.core.ring.owner_of_token(t) != forger for t in stolen), me


def test_an_honest_takeover_relayed_by_a_third_member_is_merged_at_once():
    m = machine("n0")
    ring = m.core.ring
    _removal_verified(m)
    out = m.handle(RingSeen(ring.without(["n1"]), sender="n3"), 1.1)
    assert "n1" in m.core.ring.removed and not m.guard.moves.pending
    taken = ring.without(["n1"])
    assert all(m.core.ring.owner_of_token(t) == taken.owner_of_token(t)
               for t in ring.tokens_of("n1"))
    assert not [e for e in out if isinstance(e, Gossip) and e.address]


def test_a_takeover_the_heir_handed_on_is_merged_on_the_heirs_word():
    m = machine("n0")
    ring = m.core.ring
    taken = ring.without(["n1"])
    t = ring.tokens_of("n1")[0]
    heir = taken.owner_of_token(t)
    to = next(n for n in taken.nodes if n not in (heir, "n0"))
    later = taken.with_owners({t: to}).with_version(taken.version + 1)
    _removal_verified(m)
    m.handle(RingSeen(later, sender=to), 1.1)           # relayed: the heir is asked
    if heir != "n0":
        assert m.core.ring.owner_of_token(t) != to
        m.handle(RingSeen(later, pulled=True, sender=heir), 1.2)
    assert m.core.ring.owner_of_token(t) == to or heir == "n0"
    assert m.guard.moves.counters["moves_refused"] == (heir == "n0")


def test_a_takeover_to_a_handoffs_destination_is_no_move():
    ring = machine("n0").core.ring
    t = ring.tokens_of("n1")[0]
    taken = ring.without(["n1"])
    to = next(n for n in taken.nodes if n != taken.owner_of_token(t))
    preparing = ring.with_extras({t: [to]})
    assert move_claims(preparing, taken.with_owners({t: to})) == {}
    assert move_claims(ring, taken.with_owners({t: to})) != {}


# ------------------------------------------------------------------ simulation

MOVE_SEEDS = int(os.environ.get("FLOE_SIM_MOVE_SEEDS", "30"))


def move_scenario(seed: int):
    """Views moving a live member's range to the forger, pushed under a member's
    certificate to random nodes while tuples flow, around a kill, pause or partition."""
    pick, sim, names = random_cluster(seed, 7919)
    faults = [(pick.uniform(0.05, 1.5), sim.forge_as_member,
               (pick.choice(names), "moves a live range")) for _ in range(pick.randint(2, 5))]
    kind = pick.choice(["kill", "pause", "partition", "none"])
    victim, when = pick.randrange(len(names)), pick.uniform(0.2, 1.3)
    from tests.support.simulation_shared import one_fault
    faults += one_fault(pick, sim, names, kind, victim, when)
    sim.run(until=7.0, emit_until=1.5, faults=faults)
    return sim


@pytest.mark.parametrize("seed", range(MOVE_SEEDS))
def test_forged_move_seed(seed):
    sim = move_scenario(seed)
    live = held_against_forgeries(sim, seed)
    ring = live[0].core.ring
    for _, _, token, forger, generation in sim.forged_moves:   # never merged
        i = ring.token_index(token)
        assert (ring.owners[i], ring.generations[i]) != (forger, generation), (seed, token)


def test_forged_moves_reach_their_receivers():
    """The seeds above push forged moves (not only try to)."""
    assert sum(bool(move_scenario(seed).forged_moves) for seed in range(3)) >= 2


TAKEOVER_SEEDS = int(os.environ.get("FLOE_SIM_TAKEOVER_SEEDS", "30"))


def forge_takeover(sim, name: str, victim: str, forged: list) -> None:
    """A live member's certificate pushes `name` a view removing `victim` (killed,
    paused or cut off: `name`'s own probes find it gone) that gives each of its ranges
    whose heir is not the forger to the forger. Never merged: the takeover is the
    heir's (the receiver's own takeover rule), and the heir answers otherwise."""
    from floering.node.core.membership import base_name
    proc = sim.process(name)
    if proc is None or not sim._usable(proc) or proc.core.starting or proc.core.fenced:
        return
    ring = proc.core.ring
    if victim not in ring.nodes or proc.name == victim:
        return
    taken = ring.without([victim])
    forger = next((n for n in taken.nodes if n != proc.name and sim.usable(n)), None)
    if forger is None:
        return
    stolen = [t for t in ring.tokens_of(victim) if taken.owner_of_token(t) != forger]
    if not stolen:
        return
    view = taken.with_owners({t: forger for t in stolen})
    sim.handle(proc, RingSeen(view, sender=base_name(forger)))
    for t in stolen:
        assert proc.core.ring.owner_of_token(t) != forger, (proc.name, t, forger)
        forged.append((t, forger, view.generations[view.token_index(t)]))
    sim.log.append(f"{sim.now:.3f} {proc.name} holds a forged view giving {victim}'s "
                   f"ranges {','.join(map(str, stolen))} to {forger}")


def takeover_scenario(seed: int):
    """Views giving a removed member's ranges to the forger instead of their heirs,
    pushed under a member's certificate to random nodes just after that member was
    killed, paused or cut off, while tuples flow."""
    from tests.support.simulation_shared import one_fault
    pick, sim, names = random_cluster(seed, 104729)
    victim = pick.randrange(len(names))
    when = pick.uniform(0.2, 1.0)
    faults = one_fault(pick, sim, names, pick.choice(["kill", "kill", "pause", "partition"]),
                       victim, when)
    sim.forged_takeovers = []
    for _ in range(pick.randint(2, 4)):
        receiver = pick.choice([n for n in names if n != names[victim]])
        faults.append((when + pick.uniform(0.0, 0.5), forge_takeover,
                       (sim, receiver, names[victim], sim.forged_takeovers)))
    sim.run(until=7.0, emit_until=1.5, faults=faults)
    return sim


@pytest.mark.parametrize("seed", range(TAKEOVER_SEEDS))
def test_forged_takeover_seed(seed):
    sim = takeover_scenario(seed)
    live = held_against_forgeries(sim, seed)
    ring = live[0].core.ring
    for token, forger, generation in sim.forged_takeovers:       # never merged
        i = ring.token_index(token)
        assert (ring.owners[i], ring.generations[i]) != (forger, generation), (seed, token)


def test_forged_takeovers_reach_their_receivers():
    """The seeds above push forged takeovers (not only try to)."""
    assert sum(bool(takeover_scenario(seed).forged_takeovers) for seed in range(4)) >= 3


# ------------------------------------------------------------ real processes


def test_a_held_move_of_a_member_removed_meanwhile_is_merged_at_the_next_tick():
    m = machine("n0")
    ring = m.core.ring
    t = token_of(ring, "n1")
    m.handle(RingSeen(ring.with_owners({t: "n2"}), sender="n3"), 1.0)   # n1 left, then
    assert m.guard.moves.pending
    m.core.adopt_ring(m.core.ring.without(["n1"]).with_version(ring.version + 5))
    m.handle(MonitorDue(1.2), 1.2)
    assert not m.guard.moves.pending and m.guard.moves.counters["moves_refused"] == 0
