"""SMALOPS as the mapper runs it: heavy streams found per window, moved whole to the
node that best fits them, never split; cold keys stay home."""

from __future__ import annotations

import random
from collections import Counter

from floering.mapper.sharing import chooser_for
from floering.mapper.smalops import SmalopsChooser
from floering.wire.balancers import balancer
from floering.wire.pieces import base_of
from floering.wire.ring import Ring

MEMBERS = {f"n{i}": f"127.0.0.1:{7000 + i}" for i in range(4)}
RING = Ring.initial(MEMBERS, 1, 8, "smalops")


def hot_keys_on(node: str, count: int) -> list[str]:
    return [k for k in (f"h{i}" for i in range(10_000)) if RING.owner(k) == node][:count]


def feed(chooser: SmalopsChooser, keys: list) -> dict:
    """base key -> Counter of the nodes its tuples went to, per window."""
    place = chooser.placer(RING, RING.token_for_key)
    windows: list[dict] = [{}]
    for i, key in enumerate(keys):
        piece, token = place(key)
        assert base_of(piece) == key and token == RING.token_for_key(piece)
        windows[-1].setdefault(key, Counter())[RING.owner_of_token(token)] += 1
        if (i + 1) % chooser.window == 0:
            windows.append({})
    return windows


def heavy_load(windows_part: dict, heavy: set) -> Counter:
    return Counter({n: c for k, per in windows_part.items() if k in heavy
                    for n, c in per.items()}) + Counter(dict.fromkeys(MEMBERS, 0))


def test_heavy_streams_crowded_on_one_node_are_spread_whole_by_best_fit():
    hot = hot_keys_on("n0", 4)
    rng = random.Random(3)
    keys = [rng.choice(hot) if rng.random() < 0.6 else f"cold{rng.randrange(50_000)}"
            for _ in range(60_000)]
    chooser = SmalopsChooser(balancer("smalops").pieces)
    windows = feed(chooser, keys)
    first, last = heavy_load(windows[0], set(hot)), heavy_load(windows[-2], set(hot))
    assert first["n0"] == sum(first.values())          # before any decision: all on n0
    assert max(last.values()) < 0.5 * sum(last.values()), last
    assert chooser.migrations >= 2
    for window in windows:
        for key, per_node in window.items():           # a stream is never split
            assert len(per_node) == 1, (key, per_node)
    colds = {k for w in windows for k in w if k.startswith("cold")}
    assert all(RING.owner(k) in w[k] for w in windows for k in w if k in colds)


def test_a_single_stream_hotter_than_a_node_is_not_moved():
    chooser = SmalopsChooser(balancer("smalops").pieces)
    windows = feed(chooser, ["one"] * 50_000)
    assert chooser.migrations == 0
    assert len({n for w in windows for per in w.values() for n in per}) == 1


def test_a_stream_that_cools_down_goes_home_and_memory_stays_bounded():
    hot = hot_keys_on("n0", 4)
    rng = random.Random(5)
    chooser = SmalopsChooser(balancer("smalops").pieces)
    feed(chooser, [rng.choice(hot) for _ in range(30_000)])
    assert chooser.streams
    # an even load of many keys: nobody is heavy any more
    feed(chooser, [f"k{i}" for i in range(30_000)])
    assert chooser.streams == {}
    assert len(chooser.sketch) <= chooser.sketch.capacity


def test_the_policy_picks_the_smalops_chooser_and_replayable_sources_stay_by_seq():
    assert isinstance(chooser_for(balancer("smalops")), SmalopsChooser)
    assert not isinstance(chooser_for(balancer("smalops"), replayable=True), SmalopsChooser)
