"""The skew benchmark's workloads are what their definitions say, and a short run of it is
exact and measures what each policy did.

The tests here start real node processes; the in-process ones are in
tests/unit/test_skew.py.
"""

from __future__ import annotations

import pytest

from floering.chaos.skew import run_one


@pytest.mark.multiprocess
@pytest.mark.parametrize("policy, name", [("dkg", "drifting"), ("pkg", "merge-cost"),
                                          ("dkg", "merge-cost")])
def test_the_drifting_and_merge_cost_workloads_run_exact(policy, name):
    outcome = run_one(policy, name, 30_000)
    assert outcome.exact and outcome.tuples == 30_000 and sum(outcome.loads) == 30_000
    assert outcome.pieces_max >= 2 and outcome.merges >= 1
    assert outcome.pieces_mean > 1.0
    assert 1.0 <= outcome.period_max_over_mean <= outcome.period_worst <= outcome.nodes


@pytest.mark.multiprocess
@pytest.mark.parametrize("policy", ["none", "dkg"])
def test_a_short_run_is_exact_and_dkg_evens_a_skewed_workload(policy):
    outcome = run_one(policy, "wl4-h", 30_000)
    assert outcome.exact and outcome.tuples == 30_000 and sum(outcome.loads) == 30_000
    if policy == "none":
        assert outcome.skew == pytest.approx(0.8, abs=0.01) and outcome.dist_cost == 1.0
    else:
        assert outcome.skew < 0.3 and outcome.dist_cost > 1.0


@pytest.mark.multiprocess
def test_the_overload_run_is_exact_and_counts_latency_from_when_a_tick_was_due():
    from floering.chaos.skew import run_overload
    row = run_overload("pkg", "wl4-h", rate=5000, work=10, seconds=1.0)
    assert row["exact"] and row["sent"] == 5000
    assert 0 < row["p50_ms"] <= row["p99_ms"] <= row["max_ms"]


@pytest.mark.multiprocess
def test_the_read_cost_run_reads_a_key_spread_over_every_node_exactly():
    from floering.chaos.read_cost import READS, run_policy
    row = run_policy("wchoices", 4, 30_000, gets=3, scans=1)
    assert row["exact"] and row["hot_nodes"] >= 3 and row["pieces_asked"] == 16
    assert all(0 < row[f"{read} p50 ms"] <= row[f"{read} p99 ms"] for read in READS)


@pytest.mark.multiprocess
def test_a_replayable_run_spreads_every_other_with_pkg_exactly():
    o = run_one("pkg", "every-other", 40_000, replayable=True)
    assert o.exact, o.failure
    assert o.max_over_mean <= 1.3, o.loads
