"""The Grafana dashboard the package ships: every metric its queries read is one a real node
serves on /metrics, and it has the panels an operator looks for.

The tests here start real node processes; the in-process ones are in
tests/unit/test_grafana_dashboard.py.
"""

from __future__ import annotations

import pytest

from floering.floe.grafana import dashboard, metric_names, queries
from tests.support.helpers import floe, floe_run
from tests.support.metrics_scrape_shared import _free_base, scrape


@pytest.mark.multiprocess
def test_every_metric_the_dashboard_reads_is_served_by_a_real_node(tmp_path):
    base = _free_base(2)
    try:
        floe(tmp_path, "up", "--nodes", "2", "--memory", "--metrics-port", str(base))
        floe(tmp_path, "status")                     # a gRPC call, timed by method
        served = {name.partition("{")[0] for name in scrape(f"127.0.0.1:{base}")}
    finally:
        floe_run(tmp_path, "down", "--kill")
    read = set().union(*map(metric_names, queries(dashboard())))
    assert len(read) >= 30
    missing = sorted(read - served)
    assert not missing, f"the dashboard reads metrics no node serves: {missing}"
