"""Helpers of tests/cluster/test_metrics_scrape.py that other test files use too: _free_base,
scrape.
"""

from __future__ import annotations

import random
import socket
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def _free_base(count: int) -> int:
    for _ in range(50):
        base = random.randrange(20000, 40000)
        socks = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no free ports")


def scrape(address: str) -> dict[str, float]:
    """Every sample of a node's /metrics: {name{labels}: value}."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out
