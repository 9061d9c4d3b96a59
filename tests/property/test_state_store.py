from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from floering.wire.errors import InvalidArgument
from floering.node.core.reducers import Count, Min, TopK
from floering.node.core.state_store import MISSING, LayeredState, ReplicaState


def layered(master=None, inactive=None, active=None, reducer=None):
    s = LayeredState(reducer or Count())
    s.master.update(master or {})
    s.inactive = inactive
    s.active.update(active or {})
    return s


def test_reads_look_active_then_inactive_then_master():
    s = layered(master={"a": 1, "b": 1, "c": 1}, inactive={"a": 2, "b": 2}, active={"a": 3})
    assert [s.get(k) for k in "abc"] == [3, 2, 1]
    assert [s.lookup(k) for k in "abc"] == [3, 2, 1]
    assert s.get("z") is None and s.get("z", MISSING) is MISSING
    assert s.lookup("z") == 0
    assert dict(s.items()) == s.snapshot() == {"a": 3, "b": 2, "c": 1}
    assert sorted(k for k, _ in s.items()) == ["a", "b", "c"]   # each key once
    assert len(s) == 3


def test_a_state_of_none_is_not_a_missing_key():
    s = layered(master={"a": 5}, active={"a": None}, reducer=Min())
    assert s.get("a", "default") is None and s.lookup("a") is None
    assert s.lookup("b") is None and s.get("b", MISSING) is MISSING


def test_len_counts_distinct_keys_over_all_layers():
    assert len(layered()) == 0
    assert len(layered(master={"a": 1, "b": 1})) == 2
    assert len(layered(master={"a": 1}, inactive={"a": 1, "b": 1}, active={"c": 1})) == 3
    assert len(layered(inactive={"b": 1}, active={"b": 2, "d": 1})) == 2


def test_apply_folds_onto_the_newest_layer():
    s = layered(master={"a": 10, "b": 10}, inactive={"a": 20})
    s.apply(("a", "b", "c", "a"), (1, 1, 1, 1))
    assert s.active == {"a": 22, "b": 11, "c": 1}
    assert s.master == {"a": 10, "b": 10} and s.inactive == {"a": 20}  # older layers untouched


def test_a_bad_batch_changes_nothing():
    s = layered(master={"a": 1})
    s.apply(("a",), (1,))
    with pytest.raises(InvalidArgument):
        s.apply(("a", "b"), (1, "x"))
    assert s.snapshot() == {"a": 2} and s.active == {"a": 2}


def test_swap_ships_only_changed_keys_and_merge_moves_them_to_master():
    s = LayeredState(Count())
    s.apply(("a", "b"), (1, 1))
    fragment = s.swap()
    assert fragment == {"a": 1, "b": 1} and s.inactive is fragment and s.active == {}
    s.apply(("a",), (1,))                     # processing goes on during the checkpoint
    assert s.get("a") == 2 and s.get("b") == 1
    with pytest.raises(RuntimeError):
        s.swap()
    assert s.active == {"a": 2} and s.inactive == {"a": 1, "b": 1}   # the failed swap lost nothing
    s.merge_inactive()
    assert s.master == {"a": 1, "b": 1} and s.inactive is None
    assert s.swap() == {"a": 2}
    s.merge_inactive()
    assert s.master == {"a": 2, "b": 1} and s.active == {} and s.inactive is None
    assert s.swap() == {}                     # nothing changed since
    s.merge_inactive()
    s.merge_inactive()                        # without a pending checkpoint: nothing to do
    assert s.master == {"a": 2, "b": 1}


def test_a_fragment_is_not_changed_by_later_updates():
    s = LayeredState(TopK(k=2))
    s.apply(("a",), (5,))
    fragment = s.swap()
    s.apply(("a", "a"), (7, 6))
    s.merge_inactive()
    assert fragment == {"a": (5,)} and s.get("a") == (7, 6)


def test_replace_takes_over_a_range():
    s = layered(master={"a": 1}, inactive={"b": 1}, active={"c": 1})
    s.replace({"x": 5})
    assert (s.master, s.inactive, s.active) == ({"x": 5}, None, {})
    assert s.snapshot() == {"x": 5} and len(s) == 1
    s.apply(("x",), (1,))
    assert s.get("x") == 6


@pytest.mark.parametrize("layer, value", [("master", []), ("active", None),
                                          ("inactive", [("a", 1)]), ("inactive", "same"),
                                          ("master", "same")])
def test_check_invariants_catches_broken_layers(layer, value):
    s = LayeredState(Count())
    s.check_invariants()
    setattr(s, layer, s.active if value == "same" else value)
    with pytest.raises(AssertionError):
        s.check_invariants()


def test_replica_state_follows_fragments_and_copies_a_full_state():
    r = ReplicaState()
    assert len(r) == 0 and r.get("a") is None and r.get("a", 0) == 0
    r.apply_fragment({"a": 1, "b": 2})
    r.apply_fragment({"a": 3})
    assert r.master == {"a": 3, "b": 2} and r.get("a") == 3 and len(r) == 2
    full = {"z": 1}
    r.replace(full)
    r.apply_fragment({"y": 2})
    assert r.master == {"z": 1, "y": 2} and full == {"z": 1}


ops = st.lists(st.one_of(
    st.tuples(st.just("apply"), st.lists(st.tuples(st.sampled_from("abcde"), st.integers(0, 3)),
                                         max_size=8)),
    st.tuples(st.just("bad"), st.lists(st.sampled_from("abcde"), max_size=4)),
    st.just(("swap", None)), st.just(("merge", None))), max_size=40)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_any_interleaving_matches_a_plain_count_and_replicas_follow(operations):
    s, replica, seen = LayeredState(Count()), ReplicaState(), Counter()
    for op, arg in operations:
        if op == "apply":
            s.apply(tuple(k for k, _ in arg), tuple(v for _, v in arg))
            for key, value in arg:
                seen[key] += value
        elif op == "bad":                     # refused whole: changes nothing
            with pytest.raises(InvalidArgument):
                s.apply((*arg, "a"), (1,) * len(arg) + (None,))
        elif op == "swap" and s.inactive is None:
            replica.apply_fragment(s.swap())  # shipped in order
        elif op == "merge":
            s.merge_inactive()
        s.check_invariants()
        assert s.snapshot() == seen
        assert dict(s.items()) == seen and len(list(s.items())) == len(s) == len(seen)
    s.merge_inactive()
    replica.apply_fragment(s.swap())
    s.merge_inactive()
    assert replica.master == s.snapshot() == s.master == seen
