"""Restart safety, pure: incarnations in the ring and the decision a starting process
makes from its peers' rings."""

import pytest
from hypothesis import given, settings, strategies as st

from floering.node.core.batch import Batch
from floering.wire.errors import RangeLost, Starting
from floering.node.core.membership import (DONOR_QUIET, RecentDonors, decide_start, idle_members,
                                  ready_to_decide, refill_moves, rejoin_name, restarted)
from floering.node.core.node_core import NodeCore
from floering.node.core.reducers import load_reducer
from floering.wire.ring import Ring

MEMBERS = {f"n{i}": f"127.0.0.1:{7000 + i}" for i in range(3)}


def founding(replication: int = 1) -> Ring:
    return Ring.initial(MEMBERS, replication, 4)


def running(incarnations: dict[str, int]) -> Ring:
    """The ring every founding member converged to, having heard each other."""
    ring = founding()
    views = [decide_start(n, i, MEMBERS[n], [], ring).ring for n, i in incarnations.items()]
    merged = views[0]
    for view in views[1:]:
        merged = merged.merge(view)
    return merged


def test_founding_alone_keeps_version_one_and_records_its_incarnation():
    d = decide_start("n0", 11, MEMBERS["n0"], [], founding())
    assert (d.node_id, d.replaces, d.ring.version) == ("n0", "", 1)
    assert d.ring.incarnation_of("n0") == 11 and d.ring.incarnation_of("n1") == 0


def test_a_restart_where_a_rejoined_member_still_is_removes_it():
    ring = running({"n0": 1, "n1": 2, "n2": 3})
    ring = ring.without(["n0"]).add_node("n0#1", MEMBERS["n0"], (), 4)   # fenced, rejoined
    d = decide_start("n0", 5, MEMBERS["n0"], [ring])
    assert (d.node_id, d.replaces) == ("n0#2", "n0#1") and "n0#1" in d.ring.removed
    assert [n for n, a in d.ring.addresses if a == MEMBERS["n0"]] == ["n0#2"]


def test_founding_members_starting_together_all_keep_their_names():
    ring = running({"n0": 1, "n1": 2})
    d = decide_start("n2", 3, MEMBERS["n2"], [ring], founding())
    assert d.node_id == "n2" and not d.replaces
    assert {n: d.ring.incarnation_of(n) for n in MEMBERS} == {"n0": 1, "n1": 2, "n2": 3}
    assert d.ring.tokens_of("n2") == founding().tokens_of("n2")


def test_a_restart_within_the_detection_window_is_a_new_member_and_the_old_one_dies():
    ring = running({"n0": 1, "n1": 2, "n2": 3})
    d = decide_start("n0", 4, MEMBERS["n0"], [ring], founding())
    assert d.replaces == "n0" and d.node_id == "n0#1"
    assert "n0" in d.ring.removed and d.ring.tokens_of("n0#1") == ()
    # Its ranges went to their replicas, as after a crash; nothing is lost at r=1.
    for token in ring.tokens_of("n0"):
        assert d.ring.owner_of_token(token) == ring.heir(token)
    assert not d.ring.lost
    assert d.ring.incarnation_of("n0#1") == 4


def test_a_restart_after_being_declared_dead_takes_the_next_free_name():
    ring = running({"n0": 1, "n1": 2, "n2": 3}).without(["n0"])
    ring = ring.add_node("n0#1", MEMBERS["n0"], (), 5).without(["n0#1"])
    d = decide_start("n0", 6, MEMBERS["n0"], [ring], founding())
    assert d.node_id == "n0#2" and d.replaces == ""
    assert rejoin_name("n0#2", d.ring) == "n0#3"


def test_a_joiner_restarting_under_its_name_is_a_new_member():
    ring = running({"n0": 1, "n1": 2, "n2": 3})
    first = decide_start("n3", 7, "127.0.0.1:7003", [ring])
    assert first.node_id == "n3" and first.ring.incarnation_of("n3") == 7
    again = decide_start("n3", 8, "127.0.0.1:7003", [first.ring])
    assert again.replaces == "n3" and again.node_id == "n3#1"


