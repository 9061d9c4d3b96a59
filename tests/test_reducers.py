from collections import Counter
from functools import reduce as fold

import pytest
from hypothesis import given, settings, strategies as st

from node.core.errors import InvalidArgument, UnknownReducer
from node.core.reducers import (Count, Max, Min, Reducer, SlidingWindowCount, Sum, TopK,
                                load_reducer, parse_reducer_args)
from node.core.state_store import LayeredState, ReplicaState


class Concat(Reducer):
    """A user reducer without merge: keeps strict one-owner-per-key."""

    def initial(self):
        return ""

    def reduce(self, key, value, state):
        return state + str(value)


class NotAReducer:
    pass


def run(reducer, values, key="k"):
    return fold(lambda s, v: reducer.reduce(key, v, s), values, reducer.initial())


numbers = st.lists(st.integers(-1000, 1000), max_size=30)


@pytest.mark.parametrize("reducer", [Count(), Sum(), Min(), Max(), TopK(k=3),
                                     SlidingWindowCount(window_seconds=10, bucket_seconds=2)])
@settings(max_examples=100)
@given(values=numbers, cut=st.integers(0, 30))
def test_merge_of_partial_folds_equals_the_whole_fold(reducer, values, cut):
    if isinstance(reducer, SlidingWindowCount):
        values = [abs(v) for v in values]
    whole = run(reducer, values)
    assert reducer.merge(run(reducer, values[:cut]), run(reducer, values[cut:])) == whole


def test_builtin_semantics():
    assert run(Count(), [1, 1, 5]) == 7
    assert run(Sum(), [1.5, 2]) == 3.5
    assert (run(Min(), [3, -1, 2]), run(Max(), [3, -1, 2])) == (-1, 3)
    assert run(TopK(k=2), [5, 1, 9, 7]) == (9, 7)
    window = SlidingWindowCount(window_seconds=10, bucket_seconds=1)
    state = run(window, [0, 1, 1, 5, 12])   # 0 and 1 fall out once 12 is seen
    assert window.summary(state) == 2 and state == ((5.0, 1), (12.0, 1))


@pytest.mark.parametrize("reducer, bad", [(Count(), "x"), (Count(), 1.5), (Count(), True),
                                          (Sum(), None), (TopK(), "x"), (Min(), [1])])
def test_a_bad_value_changes_nothing(reducer, bad):
    active = {"a": reducer.reduce("a", 1, reducer.initial())}
    before = dict(active)
    with pytest.raises(InvalidArgument):
        reducer.apply_batch(("a", "b", "c"), (1, 1, bad), active, lambda k: reducer.initial())
    assert active == before


def test_load_reducer_aliases_and_paths():
    assert isinstance(load_reducer("count"), Count)
    topk = load_reducer("topk", k=5)
    assert topk.k == 5 and topk.name == "topk"
    user = load_reducer("tests.test_reducers:Concat")
    assert run(user, [1, 2]) == "12" and user.merge is None


@pytest.mark.parametrize("spec, words", [
    ("nope", "neither a built-in"),
    ("no_such_module_xyz:Thing", "cannot import"),
    ("tests.test_reducers:Missing", "has no Missing"),
    ("tests.test_reducers:NotAReducer", "not a reducer class"),
])
def test_unknown_reducers_say_why(spec, words):
    with pytest.raises(UnknownReducer, match=words):
        load_reducer(spec)


def test_reducer_args():
    assert parse_reducer_args(["k=10", "window_seconds=2.5", "name=x"]) == \
        {"k": 10, "window_seconds": 2.5, "name": "x"}
    with pytest.raises(InvalidArgument):
        parse_reducer_args(["k"])
    with pytest.raises(UnknownReducer):
        load_reducer("topk", k=0)


# ------------------------------------------------------------------ state store

def test_reads_look_active_then_inactive_then_master():
    s = LayeredState(Count())
    s.master["a"] = 1
    s.inactive = {"a": 2, "b": 2}
    s.active["a"] = 3
    assert (s.get("a"), s.get("b"), s.get("c", "none")) == (3, 2, "none")
    assert len(s) == 2


def test_swap_ships_only_changed_keys_and_merge_moves_them_to_master():
    s = LayeredState(Count())
    s.apply(("a", "b"), (1, 1))
    assert s.swap() == {"a": 1, "b": 1}
    s.apply(("a",), (1,))                     # processing goes on during the checkpoint
    with pytest.raises(RuntimeError):
        s.swap()
    s.merge_inactive()
    assert s.swap() == {"a": 2}
    s.merge_inactive()
    assert s.master == {"a": 2, "b": 1} and s.active == {}


ops = st.lists(st.one_of(st.tuples(st.just("apply"), st.lists(st.sampled_from("abcde"), max_size=8)),
                         st.just(("swap", None)), st.just(("merge", None))), max_size=40)


@settings(max_examples=200)
@given(ops)
def test_any_interleaving_matches_a_plain_count_and_replicas_follow(operations):
    s, replica, seen = LayeredState(Count()), ReplicaState(), Counter()
    for op, arg in operations:
        if op == "apply":
            s.apply(tuple(arg), (1,) * len(arg))
            seen.update(arg)
        elif op == "swap" and s.inactive is None:
            replica.apply_fragment(s.swap())
        elif op == "merge":
            s.merge_inactive()
        s.check_invariants()
        assert s.snapshot() == seen
    s.merge_inactive()
    replica.apply_fragment(s.swap())
    s.merge_inactive()
    assert replica.master == s.snapshot() == seen
