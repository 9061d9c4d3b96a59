"""Ring shares back to even after a membership change: the pure rule
(node.core.shares), on rings built as crashes, rejoins and leaves leave them."""

import random

import pytest

from floering.node.core.handoff import leave_moves
from floering.node.core.shares import (PULL_GRACE, PULL_INTERVAL, PullRanges, pull_plan,
                                       short_after_removal, short_of_share, spread_leave)
from floering.wire.ring import Ring

MEMBERS = {f"n{i}": f"h:{i}" for i in range(4)}


def shares(ring: Ring) -> dict[str, float]:
    return {n: ring.share_of(n) for n in ring.nodes}


def within(ring: Ring, band: float = 0.25) -> bool:
    mean = 1 / len(ring.nodes)
    return all(abs(s - mean) <= band * mean + 1e-12 for s in shares(ring).values())


def rejoined(balancer: str = "none") -> Ring:
    """n2 crashed (its ranges went to n3, its heir) and came back empty as n2#1."""
    ring = Ring.initial(MEMBERS, 1, 8, balancer=balancer).without(["n2"])
    return ring.add_node("n2#1", "h:5", (), incarnation=7)


def test_a_crash_then_rejoin_leaves_one_member_double_and_one_empty():
    ring = rejoined()
    assert shares(ring)["n3"] == pytest.approx(0.5) and shares(ring)["n2#1"] == 0
    assert not within(ring)


def test_an_empty_member_pulls_from_the_largest_share_back_to_the_mean():
    ring = rejoined()
    donor, moves = pull_plan(ring, "n2#1")
    assert donor == "n3" and len(moves) == 8 and set(moves.values()) == {"n2#1"}
    after = ring.with_owners(moves)
    assert shares(after)["n2#1"] == pytest.approx(0.25) and within(after, 0.0001)
    assert pull_plan(after, "n2#1") == ("", {})      # settled: nothing more to pull


def test_members_at_their_share_do_not_pull_and_nothing_is_planned_during_a_handoff():
    ring = rejoined()
    assert all(pull_plan(ring, n) == ("", {}) for n in ("n0", "n1", "n3"))
    token = ring.tokens_of("n0")[0]
    busy = ring.with_extras({token: ["n2#1"]})
    assert pull_plan(busy, "n2#1") == ("", {})


@pytest.mark.parametrize("policy", ["floe", "halving", "doubling"])
def test_policies_that_shed_by_load_pull_only_for_a_member_with_no_range(policy):
    ring = rejoined(policy)
    assert short_of_share(ring, "n2#1")
    one = ring.with_owners({ring.tokens_of("n3")[0]: "n2#1"})
    assert not short_of_share(one, "n2#1")          # uneven on purpose: load decides
    assert short_of_share(rejoined("none").with_owners(
        {rejoined().tokens_of("n3")[0]: "n2#1"}), "n2#1")


def test_a_leave_spreads_over_every_member_instead_of_one_neighbour():
    ring = Ring.initial(MEMBERS, 1, 8)
    old = {t: ring.heir(t) for t in ring.tokens_of("n0")}
    assert set(old.values()) == {"n1"}              # every range's heir: one neighbour
    moves = leave_moves(ring, "n0")
    assert moves == spread_leave(ring, "n0") and set(moves) == set(ring.tokens_of("n0"))
    assert set(moves.values()) == {"n1", "n2", "n3"}
    after = ring.with_owners(moves).without(["n0"])
    assert within(after) and max(shares(after).values()) < 0.35


def test_a_leave_fills_an_empty_member_first():
    ring = rejoined()
    moves = spread_leave(ring, "n3")               # n3 holds half the ring
    after = ring.with_owners(moves).without(["n3"])
    assert within(after), shares(after)


def settle(ring: Ring, removed: bool = False) -> Ring:
    """Pulls as the members' machines make them, until none is planned: a member that
    had no range, or (`removed`: a member was just removed) one below the mean by more
    than the slack, pulls while it is short (`filling`)."""
    filling = {n for n in ring.nodes if not ring.tokens_of(n)
               or (removed and short_after_removal(ring, n))}
    for _ in range(4 * len(ring.nodes)):
        filling = {n for n in filling if n in ring.nodes and short_of_share(ring, n)}
        pulls = [pull_plan(ring, n) for n in sorted(filling)]
        pulls = [moves for _, moves in pulls if moves]
        if not pulls:
            return ring
        ring = ring.with_owners(pulls[0])
    pytest.fail(f"pulls never settled: {shares(ring)}")


