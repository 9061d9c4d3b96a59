"""`floe feed` on a ring that shares keys, with real node processes: a file whose every
other word is one word is spread by the routing plan made from its first chunk, and a
rerun after a crash half way and a node killed meanwhile sends every seq to the piece
it went to (the plan kept with the feed's state): counts exact."""

from __future__ import annotations

from collections import Counter

import pytest

from floering.floe.cluster import LocalCluster
from floering.chaos.corpus import kjv_lines
from floering.floe.feed import Progress, check_inputs, feed
from floering.mapper import RingClient, split_words

pytestmark = pytest.mark.multiprocess

HOT = "floe"


def every_other_file(path, lines: int = 12_000) -> Counter:
    words = [w for line in kjv_lines(lines) for w in split_words(line)]
    text = [w for x in words for w in (HOT, x)]
    path.write_text("\n".join(" ".join(text[i:i + 20]) for i in range(0, len(text), 20)))
    return Counter(text)


class Crashing:
    """A client that dies after `chunks` chunks were handed over, unflushed."""

    def __init__(self, client, chunks: int) -> None:
        self.client, self.left = client, chunks

    def __getattr__(self, name):
        return getattr(self.client, name)

    def emit_many(self, keys, *args, **kwargs):
        if self.left == 0:
            raise KeyboardInterrupt
        self.left -= 1
        return self.client.emit_many(keys, *args, **kwargs)


def max_over_mean(client) -> float:
    loads = [s["applied"] for s in client.stats() if "error" not in s]
    return max(loads) / (sum(loads) / len(loads))


def test_a_hot_word_at_every_other_position_is_fed_evenly_with_pkg(tmp_path):
    corpus = tmp_path / "hot.txt"
    expect = every_other_file(corpus)
    inputs = check_inputs([str(corpus)], key=b"k" * 32)
    with LocalCluster.up(4, 1, workdir=tmp_path / "ring", balancer="pkg") as cluster, \
            RingClient(cluster.seeds, tls=cluster.tls("client"), source="x") as client:
        assert feed(client, inputs, Progress(0, show=False), plans=tmp_path / "plans") \
            == sum(expect.values())
        assert client.scan_all() == dict(expect)
        ratio = max_over_mean(client)
    assert ratio <= 1.3, ratio
    assert [p.name for p in (tmp_path / "plans").iterdir()] == [f"{inputs[0].source}.plan"]


def test_a_rerun_after_a_crash_and_a_node_killed_counts_every_word_once(tmp_path):
    corpus = tmp_path / "hot.txt"
    expect = every_other_file(corpus)
    inputs = check_inputs([str(corpus)], key=b"k" * 32)
    plans = tmp_path / "plans"
    with LocalCluster.up(4, 1, workdir=tmp_path / "ring", balancer="dkg") as cluster:
        with RingClient(cluster.seeds, tls=cluster.tls("client"), source="x") as client:
            with pytest.raises(KeyboardInterrupt):
                feed(Crashing(client, 2), inputs, Progress(0, show=False), plans=plans)
        kept = (plans / f"{inputs[0].source}.plan").read_bytes()
        cluster.kill(cluster.nodes[2].node_id)
        with RingClient(cluster.seeds, tls=cluster.tls("client"), source="y") as client:
            before = client.scan_all()
            assert 0 < sum(before.values()) < sum(expect.values())
            feed(client, inputs, Progress(0, show=False), plans=plans)
            assert client.scan_all() == dict(expect)
            assert sum(s["duplicates"] for s in client.stats() if "error" not in s) > 0
    assert (plans / f"{inputs[0].source}.plan").read_bytes() == kept
