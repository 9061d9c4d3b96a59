"""The retiring machine (node.core.retiring), driven by a plain executor over cores:
it keeps what removed members held, hands each lost range its part of a retired copy,
and deletes a retired range once r+1 members hold it. Pure; the runtime's executor
runs on real processes in tests/cluster/test_retired_ring.py, the simulation's in
tests/simulation/test_simulation.py (starved chains)."""

from collections import Counter

import pytest

from floering.node.core.machine_io import Note, Record
from floering.node.core.retired import Held, held, restore_chunk
from floering.node.core.retiring import (AskHeld, HeldAnswers, RestoreRefused, Restored,
                                         RestoreRetired, Retiring, RetiringState,
                                         RetiringStateError, WriteRetired)
from floering.node.core.state_wire import decode
from floering.wire.errors import FloeError
from tests.support.retired_shared import WORDS, cluster


def two_removed():
    """n1 and n2 removed at r = 1: n0 holds their ranges as lost; one machine keeps
    what both held (as one process would over two rejoins)."""
    c = cluster()
    c.push("s1", WORDS)
    c.checkpoint()
    c.push("s2", WORDS[:100])                 # past the checkpoint: backups only
    ring = c.ring.without(["n1", "n2"])
    machine, effects = Retiring(), []
    for node in ("n1", "n2"):
        c.cores[node].adopt_ring(ring)
        effects += machine.keep(c.cores.pop(node).retired, f"{node} was removed", node)
    n0 = c.cores["n0"]
    n0.adopt_ring(ring)
    c.ring = ring
    return c, n0, machine, effects


def execute(c, machine, effects, now=1.0, refuse=None) -> list:
    """Carry out a round's effects over the cluster's cores; returns the others."""
    rest = []
    while effects:
        later = []
        for e in effects:
            if isinstance(e, AskHeld):
                answers = tuple(held(c.cores[a.node], a.token, a.want) if a.node in c.cores
                                else Held("", False) for a in e.asks)
                later += machine.handle(HeldAnswers(answers), now)
            elif isinstance(e, RestoreRetired):
                node = next(n for n in c.cores if c.ring.address(n) == e.address)
                try:
                    if refuse:
                        raise FloeError(refuse)
                    for n, chunk in enumerate(e.chunks, 1):
                        restore_chunk(c.cores[node], e.ring_stamp, e.token, e.member,
                                      e.retired, n, len(e.chunks), decode(chunk), None,
                                      e.watermarks if n == 1 else {}, now)
                    later += machine.handle(Restored(), now)
                except FloeError as exc:
                    later += machine.handle(RestoreRefused(str(exc)), now)
            else:
                rest.append(e)
        effects = later
    return rest


def kinds(effects) -> Counter:
    return Counter(e.kind for e in effects if isinstance(e, Record))


def test_kept_ranges_are_written_and_recorded_once():
    c, n0, machine, effects = two_removed()
    writes = [e for e in effects if isinstance(e, WriteRetired)]
    assert sorted(w.member for w in writes) == ["n1", "n2"]
    assert sum(len(w.ranges) for w in writes) == len(machine.kept.ranges)
    assert kinds(effects) == Counter(retired=2)
    again = machine.keep([r for w in writes for r in w.ranges], "again", "n2")
    assert again == []                       # kept already: nothing written or recorded


def test_a_round_gives_every_lost_range_back_exactly_and_deletes_what_r_plus_1_hold():
    c, n0, machine, _ = two_removed()
    lost = set(n0.lost_tokens)
    assert lost
    first = execute(c, machine, machine.start(n0, 1.0))
    assert machine.state == RetiringState.IDLE
    assert kinds(first)["retired_handed_over"] == len(lost) == machine.handed_over
    assert not n0.lost_tokens
    assert Counter(dict(n0.items())) == Counter(WORDS + WORDS[:100])
    # at r = 1 with one member left the ring cannot place r+1 copies: nothing deleted
    assert machine.deleted_last == 0 and machine.kept.ranges
    # a second round finds nothing lost, hands nothing over again
    second = execute(c, machine, machine.start(n0, 2.0))
    assert kinds(second)["retired_handed_over"] == 0
    assert Counter(dict(n0.items())) == Counter(WORDS + WORDS[:100])


def test_a_range_held_on_r_plus_1_members_is_deleted_and_its_file_rewritten():
    c = cluster()
    c.push("s1", WORDS)
    c.checkpoint()
    ring = c.ring.without(["n2"])
    c.cores["n2"].adopt_ring(ring)
    machine = Retiring()
    machine.keep(c.cores.pop("n2").retired, "n2 was removed", "n2")
    for core in c.cores.values():
        core.adopt_ring(ring)
    c.ring = ring
    c.checkpoint()                            # the survivors fill their new replicas
    kept = len(machine.kept.ranges)
    out = execute(c, machine, machine.start(c.cores["n0"], 1.0))
    assert machine.deleted_last == kept == kinds(out)["retired_deleted"]
    assert not machine.kept.ranges
    assert [(w.member, w.ranges) for w in out if isinstance(w, WriteRetired)] == [("n2", ())]
    assert machine.start(c.cores["n0"], 2.0) == []        # nothing kept: no round


def test_a_refused_hand_over_is_logged_once_per_report_interval_and_keeps_the_range():
    c, n0, machine, _ = two_removed()
    out = execute(c, machine, machine.start(n0, 1.0), refuse="busy")
    notes = [e for e in out if isinstance(e, Note) and "refused" in e.text]
    assert notes and machine.handed_over == 0 and n0.lost_tokens
    out = execute(c, machine, machine.start(n0, 2.0), refuse="busy")
    assert not [e for e in out if isinstance(e, Note) and "refused" in e.text]
    assert machine.kept.ranges


def test_events_out_of_turn_are_refused_and_a_broken_round_can_be_abandoned():
    c, n0, machine, _ = two_removed()
    with pytest.raises(RetiringStateError):
        machine.handle(Restored(), 1.0)                   # no round runs
    (first,) = machine.start(n0, 1.0)       # n0 answers its own questions: a hand-over
    assert isinstance(first, RestoreRetired)
    assert machine.state == RetiringState.HANDING_OVER
    assert machine.start(n0, 1.5) == []                   # one round at a time
    with pytest.raises(RetiringStateError):
        machine.handle(HeldAnswers(()), 1.0)
    machine.abandon()                        # its executor failed
    assert machine.state == RetiringState.IDLE
    assert isinstance(machine.start(n0, 2.0)[0], RestoreRetired)    # asked afresh


def test_no_round_for_a_core_not_serving():
    c, n0, machine, _ = two_removed()
    n0.starting = True
    assert machine.start(n0, 1.0) == [] and machine.state == RetiringState.IDLE
