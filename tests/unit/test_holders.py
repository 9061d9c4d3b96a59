"""A range's complete copies survive the churn of concurrent cuts and handoffs (the
kill-while-doubling loss, docs/chaos.md): whoever a single death hands a range to holds
a complete copy of it."""

from floering.node.core.handoff import Handoff, commit_ring, complete_copies, retired_extras
from floering.wire.hashing import HASH_SPACE
from floering.node.core.node_core import NodeCore
from floering.node.core.reducers import load_reducer
from floering.wire.ring import Ring

TOKENS = tuple((i + 1) * HASH_SPACE // 8 - 1 for i in range(8))
T0, T1 = TOKENS[0], TOKENS[1]
P, Q = T0 // 2, T0 + (T1 - T0) // 2          # heads of A's range and of C's


def cluster(owners=("A", "C", "B", "D") * 2):
    ring = Ring(1, 1, TOKENS, owners, tuple((n, f"x:{n}") for n in "ABCD"))
    return {n: NodeCore(n, ring, load_reducer("count")) for n in "ABCD"}


def adopt(cores, ring, who="ABCD"):
    for n in who:
        cores[n].adopt_ring(ring)


def takeover_of(cores, dead, token):
    """Who `dead`'s death hands `token` to, and whether its copy is complete."""
    ring = next(c.ring for n, c in cores.items() if n != dead).remove_node(dead)
    heir = ring.owner_of_token(token)
    return heir, cores[heir].replicas.is_complete(token)


def c_hands_q_to_b(cores, who="ABCD"):
    adopt(cores, cores["C"].ring.split_token(T1, Q), who)
    h = Handoff("C", {Q: "B"}, deadline=10)
    adopt(cores, h.prepare(cores["C"], 0), who)


def test_a_head_prepared_while_the_neighbour_commits_keeps_the_old_replica_marked():
    # A cuts p and prepares p -> B; C, not having seen that, commits q -> B, which
    # moves the walk of A's range from C to B and marks C holding on the whole range.
    cores = cluster()
    c_hands_q_to_b(cores)
    adopt(cores, cores["A"].ring.split_token(T0, P), "A")
    h = Handoff("A", {P: "B"}, deadline=10)
    prepared = h.prepare(cores["A"], 0)
    cores["A"].adopt_ring(prepared)
    committed = commit_ring(cores["C"].ring, {Q: "B"})
    cores["C"].adopt_ring(committed)
    for n in "ABCD":            # C hears A's split first, then its prepare, the others the reverse
        views = (prepared, committed) if n != "C" else (prepared,)
        adopt(cores, views[0], n)
        adopt(cores, views[-1], n)
    assert cores["C"].replicas.is_complete(P)
    assert takeover_of(cores, "A", P) == ("C", True)


def test_a_prepared_anew_keeps_the_holders_marked():
    cores = cluster(("A", "B", "C", "D") * 2)
    hb = Handoff("B", {T1: "C"}, deadline=10)
    adopt(cores, hb.prepare(cores["B"], 0))
    committed = commit_ring(cores["B"].ring, {T1: "C"})   # T0's walk: B -> C, B holds
    cores["B"].adopt_ring(committed)
    ha = Handoff("A", {T0: "D"}, deadline=10)
    cores["A"].adopt_ring(ha.prepare(cores["A"], 0))
    cores["A"].adopt_ring(committed)
    again = ha.step(cores["A"], 0.1)                       # the future walk changed
    assert again is not None
    adopt(cores, again)
    assert takeover_of(cores, "A", T0) == ("B", True)
    # and an abort gives the range back its holders, not only its walk
    ha2 = Handoff("A", {T0: "D"}, deadline=0)
    ha2.state = ha.state
    ha2.marks = ha.marks
    cleared = ha2.step(cores["A"], 1.0)
    adopt(cores, cleared)
    assert takeover_of(cores, "A", T0) == ("B", True)


def test_a_commit_marks_holding_only_copies_the_owner_knows_complete():
    # C's commit makes B the walk replica of A's head p, then A commits p -> D before
    # B acknowledged any checkpoint of p: B must not be the holder D's death picks.
    cores = cluster()
    adopt(cores, cores["A"].ring.split_token(T0, P))
    c_hands_q_to_b(cores)
    h = Handoff("A", {P: "D"}, deadline=10)
    adopt(cores, h.prepare(cores["A"], 0))
    committed = commit_ring(cores["C"].ring, {Q: "B"})
    adopt(cores, committed, "ABC")
    cores["A"].primaries[P].replica_seq["D"] = 99          # D acknowledged the final one
    adopt(cores, h.step(cores["A"], 0.2))
    assert h.state == "committed"
    assert not cores["B"].replicas.is_complete(P)
    assert takeover_of(cores, "D", P)[1]


def test_a_refill_that_adds_a_replica_keeps_the_old_replica_marked_holding():
    # Three nodes, r=2, one token each: B hands its only token to C, so A's range is
    # replicated by C alone; then C hands it back, which makes B a replica of A's range
    # again with nothing in it yet. A's death must give its range to C, which holds it.
    third = HASH_SPACE // 3
    tokens = (third - 1, 2 * third - 1, HASH_SPACE - 1)
    ring = Ring(1, 2, tokens, ("A", "B", "C"), tuple((n, f"x:{n}") for n in "ABC"))
    cores = {n: NodeCore(n, ring, load_reducer("count")) for n in "ABC"}
    ta, tb = tokens[0], tokens[1]
    away = Handoff("B", {tb: "C"}, deadline=10)
    adopt(cores, away.prepare(cores["B"], 0), "ABC")
    adopt(cores, commit_ring(cores["B"].ring, {tb: "C"}), "ABC")
    cores["A"].primaries[ta].replica_seq["C"] = 5           # C acknowledged A's rounds
    adopt(cores, retired_extras(cores["A"]), "ABC")
    cores["C"].primaries[tb].replica_seq["A"] = 5           # and A acknowledged C's
    adopt(cores, retired_extras(cores["C"]), "ABC")
    assert cores["A"].ring.destinations(ta) == ("A", "C")
    back = Handoff("C", {tb: "B"}, deadline=10)
    adopt(cores, back.prepare(cores["C"], 1), "ABC")
    adopt(cores, commit_ring(cores["C"].ring, {tb: "B"}, complete_copies(cores["C"])), "ABC")
    assert set(cores["A"].ring.regular_replicas(ta)) == {"B", "C"}
    assert takeover_of(cores, "A", ta) == ("C", True)
