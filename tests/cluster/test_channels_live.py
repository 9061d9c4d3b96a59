"""Channels to peers are bounded by the ring: one to an address the ring has left and no call
took for a while is closed, on nodes and mappers alike.

The tests here start real node processes; the in-process ones are in
tests/unit/test_channels.py.
"""

from __future__ import annotations

from collections import Counter

import pytest

from floering.floe.cluster import LocalCluster
from floering.mapper import RingClient
from floering.mapper import delivery as delivery_module
from floering.wire import channels as channels_module
from tests.support.helpers import wait_for


@pytest.mark.multiprocess
def test_a_mapper_closes_its_channel_to_a_killed_node_and_counts_stay_exact(
        tmp_path, monkeypatch):
    monkeypatch.setattr(delivery_module, "RETIRE_EVERY", 0.1)
    monkeypatch.setattr(channels_module, "IDLE", 0.3)
    words = [f"w{i % 97}" for i in range(3000)]
    sent: Counter = Counter()
    with LocalCluster.up(3, 1, workdir=str(tmp_path)) as cluster:
        victim = cluster.node("n2")
        seeds = [a for a in cluster.seeds if a != victim.address]   # a seed's stays
        with RingClient(seeds, tls=cluster.tls()) as client:
            client.emit_many(words)
            client.flush()
            sent.update(words)
            channels = client._delivery.channels
            assert victim.address in channels
            cluster.kill("n2")

            def gone() -> bool:
                client.emit_many(words[:300])      # the client keeps feeding meanwhile
                client.flush()
                sent.update(words[:300])
                return victim.address not in channels
            wait_for(gone, timeout=30, what="the channel to the killed node to close")
            assert "n2" not in client.ring.nodes
            assert all(seed in channels for seed in seeds)
            assert dict(client.scan()) == sent
