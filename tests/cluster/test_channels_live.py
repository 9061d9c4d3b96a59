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



def connections(ports: dict[int, str]) -> set[tuple[str, int]]:
    """This process's established TCP connections to the nodes, as (node, local
    port): each began with a TLS handshake."""
    import psutil
    return {(ports[c.raddr.port], c.laddr.port)
            for c in psutil.Process().net_connections(kind="tcp")
            if c.raddr and c.raddr.port in ports and c.status == "ESTABLISHED"}


@pytest.mark.multiprocess
def test_a_client_after_the_first_connects_once_to_each_node_and_a_stale_name_is_outlived(
        tmp_path, monkeypatch):
    monkeypatch.setattr(delivery_module, "PLACED", {})     # this process saw no ring yet
    words = [f"w{i}" for i in range(2000)]                 # every node gets some
    sent: Counter = Counter()
    with LocalCluster.up(3, 1, workdir=str(tmp_path)) as cluster:
        ports = {int(n.address.rsplit(":", 1)[1]): n.node_id for n in cluster.nodes}
        every = {n.node_id for n in cluster.nodes}

        def feed() -> tuple[Counter, Counter]:
            """(channels the client opened, connections it opened) per node."""
            before = connections(ports)
            with RingClient(cluster.seeds, tls=cluster.tls()) as client:
                client.emit_many(words)
                client.flush()
                sent.update(words)
                opened = Counter(node for node, _ in connections(ports) - before)
                channels = Counter(ports[int(address.rsplit(":", 1)[1])]
                                   for address, _ in client._delivery.channels._open)
                assert dict(client.scan()) == sent
            return channels, opened

        # The first client asks every seed accepting any node, then each member under
        # its own name: two channels to each node. The next expects each seed's member
        # from the first: one channel, at most one handshake a node (gRPC may hand it
        # a connection a closed channel left); it opened two of each before.
        channels, opened = feed()
        assert channels == Counter(dict.fromkeys(every, 2))
        channels, opened = feed()
        assert channels == Counter(dict.fromkeys(every, 1))
        assert set(opened) <= every and max(opened.values(), default=0) <= 1, opened
        # Names placed from a ring whose members moved: every seed refuses them, the
        # client asks again accepting any node, and goes on exactly.
        moved = dict(zip(cluster.seeds, ["n2", "n3", "n1"]))
        monkeypatch.setattr(delivery_module, "PLACED", moved)
        channels, _ = feed()
        assert channels == Counter(dict.fromkeys(every, 2))
        assert delivery_module.PLACED == {n.address: n.node_id for n in cluster.nodes}
