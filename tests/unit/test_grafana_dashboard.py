"""The Grafana dashboard the package ships: every metric its queries read is one a
real node serves on /metrics, and it has the panels an operator looks for."""

from __future__ import annotations

import json
import re
import subprocess
import sys


from floering.floe.grafana import DASHBOARD, dashboard, metric_names, queries
from tests.support.helpers import ROOT


def test_the_dashboard_is_grafana_json_with_the_panels_an_operator_needs():
    board = dashboard()
    assert board["uid"] == "floe-ring" and board["schemaVersion"] >= 36
    titles = " / ".join(p["title"] for p in board["panels"]).lower()
    for wanted in ("tuples applied /s", "batch apply time", "event-loop lag",
                   "checkpoint time", "takeover time (histogram)", "keys",
                   "ranges under-replicated", "ranges lost", "resident memory"):
        assert wanted in titles, wanted
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    exprs = queries(board)
    assert len(exprs) >= 30
    # rates come from counters through rate()/increase(), never from a gauge
    for expr in exprs:
        for counter in re.findall(r"(\w+_total)\{", expr):
            assert re.search(rf"(rate|increase)\(\s*{counter}\{{", expr), expr
        for name in metric_names(expr):
            assert f'{name}{{job=~"$job"' in expr or f"label_values({name}," in expr, \
                (name, expr)
    kinds = {p["type"] for p in board["panels"]}
    assert {"timeseries", "stat", "heatmap", "row"} <= kinds
    heat = next(p for p in board["panels"] if p["type"] == "heatmap")
    assert "floe_takeover_seconds_bucket" in heat["targets"][0]["expr"]


def test_the_module_prints_the_dashboard():
    printed = subprocess.run([sys.executable, "-m", "floering.floe.grafana"],
                             capture_output=True, text=True, timeout=60,
                             env={"PYTHONPATH": f"{ROOT}:{ROOT / 'proto'}"})
    assert printed.returncode == 0 and json.loads(printed.stdout) == dashboard()
    assert DASHBOARD.parent.name == "data"      # package data (pyproject)
