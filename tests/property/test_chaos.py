"""The chaos harness: its pure parts checked directly, and every CI-sized scenario run
against a real cluster (real node and mapper processes, real signals)."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from floering.chaos.harness import run_scenario, series, summary_table
from floering.chaos.load import burst_vocabulary, chunk_keys, zipf_probability
from floering.chaos.oracle import check
from floering.chaos.scenarios import (BUILTIN, Fault, Load, Round, Scenario, loses_data, plan,
                             ring_order)
from floering.chaos.timeline import (Injected, by_simultaneous, failure_timelines, parse_events,
                            percentile)
from floering.wire.ring import Ring


def node_ring(nodes: int, r: int) -> Ring:
    return Ring.initial({f"n{i}": f"127.0.0.1:{i + 1}" for i in range(nodes)}, r, 8)


# ------------------------------------------------------------ scenarios and plans

def test_every_builtin_plans_the_same_for_the_same_seed():
    for scenario in BUILTIN.values():
        assert plan(scenario, 7) == plan(scenario, 7), scenario.name


def test_seed_changes_random_choices():
    s = BUILTIN["kill-random"]
    plans = {tuple((f.at, f.victims) for f in plan(s, seed)[0]) for seed in range(20)}
    assert len(plans) > 5


def test_ring_order_is_the_nodes_own_ring_order():
    assert ring_order(12)[:4] == ["n0", "n1", "n10", "n11"]   # ids sort as strings
    ring = node_ring(12, 1)
    order = ring_order(12)
    for i, node in enumerate(order):   # each node's replica is the next one in order
        token = ring.tokens_of(node)[0]
        assert ring.replicas_of_token(token) == (order[(i + 1) % 12],)


@settings(max_examples=200, deadline=None)
@given(st.integers(3, 12), st.integers(1, 3), st.data())
def test_loses_data_agrees_with_the_rings_own_loss_accounting(nodes, r, data):
    r = min(r, nodes - 1)
    victims = data.draw(st.sets(st.sampled_from([f"n{i}" for i in range(nodes)]),
                                min_size=1, max_size=nodes - 1))
    lost = node_ring(nodes, r).without(victims).lost
    assert loses_data(ring_order(nodes), victims, r) == bool(lost)


@pytest.mark.parametrize("nodes,k", [(8, k) for k in range(1, 5)] + [(12, k) for k in range(1, 7)])
def test_non_adjacent_victims_never_lose_a_range(nodes, k):
    s = Scenario("t", "", nodes, 1, (Round((Fault("kill", "non-adjacent", count=k),)),))
    for seed in range(10):
        (fault,), = plan(s, seed)
        assert len(set(fault.victims)) == k
        assert not node_ring(nodes, 1).without(fault.victims).lost


@pytest.mark.parametrize("nodes,r,expect", [(6, 1, 3), (8, 1, 4), (6, 2, 4), (9, 2, 6)])
def test_every_other_kills_n_r_over_r_plus_1_and_keeps_every_range(nodes, r, expect):
    s = Scenario("t", "", nodes, r, (Round((Fault("kill", "every-other"),)),))
    for seed in range(5):
        (fault,), = plan(s, seed)
        assert len(fault.victims) == expect
        assert not node_ring(nodes, r).without(fault.victims).lost


def test_consecutive_and_beyond_r():
    s = Scenario("t", "", 6, 2, (Round((Fault("kill", "consecutive"),)),
                                 Round((Fault("kill", "beyond-r"),))))
    (safe,), (fatal,) = plan(s, 3)
    assert len(safe.victims) == 2 and not node_ring(6, 2).without(safe.victims).lost
    assert len(fatal.victims) == 3 and node_ring(6, 2).without(fatal.victims).lost


def test_sequential_random_kills_respect_earlier_deaths():
    s = Scenario("t", "", 5, 1, (Round((Fault("kill", "random", at=1), Fault("kill", "random", at=3),
                                        Fault("kill", "random", at=5))),))
    for seed in range(30):
        ring = node_ring(5, 1)
        for fault in plan(s, seed)[0]:
            ring = ring.without(fault.victims)
            assert not ring.lost, seed


def test_hottest_targets_the_owner_of_the_hottest_key():
    s = BUILTIN["burst"]
    for seed in range(5):
        (fault,), = plan(s, seed)
        hot = burst_vocabulary(s.load, seed)[0]
        assert fault.victims == (node_ring(4, 1).owner(hot),)


def test_scenarios_round_trip_through_json_and_reject_unknown_fields(tmp_path):
    for scenario in BUILTIN.values():
        again = Scenario.from_dict(json.loads(json.dumps(scenario.to_dict())))
        assert again == scenario
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"name": "mine", "description": "", "nodes": 3, "replicas": 1,
                                "rounds": [{"faults": [{"kind": "kill", "at": 0.5}]}]}))
    from floering.chaos.scenarios import load_scenario
    assert load_scenario(str(path)).rounds[0].faults[0].at == 0.5
    with pytest.raises(ValueError, match="unknown fault fields: when"):
        Scenario.from_dict({"name": "x", "description": "", "nodes": 3, "replicas": 1,
                            "rounds": [{"faults": [{"kind": "kill", "when": 1}]}]})
    with pytest.raises(ValueError, match="fault kind"):
        Fault("explode")
    with pytest.raises(ValueError, match="no scenario"):
        load_scenario("no-such-scenario")
    with pytest.raises(ValueError, match="impossible"):
        plan(Scenario("t", "", 4, 1, (Round((Fault("kill", "non-adjacent", count=3),)),)), 1)


# ------------------------------------------------------- kills during a handoff

def handoff_fault(handoff, side, nodes=4, r=1, count=1, **kw):
    return Scenario("h", "", nodes, r, (Round((Fault("kill-mid-handoff", side, at=1.0,
                                                     count=count, handoff=handoff),)
                                              + tuple(kw.get("more", ()))),))


@pytest.mark.parametrize("seed", range(6))
def test_a_move_goes_to_the_givers_clockwise_neighbour_and_kills_one_side(seed):
    order = ring_order(5)
    ring = node_ring(5, 1)
    for side in ("giver", "receiver"):
        (p,), = plan(handoff_fault("move", side, nodes=5, count=3), seed)
        giver = p.watch
        receiver = order[(order.index(giver) + 1) % 5]
        assert len(p.moves) == 3 and len({t for _, t, _ in p.moves}) == 3
        assert all(g == giver and ring.owner_of_token(t) == giver and to == receiver
                   for g, t, to in p.moves)
        assert p.victims == ((giver,) if side == "giver" else (receiver,))
        assert p.ranges == ((p.victims[0], ring.tokens_of(p.victims[0])),)
    # the giver's choice follows the seed, not the side
    assert plan(handoff_fault("move", "giver", nodes=5, count=3), seed)[0][0].moves == p.moves
    assert p.lag == 0.0
    late = Scenario("h", "", 5, 1, (Round((Fault("kill-mid-handoff", "giver", handoff="move",
                                                 lag=0.02),)),))
    lags = {plan(late, sd)[0][0].lag for sd in range(20)}
    assert all(0 <= x <= 0.02 for x in lags) and len(lags) > 10


def test_a_scale_out_plans_the_new_node_and_donors_like_floe_scale():
    from floering.mapper.admin import plan_scale_out
    ring = node_ring(4, 1)
    (p,), = plan(handoff_fault("scale-out", "receiver"), 3)
    assert p.newcomer == "n4" and p.victims == ("n4",) and p.ranges == (("n4", ()),)
    expected = plan_scale_out(ring.add_node("n4", "127.0.0.1:0", ()), ["n4"])
    assert {(g, t) for g, t, _ in p.moves} == {(g, t) for g, m in expected.items() for t in m}
    assert {to for _, _, to in p.moves} == {"n4"} and len(p.moves) == 32 // 5
    assert p.watch in expected
    (g,), = plan(handoff_fault("scale-out", "giver"), 3)
    assert g.victims == (g.watch,) and g.watch in expected and g.moves == p.moves


def test_a_scale_in_hands_every_range_of_the_leaver_to_its_first_replica():
    ring = node_ring(4, 1)
    for side in ("giver", "receiver"):
        (p,), = plan(handoff_fault("scale-in", side), 5)
        leaver = p.watch
        assert sorted(t for _, t, _ in p.moves) == sorted(ring.tokens_of(leaver))
        assert {to for _, _, to in p.moves} == {ring.heir(ring.tokens_of(leaver)[0])}
        assert p.victims[0] == (leaver if side == "giver" else p.moves[0][2])


def test_handoff_faults_are_checked_when_planned():
    with pytest.raises(ValueError, match="giver' or 'receiver"):
        Fault("kill-mid-handoff", "one")
    with pytest.raises(ValueError, match="giver' or 'receiver"):
        Fault("kill", "giver")
    with pytest.raises(ValueError, match="fault handoff"):
        Fault("kill-mid-handoff", "giver", handoff="teleport")
    with pytest.raises(ValueError, match="r >= 1"):
        plan(handoff_fault("move", "giver", r=0), 1)
    with pytest.raises(ValueError, match="at most all but one"):
        plan(handoff_fault("move", "giver", count=8), 1)
    with pytest.raises(ValueError, match="last node fault"):
        plan(handoff_fault("move", "giver", more=(Fault("kill", "one", at=2.0),)), 1)
    # a mapper kill after it is fine, and a node kill before it changes the giver's ring
    plan(handoff_fault("move", "giver", more=(Fault("kill-mapper", "mapper", at=2.0),)), 1)
    s = Scenario("h", "", 5, 1, (Round((Fault("kill", "one", at=0.5),
                                        Fault("kill-mid-handoff", "receiver", at=1.0,
                                              handoff="scale-in"))),))
    (kill, p), = plan(s, 2)
    assert kill.victims[0] not in {p.watch, p.victims[0]}
    assert set(p.ranges[0][1]) == set(node_ring(5, 1).without(kill.victims)
                                      .tokens_of(p.victims[0]))


def test_durable_faults_hit_every_node_and_need_a_durable_scenario():
    with pytest.raises(ValueError, match="target 'all'"):
        Fault("kill-all", "one")
    with pytest.raises(ValueError, match="durable scenario"):
        Scenario("d", "", 4, 1, (Round((Fault("power-loss", "all"),)),))
    with pytest.raises(ValueError, match="disk_mb"):
        Scenario("d", "", 4, 1, (Round((Fault("disk-full", "all"),)),), durable=True)
    with pytest.raises(ValueError, match="disk_mb"):
        Scenario("d", "", 4, 1, (Round((Fault("kill", "one"),)),), disk_mb=64)
    s = Scenario("d", "", 4, 1, (Round((Fault("kill-during-replay", "all", lag=0.02),
                                        Fault("kill", "one", at=3.0))),), durable=True)
    (replay, kill), = plan(s, 5)
    assert replay.victims == tuple(ring_order(4)) and replay.again in replay.victims
    assert 0 <= replay.lag <= 0.02 and replay.ranges == ()
    # every node comes back as itself: a later kill is planned on the whole ring
    assert dict(kill.ranges)[kill.victims[0]] == node_ring(4, 1).tokens_of(kill.victims[0])
    (full,), = plan(BUILTIN["disk-full"], 1)
    assert full.hold == 3.0 and BUILTIN["disk-full"].round_seconds >= full.at + full.hold
    assert Scenario.from_dict(json.loads(json.dumps(BUILTIN["disk-full"].to_dict()))) \
        == BUILTIN["disk-full"]


def test_a_power_loss_tears_the_newest_record_of_every_nodes_log(tmp_path):
    from floering.chaos.durable_faults import tear_every_log
    from floering.node.storage.segment_log import SegmentLog
    for node in ("n0", "n1"):
        log = SegmentLog(tmp_path / node / "log")
        for i in range(5):
            log.append(b"record %d" % i)
        log.close()
    (tmp_path / "n2" / "log").mkdir(parents=True)     # nothing logged: nothing to tear
    torn = tear_every_log(tmp_path)
    assert [Path(p).parent.parent.name for p in torn] == ["n0", "n1"]
    for node in ("n0", "n1"):
        log = SegmentLog(tmp_path / node / "log")       # the torn tail is cut, no more
        assert [p for _, p in log] == [b"record %d" % i for i in range(5)]
        assert log.truncated > 0
        log.close()


def test_a_node_takes_writes_again_only_on_a_line_of_its_own(tmp_path):
    from floering.floe.cluster import NodeProcess
    from floering.chaos.durable_faults import REFUSING, WRITES_AGAIN, LogTail
    path = tmp_path / "n0.log"
    path.write_text("before\n")
    tail = LogTail(NodeProcess("n0", "127.0.0.1:1", 0, str(path)))
    with open(path, "a") as f:
        f.write("n0 ERROR floe.node: data directory d: [Errno 28] No space left on device; "
                "refusing batches until it takes writes again\n")
    assert tail.has(REFUSING) and not tail.has(WRITES_AGAIN, unless=REFUSING)
    with open(path, "a") as f:
        f.write("n0 WARNING floe.node: data directory d takes writes again\n")
    assert tail.has(WRITES_AGAIN, unless=REFUSING) and not tail.has("before")


def test_a_disk_full_run_is_skipped_with_its_reason_unless_root(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    result = run_scenario(BUILTIN["disk-full"], seed=1, out=tmp_path, plots=False)
    assert "needs root" in result["skipped"] and not result["rounds"] and not result["ok"]
    assert summary_table(result).startswith("SKIP: disk-full seed 1: ")
    assert json.loads((tmp_path / "result.json").read_text())["skipped"]


def ev(kind, t, node, **fields) -> str:
    """One line of a node's structured events file."""
    return json.dumps({"t": t, "kind": kind, "node": node, "process": node, **fields}) + "\n"


