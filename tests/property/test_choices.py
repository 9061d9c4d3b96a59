"""D-choices and W-choices as the mapper runs them: keys too hot for two candidates get
more (d from the key's share, or every node), every other key keeps partial key
grouping's two."""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given, settings, strategies as st

from floering.mapper.choices import ChoicesChooser
from floering.mapper.sharing import chooser_for
from floering.wire.balancers import balancer
from floering.wire.pieces import base_of, piece_key
from floering.wire.ring import Ring

MEMBERS = {f"n{i}": f"127.0.0.1:{7000 + i}" for i in range(8)}


def stream(shares: dict, total: int, seed: int = 3) -> list:
    """`total` keys: each of `shares` in its share, the rest spread over cold keys."""
    keys = [k for k, share in shares.items() for _ in range(int(share * total))]
    keys += [f"cold{i % 5000}" for i in range(total - len(keys))]
    random.Random(seed).shuffle(keys)
    return keys


def feed(policy: str, keys: list) -> tuple[ChoicesChooser, Ring, dict]:
    ring = Ring.initial(MEMBERS, 1, 8, policy)
    chooser = chooser_for(balancer(policy))
    place = chooser.placer(ring, ring.token_for_key)
    where: dict = {}
    for key in keys:
        piece, token = place(key)
        assert base_of(piece) == key and token == ring.token_for_key(piece)
        where.setdefault(key, Counter())[ring.owner_of_token(token)] += 1
    return chooser, ring, where


def reachable(ring: Ring, key, pieces: int = 16) -> int:
    return len({ring.owner(piece_key(key, i)) for i in range(pieces)})


def test_wchoices_spreads_a_key_too_hot_for_two_evenly_over_every_node_it_reaches():
    keys = stream({"hot": 0.4}, 80_000)
    chooser, ring, where = feed("wchoices", keys)
    assert chooser.heads["hot"] == 16
    assert len(where["hot"]) == reachable(ring, "hot")
    late = Counter(ring.owner_of_token(chooser.placer(ring, ring.token_for_key)("hot")[1])
                   for _ in range(40_000))
    mean = 40_000 / len(late)
    assert max(late.values()) <= 1.10 * mean, late
    # a cold key keeps partial key grouping's two candidates
    assert all(len(where[f"cold{i}"]) <= 2 for i in range(5000))


def test_dchoices_gives_a_hot_key_as_many_candidates_as_its_share_needs():
    # 30% of the tuples on 8 nodes: ceil(0.3 * 8) + 1 = 4 candidates; 5%: two are enough
    keys = stream({"hot": 0.3, "warm": 0.05}, 80_000)
    chooser, ring, where = feed("dchoices", keys)
    assert chooser.heads == {"hot": 4}
    assert len(where["hot"]) == 4
    assert len(where["warm"]) <= 2
    candidates = chooser.candidates(ring, ring.token_for_key, "hot", 4)
    assert candidates[0][0] == "hot"
    assert {ring.owner_of_token(t) for _, t in candidates} == set(where["hot"])


def test_a_key_that_cools_down_goes_back_to_two_candidates():
    chooser, ring, _ = feed("dchoices", ["hot"] * 20_000)
    assert chooser.heads["hot"] == 9                         # ceil(1.0 * 8) + 1
    place = chooser.placer(ring, ring.token_for_key)
    for i in range(100_000):
        place(f"k{i}")
    assert "hot" not in chooser.heads
    assert {place("hot")[0] for _ in range(10)} <= {"hot", piece_key("hot", 1)}


@settings(max_examples=60, deadline=None)
@given(key=st.one_of(st.text(max_size=12), st.integers(-2 ** 63, 2 ** 63 - 1),
                      st.binary(max_size=12)),
       count=st.integers(min_value=1, max_value=16), tokens=st.integers(1, 8))
def test_candidates_are_on_distinct_nodes_and_begin_with_the_key(key, count, tokens):
    if isinstance(key, bytes) and key.startswith(b"\x00floe:"):
        return
    ring = Ring.initial(MEMBERS, 1, tokens, "wchoices")
    found = ChoicesChooser(16, every_node=True).candidates(ring, ring.token_for_key, key, count)
    nodes = [ring.owner_of_token(t) for _, t in found]
    assert found[0] == (key, ring.token_for_key(key))
    assert len(set(nodes)) == len(nodes) == min(count, reachable(ring, key))
    assert all(t == ring.token_for_key(p) and base_of(p) == key for p, t in found)