def test_views_that_heard_two_incarnations_of_a_member_remove_it():
    ring = running({"n0": 1, "n1": 2, "n2": 3})
    restarted = founding().merge(decide_start("n1", 9, MEMBERS["n1"], [], founding()).ring)
    for merged in (ring.merge(restarted), restarted.merge(ring)):
        assert "n1" in merged.removed and "n1" not in merged.nodes
    assert ring.merge(restarted) == restarted.merge(ring)


def test_a_message_from_another_incarnation_removes_the_member():
    ring = running({"n0": 1, "n1": 2, "n2": 3})
    assert ring.with_incarnation("n1", 2) is ring
    assert "n1" in ring.with_incarnation("n1", 5).removed


@settings(max_examples=100)
@given(st.lists(st.tuples(st.sampled_from(sorted(MEMBERS)), st.integers(1, 3)),
                min_size=1, max_size=6))
def test_incarnation_merges_converge_whatever_the_order(heard):
    """While one member still runs as the process everyone heard (the only way a
    ring can be served), every order of merges gives the same ring."""
    survivors = {n for n in MEMBERS if len({i for m, i in heard if m == n}) == 1}
    if not survivors:
        heard = heard + [("n2", 4)] if "n2" not in {m for m, _ in heard} else \
            [(m, i) for m, i in heard if m != "n2"] + [("n2", 4)]
    views = [decide_start(n, i, MEMBERS[n], [], founding()).ring for n, i in heard]
    forward = views[0]
    for v in views[1:]:
        forward = forward.merge(v)
    backward = views[-1]
    for v in reversed(views[:-1]):
        backward = backward.merge(v)
    # Removal order may count generations differently; who owns what may not differ.
    for field in ("tokens", "owners", "removed", "incarnations", "lost"):
        assert getattr(forward, field) == getattr(backward, field)
    twice = {n for n in MEMBERS if len({i for m, i in heard if m == n}) > 1}
    assert twice <= forward.removed


def test_views_in_which_every_member_restarted_still_merge_to_a_valid_ring():
    views = [decide_start(n, i, MEMBERS[n], [], founding()).ring
             for n in sorted(MEMBERS) for i in (1, 2)]
    merged = views[0]
    for v in views[1:]:
        merged = merged.merge(v)          # a ring keeps one member, never none
    merged.check_invariants()
    assert len(merged.nodes) == 1


def test_removing_the_only_owner_leaves_its_ranges_lost_with_an_empty_member():
    ring = running({"n0": 1, "n1": 2, "n2": 3})
    ring = ring.without(["n0"]).add_node("n0#1", MEMBERS["n0"], (), 4)
    ring = ring.without(["n1"]).add_node("n1#1", MEMBERS["n1"], (), 5)
    assert set(ring.owners) == {"n2"}
    gone = ring.without(["n2"])
    assert set(gone.owners) == {"n0#1"} and set(gone.lost) == set(gone.tokens)


def test_under_replicated_counts_ranges_whose_replicas_are_missing():
    ring = running({"n0": 1, "n1": 2, "n2": 3})
    ring = ring.without(["n0"]).add_node("n0#1", MEMBERS["n0"], (), 4)
    ring = ring.without(["n1"]).add_node("n1#1", MEMBERS["n1"], (), 5)
    core = NodeCore("n2", ring, load_reducer("count"))
    # n2 owns every range, and its only peers own none: no range has a replica.
    assert len(core.under_replicated()) == len(ring.tokens)


def test_a_lost_range_is_an_error_on_get_never_absent():
    ring = running({"n0": 1, "n1": 2, "n2": 3})
    ring = ring.without(["n0"]).add_node("n0#1", MEMBERS["n0"], (), 4)
    ring = ring.without(["n1"]).add_node("n1#1", MEMBERS["n1"], (), 5).without(["n2"])
    core = NodeCore("n0#1", ring, load_reducer("count"))
    with pytest.raises(RangeLost):
        core.get("the")


def test_a_starting_core_accepts_and_answers_nothing():
    core = NodeCore("n0", founding(), load_reducer("count"))
    core.starting = True
    with pytest.raises(Starting):
        core.get("the")
    with pytest.raises(Starting):
        core.receive_batch(Batch(founding().stamp, founding().tokens[0], "s", 1, 1, 1, b""))