HANDOFF_LOG = (ev("handoff_prepared", 100.05, "n0", to=["n4"], tokens=[1, 2], ring_version=3)
               + ev("detected", 100.25, "n0", about=["n4"], why="y")
               + ev("handoff_aborted", 100.3, "n0", to=["n4"], reason="target n4 left the ring"))


def test_handoff_state_follows_the_givers_log():
    from floering.chaos.handoff_faults import handoff_state
    assert handoff_state("", "n4") == "requested"
    assert handoff_state(HANDOFF_LOG.splitlines()[0], "n4") == "in flight"
    assert handoff_state(HANDOFF_LOG.splitlines()[0], "n1") == "requested"
    assert handoff_state(HANDOFF_LOG, "n4") == "aborted"
    done = HANDOFF_LOG.splitlines()[0] + "\n" + ev("handoff_committed", 9.5, "n0", to=["n4"],
                                                   tokens=[1, 2], ms=170.0)
    assert handoff_state(done, "n4") == "committed"
    assert handoff_state(done + '{"t": 9.6, "ki', "n4") == "committed"   # a torn last line


def test_handoff_outcome_from_the_logs():
    from floering.chaos.handoff_faults import handoff_errors, handoff_outcome
    moves = {"n0": {"to": "n4", "tokens": [1, 2]}, "n2": {"to": "n4", "tokens": [5]}}
    detail = {"moves": moves, "offsets": {"n0": 0, "n2": 0}, "watch": "n0",
              "operator": {"n2": {"accepted": False, "detail": "cannot hand token 5 to 'n4'"}}}
    receiver = Injected("kill-mid-handoff", ("n4",), 100.0, detail=detail)
    out = handoff_outcome(receiver, {"n0": HANDOFF_LOG, "n2": ""}, parse_events("n0", HANDOFF_LOG))
    assert out["summary"] == "aborted"
    assert out["givers"]["n0"]["reason"] == "target n4 left the ring"
    assert out["givers"]["n2"]["outcome"] == "refused"
    assert handoff_errors(out) == []
    # the giver killed: its heir must take over every moving range
    giver = Injected("kill-mid-handoff", ("n0",), 100.0,
                     detail={**detail, "moves": {"n0": moves["n0"]}})
    log = HANDOFF_LOG.splitlines()[0] + "\n"
    heir = ev("taken_over", 100.3, "n1", previous=["n0"], tokens=[1, 2, 3])
    out = handoff_outcome(giver, {"n0": log}, parse_events("n1", heir))
    assert out["summary"] == "taken over by the heir"
    assert out["givers"]["n0"]["taken_over_by"] == ["n1"] and handoff_errors(out) == []
    half = ev("taken_over", 100.3, "n1", previous=["n0"], tokens=[1])
    out = handoff_outcome(giver, {"n0": log}, parse_events("n1", half))
    assert "only 1 of 2" in out["summary"] and handoff_errors(out)
    # a surviving giver that never finished is a hang, and reported
    stuck = Injected("kill-mid-handoff", ("n4",), 100.0,
                     detail={**detail, "moves": {"n0": moves["n0"]}})
    out = handoff_outcome(stuck, {"n0": log}, [])
    assert out["summary"] == "in flight" and "never finished" in handoff_errors(out)[0]
    committed = log + ev("handoff_committed", 100.2, "n0", to=["n4"], tokens=[1, 2], ms=190.0)
    out = handoff_outcome(stuck, {"n0": committed}, [])
    assert out["givers"]["n0"]["at_ms"] == pytest.approx(200.0)


