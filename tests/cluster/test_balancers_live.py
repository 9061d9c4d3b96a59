"""The ring's balancer and the pieces of shared keys: pure rules, the mapper's choice of piece,
and real rings under partial key grouping, exact against a Counter.

The tests here start real node processes; the in-process ones are in
tests/property/test_balancers.py.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from floering.floe.cluster import LocalCluster
from floering.v1 import floe_pb2, floe_pb2_grpc
from floering.mapper import RingClient
from floering.wire.balancers import balancer
from floering.wire.codec import pack, unpack
from floering.wire.pieces import piece_key
from tests.support.helpers import corpus_words


def raw_get(cluster, ring, key) -> int:
    """What the owner of `key` itself holds under it (a piece is not merged there)."""
    with cluster.channel(ring.address(ring.owner(key))) as channel:
        reply = floe_pb2_grpc.QueryPlaneStub(channel).Get(
            floe_pb2.GetRequest(key=pack(key)), timeout=5)
    return unpack(reply.state) if reply.found else 0


@pytest.mark.multiprocess
@pytest.mark.parametrize("policy", ["pkg", "dkg", "smalops", "dchoices", "wchoices"])
def test_a_sharing_ring_reads_every_key_whole_and_exact_through_a_kill(tmp_path, policy):
    words = corpus_words()[:60_000]
    expect = Counter(words)
    with LocalCluster.up(4, 1, workdir=tmp_path, balancer=policy) as cluster:
        tls = cluster.tls("client")
        with RingClient(cluster.seeds, tls=tls) as client:
            assert client.ring.balancer == policy
            client.emit_many(words[:30_000])
            client.flush()
            ring, first = client.ring, Counter(words[:30_000])
            # hot words are spread: their pieces on several nodes hold parts of them
            # (smalops moves a whole stream: a part before the move, a part after)
            for hot, _ in first.most_common(10):
                parts = {i: raw_get(cluster, ring, piece_key(hot, i))
                         for i in range(balancer(policy).pieces)}
                assert sum(parts.values()) == first[hot], parts
                holders = {ring.owner(piece_key(hot, i)) for i, n in parts.items() if n}
                if len(holders) >= 2:
                    break
            assert len(holders) >= 2, parts
            if policy != "smalops":
                assert hot == expect.most_common(1)[0][0]
                assert max(parts.values()) < first[hot] * 3 // 4, parts
            feeder = threading.Thread(target=lambda: (client.emit_many(words[30_000:]),
                                                      client.flush()))
            feeder.start()
            cluster.kill(sorted(holders)[0])          # a node holding a piece of "the"
            feeder.join(120)
            assert not feeder.is_alive()
        with RingClient([n.address for n in cluster.nodes if n.alive()], tls=tls,
                        timeout=30) as client:
            assert client.scan_all() == dict(expect)
            for word in [hot, "and", "Jesus", "zzz-never-sent"]:
                assert client.get(word) == (expect[word] or None), word
            assert [c for _, c in client.top(5)] == [c for _, c in expect.most_common(5)]


@pytest.mark.multiprocess
@pytest.mark.parametrize("policy", ["dkg", "smalops", "dchoices", "wchoices"])
def test_a_shrunk_pools_pieces_are_merged_back_exactly_into_their_keys(tmp_path, policy):
    words = corpus_words()[:40_000]
    expect = Counter(words)
    # Pieces idle for 3 s are merged back: long enough for the spread to be seen after
    # the feed even on a loaded machine (a stream smalops moved stops changing at once).
    with LocalCluster.up(4, 1, workdir=tmp_path, balancer=policy,
                         extra_args=["--piece-idle", "3"]) as cluster:
        with RingClient(cluster.seeds, tls=cluster.tls("client")) as client:
            client.emit_many(words)
            client.flush()
            ring = client.ring
            shared = [w for w, _ in expect.most_common(20)
                      if any(raw_get(cluster, ring, piece_key(w, i)) for i in range(1, 16))]
            assert shared, "no hot word was spread over pieces"
            # a folded piece's state reaches its key once every replica holds the fold
            # (about 1,400 pieces fold, at most 64 a range a round: 5-20 s here, over 90 s
            # at load 13)
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and any(
                    raw_get(cluster, ring, w) != expect[w] or
                    any(raw_get(cluster, ring, piece_key(w, i)) for i in range(1, 16))
                    for w in shared):
                time.sleep(0.2)
            # every piece merged back: the key itself holds the whole count
            for word in shared:
                assert raw_get(cluster, ring, word) == expect[word], word
                assert client.get(word) == expect[word], word
            assert sum(s["pieces_folded"] for s in client.stats()) >= len(shared)
            # the colder keys' pieces fold too: read the whole ring once none has run
            # for longer than a piece's idle time
            folds_settle(client, quiet=4.0, timeout=90)
            assert client.scan_all() == dict(expect)


def folds_settle(client, quiet: float, timeout: float) -> None:
    """Wait until no node's fold epoch has moved for `quiet` seconds."""
    deadline = time.monotonic() + timeout
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        epochs = [s["fold_epoch"] for s in client.stats()]
        if epochs != last:
            last, since = epochs, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return
        time.sleep(0.25)
    raise AssertionError(f"folds still ran {timeout}s on (fold epochs {last})")


@pytest.mark.multiprocess
def test_floe_up_keeps_the_balancer_and_refuses_another_on_the_kept_cluster(tmp_path):
    from tests.support.helpers import floe, floe_run
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("alpha beta alpha alpha")
    try:
        assert "balancer pkg" in floe(tmp_path, "up", "--nodes", "2", "--balancer", "pkg")
        floe(tmp_path, "feed", str(corpus))
        assert floe(tmp_path, "get", "alpha").strip() == "3"
        floe(tmp_path, "down")
        refused = floe_run(tmp_path, "up", "--balancer", "floe")
        assert refused.returncode == 1 and "--balancer floe (kept: pkg)" in refused.stderr
        assert "balancer pkg" in floe(tmp_path, "up")          # brought back as it was
        assert floe(tmp_path, "get", "alpha").strip() == "3"
    finally:
        floe_run(tmp_path, "down")
