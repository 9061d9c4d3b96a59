"""Combining on the mapper: batches of partial states, pure (no nodes), against the same tuples
sent uncombined.

The tests here start real node processes; the in-process ones are in
tests/property/test_combining.py.
"""

from __future__ import annotations

from collections import Counter

import pytest

from floering.wire.pieces import COMBINED_SOURCE
from tests.support.combining_shared import applied


@pytest.mark.multiprocess
def test_a_combining_client_is_exact_through_a_kill_on_real_nodes(tmp_path):
    """Count and top-k rings fed by combining clients, a node SIGKILLed mid-feed: every
    key exact, and the nodes applied far fewer tuples than were emitted."""
    import random

    from floering.floe.cluster import LocalCluster
    from floering.chaos.corpus import kjv_lines
    from floering.mapper import RingClient, split_words

    words = [w for line in kjv_lines(6000) for w in split_words(line)]
    for spec, args in (("count", []), ("topk", ["--reducer-arg", "k=3"])):
        with LocalCluster.up(4, 1, workdir=tmp_path / spec, reducer=spec,
                             extra_args=args) as cluster:
            with RingClient(cluster.seeds, tls=cluster.tls(), batch_size=200) as client:
                assert client.source.startswith(COMBINED_SOURCE)
                rng = random.Random(5)
                values = [rng.randrange(1000) for _ in words] if spec == "topk" else None
                victim = client.ring.owner("the")
                for i in range(0, len(words), 2000):
                    if i == 20 * 2000:          # batches of the chunks before in flight
                        cluster.kill(victim)
                    if values is None:
                        client.emit_many(words[i:i + 2000])
                    else:
                        for word, value in zip(words[i:i + 2000], values[i:i + 2000]):
                            client.emit(word, value)
                client.flush()
                assert victim not in client.ring.nodes
                got = dict(client.scan())
                applied = sum(s.get("applied", 0) for s in client.stats())
            if values is None:
                assert got == Counter(words)
            else:
                best: dict = {}
                for word, value in zip(words, values):
                    best.setdefault(word, []).append(value)
                assert got == {w: tuple(sorted(v, reverse=True)[:3]) for w, v in best.items()}
            assert applied < len(words) / 2, (spec, applied, len(words))
