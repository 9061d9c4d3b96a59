"""The throughput benchmark's search for the rate an open-loop feed keeps up with."""

from __future__ import annotations

import pytest

from floering.chaos import bench


@pytest.mark.parametrize("capacity,start", [(1_000_000, 100_000), (1_000_000, 4_000_000),
                                            (250_000, 240_000), (50_000, 3_000_000)])
def test_the_sustained_rate_is_found_within_its_step_below_the_capacity(
        monkeypatch, capacity, start):
    tried = []

    def ring(words, nodes, replicas, rate, seconds, *rest):
        tried.append(rate)        # a ring that keeps up to `capacity`, then falls behind
        behind = 0.05 if rate <= capacity else 0.05 + seconds * (1 - capacity / rate)
        return 0.01, 0.02, 0.03, True, behind

    monkeypatch.setattr(bench, "open_loop", ring)
    rate, exact = bench.sustained_rate([], 4, 1, start, log=lambda line: None)
    assert exact and len(tried) <= bench.MAX_STEPS
    assert capacity / 1.5 <= rate <= capacity
    assert any(r > capacity for r in tried)          # it did find where the ring fell behind


def test_a_feed_that_never_keeps_up_gives_no_rate(monkeypatch):
    monkeypatch.setattr(bench, "open_loop",
                        lambda *a: (1.0, 2.0, 3.0, False, 5.0))
    assert bench.sustained_rate([], 4, 1, 1000.0, log=lambda line: None) == (0.0, False)


def test_the_rpc_cost_benchmark_measures_both_sides_and_stops_its_server():
    import multiprocessing

    from floering.chaos import rpc_cost
    # enough round trips that the server's CPU is many of the kernel's 10 ms ticks
    rows = rpc_cost.measure(1000, [0.0, 0.002])
    assert [gap for gap, _, _ in rows] == [0.0, 0.002]
    for _, client, served in rows:
        assert 0 < client < 0.05 and 0 < served < 0.05     # seconds per round trip
    assert not multiprocessing.active_children()


def test_the_spark_benchmark_counts_cpu_by_kind_of_process(tmp_path):
    import os
    import subprocess
    import sys

    from floering.chaos import spark_bench
    # Children that burn 0.3 s of CPU, then wait: one named as a node process is, one
    # as Spark's JVM is (with pyspark on its command line, as the JVM's classpath has).
    burn = ("import sys, time\nt = time.process_time()\n"
            "while time.process_time() - t < 0.3: pass\nprint(flush=True)\nsys.stdin.read()")
    java = tmp_path / "java"
    os.symlink(sys.executable, java)
    before = spark_bench.cpu_seconds()
    children = [subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                for argv in ([sys.executable, "-c", burn, "floering.node"],
                             [str(java), "-c", burn + "  # -cp pyspark/jars/*"])]
    try:
        for child in children:
            child.stdout.readline()           # it has burnt its CPU
        after = spark_bench.cpu_seconds()
    finally:
        for child in children:
            child.stdin.close()
            child.wait(10)
    for kind in ("nodes", "jvm"):
        assert 0.25 <= after[kind] - before[kind] < 2.0, kind
    # the JVM-named child is not a Python worker (a Spark session of another test may be)
    assert after["python workers"] - before["python workers"] < 0.1
    assert after["driver"] >= before["driver"] > 0
