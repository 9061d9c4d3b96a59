"""The mapper's combiner kernel, compiled (mapper/ccombine.pyx) and pure Python
(mapper/pycombine.py): exact against a Counter, byte for byte the same payloads, and a
client that sends format 2 to nodes that say they decode it.

The tests here start real node processes; the in-process ones are in
tests/property/test_ccombine.py.
"""

from __future__ import annotations

from collections import Counter

import pytest

from floering.node.core.batch import is_versioned


@pytest.mark.multiprocess
def test_a_client_sends_columns_to_nodes_that_decode_them_and_counts_exactly(tmp_path):
    """Default `floe up`-style nodes (4, r=1, TLS): a client by default sends format
    2, combined and every tuple, and columnar=False sends format 1; every count exact."""
    from floering.floe.cluster import LocalCluster
    from floering.chaos.corpus import kjv_lines
    from floering.mapper import RingClient, split_words

    words = [w for line in kjv_lines(3000) for w in split_words(line)]
    expect: Counter = Counter()
    with LocalCluster.up(4, 1, workdir=tmp_path, reducer="count") as cluster:
        for combine, columnar, form in ((True, None, 2), (False, None, 2),
                                        (True, False, 1), (False, False, 1)):
            with RingClient(cluster.seeds, tls=cluster.tls(), batch_size=300,
                            combine=combine, columnar=columnar) as client:
                seen = []
                submit = client._delivery.submit
                client._delivery.submit = lambda b: (seen.append(is_versioned(b.payload)),
                                                     submit(b))
                for i in range(0, len(words), 5000):
                    client.emit_many(words[i:i + 5000])
                client.flush()
                expect.update(words)
                assert seen and set(seen) == {form == 2}, (combine, columnar)
                assert dict(client.scan()) == expect
