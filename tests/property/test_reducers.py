from functools import reduce as fold

import pytest
from hypothesis import given, settings, strategies as st

from floering.wire.errors import InvalidArgument, UnknownReducer
from floering.node.core.reducers import (BUILTINS, Count, Max, Min, Reducer, SlidingWindowCount, Sum,
                                TopK, load_reducer, parse_reducer_args)


class Concat(Reducer):
    """A user reducer without merge, loaded by import path below."""

    def initial(self):
        return ""

    def check_value(self, value):
        if type(value) is not int or value < 0:
            raise InvalidArgument(f"concat takes non-negative ints, got {value!r}")

    def reduce(self, key, value, state):
        return state + str(value)


class Fragile(Concat):
    """reduce fails half-way through a batch, after check_value let it through."""

    def reduce(self, key, value, state):
        if value == 13:
            raise ZeroDivisionError("unlucky")
        return super().reduce(key, value, state)


class NotAReducer:
    def initial(self):
        return 0

    def reduce(self, key, value, state):
        return state


class NoReduce(Reducer):
    def initial(self):
        return 0


def not_a_class():
    return Count()


def run(reducer, values, key="k"):
    return fold(lambda s, v: reducer.reduce(key, v, s), values, reducer.initial())


def window():
    return SlidingWindowCount(window_seconds=10, bucket_seconds=2)


# ------------------------------------------------------------------ semantics

def test_count_adds_int_values():
    c = Count()
    assert c.initial() == 0
    assert run(c, [1, 1, 5, -2]) == 5
    assert c.merge(3, 4) == 7


def test_sum_adds_ints_and_floats():
    assert run(Sum(), [1.5, 2, -0.5]) == 3.0
    assert Sum().merge(1, 2.5) == 3.5


def test_min_and_max_start_at_none():
    for reducer, expected in ((Min(), -1), (Max(), 3)):
        assert reducer.initial() is None
        assert run(reducer, [3, -1, 2.5]) == expected
        assert reducer.merge(None, 4) == reducer.merge(4, None) == 4
        assert reducer.merge(None, None) is None
        assert reducer.sort_key(None) == float("-inf")
    assert Min().merge(2, 1.5) == 1.5 and Max().merge(2, 1.5) == 2


def test_topk_keeps_the_k_largest_with_repeats_largest_first():
    topk = TopK(k=3)
    assert run(topk, [5, 1, 9, 7, 9, 2]) == (9, 9, 7)
    assert run(topk, [4]) == (4,)
    assert topk.merge((9, 3), (5, 4, 1)) == (9, 5, 4)
    assert topk.sort_key((9, 5)) == 9 and topk.sort_key(()) == float("-inf")
    assert TopK().k == 10
    for k in (0, 2.5, True, "3"):
        with pytest.raises(InvalidArgument):
            TopK(k=k)


def test_window_drops_buckets_older_than_the_window():
    w = SlidingWindowCount(window_seconds=10, bucket_seconds=1)
    state = run(w, [0, 1, 1, 5, 5.5, 12])  # 0 and 1 fall out once 12 is seen
    assert state == ((5, 2), (12, 1))
    assert w.summary(state) == w.sort_key(state) == 3
    assert w.reduce("k", 2, state) == state            # too old: counted, then dropped
    assert w.reduce("k", 2.9, ((12, 1),)) == ((12, 1),)
    assert w.reduce("k", 6, state) == ((5, 2), (6, 1), (12, 1))  # late but in the window
    assert w.merge(((0, 4),), ((10, 1), (11, 2))) == ((10, 1), (11, 2))
    assert w.merge((), ((3, 1),)) == ((3, 1),)


def test_window_buckets_by_bucket_seconds():
    state = run(window(), [0, 1, 3, 3.5, 8])
    assert state == ((0, 2), (2, 2), (8, 1))
    assert run(window(), [8, 3.5, 0, 3, 1]) == state   # order does not matter


@pytest.mark.parametrize("args", [dict(window_seconds=0), dict(bucket_seconds=-1),
                                  dict(window_seconds=1, bucket_seconds=2),
                                  dict(window_seconds=float("nan")), dict(bucket_seconds="1")])
def test_window_rejects_bad_arguments(args):
    with pytest.raises(InvalidArgument):
        SlidingWindowCount(**args)


# ------------------------------------------------------------------ merge and batch properties

ints = st.integers(-1000, 1000)
finite = st.one_of(ints, st.floats(-1e6, 1e6, allow_nan=False))
# Float sums depend on the order of additions, so Sum and Count get ints only.
CASES = [(Count, ints), (Sum, ints), (Min, finite), (Max, finite), (lambda: TopK(k=3), finite),
         (window, st.one_of(st.integers(0, 40), st.floats(0, 40)))]
IDS = ["count", "sum", "min", "max", "topk", "window"]


@pytest.mark.parametrize("make, values", CASES, ids=IDS)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_merge_of_partial_folds_equals_the_whole_fold(make, values, data):
    reducer = make()
    items = data.draw(st.lists(values, max_size=30))
    cut = data.draw(st.integers(0, len(items)))
    whole = run(reducer, items)
    left, right = run(reducer, items[:cut]), run(reducer, items[cut:])
    assert reducer.merge(left, right) == whole
    assert reducer.merge(right, left) == whole


