"""The chaos harness: its pure parts checked directly, and every CI-sized scenario run against
a real cluster (real node and mapper processes, real signals).

The tests here start real node processes; the in-process ones are in
tests/property/test_chaos.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from floering.chaos.harness import run_scenario
from floering.chaos.scenarios import BUILTIN
from tests.support.helpers import came_back_fresh


ROOT = Path(__file__).resolve().parents[2]


def mid_handoff(scenario) -> bool:
    return any(f.kind == "kill-mid-handoff" for r in scenario.rounds for f in r.faults)


CI = [name for name, s in BUILTIN.items() if s.ci and len(s.rounds) == 1
      and name != "lose-range" and not mid_handoff(s) and not s.durable and not s.netns]


HANDOFF_CI = [name for name, s in BUILTIN.items() if s.ci and mid_handoff(s)]


def check_round_timelines(result, applying_seen: bool = True):
    """Every stage of every failure, in order. `applying_seen=False`: the heir may not
    apply new tuples to a taken-over range before the round ends (a joiner's ranges can
    be slices of a donor's that the feed's keys seldom hit); if it does, in order."""
    for rnd in result["rounds"]:
        for tl in rnd["timelines"]:
            stages = [tl[s] for s in ("injected", "detected", "taken_over")]
            if applying_seen or tl["applying"] is not None:
                stages.append(tl["applying"])
                assert tl["ranges_applying"] >= 1, tl
            assert None not in stages and tl["re_replicated"] is not None, tl
            assert stages == sorted(stages), json.dumps(tl)
            assert tl["re_replicated"] >= tl["taken_over"]


@pytest.mark.chaos
@pytest.mark.multiprocess
@pytest.mark.parametrize("name", [n for n in CI if n != "kill-one"])
def test_ci_scenario_loses_nothing_and_times_every_failure(name, tmp_path):
    result = run_scenario(BUILTIN[name], seed=1, out=tmp_path, plots=False)
    assert result["ok"], json.dumps([(r["errors"], r["oracle"]) for r in result["rounds"]])
    if not name.startswith("kill-while-"):
        # (there ranges move every 0.5 s: the victim's ranges when the kill was
        # planned are not all its own when it lands, so no timeline is complete)
        check_round_timelines(result)
    (rnd,) = result["rounds"]
    assert rnd["oracle"]["acknowledged"] > 1000
    planned = {v for p in rnd["planned"] for v in p["victims"]}
    assert {v for i in rnd["injected"] for v in i["victims"]} == planned
    live = {s["node_id"] for s in rnd["final_stats"]}
    if name == "pause":
        (tl,) = rnd["timelines"]
        assert tl["fenced"] is not None and tl["fenced"] >= tl["detected"]
        rejoined = [s for s in rnd["final_stats"] if s["node_id"] == f"{tl['victim']}#1"]
        assert rejoined and came_back_fresh(rejoined[0], len(rnd["final_stats"]))
    else:
        killed = {v for i in rnd["injected"] if i["kind"] == "kill" for v in i["victims"]}
        assert not live & killed and len(live) == BUILTIN[name].nodes - len(killed)
    if name.startswith("kill-while-"):        # the policy moved ranges all along
        assert sum(s["handed_off"] for s in rnd["final_stats"]) >= 2, rnd["final_stats"]
    if name == "kill-mapper":
        (mapper_kill,) = [i for i in rnd["injected"] if i["kind"] == "kill-mapper"]
        assert mapper_kill["detail"]["mid_chunk"], mapper_kill
        assert rnd["oracle"]["unacknowledged"] > 0
        assert BUILTIN[name].load.ids       # checked tuple by tuple
        assert len(rnd["mappers"]) == 3 and rnd["mappers"][0]["exit"] == -9


@pytest.mark.chaos
@pytest.mark.multiprocess
def test_floe_chaos_cli_runs_a_scenario_writes_json_and_plots(tmp_path):
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'proto'}")
    listing = subprocess.run([sys.executable, "-m", "floering.floe.cli", "chaos", "list"], env=env,
                             capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0 and "fig8b" in listing.stdout and "kill-one" in listing.stdout
    assert "whole-cluster-kill" in listing.stdout and "disk-full" in listing.stdout
    run = subprocess.run([sys.executable, "-m", "floering.floe.cli", "chaos", "run", "kill-one",
                          "--seed", "2", "--out", str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "PASS: kill-one seed 2" in run.stdout and "exact:" in run.stdout
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["ok"] and result["seed"] == 2
    check_round_timelines(result)
    for png in ("round-01.png", "recovery.png"):
        data = (tmp_path / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert (tmp_path / "round-01" / "floe-cluster" / "logs" / "n0.log").exists()


@pytest.mark.chaos
@pytest.mark.multiprocess
def test_killing_r_plus_1_neighbours_fails_the_run_and_says_so(tmp_path):
    result = run_scenario(BUILTIN["lose-range"], seed=1, out=tmp_path, plots=False)
    assert not result["ok"]
    (rnd,) = result["rounds"]
    assert "RangeLost" in rnd["oracle"]["error"] or "DATA_LOSS" in rnd["oracle"]["error"] \
        or "lost" in rnd["oracle"]["error"], rnd["oracle"]
    assert any("ranges reported lost" in e for e in rnd["errors"])


@pytest.mark.chaos
@pytest.mark.multiprocess
def test_fig8b_in_small_times_each_number_of_simultaneous_failures(tmp_path):
    result = run_scenario(BUILTIN["fig8b-mini"], seed=1, out=tmp_path)
    assert result["ok"], json.dumps([(r["errors"], r["oracle"]) for r in result["rounds"]])
    check_round_timelines(result)
    assert [len(r["timelines"]) for r in result["rounds"]] == [1, 2, 3]
    assert set(result["recovery_by_simultaneous"]) == {1, 2, 3}
    assert all(v["n"] == k and v["missing"] == 0
               for k, v in result["recovery_by_simultaneous"].items())
    assert (tmp_path / "recovery.png").stat().st_size > 10_000
    assert len(list(tmp_path.glob("round-*.png"))) == 3


@pytest.mark.slow
@pytest.mark.chaos
@pytest.mark.multiprocess
@pytest.mark.parametrize("name", ["target-n8", "fig8b"])
def test_long_benchmark_scenarios_lose_nothing(name, tmp_path):
    result = run_scenario(BUILTIN[name], seed=1, out=tmp_path, plots=False)
    assert result["ok"], json.dumps([(r["errors"], r["oracle"]["summary"]) for r in result["rounds"]])
    check_round_timelines(result)


@pytest.mark.chaos
@pytest.mark.multiprocess
@pytest.mark.parametrize("name", HANDOFF_CI)
def test_a_kill_inside_a_live_handoff_loses_nothing(name, tmp_path):
    scenario = BUILTIN[name]
    # The in-flight window is 25-60 ms; on a starved machine the harness may see the
    # handoff start only after it finished. Such a run injected nothing and proves
    # nothing either way, so it is retried on the next seed; every other failure counts.
    for seed in (1, 2, 3):
        result = run_scenario(scenario, seed=seed, out=tmp_path / f"seed-{seed}", plots=False)
        (rnd,) = result["rounds"]
        if not any("missed the handoff window" in e for e in rnd["errors"]):
            break
    assert result["ok"], json.dumps([(r["errors"], r["oracle"]) for r in result["rounds"]])
    o = rnd["oracle"]
    assert o["by_id"] and o["acknowledged"] > 1000
    assert o["lost_keys"] == 0 and o["duplicated_keys"] == 0
    (inj,) = rnd["injected"]
    d = inj["detail"]
    assert d["in_flight"] and d["state_when_killed"] == "in flight", d
    assert all(s["lost_ranges"] == 0 for s in rnd["final_stats"])
    victim = inj["victims"][0]
    assert victim not in {s["node_id"] for s in rnd["final_stats"]}
    outcome = d["outcome"]
    assert outcome["detected_ms"] is not None
    if d["side"] == "giver":
        # the giver died before committing: its heir took every moving range over
        assert outcome["summary"] == "taken over by the heir", outcome
        check_round_timelines(result)
    else:
        # the receiver died: its giver aborted (or had just committed, and then the
        # receiver's heirs took the moved ranges over with the rest of its ranges)
        assert outcome["summary"] in ("aborted", "committed"), outcome
        check_round_timelines(result, applying_seen=d["handoff"] != "scale-out")
        if d["handoff"] == "scale-out":
            # the new node owned only what a donor had committed to it before it died
            committed = [g for g, row in outcome["givers"].items()
                         if row["outcome"] == "committed"]
            assert bool(rnd["timelines"]) == bool(committed), outcome


DURABLE_CI = [name for name, s in BUILTIN.items() if s.ci and s.durable]


@pytest.mark.chaos
@pytest.mark.multiprocess
@pytest.mark.parametrize("name", DURABLE_CI)
def test_a_durable_cluster_hit_as_a_whole_comes_back_exact(name, tmp_path):
    scenario = BUILTIN[name]
    # As with the handoff window: a node killed only after it already served again
    # proves nothing about a kill during replay, so that run is retried on the next seed.
    for seed in (1, 2, 3):
        result = run_scenario(scenario, seed=seed, out=tmp_path / f"seed-{seed}", plots=False)
        if result.get("skipped"):
            pytest.skip(result["skipped"])
        (rnd,) = result["rounds"]
        if not any("missed the restore window" in e for e in rnd["errors"]):
            break
    assert result["ok"], json.dumps([(r["errors"], r["oracle"]) for r in result["rounds"]])
    o = rnd["oracle"]
    assert o["by_id"] and o["acknowledged"] > 1000
    assert o["lost_keys"] == 0 and o["duplicated_keys"] == 0
    (inj,) = rnd["injected"]
    d = inj["detail"]
    assert d["first_ack_after_ms"] is not None           # the load went on after it
    assert all(s["lost_ranges"] == 0 for s in rnd["final_stats"])
    members = {s["node_id"] for s in rnd["final_stats"]}
    if inj["kind"] == "rolling-restart":
        # no outage: acknowledged throughout; each node started again on its own data
        # directory as a new member (n0#1, ...)
        assert d["acked_during"] > 0 and sorted(d["new_members_on_data_dir"]) == \
            sorted(inj["victims"])
        assert all("#" in m for m in members), members
        return
    again = d.get("again")
    assert {m for m in members if m.split("#")[0] != again} == \
        {f"n{i}" for i in range(scenario.nodes)} - {again}
    if inj["kind"] == "disk-full":
        assert d["refusing_ms"] and set(d["writes_again_ms"]) == set(d["refusing_ms"])
        assert d["read_while_full"]["ok"] and d["read_while_full"]["found"]
        assert d["acked_while_full"] == 0
        return
    # nothing acknowledged while down: a chunk flushed after the kill waits for the
    # restart (one flushed before may see acks the nodes sent before the signal)
    assert d["first_flush_after_acked_ms"] > d["restarted_ms"], d
    if inj["kind"] == "power-loss":
        assert len(d["torn_tail_cut"]) == len(d["torn_segments"]) == scenario.nodes
    if inj["kind"] == "kill-during-replay":
        assert d["in_restore"], d
        assert d["state_when_killed"] in ("restoring", "restored, not yet serving")