def test_random_rings_settle_within_the_band_after_rejoins_and_leaves():
    """Crashes followed by a rejoin, and leaves, at random; after each, pulls run
    until none is planned: every member ends within 25% of the mean share."""
    for seed in range(150):
        rng = random.Random(seed)
        ring = Ring.initial({f"n{i}": f"h:{i}" for i in range(rng.randint(3, 7))}, 1,
                            rng.choice([4, 8, 16]))
        for serial in range(6):
            victim = rng.choice(sorted(ring.nodes))
            if rng.random() < 0.5 and len(ring.nodes) > 2:
                ring = ring.with_owners(spread_leave(ring, victim)).without([victim])
            else:
                ring = ring.without([victim]).add_node(f"x{serial}", f"h:x{serial}", ())
            ring = settle(ring)
            assert within(ring), (seed, serial, shares(ring))


def test_random_rings_settle_within_the_band_after_crashes_with_no_restart():
    """A member crashes and is not started again: its heirs take its ranges over (one
    may hold a double share); the members below the mean pull until none is planned,
    and every member ends within 25% of the mean share."""
    doubled = 0
    for seed in range(150):
        rng = random.Random(seed)
        ring = Ring.initial({f"n{i}": f"h:{i}" for i in range(rng.randint(3, 8))}, 1,
                            rng.choice([4, 8, 16]))
        while len(ring.nodes) > 2:
            ring = ring.without([rng.choice(sorted(ring.nodes))])
            doubled += not within(ring)
            ring = settle(ring, removed=True)
            assert within(ring), (seed, shares(ring))
    assert doubled > 100                 # the takeovers alone leave shares uneven


def test_a_crash_with_no_restart_makes_the_members_below_the_mean_pull_from_the_heir():
    ring = Ring.initial(MEMBERS, 1, 8)
    crashed = ring.without(["n2"])          # its heir n3 takes every range: half
    assert shares(crashed)["n3"] == pytest.approx(0.5)
    short, heir = Machine(ring, "n0"), Machine(ring, "n3")
    assert short.due(0.0) == [] and heir.due(0.0) == []      # 4 members seen
    short.mixin.core.ring = heir.mixin.core.ring = crashed
    assert short.due(1.0) == [] and heir.due(1.0) == []      # first seen short
    [pull] = short.due(1.0 + PULL_GRACE)
    assert pull.donor == "n3" and heir.due(1.0 + PULL_GRACE) == []
    moves = heir.mixin.share_moves_for("n0")
    assert moves == pull_plan(crashed, "n0")[1] and len(moves) == pull.ranges
    after = crashed.with_owners(moves)
    assert abs(shares(after)["n0"] - 1 / 3) < 1 / 32 and shares(after)["n3"] >= 1 / 3
    # a member at the mean after a removal does not pull, nor does one that was
    # short before the removal was seen by it (an operator's move)
    even = Ring.initial({f"n{i}": f"h:{i}" for i in range(3)}, 1, 8)
    m = Machine(even.add_node("n9", "h:9", ()), "n0")
    m.due(0.0)
    m.mixin.core.ring = even
    assert m.due(0.0) == [] and m.due(PULL_GRACE + 1) == []


def test_a_member_that_kept_ranges_never_pulls_so_operator_moves_stay():
    ring = Ring.initial(MEMBERS, 1, 8)
    moved = ring.with_owners({t: "n1" for t in ring.tokens_of("n0")[:6]})   # n0: 2 of 8
    m = Machine(moved, "n0")
    assert all(m.due(t) == [] for t in (0.0, 10.0, 20.0))
    emptied = ring.with_owners({t: "n1" for t in ring.tokens_of("n0")})
    m = Machine(emptied, "n0")
    assert m.due(0.0) == [] and m.due(PULL_GRACE) == [PullRanges("n1", "h:1", 8)]