# ----------------------------------------------------------------------- load

def test_chunks_are_a_pure_function_of_seed_mapper_and_index():
    load = Load("zipf", chunk=200)
    assert chunk_keys(load, 1, 0, 5) == chunk_keys(load, 1, 0, 5)
    assert chunk_keys(load, 1, 0, 5) != chunk_keys(load, 1, 1, 5)
    assert chunk_keys(load, 1, 0, 5) != chunk_keys(load, 2, 0, 5)


def test_zipf_frequencies_follow_s_and_v():
    load = Load("zipf", chunk=1000)
    counts = Counter(k for i in range(60) for k in chunk_keys(load, 3, 0, i))
    for rank in (0, 1, 5):
        expected = zipf_probability(load, rank) * 60_000
        assert abs(counts[f"w{rank}"] - expected) < 5 * expected ** 0.5 + 5, rank
    ratio = zipf_probability(load, 0) / zipf_probability(load, 9)
    assert ratio == pytest.approx(((2.72 + 10) / (2.72 + 1)) ** 1.1)


def test_corpus_chunks_continue_each_other_and_burst_repeats_few_words():
    load = Load("corpus", chunk=50)
    assert chunk_keys(load, 1, 0, 0)[1:] + [chunk_keys(load, 1, 0, 1)[0]] == \
        (chunk_keys(load, 1, 0, 0) + chunk_keys(load, 1, 0, 1))[1:51]
    burst = Load("burst", chunk=500, burst_words=3)
    assert set(chunk_keys(burst, 4, 0, 0)) == set(burst_vocabulary(burst, 4))


