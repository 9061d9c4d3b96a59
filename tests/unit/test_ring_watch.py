"""The mapper's ring rules without I/O (mapper/ring_watch.py): which view it adopts,
and when it looks for a newer ring, on a fake clock."""

from floering.mapper.ring_watch import RETIRE_EVERY, STALL, Look, ProgressWatch, choose_ring
from floering.wire.ring import Ring

MEMBERS = {f"n{i}": f"h:{i}" for i in range(3)}


def view(ring: Ring) -> tuple[Ring, bytes]:
    return ring, ring.to_wire()


def test_a_newer_view_is_adopted_and_an_older_or_equal_one_is_not():
    ring = Ring.initial(MEMBERS, 1, 4)
    newer = ring.without(["n2"])
    assert choose_ring(None, b"", [view(ring)], True) == view(ring)
    assert choose_ring(ring, ring.to_wire(), [view(ring), view(newer)], True) == view(newer)
    assert choose_ring(newer, newer.to_wire(), [view(ring), view(newer)], True) is None
    assert choose_ring(ring, ring.to_wire(), [], True) is None


def test_a_ring_no_answering_node_holds_is_given_up_for_the_newest_even_at_its_version():
    """Our ring's only holder died before telling anyone (it had just split a range):
    the survivors hold another ring of the same version number."""
    base = Ring.initial(MEMBERS, 1, 4)
    ours = base.with_owners({base.tokens_of("n0")[0]: "n1"})
    theirs = base.with_owners({base.tokens_of("n0")[1]: "n2"})
    assert ours.version == theirs.version and ours.stamp != theirs.stamp
    assert choose_ring(ours, ours.to_wire(), [view(theirs)], True) == view(theirs)
    # one answering node still holds ours: keep it
    assert choose_ring(ours, ours.to_wire(), [view(theirs), view(ours)], True) is None
    # a fetch begun before another adopted our ring: its views may be older than ours
    assert choose_ring(ours, ours.to_wire(), [view(theirs)], False) is None


def test_no_ack_for_the_stall_refreshes_once_per_stall_and_acks_hold_it_off():
    watch = ProgressWatch(100.0)
    assert watch.tick(100.0 + STALL / 2, True, []) == set()
    assert watch.tick(100.0 + STALL * 1.1, True, []) == {Look.REFRESH}
    assert watch.tick(100.0 + STALL * 1.2, True, []) == set()
    watch.progressed(100.0 + STALL * 2)
    assert watch.tick(100.0 + STALL * 2.5, True, []) == set()
    assert watch.tick(100.0 + STALL * 3.5, False, []) == set()       # nothing waits


def test_one_node_unanswered_for_the_stall_makes_the_mapper_watch_the_ring():
    watch = ProgressWatch(0.0)
    watch.progressed(0.9)
    assert watch.tick(1.0, True, [0.9, None, 0.2]) == {Look.WATCH}
    assert watch.tick(1.0, True, [0.9, None, 0.7]) == set()


def test_channels_are_looked_at_every_retire_period():
    watch = ProgressWatch(0.0, retire_every=RETIRE_EVERY)
    assert watch.tick(RETIRE_EVERY - 1, False, []) == set()
    assert watch.tick(RETIRE_EVERY + 1, False, []) == {Look.RETIRE}
    assert watch.tick(RETIRE_EVERY + 2, False, []) == set()
    assert watch.tick(2 * RETIRE_EVERY + 2, False, []) == {Look.RETIRE}
