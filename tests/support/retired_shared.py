"""Helpers of tests/unit/test_retired.py that other test files use too: WORDS, cluster.
"""

from floering.node.core.reducers import load_reducer
from floering.node.core.retired import RetainingCore
from tests.support.helpers import CoreCluster


WORDS = [f"w{i % 97}" for i in range(600)]


def cluster() -> CoreCluster:
    c = CoreCluster(nodes=3, replication=1)
    c.cores = {n: RetainingCore(n, c.ring, load_reducer("count")) for n in c.cores}
    return c