# --------------------------------------------------------------------- oracle

def test_oracle_exact_lost_duplicated_and_unacknowledged():
    acked = Counter({"a": 3, "b": 2})
    assert check({"a": 3, "b": 2}, acked, Counter()).ok
    lost = check({"a": 2, "b": 2}, acked, Counter())
    assert not lost.ok and lost.lost == {"a": (2, 3)} and "'a'" in lost.describe()
    doubled = check({"a": 4, "b": 2}, acked, Counter())
    assert not doubled.ok and doubled.duplicated == {"a": (4, 3)}
    stranger = check({"a": 3, "b": 2, "z": 1}, acked, Counter())
    assert stranger.duplicated == {"z": (1, 0)}
    # unacknowledged tuples may be absent or present once, never twice
    pending = Counter({"a": 2, "c": 1})
    assert check({"a": 3, "b": 2}, acked, pending).ok
    some = check({"a": 4, "b": 2, "c": 1}, acked, pending)
    assert some.ok and some.unacknowledged_counted == 2
    assert check({"a": 6, "b": 2}, acked, pending).duplicated == {"a": (6, 5)}
    assert check({"a": 2, "b": 2, "c": 1}, acked, pending).lost == {"a": (2, 3)}
    assert not check({"a": "3", "b": 2}, acked, Counter()).ok


