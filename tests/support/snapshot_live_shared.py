"""Helpers of tests/cluster/test_snapshot_live.py that other test files use too: SOURCE,
counts, feed.
"""

from floering.mapper import RingClient


SOURCE = "novel"


def feed(cluster, words) -> None:
    with RingClient(cluster.seeds, source=SOURCE, combine=False, batch_size=500,
                    tls=cluster.tls("client")) as client:
        client.emit_many(words)
        client.flush(timeout=60)


def counts(cluster) -> dict:
    with RingClient(cluster.seeds, tls=cluster.tls("client")) as client:
        return client.scan_all()
