"""The Space-Saving sketch: its error bounds hold for any stream (hypothesis), it
finds the heavy hitters of a Zipf stream in bounded memory, and decay lets a new hot
key take over from an old one."""

import random
from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from floering.node.core.sketch import SpaceSaving

streams = st.lists(st.tuples(st.integers(0, 40), st.integers(1, 5)), max_size=400)


@settings(max_examples=200, deadline=None)
@given(streams, st.integers(1, 12))
def test_counts_bound_the_true_weights_within_total_over_capacity(stream, capacity):
    sketch, truth = SpaceSaving(capacity), Counter()
    for key, weight in stream:
        sketch.add(key, weight)
        truth[key] += weight
    total = sum(truth.values())
    assert sketch.total == total and len(sketch) <= capacity
    slack = total / capacity
    for key, count in sketch.counts.items():
        assert sketch.guaranteed(key) <= truth[key] <= count
        assert sketch.error(key) <= slack + 1e-9
    for key, weight in truth.items():
        if weight > slack:
            assert key in sketch, (key, weight, slack)


def test_the_heavy_hitters_of_a_zipf_stream_are_found_with_few_counters():
    pick = random.Random(7)
    keys = [f"w{i}" for i in range(20_000)]
    weights = [1 / (i + 2.72) ** 1.1 for i in range(len(keys))]
    stream = pick.choices(keys, weights, k=200_000)
    truth = Counter(stream)
    sketch = SpaceSaving(64)
    sketch.add_all(stream)
    assert [k for k, _ in sketch.top(3)] == [k for k, _ in truth.most_common(3)]
    assert {k for k, _ in truth.most_common(10)} <= set(sketch.counts)
    for key, count in sketch.top(10):
        assert 0 <= count - truth[key] <= 200_000 / 64


def test_decay_lets_a_new_hot_key_overtake_an_old_one():
    sketch = SpaceSaving(8)
    for _ in range(1000):
        sketch.add("old")
    for _ in range(20):                     # periods: decay, then the new key's share
        sketch.decay(0.5)
        for _ in range(100):
            sketch.add("new")
    assert sketch.top(1)[0][0] == "new"
    assert sketch.count("old") < 1
    assert sketch.above(0.5) == [("new", sketch.count("new"))]


@pytest.mark.parametrize("bad", [0, -1])
def test_bad_parameters_are_refused(bad):
    with pytest.raises(ValueError):
        SpaceSaving(bad)
    with pytest.raises(ValueError):
        SpaceSaving(4).add("k", bad)
    with pytest.raises(ValueError):
        SpaceSaving(4).decay(bad)
