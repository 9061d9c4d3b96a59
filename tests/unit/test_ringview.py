"""What `floe status` calls each member, and its verdict, from the ring, the Stats
replies and the recorded processes."""

from __future__ import annotations

from floering.floe.ringview import locate, member_rows, range_rows, verdict
from floering.wire.hashing import position
from floering.wire.ring import Ring

MEMBERS = {f"n{i}": f"127.0.0.1:{7400 + i}" for i in range(4)}


def _stats(node: str, **fields) -> dict:
    row = {"node_id": node, "address": MEMBERS.get(node, "127.0.0.1:7499"), "pid": 100 + int(
        node[1]), "tokens": 2, "lost_ranges": 0, "under_replicated": 0, "fenced": False,
        "leaving": False, "suspects": []}
    row.update(fields)
    return row


def _recorded(*dead: str) -> dict:
    return {n: {"address": a, "pid": 100 + int(n[1]), "alive": n not in dead}
            for n, a in MEMBERS.items()}


def _states(rows) -> dict:
    return {r["node_id"]: r["state"] for r in rows}


def test_a_healthy_ring_serves_everywhere():
    ring = Ring.initial(MEMBERS, 1, 2)
    rows = member_rows(ring, [_stats(n) for n in MEMBERS], _recorded())
    assert set(_states(rows).values()) == {"serving"}
    assert verdict(ring, rows) == "HEALTHY: 4 of 4 members serving; every range on r+1 nodes"


def test_each_state_is_named_and_the_verdict_says_who_is_not_serving():
    ring = Ring.initial(MEMBERS, 1, 2).without(["n3"])
    rows = member_rows(ring, [
        _stats("n0", suspects=["n2"]),
        _stats("n1", leaving=True),
        {"node_id": "n2", "address": MEMBERS["n2"], "error": "DEADLINE_EXCEEDED"},
    ], _recorded("n3"))
    assert _states(rows) == {"n0": "serving", "n1": "leaving", "n2": "suspect", "n3": "dead"}
    assert verdict(ring, rows) == (
        "DEGRADED: 1 of 4 members serving; every range on r+1 nodes; suspect: n2 (not "
        "answering: DEADLINE_EXCEEDED); dead: n3 (process 103 gone); leaving: n1 (handing "
        "its ranges over)")


def test_joining_fenced_and_removed_members():
    ring = Ring.initial(MEMBERS, 1, 2).without(["n1", "n3"])
    rows = member_rows(ring, [_stats("n0"), _stats("n2", tokens=0),
                              _stats("n1", fenced=True)],
                       {"n1": {"address": MEMBERS["n1"], "pid": 101, "alive": True}})
    assert _states(rows) == {"n0": "serving", "n2": "joining", "n1": "fenced",
                             "n3": "removed"}
    assert verdict(ring, rows) == (
        "DEGRADED: 1 of 3 members serving; every range on r+1 nodes; fenced: n1 (declared "
        "dead, still running, serves nothing); joining: n2 (holds no range yet)")


def test_a_restarted_process_is_shown_once_under_its_new_name():
    ring = Ring.initial(MEMBERS, 1, 2).without(["n1"])
    ring = ring.add_node("n1#1", "127.0.0.1:7401", [5])
    rows = member_rows(ring, [_stats(n) for n in ("n0", "n2", "n3")]
                       + [_stats("n1#1", node_id="n1#1", pid=101)], _recorded())
    assert _states(rows) == {"n0": "serving", "n2": "serving", "n3": "serving",
                             "n1#1": "serving"}


def test_a_range_lost_is_data_lost():
    ring = Ring.initial(MEMBERS, 1, 2).without(["n1", "n2"])
    rows = member_rows(ring, [_stats("n0", lost_ranges=2), _stats("n3")], _recorded("n1", "n2"))
    assert verdict(ring, rows) == ("DATA LOST: 2 of 4 members serving; 2 ranges lost; dead: "
                                   "n1 (process 101 gone), n2 (process 102 gone)")


def test_locate_names_the_range_and_its_holders_in_the_form_asked():
    ring = Ring.initial(MEMBERS, 1, 2)
    where = locate(ring, "lord")
    token = ring.token_for_position(position("lord"))
    assert where["position"] == str(position("lord")) and where["token"] == str(token)
    assert where["primary"] == ring.owner_of_token(token)
    assert where["replicas"] == list(ring.regular_replicas(token))
    assert locate(ring, "lord", hex)["position"] == hex(position("lord"))
    assert sum(r["share"] for r in range_rows(ring)) == 1.0


def test_a_dead_process_the_ring_took_over_from_is_still_degraded():
    ring = Ring.initial(MEMBERS, 1, 2).without(["n1"])
    rows = member_rows(ring, [_stats(n) for n in ("n0", "n2", "n3")], _recorded("n1"))
    assert verdict(ring, rows) == ("DEGRADED: 3 of 4 members serving; every range on r+1 "
                                   "nodes; dead: n1 (process 101 gone)")
    rows = member_rows(ring, [_stats(n) for n in ("n0", "n2", "n3")],
                       {n: p for n, p in _recorded().items() if n != "n1"})
    assert verdict(ring, rows) == "HEALTHY: 3 of 3 members serving; every range on r+1 nodes"


def test_a_recorded_process_missing_from_the_ring_is_named():
    ring = Ring.initial({n: a for n, a in MEMBERS.items() if n != "n3"}, 1, 2)
    rows = member_rows(ring, [_stats(n) for n in ("n0", "n1", "n2")] + [_stats("n3")],
                       _recorded())
    assert verdict(ring, rows) == ("DEGRADED: 3 of 4 members serving; every range on r+1 "
                                   "nodes; joining: n3 (missing from the ring)")


def test_a_range_row_tells_a_receiving_destination_from_a_holder_keeping_its_copy():
    ring = Ring.initial(MEMBERS, 1, 2)
    token = ring.tokens[0]
    others = sorted(set(MEMBERS) - set(ring.destinations(token)))
    ring = ring.with_extras({token: others}, holding=[(token, others[0])])
    row = next(r for r in range_rows(ring) if r["token"] == str(token))
    assert row["extras"] == others and row["keeping"] == [others[0]]
    assert all(r["keeping"] == [] for r in range_rows(ring) if r["token"] != str(token))