def test_oracle_per_tuple_ids():
    from floering.chaos.oracle import check_ids
    acked = {"a": {1, 2, 3}, "b": {4}}
    assert check_ids({"a": (3, 1, 2), "b": (4,)}, acked, {}).ok
    v = check_ids({"a": (1, 2, 2), "b": (4,)}, acked, {})     # 3 lost, 2 twice: same count
    assert not v.ok and v.lost == {"a": (3, 3)} and v.duplicated == {"a": (3, 3)}
    assert v.tuples["a"] == {"missing": [3], "doubled": [2], "unknown": []}
    assert "missing ids [3]" in v.describe()
    pending = {"a": {9}, "c": {7}}
    ok = check_ids({"a": (1, 2, 3, 9), "b": (4,)}, acked, pending)
    assert ok.ok and ok.unacknowledged == 2 and ok.unacknowledged_counted == 1
    assert check_ids({"a": (1, 2, 3, 9, 9), "b": (4,)}, acked, pending).tuples["a"]["doubled"] == [9]
    assert check_ids({"a": (1, 2, 3), "b": (4, 5)}, acked, pending).tuples["b"]["unknown"] == [5]


def test_tuple_ids_reducer_through_the_node_state_store():
    from floering.node.core.reducers import load_reducer
    from floering.node.core.state_store import LayeredState
    from floering.chaos.load import chunk_ids, tuple_id
    reducer = load_reducer("floering.chaos.oracle:TupleIds")
    state = LayeredState(reducer)
    state.apply(["x", "y", "x"], [tuple_id(1, 2, 0), tuple_id(1, 2, 1), tuple_id(1, 2, 2)])
    assert dict(state.items()) == {"x": (tuple_id(1, 2, 0), tuple_id(1, 2, 2)),
                                   "y": (tuple_id(1, 2, 1),)}
    assert len(set(chunk_ids(0, 0, 500) + chunk_ids(0, 1, 500) + chunk_ids(1, 0, 500))) == 1500
    with pytest.raises(Exception, match="int tuple ids"):
        state.apply(["x"], ["nope"])


