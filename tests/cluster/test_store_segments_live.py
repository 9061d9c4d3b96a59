"""A data directory keeps each range's states as segments (frames of column states,
node.core.state_wire): a whole range as generation 0, each checkpoint's changed keys as the
next generation, folded back into one generation 0 past a bound. Read back exact; a damaged
segment is its range corrupt, named; a directory of the earlier format (one entry a key) is
still read, and one of a newer format refused.

The tests here start real node processes; the in-process ones are in
tests/unit/test_store_segments.py.
"""

import pytest

from floering.node.storage import node_store
from floering.node.storage.node_store import CopyWrite, NodeStore, write_per_key


@pytest.mark.multiprocess
def test_a_cluster_killed_on_directories_of_the_earlier_format_comes_back_exact(tmp_path):
    """Every node's copies rewritten as format 1 left them (one entry a key, no `V`)
    while the cluster is down: each node comes back as itself from them, exact, then
    writes segments over them, and comes back exact again."""
    from collections import Counter

    from floering.mapper import RingClient
    from tests.support.helpers import wait_checkpoint_rounds, wait_for
    from tests.support.durable_shared import durable_cluster, restart_all
    words = [f"w{i % 700}" for i in range(9000)]
    more = [f"v{i % 300}" for i in range(3000)] + words[:2000]

    def to_format_1():
        for node in sorted((tmp_path / "data").iterdir()):
            store = NodeStore(node)
            loaded = store.load()
            assert loaded.copies and store.db.get(node_store.VERSION) is not None
            write_per_key(store, [CopyWrite(t, c.primary, c.states, c.watermarks, True,
                                            c.complete) for t, c in loaded.copies.items()])
            assert not any(node_store._is_segment(k) for k, _ in store.db.items())
            store.close()

    with durable_cluster(tmp_path) as cluster:
        with RingClient(cluster.seeds, tls=cluster.tls()) as client:
            client.emit_many(words)
            client.flush()
        wait_checkpoint_rounds(cluster)          # a checkpoint round writes the copies
        restart_all(cluster, to_format_1)
        with RingClient(cluster.seeds, tls=cluster.tls(), timeout=30) as client:
            assert dict(client.scan()) == Counter(words)
            client.emit_many(more)
            client.flush()
        wait_checkpoint_rounds(cluster)
        restart_all(cluster)
        with RingClient(cluster.seeds, tls=cluster.tls(), timeout=30) as client:
            wait_for(lambda: dict(client.scan()) == Counter(words + more), 30,
                     "every count after the second restart")
        logs = "".join(open(n.log).read() for n in cluster.nodes)
        assert "corrupt" not in logs and "joins empty" not in logs
    for node in sorted((tmp_path / "data").iterdir()):
        store = NodeStore(node)                  # format 2 from the first write on
        assert store.db.get(node_store.VERSION) == bytes([node_store.FORMAT])
        assert any(node_store._is_segment(k) for k, _ in store.db.items())
        store.close()
