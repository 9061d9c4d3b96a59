"""Helpers of tests/cluster/test_observability.py that other test files use too: HOST, scrape,
value.
"""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


HOST = "127.0.0.1"


def scrape(port: int) -> dict:
    """{(sample name, labels as a sorted tuple): value} from GET /metrics."""
    with urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=5) as reply:
        assert reply.status == 200
        text = reply.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict, name: str, **labels) -> float:
    return samples[(name, tuple(sorted(labels.items())))]
