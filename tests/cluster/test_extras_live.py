"""Without an extra installed (pyspark, matplotlib made unimportable for the process by a
sitecustomize shim), the Spark driver says in one line which extra to install, and a chaos
run and the recovery benchmark print their verdict and results, the plots skipped in one
line.

The tests here start real node processes; the in-process ones are in
tests/unit/test_extras.py.
"""

from __future__ import annotations

import json

import pytest

from tests.support.extras_shared import _run


@pytest.mark.multiprocess
def test_a_chaos_run_gives_its_verdict_without_plots(tmp_path):
    scenario = tmp_path / "one.toml"
    scenario.write_text('name = "one"\ndescription = "SIGKILL one node"\nnodes = 3\n'
                        'replicas = 1\nduration = 2.0\ntls = false\n'
                        '[[rounds]]\n[[rounds.faults]]\nkind = "kill"\ntarget = "one"\n'
                        'at = 0.8\n[load]\nkeys = "zipf"\nrate = 2000\n')
    out = tmp_path / "out"
    result = _run(tmp_path, ["-m", "floering.floe.cli", "chaos", "run", str(scenario),
                             "--out", str(out)], "matplotlib")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1] == (
        "plots skipped: matplotlib is not installed (pip install 'floe-ring[plots]')")
    saved = json.loads((out / "result.json").read_text())
    assert saved["ok"] is True and len(saved["rounds"]) == 1
    assert "PASS" in result.stdout and not list(out.glob("*.png"))


@pytest.mark.multiprocess
def test_the_recovery_benchmark_prints_its_results_without_plots(tmp_path):
    out = tmp_path / "out"
    result = _run(tmp_path, ["-m", "floering.chaos.recovery", "--nodes", "3", "--trials",
                             "1", "--out", str(out)], "matplotlib")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "plots skipped: matplotlib is not installed (pip install 'floe-ring[plots]')" \
        in result.stderr.splitlines()
    lines = result.stdout.splitlines()
    assert lines[-2].startswith("trial 0: killed ") and "exact=True" in lines[-2]
    assert lines[-1].startswith("n=3 r=1 kill=1: takeover p50 ") and "all exact: True" \
        in lines[-1]
    assert not list(out.glob("*.png"))