class Machine:
    """The machine's side of the rule, on a bare ring (the mixin reads only these)."""

    def __init__(self, ring, me):
        from floering.node.core.shares import SharePulling
        self.mixin = type("M", (SharePulling,), {})()
        self.mixin.core = type("C", (), {"ring": ring, "node_id": me, "fenced": False,
                                         "primaries": {}})()
        self.mixin.leaving = False
        self.mixin.failing = {}

    def due(self, now):
        out = []
        self.mixin._pull_due(now, out)
        return out


def test_a_short_member_waits_out_the_grace_then_pulls_at_most_once_per_interval():
    m = Machine(rejoined(), "n2#1")
    assert m.due(10.0) == []                        # first seen short
    assert m.due(10.0 + PULL_GRACE - 0.01) == []
    [pull] = m.due(10.0 + PULL_GRACE)
    assert pull == PullRanges("n3", "h:3", 8)
    assert m.due(10.0 + PULL_GRACE + PULL_INTERVAL / 2) == []
    assert len(m.due(10.0 + PULL_GRACE + PULL_INTERVAL)) == 1


def test_the_donor_hands_only_what_its_own_ring_names():
    ring = rejoined()
    donor = Machine(ring, "n3").mixin
    assert donor.share_moves_for("n2#1") == pull_plan(ring, "n2#1")[1]
    assert Machine(ring, "n0").mixin.share_moves_for("n2#1") == {}   # not the donor
    assert donor.share_moves_for("n1") is None       # not short: ordinary shedding
    assert donor.share_moves_for("nobody") is None


def test_a_donor_whose_ranges_lack_a_copy_hands_no_share_until_they_have_it():
    """Re-replication first: the share handoff's ring changes would turn the full
    copies in flight away. A replica whose checkpoints keep failing does not hold it."""
    from types import SimpleNamespace
    from floering.node.core.shares import FAILING_ROUNDS
    ring = rejoined()
    donor = Machine(ring, "n3").mixin
    token = ring.tokens_of("n3")[0]
    replica = ring.replicas_of_token(token)[0]
    rng = SimpleNamespace(replica_seq={})                  # no copy there yet
    donor.core.primaries = {token: rng}
    assert donor.copies_owed()
    assert donor.share_moves_for("n2#1") == {}
    assert donor.share_moves_for("n1") is None             # ordinary shedding as before
    rng.replica_seq[replica] = 7                           # the full copy acknowledged
    assert not donor.copies_owed()
    assert donor.share_moves_for("n2#1") == pull_plan(ring, "n2#1")[1]
    del rng.replica_seq[replica]
    donor.failing[(token, replica)] = FAILING_ROUNDS        # reported failing: no wait
    assert donor.share_moves_for("n2#1") == pull_plan(ring, "n2#1")[1]


def test_a_member_on_its_way_out_neither_pulls_nor_gives():
    leaver = Machine(rejoined(), "n2#1")
    leaver.mixin.begin_leaving()
    assert leaver.due(0.0) == [] and leaver.due(PULL_GRACE + 1) == []
    donor = Machine(rejoined(), "n3").mixin
    donor.begin_leaving()
    assert donor.share_moves_for("n2#1") == {}       # the ring spreads its ranges anyway


def test_a_member_that_pulled_after_a_removal_leaves_a_later_operator_move_alone():
    """n0 crashed out of a 3-member ring: n2, below the mean, pulls until whole ranges
    bring it no closer (4 of 9 ninths), and stops pulling there, so an operator's
    move of one of its ranges stays (it went on pulling while below the mean, and
    took the moved range straight back)."""
    ring = Ring.initial({f"n{i}": f"h:{i}" for i in range(3)}, 1, 3)
    m = Machine(ring, "n2")
    m.due(0.0)
    ring = ring.without(["n0"])
    m.mixin.core.ring = ring
    assert m.due(1.0) == [] and len(m.due(1.0 + PULL_GRACE)) == 1
    while (plan := pull_plan(ring, "n2")[1]):
        ring = ring.with_owners(plan)
    m.mixin.core.ring = ring
    assert short_of_share(ring, "n2") and m.due(10.0) == []
    moved = ring.with_owners({ring.tokens_of("n2")[0]: "n1"})
    m.mixin.core.ring = moved
    assert all(m.due(t) == [] for t in (20.0, 40.0, 80.0))