# ------------------------------------------------------------------- timeline

LOG = (ev("detected", 100.2, "n2", about=["n1"], why="probes failed")
       + ev("taken_over", 100.21, "n2", previous=["n1"], tokens=[11, 12])
       + ev("re_replicated", 100.15, "n2")
       + ev("applying_again", 100.3, "n2", token=11, previous="n1")
       + ev("applying_again", 100.35, "n2", token=12, previous="n1")
       + ev("re_replicated", 100.4, "n2")
       + ev("re_replicated", 100.5, "n2"))


def test_timeline_from_node_events():
    events = parse_events("n2", LOG) + parse_events(
        "n0", ev("detected", 100.19, "n0", about=["n1"], why="x"))
    (tl,) = failure_timelines([Injected("kill", ("n1",), 100.0)], events)
    assert tl.ms("detected") == 190.0          # the first node to declare it
    assert tl.ms("taken_over") == 210.0
    assert tl.ms("applying") == 350.0          # the last of its ranges to resume
    assert tl.ranges_applying == 2
    assert tl.ms("re_replicated") == 400.0     # the first one after the takeover
    assert tl.heirs == ("n2",) and tl.complete
    # a fault before the events it explains; a mapper kill has no node timeline
    assert failure_timelines([Injected("kill-mapper", ("mapper-0",), 100.0)], events) == []
    late = failure_timelines([Injected("kill", ("n1",), 200.0)], events)[0]
    assert late.detected is None and not late.complete