def test_an_owner_without_enough_replicas_refills_the_first_idle_member():
    ring = running({"n0": 1, "n1": 2, "n2": 3})
    ring = ring.without(["n0"]).add_node("n0#1", MEMBERS["n0"], (), 4)
    ring = ring.without(["n1"]).add_node("n1#1", MEMBERS["n1"], (), 5)
    moves = refill_moves(ring, "n2")
    assert set(moves.values()) == {"n0#1"} and len(moves) == len(ring.tokens) // 2
    assert refill_moves(ring, "n0#1") == {}           # it owns nothing to give
    moved = ring.with_owners(moves)
    assert refill_moves(moved, "n2") == {}            # r replicas again: nothing more
    assert idle_members(moved) == ["n1#1"]


def test_no_refill_while_replication_is_whole_or_a_handoff_runs():
    ring = running({"n0": 1, "n1": 2, "n2": 3}).add_node("n3", "127.0.0.1:7003", (), 9)
    assert refill_moves(ring, "n0") == {}             # r=1 is met by the three owners
    alone = running({"n0": 1, "n1": 2, "n2": 3}).without(["n0"]).without(["n1"])
    alone = alone.add_node("n0#1", MEMBERS["n0"], (), 4)
    token = alone.tokens[0]
    pinned = alone.with_extras({token: ["n0#1"]})
    assert refill_moves(pinned, "n2") == {}


def test_a_member_that_handed_us_its_ranges_is_no_refill_target_for_a_while():
    """A leaver of a two-member ring at r=1 empties itself into the other member, whose
    ranges then lack a replica: refilling the leaver would bounce them back and forth
    until the leave ended."""
    pair = {n: MEMBERS[n] for n in ("n0", "n1")}
    ring = Ring.initial(pair, 1, 4)
    theirs = {t: "n1" for t in ring.tokens_of("n0")}
    emptied = ring.with_owners(theirs)
    assert idle_members(emptied) == ["n0"] and refill_moves(emptied, "n1")   # the old rule
    donors = RecentDonors()
    donors.saw(emptied, ["n0"], now=100.0)
    assert refill_moves(emptied, "n1", donors.quiet(emptied, 100.0 + DONOR_QUIET / 2)) == {}
    # once quiet long enough (an operator's move, not a leave) it is refilled again
    later = donors.quiet(emptied, 100.0 + DONOR_QUIET)
    assert later == frozenset() and set(refill_moves(emptied, "n1", later).values()) == {"n0"}
    donors.saw(emptied, ["n0"], now=200.0)
    gone = emptied.without(["n0"])
    assert donors.quiet(gone, 201.0) == frozenset() and donors.since == {}   # bounded


def test_when_a_starting_process_may_decide():
    assert ready_to_decide(0, 0, 0, False, False)              # no peer to ask
    assert ready_to_decide(1, 0, 3, True, False)               # a running peer answered
    assert not ready_to_decide(0, 0, 3, False, True)           # nobody answered: wait
    assert not ready_to_decide(2, 2, 3, False, False)          # only starting peers, one silent
    assert ready_to_decide(3, 3, 3, False, False)              # every founder starting: fresh
    assert ready_to_decide(2, 2, 3, False, True)               # after the start-up grace
    assert not ready_to_decide(3, 3, 3, True, True)            # a joiner needs a running ring


def test_a_message_from_another_process_is_a_restart():
    ring = running({"n0": 1, "n1": 2, "n2": 3})
    assert restarted(ring, "n1", 9)
    assert not restarted(ring, "n1", 2) and not restarted(ring, "n1", 0)
    assert not restarted(ring.without(["n1"]), "n1", 9)        # no longer a member: nothing known


def test_a_ring_from_the_wire_with_bad_incarnations_is_refused():
    from floering.wire.errors import InvalidArgument
    import msgpack
    wire = msgpack.unpackb(running({"n0": 1, "n1": 2, "n2": 3}).to_wire())
    for bad in ([["n0", 0]], [["n0", -5]], [["n9", 4]], [["n0", 1], ["n0", 2]], [["n0", "x"]]):
        with pytest.raises(InvalidArgument):
            Ring.from_wire(msgpack.packb(dict(wire, incarnations=bad)))
