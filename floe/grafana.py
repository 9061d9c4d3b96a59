"""The Grafana dashboard shipped with the package (data/grafana-dashboard.json): a
floe ring's nodes from their /metrics, through a Prometheus data source chosen at
import time. Every query names its metrics with a `{job=~"$job"}` selector.

    python -m floering.floe.grafana > floe-dashboard.json    # then import it in Grafana

Its rows: health (members serving, ranges under-replicated and lost, ring
version); rates over the counters (tuples applied and backed up, duplicates and
refusals, checkpoint and moved bytes, takeovers, deaths declared, handoffs, rejoins,
gRPC calls by method); latency (batch apply time, applier busy fraction, event-loop
lag, checkpoint time, takeover time as a heatmap and its p99, gRPC p99 by method);
state and queues (keys, ring share, queue and its bytes, backups held, overload);
the process (memory, CPU, file descriptors and GC); and the request budgets (bytes
held, waits and refusals, mean wait).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

DASHBOARD = Path(__file__).resolve().parent / "data" / "grafana-dashboard.json"
# A metric in a query: a name right before its label selector.
_SELECTED = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\{")
_METRIC_LIKE = re.compile(r"\b((?:floe|process|python)_[A-Za-z0-9_]+)")


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def queries(board: dict) -> list[str]:
    """Every PromQL expression of the dashboard: its panels' (rows' too) and its
    template variables'."""
    out = []

    def walk(panels):
        for panel in panels:
            out.extend(t["expr"] for t in panel.get("targets", ()) if t.get("expr"))
            walk(panel.get("panels", ()))
    walk(board.get("panels", ()))
    for var in board.get("templating", {}).get("list", ()):
        query = var.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        if var.get("type") == "query" and query:
            out.append(query)
    return out


def metric_names(expr: str) -> set[str]:
    """The metric names a query reads: each written with a label selector (checked:
    a name that looks like a metric and has none is returned as well, so it cannot
    slip by). `label_values(m, label)` reads m."""
    names = set(_SELECTED.findall(expr)) | set(_METRIC_LIKE.findall(expr))
    names |= set(re.findall(r"label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)", expr))
    return names


def main(argv=None) -> int:
    sys.stdout.write(DASHBOARD.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
