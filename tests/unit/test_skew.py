"""The skew benchmark's workloads are what their definitions say, and a short run of it
is exact and measures what each policy did."""

from __future__ import annotations

from collections import Counter

import pytest

from floering.chaos.skew import PAPER_S, RAY, TOKENS_PER_NODE, ray_items, workload
from floering.chaos.skew_measures import skew
from floering.wire.ring import Ring


def static_skew(keys, nodes: int) -> float:
    ring = Ring.initial({f"n{i}": f"h:{i}" for i in range(nodes)}, 1, TOKENS_PER_NODE)
    per_node = Counter(ring.owner(k) for k in keys)
    return skew([per_node[n] for n in ring.nodes])


@pytest.mark.parametrize("name", sorted(RAY))
def test_the_ray_workloads_have_the_papers_skew_under_static_hashing(name):
    items = ray_items(name)
    assert len(items) == 100
    assert static_skew(items, 4) == pytest.approx(PAPER_S[name][1], abs=0.01)
    assert Counter(workload(name, 10_000)) == Counter({k: 100 * n for k, n in
                                                      Counter(items).items()})


def test_the_shifting_workload_changes_its_hot_keys_half_way():
    keys = workload("shifting", 100_000)
    first, second = Counter(keys[:50_000]), Counter(keys[50_000:])
    assert first.most_common(1)[0][0] != second.most_common(1)[0][0]


def test_the_drifting_workload_changes_its_hot_keys_every_period():
    from floering.chaos.skew import DRIFT_EVERY
    keys = workload("drifting", 4 * DRIFT_EVERY)
    assert len(keys) == 4 * DRIFT_EVERY and workload("drifting", 4 * DRIFT_EVERY) == keys
    tops = [Counter(keys[at:at + DRIFT_EVERY]).most_common(1)[0]
            for at in range(0, len(keys), DRIFT_EVERY)]
    assert len({key for key, _ in tops}) == 4                 # a new hottest key each period
    assert all(n > 0.1 * DRIFT_EVERY for _, n in tops)        # Zipf 1.1: ~15% on the top key


def test_the_merge_cost_workload_makes_every_key_hot_again_and_again():
    from floering.chaos.skew import MERGE_EVERY, MERGE_HOT, MERGE_KEYS
    periods = 40
    keys = workload("merge-cost", periods * MERGE_EVERY)
    assert len(keys) == periods * MERGE_EVERY and len(set(keys)) == MERGE_KEYS
    hot_times = Counter()
    for at in range(0, len(keys), MERGE_EVERY):
        top = Counter(keys[at:at + MERGE_EVERY]).most_common(MERGE_HOT)
        assert sum(n for _, n in top) > 0.75 * MERGE_EVERY
        hot_times.update(k for k, _ in top)
    assert hot_times == Counter({k: periods * MERGE_HOT // MERGE_KEYS for k in hot_times})
    assert len(hot_times) == MERGE_KEYS


def test_piece_counts_are_the_partial_states_a_read_merges():
    from floering.chaos.skew_measures import piece_counts
    assert piece_counts({"a": ["a"], "b": ["b", "p1", "p2"], "c": []}) == (5 / 3, 3, 2)


def test_the_ray_table_replay_matches_the_papers_halving_and_doubling_reaches_its_s():
    from floering.chaos.ray_table import START_TOKENS, replay, table
    rows = {(r["workload"], r["method"]): r for r in table()}
    for (name, method), r in rows.items():
        # the letters sit on the layout the paper starts that method from
        ring = Ring.initial({f"n{i}": f"h:{i}" for i in range(4)}, 1, START_TOKENS[method])
        per_node = Counter(ring.owner(k) for k in ray_items(name, START_TOKENS[method]))
        assert round(skew([per_node[n] for n in ring.nodes]), 3) == r["before"]
        assert r["before"] == pytest.approx(r["paper"][0], abs=0.01)
        assert r["after"] <= r["before"], r                 # never worse
    assert rows[("wl4-h", "halving")]["after"] == pytest.approx(0.52, abs=0.005)
    for name in ("wl1-d", "wl4-d", "wl5-d"):                # where the items land
        assert rows[(name, "doubling")]["after"] <= rows[(name, "doubling")]["paper"][1]
    for name in ("wl1-d", "wl2", "wl3", "wl4-d", "wl5-d"):  # the paper's own measure
        assert rows[(name, "doubling")]["processed_p20"] <= rows[(name, "doubling")]["paper"][1]
    assert replay("wl2", "halving") == (0.0, 0.0, 0)        # no skew: no trigger


def test_the_overload_table_shows_each_pairs_median_p99_over_its_rounds():
    from floering.chaos.skew import overload_markdown, overload_medians

    def row(policy, round_, p99, exact=True):
        return {"workload": "wl4-h", "policy": policy, "round": round_, "p99_ms": p99,
                "exact": exact}
    rows = [row("none", 1, 900.0), row("pkg", 1, 30.0), row("none", 2, 1500.0),
            row("pkg", 2, 500.0, exact=False), row("none", 3, 1000.0), row("pkg", 3, 50.0)]
    medians = overload_medians(rows)
    assert medians[("wl4-h", "none")] == {"p99_ms": 1000.0, "low": 900.0, "high": 1500.0,
                                          "rounds": 3, "exact": True}
    assert medians[("wl4-h", "pkg")]["p99_ms"] == 50.0
    assert not medians[("wl4-h", "pkg")]["exact"]
    table = overload_markdown(rows)
    assert "| WL4-h | 1000 ms [900-1500] | 50 ms [30-500] (-95%) **not exact** |" in table


def test_the_costly_reducer_waits_its_wall_time_per_tuple_and_counts_exactly():
    import time

    from floering.chaos.costly import CostlyCount
    reducer, state = CostlyCount(work=0, wait_us=2000), {}
    started = time.perf_counter()
    reducer.apply_batch(["a", "b", "a"] * 5, [1] * 15, state, lambda key: 0)
    assert time.perf_counter() - started >= 15 * 2000 / 1e6
    assert state == {"a": 10, "b": 5}
    with pytest.raises(ValueError):
        CostlyCount(wait_us=-1)


def test_the_hot_word_workloads_put_it_at_every_other_position_or_at_half_shuffled():
    from floering.chaos.skew import HOT
    every, half = workload("every-other", 10_000), workload("hot-half", 10_000)
    assert every[0::2] == [HOT] * 5000 and HOT not in every[1::2]
    assert Counter(half)[HOT] == 5000 and half[0::2] != [HOT] * 5000


def test_spark_runs_word_workloads_only_and_alone():
    from floering.chaos.skew import main
    for argv in (["--spark", "--workloads", "zipf-1.1"], ["--spark", "--replayable"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