def test_ranges_that_pass_through_a_dead_neighbour_count_for_their_first_owner():
    # r=2, n1 and n2 killed together: n1 is declared first and its ranges pass to n2
    # (dead, still in the ring); n3 then takes over all of them "from n2".
    log = (ev("detected", 10.1, "n3", about=["n1"], why="y")
           + ev("detected", 10.2, "n3", about=["n2"], why="y")
           + ev("taken_over", 10.25, "n3", previous=["n2"], tokens=[1, 2, 3, 4])
           + ev("applying_again", 10.3, "n3", token=1, previous="n2")
           + ev("applying_again", 10.4, "n3", token=3, previous="n2")
           + ev("re_replicated", 10.5, "n3"))
    fault = Injected("kill", ("n1", "n2"), 10.0, tokens={"n1": (1, 2), "n2": (3, 4)})
    n1, n2 = failure_timelines([fault], parse_events("n3", log))
    assert (n1.ms("detected"), n1.ms("taken_over"), n1.ms("applying")) == (100.0, 250.0, 300.0)
    assert n1.ranges_applying == 1 and n1.heirs == ("n3",) and n1.ms("re_replicated") == 500.0
    assert (n2.ms("detected"), n2.ms("applying")) == (200.0, 400.0)
    # a range nobody took over leaves the stage open
    partial = Injected("kill", ("n1",), 10.0, tokens={"n1": (1, 9)})
    (tl,) = failure_timelines([partial], parse_events("n3", log))
    assert tl.taken_over is None and tl.re_replicated is None and not tl.complete


def test_fenced_and_unknown_events():
    text = (ev("fenced", 27.572, "n3", ring_version=4, rejoins_as="n3#1")
            + ev("handoff_prepared", 28.0, "n3", to=["n1"], tokens=[1], ring_version=5)
            + "not json\n")
    (event,) = parse_events("n3", text)
    assert event.kind == "fenced" and event.about == ("n3",) and event.t == 27.572


def test_percentiles_and_grouping():
    assert percentile([], 50) is None
    assert percentile([5.0, 1.0, 3.0], 50) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 100) == 4.0
    tls = failure_timelines([Injected("kill", ("n1",), 100.0)], parse_events("n2", LOG))
    assert by_simultaneous(tls)[1]["p50"] == 350.0


def test_throughput_series_ignores_a_vanished_node():
    samples = [{"t": 0.0, "nodes": {"a": {"applied": 0, "backup_tuples": 1},
                                    "b": {"applied": 0, "backup_tuples": 1}}},
               {"t": 1.0, "nodes": {"a": {"applied": 100, "backup_tuples": 2},
                                    "b": {"applied": 50, "backup_tuples": 3}}},
               {"t": 2.0, "nodes": {"a": {"applied": 300, "backup_tuples": 0}}}]
    out = series(samples, since=0.0, window=0.5)
    assert [p["applied_per_s"] for p in out] == [150.0, 200.0]
    assert [p["backup_tuples"] for p in out] == [5, 0]


def test_progress_line_rewrites_itself_on_a_terminal_only():
    import io
    from floering.chaos.harness import Progress, bar
    out = io.StringIO()
    p = Progress(out, enabled=True)
    p.update("round 1/2 " + bar(0.5, 10))
    p.update("done")
    p.done()
    assert out.getvalue().startswith("\rround 1/2 [#####.....]") and "\rdone" in out.getvalue()
    quiet = io.StringIO()
    Progress(quiet).update("x")            # StringIO is not a terminal
    assert quiet.getvalue() == ""


# --------------------------------------------------- scenarios on real clusters


# The network faults (hosts of their own, root only) run in tests/chaos/test_netns_live.py.


# A node whose first failed write on the full disk is a copy write (RocksDB), not the
# log's fsync, never tries to repair: its group-commit loop waits for a batch to log,
# and every batch is refused meanwhile (node.runtime.durability, Durability._fail).
