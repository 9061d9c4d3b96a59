"""A token's next batch goes as soon as a reply completes its last one's delivery, not at the
batcher's next tick: on a fake clock (the batcher, the delivery, one node's stream of
replies), and with real node processes, durable, against a Counter.

The tests here start real node processes; the in-process ones are in
tests/unit/test_mapper_ack_sealing.py.
"""

import time
from collections import Counter

import pytest

from floering.floe.cluster import LocalCluster
from floering.mapper import RingClient


@pytest.mark.multiprocess
def test_ticks_of_tuples_on_a_durable_ring_are_delivered_exactly(tmp_path):
    """An open-loop feed (a tick of tuples every 5 ms) on a durable 4-node r=1 ring
    with mutual TLS: every tuple delivered once, each batch's latency counted."""
    words = [f"w{(i * 7919) % 997}" for i in range(40_000)]
    fed = Counter()
    with LocalCluster.up(4, 1, workdir=tmp_path, data_dir=tmp_path / "data") as cluster:
        with RingClient(cluster.seeds, tls=cluster.tls("client")) as client:
            started = time.monotonic()
            for n, at in enumerate(range(0, len(words), 400)):
                due = started + n * 0.005
                time.sleep(max(0.0, due - time.monotonic()))
                chunk = words[at:at + 400]
                fed.update(chunk)
                client.emit_many(chunk, due=due)
            client.flush()
            delivered = client.delivery_latencies()
            assert sum(n for _, n in delivered) == len(words)
            # where each batch's time went, stamped on its real way (one ring throughout)
            stages = client.delivery_stages()
            assert len(stages) == len(delivered) and all(min(s) >= 0 for s in stages)
            assert dict(client.scan()) == fed
