"""The reducer API and the built-in reducers.

A reducer is named by import path (`package.module:Class`) or a built-in alias. Its
states must be msgpack-serialisable, and `reduce` must return a new state rather than
mutate the one it is given: older state layers and shipped checkpoints share objects.
"""

from __future__ import annotations

import heapq
import importlib
from numbers import Real

from node.core.errors import InvalidArgument, UnknownReducer


class Reducer:
    name: str = ""
    merge = None  # optional: merge(a, b) -> state, associative and commutative

    def initial(self):
        raise NotImplementedError

    def reduce(self, key, value, state):
        raise NotImplementedError

    def check_value(self, value) -> None:
        """Raise InvalidArgument for a value this reducer cannot take."""

    def check_values(self, values) -> None:
        for value in values:
            self.check_value(value)

    def apply_batch(self, keys, values, active: dict, lookup) -> None:
        """Fold a batch into `active`; lookup(key) gives the state of a key not in it.
        Values are checked first, so a bad batch changes nothing."""
        self.check_values(values)
        reduce = self.reduce
        for key, value in zip(keys, values):
            active[key] = reduce(key, value, active[key] if key in active else lookup(key))

    def sort_key(self, state):
        """The number that ranks keys in top-k queries."""
        return state

    def summary(self, state):
        return state


def _check_numbers(values, what: str) -> None:
    # C-speed scan; only on failure do we look for the culprit.
    if not all(type(v) in (int, float) for v in values):
        bad = next(v for v in values if type(v) not in (int, float))
        raise InvalidArgument(f"{what} values must be numbers, got {type(bad).__name__} {bad!r}")


class Count(Reducer):
    """Adds the integer values: emit(word) (value 1) counts tuples; a mapper may
    pre-combine and emit(word, n)."""

    def initial(self):
        return 0

    def reduce(self, key, value, state):
        return state + value

    def merge(self, a, b):
        return a + b

    def check_values(self, values) -> None:
        if not all(type(v) is int for v in values):
            bad = next(v for v in values if type(v) is not int)
            raise InvalidArgument(f"count values must be int, got {type(bad).__name__} {bad!r}")

    def check_value(self, value) -> None:
        self.check_values((value,))

    def apply_batch(self, keys, values, active: dict, lookup) -> None:
        self.check_values(values)
        get = active.get
        for key, value in zip(keys, values):
            state = get(key)
            active[key] = (lookup(key) if state is None else state) + value


class Sum(Count):
    def check_values(self, values) -> None:
        _check_numbers(values, "sum")


class Min(Reducer):
    def initial(self):
        return None

    def check_values(self, values) -> None:
        _check_numbers(values, "min")

    def check_value(self, value) -> None:
        self.check_values((value,))

    def reduce(self, key, value, state):
        return value if state is None or value < state else state

    def merge(self, a, b):
        return b if a is None else a if b is None else min(a, b)

    def sort_key(self, state):
        return float("-inf") if state is None else state


class Max(Min):
    def check_values(self, values) -> None:
        _check_numbers(values, "max")

    def reduce(self, key, value, state):
        return value if state is None or value > state else state

    def merge(self, a, b):
        return b if a is None else a if b is None else max(a, b)


class TopK(Reducer):
    """Per key, the k largest values seen, largest first."""

    def __init__(self, k: int = 10) -> None:
        if int(k) < 1:
            raise InvalidArgument("topk needs k >= 1")
        self.k = int(k)

    def initial(self):
        return ()

    def check_values(self, values) -> None:
        _check_numbers(values, "topk")

    def check_value(self, value) -> None:
        self.check_values((value,))

    def reduce(self, key, value, state):
        if len(state) >= self.k and value <= state[-1]:
            return state
        return tuple(heapq.nlargest(self.k, (*state, value)))

    def merge(self, a, b):
        return tuple(heapq.nlargest(self.k, (*a, *b)))

    def sort_key(self, state):
        return state[0] if state else float("-inf")


class SlidingWindowCount(Reducer):
    """Per key, event counts in time buckets within `window_seconds` of the newest
    event seen; the value is the event time in seconds."""

    def __init__(self, window_seconds: float = 60, bucket_seconds: float = 1) -> None:
        if float(bucket_seconds) <= 0 or float(window_seconds) < float(bucket_seconds):
            raise InvalidArgument("window needs 0 < bucket_seconds <= window_seconds")
        self.window = float(window_seconds)
        self.bucket = float(bucket_seconds)

    def initial(self):
        return ()

    def check_values(self, values) -> None:
        _check_numbers(values, "window (event time)")

    def check_value(self, value) -> None:
        self.check_values((value,))

    def _trim(self, buckets: dict) -> tuple:
        if not buckets:
            return ()
        newest = max(buckets)
        return tuple((b, c) for b, c in sorted(buckets.items()) if b > newest - self.window)

    def reduce(self, key, value, state):
        start = (value // self.bucket) * self.bucket
        buckets = dict(state)
        buckets[start] = buckets.get(start, 0) + 1
        return self._trim(buckets)

    def merge(self, a, b):
        buckets = dict(a)
        for start, count in b:
            buckets[start] = buckets.get(start, 0) + count
        return self._trim(buckets)

    def sort_key(self, state):
        return sum(c for _, c in state)

    summary = sort_key


BUILTINS = {"count": Count, "sum": Sum, "min": Min, "max": Max, "topk": TopK,
            "window": SlidingWindowCount}


def load_reducer(spec: str, **kwargs) -> Reducer:
    if spec in BUILTINS:
        cls = BUILTINS[spec]
    else:
        module_name, sep, attr = spec.partition(":")
        if not sep or not module_name or not attr:
            raise UnknownReducer(f"reducer {spec!r} is neither a built-in "
                                 f"({', '.join(BUILTINS)}) nor package.module:Class")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise UnknownReducer(f"reducer {spec!r}: cannot import {module_name}: {exc}") from None
        cls = getattr(module, attr, None)
        if cls is None:
            raise UnknownReducer(f"reducer {spec!r}: {module_name} has no {attr}")
        if not (isinstance(cls, type) and callable(getattr(cls, "reduce", None))
                and callable(getattr(cls, "initial", None))):
            raise UnknownReducer(f"reducer {spec!r} is not a reducer class "
                                 f"(needs initial() and reduce(key, value, state))")
    try:
        reducer = cls(**kwargs)
    except (TypeError, ValueError, InvalidArgument) as exc:
        raise UnknownReducer(f"reducer {spec!r} rejects its arguments {kwargs}: {exc}") from None
    if not isinstance(reducer, Reducer):
        # A plain class with the right methods: give it the base behaviour it lacks.
        for name in ("check_value", "check_values", "apply_batch", "sort_key", "summary"):
            if not hasattr(reducer, name):
                setattr(reducer, name, getattr(Reducer, name).__get__(reducer))
    reducer.name = spec
    return reducer


def parse_reducer_args(items) -> dict:
    args = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name.strip():
            raise InvalidArgument(f"reducer argument must be name=value, got {item!r}")
        value: object = text
        for kind in (int, float):
            try:
                value = kind(text)
                break
            except ValueError:
                pass
        args[name.strip()] = value
    return args