@pytest.mark.parametrize("make, values", CASES + [(Concat, st.integers(0, 99))],
                         ids=IDS + ["user"])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_apply_batch_agrees_with_reduce(make, values, data):
    reducer = make()
    batch = data.draw(st.lists(st.tuples(st.sampled_from("abc"), values), max_size=30))
    older = data.draw(st.dictionaries(st.sampled_from("abcd"), values.map(
        lambda v: reducer.reduce("x", v, reducer.initial()))))
    active = {}
    keys, vals = tuple(k for k, _ in batch), tuple(v for _, v in batch)
    reducer.apply_batch(keys, vals, active,
                        lambda key: older[key] if key in older else reducer.initial())
    expected = dict(older)
    for key, value in batch:
        expected[key] = reducer.reduce(key, value, expected.get(key, reducer.initial()))
    # Keys a batch leaves unchanged may stay out of active (Min, Max).
    assert {**older, **active} == expected
    assert set(active) <= set(keys)


BAD = [(Count, "x"), (Count, 1.5), (Count, True), (Count, None), (Sum, None), (Sum, "1"),
       (Sum, False), (Sum, float("nan")), (Sum, float("inf")), (Min, [1]), (Max, float("nan")),
       (TopK, "x"), (TopK, float("-inf")), (window, float("inf")), (window, b"1"),
       (Concat, -1)]


@pytest.mark.parametrize("make, bad", BAD)
def test_a_batch_with_a_bad_last_value_raises_and_changes_nothing(make, bad):
    reducer = make()
    good = 3
    active = {"a": reducer.reduce("a", good, reducer.initial())}
    before = dict(active)
    with pytest.raises(InvalidArgument):
        reducer.apply_batch(("a", "b", "c"), (good, good, bad), active,
                            lambda k: reducer.initial())
    assert active == before
    with pytest.raises(InvalidArgument):
        reducer.check_value(bad)
    reducer.check_value(good)


@pytest.mark.parametrize("make", [Count, Min, Concat])
def test_keys_and_values_of_different_lengths_are_refused(make):
    reducer, active = make(), {}
    with pytest.raises(InvalidArgument, match="2 keys but 1 values"):
        reducer.apply_batch(("a", "b"), (1,), active, lambda k: reducer.initial())
    assert active == {}


def test_a_user_reduce_failing_half_way_changes_nothing():
    reducer, active = Fragile(), {"a": "1"}
    with pytest.raises(ZeroDivisionError):
        reducer.apply_batch(("a", "b", "a"), (2, 13, 4), active, lambda k: "")
    assert active == {"a": "1"}


def test_defaults_accept_anything_and_show_the_state():
    r = Reducer()
    assert r.merge is None
    r.check_value(object())
    assert r.sort_key(5) == r.summary(5) == 5
    with pytest.raises(NotImplementedError):
        r.initial()


# ------------------------------------------------------------------ loading

@pytest.mark.parametrize("alias, cls", [("count", Count), ("sum", Sum), ("min", Min),
                                        ("max", Max), ("topk", TopK),
                                        ("window", SlidingWindowCount)])
def test_aliases(alias, cls):
    reducer = load_reducer(alias)
    assert type(reducer) is cls and reducer.name == alias
    assert BUILTINS[alias] is cls


def test_aliases_take_arguments():
    topk = load_reducer("topk", k=5)
    assert topk.k == 5 and topk.name == "topk"
    w = load_reducer("window", window_seconds=30, bucket_seconds=5)
    assert (w.window, w.bucket) == (30, 5)


def test_import_path_of_a_user_reducer():
    user = load_reducer("tests.property.test_reducers:Concat")
    assert type(user).__name__ == "Concat" and isinstance(user, Reducer)
    assert user.name == "tests.property.test_reducers:Concat"
    assert run(user, [1, 2]) == "12" and user.merge is None
    assert load_reducer("floering.node.core.reducers:TopK", k=2).k == 2


@pytest.mark.parametrize("spec, words", [
    ("nope", "neither a built-in"),
    ("tests.property.test_reducers", "neither a built-in"),
    (":Count", "neither a built-in"),
    ("no_such_module_xyz:Thing", "cannot import no_such_module_xyz"),
    ("tests.property.test_reducers:Missing", "has no Missing"),
    ("tests.property.test_reducers:NotAReducer", "not a reducer class"),
    ("tests.property.test_reducers:NoReduce", "not a reducer class"),
    ("tests.property.test_reducers:not_a_class", "not a reducer class"),
    ("floering.node.core.reducers:Reducer", "not a reducer class"),
])
def test_unknown_reducers_say_why(spec, words):
    with pytest.raises(UnknownReducer, match=words) as info:
        load_reducer(spec)
    assert repr(spec) in str(info.value)


def test_a_user_module_that_fails_to_import(monkeypatch):
    def broken(name):
        raise SyntaxError("invalid syntax (user.py, line 3)")
    monkeypatch.setattr("importlib.import_module", broken)
    with pytest.raises(UnknownReducer, match="cannot import user: SyntaxError"):
        load_reducer("user:Thing")


@pytest.mark.parametrize("spec, args", [("topk", dict(k=0)), ("count", dict(k=3)),
                                        ("window", dict(bucket_seconds=0))])
def test_arguments_a_reducer_rejects(spec, args):
    with pytest.raises(UnknownReducer, match="rejects its arguments"):
        load_reducer(spec, **args)


def test_reducer_args():
    assert parse_reducer_args(["k=10", "window_seconds=2.5", "unit=s", " pad = 7",
                               "empty="]) == \
        {"k": 10, "window_seconds": 2.5, "unit": "s", "pad": 7, "empty": ""}
    assert parse_reducer_args([]) == {}
    for bad in (["k"], ["=3"], ["1x=2"], ["k=1", "k=2"]):
        with pytest.raises(InvalidArgument):
            parse_reducer_args(bad)
