"""The reducer API and the built-in reducers.

A reducer is named by import path (`package.module:Class`) or a built-in alias, the
same on every node. Its states must be msgpack-serialisable, and `reduce` must return a
new state rather than mutate the one it is given: older state layers and shipped
checkpoints share objects.

Built-in states are tuples, not lists, because that is what msgpack gives back
(`use_list=False`): a state read from a checkpoint then equals the one that was sent.
"""

from __future__ import annotations

import ast
import importlib
from math import isfinite
from operator import gt, lt
from typing import Any, Callable

from floering.wire.errors import InvalidArgument, UnknownReducer, inert

# Exact types: bool is an int subclass, but True is not a count.
_INT: frozenset[type] = frozenset((int,))
_NUMBER: frozenset[type] = frozenset((int, float))
_INF = float("inf")


class Reducer:
    name: str = ""  # set by load_reducer to the spec it was loaded from
    # optional: merge(a, b) -> state, associative and commutative (states are whatever
    # the reducer keeps)
    merge: Callable[[Any, Any], Any] | None = None
    # True when a state is the initial 0 plus the sum of the values (merge is +):
    # a combining mapper then folds tuples with plain arithmetic.
    additive = False

    def initial(self):
        raise NotImplementedError

    def reduce(self, key, value, state):
        raise NotImplementedError

    def check_value(self, value) -> None:
        """Raise InvalidArgument for a value this reducer cannot take."""

    def check_values(self, values) -> None:
        """check_value over a batch; built-ins override it with a C-speed scan."""
        for value in values:
            self.check_value(value)

    def apply_batch(self, keys, values, active: dict, lookup) -> None:
        """Fold a batch into `active`; lookup(key) gives the state of a key not in it.
        A bad batch changes nothing: values are checked first, and the batch is folded
        into a scratch dict so that a user reduce raising half-way leaves `active` as is."""
        _check_lengths(keys, values)
        self.check_values(values)
        reduce = self.reduce
        new: dict = {}
        for key, value in zip(keys, values):
            state = new[key] if key in new else active[key] if key in active else lookup(key)
            new[key] = reduce(key, value, state)
        active.update(new)

    def check_states(self, states) -> None:
        """Raise InvalidArgument for a state (from another node: a piece's state merged
        back into its key) that `merge` cannot take."""
        initial, merge = self.initial(), self.merge
        if merge is None:
            raise InvalidArgument(f"reducer {self.name or type(self).__name__} merges no state")
        for state in states:
            try:
                merge(initial, state)
            except Exception as exc:
                raise InvalidArgument(f"not a state of reducer {self.name or type(self).__name__}:"
                                      f" {type(exc).__name__}") from None

    def merge_batch(self, keys, states, active: dict, lookup) -> None:
        """As apply_batch, with states merged in (`merge`) instead of values reduced."""
        _check_lengths(keys, states)
        if self.merge is None:
            raise InvalidArgument("this reducer has no merge: it takes no states")
        self.check_states(states)
        merge = self.merge
        new: dict = {}
        for key, state in zip(keys, states):
            held = new[key] if key in new else active[key] if key in active else lookup(key)
            new[key] = merge(held, state)
        active.update(new)

    def combine(self, key, value, n: int):
        """The state `n` tuples (key, value) make from the initial one: what a mapper
        that pre-aggregates sends in their place, merged on the node with `merge`.
        Only asked of reducers with a merge; override it where a product is cheaper."""
        state = self.initial()
        for _ in range(n):
            state = self.reduce(key, value, state)
        return state

    def sort_key(self, state):
        """The number that ranks keys in top-k queries."""
        return state

    def summary(self, state):
        """The json-friendly value queries show."""
        return state


def _check_lengths(keys, values) -> None:
    if len(keys) != len(values):
        raise InvalidArgument(f"batch has {len(keys)} keys but {len(values)} values")


def _check_types(values, allowed: frozenset, what: str) -> None:
    # set(map(type)) runs in C: about twice as fast as all(type(v) is ... for v in values).
    types = set(map(type, values))
    if not types <= allowed:
        bad = next(v for v in values if type(v) not in allowed)
        kinds = " or ".join(sorted(t.__name__ for t in allowed))
        raise InvalidArgument(f"{what} values must be {kinds}, got {type(bad).__name__} {inert(bad)}")
    # NaN breaks ordering (min/max/topk would depend on arrival order) and inf has no
    # time bucket; an inf sum can only turn into NaN. No reducer here takes them.
    if float in types and not all(isfinite(v) for v in values if type(v) is float):
        bad = next(v for v in values if type(v) is float and not isfinite(v))
        raise InvalidArgument(f"{what} values must be finite, got {inert(bad)}")


class Count(Reducer):
    """Adds integer values: emit(word) (value 1) counts tuples; a mapper may pre-combine
    and emit(word, n)."""

    _types = _INT
    additive = True

    def initial(self):
        return 0

    def reduce(self, key, value, state):
        return state + value

    def merge(self, a, b):
        return a + b

    def check_values(self, values) -> None:
        _check_types(values, self._types, type(self).__name__.lower())

    def check_value(self, value) -> None:
        self.check_values((value,))

    def check_states(self, states) -> None:
        self.check_values(states)

    def apply_batch(self, keys, values, active: dict, lookup) -> None:
        # The hot path: no per-tuple method call except lookup for a key new to active.
        _check_lengths(keys, values)
        self.check_values(values)
        for key, value in zip(keys, values):
            active[key] = (active[key] if key in active else lookup(key)) + value

    # A count's state is a value: merging states is applying them (and as fast).
    def merge_batch(self, keys, states, active: dict, lookup) -> None:
        self.apply_batch(keys, states, active, lookup)

    def combine(self, key, value, n: int):
        return value * n


class Sum(Count):
    _types = _NUMBER


class Min(Reducer):
    """The smallest value seen; None before any."""

    _better = staticmethod(lt)

    def initial(self):
        return None

    def check_values(self, values) -> None:
        _check_types(values, _NUMBER, type(self).__name__.lower())

    def check_value(self, value) -> None:
        self.check_values((value,))

    def reduce(self, key, value, state):
        return value if state is None or self._better(value, state) else state

    def merge(self, a, b):
        return self.reduce(None, b, a) if b is not None else a

    def combine(self, key, value, n: int):
        return value

    def apply_batch(self, keys, values, active: dict, lookup) -> None:
        _check_lengths(keys, values)
        self.check_values(values)
        better = self._better
        for key, value in zip(keys, values):
            state = active[key] if key in active else lookup(key)
            # An unchanged state need not enter active: the fragment stays smaller.
            if state is None or better(value, state):
                active[key] = value

    def sort_key(self, state):
        return -_INF if state is None else state


class Max(Min):
    """The largest value seen; None before any."""

    _better = staticmethod(gt)


class TopK(Reducer):
    """Per key, the k largest values seen (repeats count), largest first."""

    def __init__(self, k: int = 10) -> None:
        if type(k) is not int or k < 1:
            raise InvalidArgument(f"topk needs an integer k >= 1, got {k!r}")
        self.k = k

    def initial(self):
        return ()

    def check_values(self, values) -> None:
        _check_types(values, _NUMBER, "topk")

    def check_value(self, value) -> None:
        self.check_values((value,))

    def reduce(self, key, value, state):
        if len(state) >= self.k and value <= state[-1]:
            return state  # the common case once full: nothing to do
        return tuple(sorted((*state, value), reverse=True)[:self.k])

    def merge(self, a, b):
        return tuple(sorted((*a, *b), reverse=True)[:self.k])

    def sort_key(self, state):
        return state[0] if state else -_INF


class SlidingWindowCount(Reducer):
    """Per key, event counts per time bucket: ((bucket_start, count), ...) ascending,
    keeping the buckets that start within `window_seconds` of the newest bucket seen.
    The value is the event time in seconds. The window follows the key's own newest
    event, not a clock, so folds in any order and merges agree."""

    def __init__(self, window_seconds: float = 60, bucket_seconds: float = 1) -> None:
        for name, v in (("window_seconds", window_seconds), ("bucket_seconds", bucket_seconds)):
            if type(v) not in _NUMBER or not 0 < v < _INF:  # NaN fails both comparisons
                raise InvalidArgument(f"window needs a number {name} > 0, got {v!r}")
        if window_seconds < bucket_seconds:
            raise InvalidArgument("window needs bucket_seconds <= window_seconds")
        self.window = window_seconds
        self.bucket = bucket_seconds

    def initial(self):
        return ()

    def check_values(self, values) -> None:
        _check_types(values, _NUMBER, "window (event time)")

    def check_value(self, value) -> None:
        self.check_values((value,))

    def _trim(self, buckets: dict) -> tuple:
        oldest = max(buckets) - self.window
        return tuple(sorted(item for item in buckets.items() if item[0] > oldest))

    def reduce(self, key, value, state):
        start = value // self.bucket * self.bucket
        if state and state[-1][0] == start:  # in-order events: bump the newest bucket
            return (*state[:-1], (state[-1][0], state[-1][1] + 1))
        buckets = dict(state)
        buckets[start] = buckets.get(start, 0) + 1
        return self._trim(buckets)

    def merge(self, a, b):
        if not a or not b:
            return a or b
        buckets = dict(a)
        for start, count in b:
            buckets[start] = buckets.get(start, 0) + count
        return self._trim(buckets)

    def sort_key(self, state):
        return sum(count for _, count in state)

    summary = sort_key


BUILTINS = {"count": Count, "sum": Sum, "min": Min, "max": Max, "topk": TopK,
            "window": SlidingWindowCount}


def load_reducer(spec: str, **kwargs) -> Reducer:
    """A reducer from a built-in alias or "package.module:Class", built with kwargs."""
    cls = BUILTINS.get(spec)
    if cls is None:
        module_name, sep, attr = spec.partition(":")
        if not sep or not module_name or not attr:
            raise UnknownReducer(f"reducer {spec!r} is neither a built-in "
                                 f"({', '.join(BUILTINS)}) nor package.module:Class")
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # user code: a syntax or import error inside it too
            raise UnknownReducer(f"reducer {spec!r}: cannot import {module_name}: "
                                 f"{type(exc).__name__}: {exc}") from None
        cls = getattr(module, attr, None)
        if cls is None:
            raise UnknownReducer(f"reducer {spec!r}: module {module_name} has no {attr}")
        if not (isinstance(cls, type) and issubclass(cls, Reducer)
                and cls.initial is not Reducer.initial and cls.reduce is not Reducer.reduce):
            raise UnknownReducer(f"reducer {spec!r} is not a reducer class (it must subclass "
                                 f"floering.mapper.Reducer and define initial and reduce)")
    try:
        reducer = cls(**kwargs)
    except (TypeError, ValueError, InvalidArgument) as exc:
        raise UnknownReducer(f"reducer {spec!r} rejects its arguments {kwargs}: {exc}") from None
    reducer.name = spec
    return reducer


def reducer_identity(spec: str, kwargs: dict) -> str:
    """What every member of a ring must run alike: the reducer's class (an alias as
    the class it names) and its arguments."""
    cls = BUILTINS.get(spec)
    path = f"{cls.__module__}:{cls.__qualname__}" if cls is not None else spec
    return path + "(" + ", ".join(f"{k}={kwargs[k]!r}" for k in sorted(kwargs)) + ")"


def reducer_from_identity(identity: str) -> Reducer:
    """The reducer a ring records (`reducer_identity`), loaded here; UnknownReducer
    when this process cannot import it or its arguments cannot be read back."""
    path, sep, args = identity.partition("(")
    try:
        call = ast.parse(f"f({args}" if sep else "f()", mode="eval").body
        if not isinstance(call, ast.Call) or call.args:
            raise ValueError("positional arguments")
        if any(kw.arg is None for kw in call.keywords):
            raise ValueError("** arguments")
        kwargs = {str(kw.arg): ast.literal_eval(kw.value) for kw in call.keywords}
    except (SyntaxError, ValueError, TypeError) as exc:
        raise UnknownReducer(f"reducer {identity!r}: arguments not readable: {exc}") from None
    return load_reducer(path, **kwargs)


def parse_reducer_args(items) -> dict:
    """["k=10", "unit=s"] -> {"k": 10, "unit": "s"}: ints, then floats, else strings."""
    args: dict = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier():
            raise InvalidArgument(f"reducer argument must be name=value, got {item!r}")
        if name in args:
            raise InvalidArgument(f"reducer argument {name!r} given twice")
        value: object = text
        for kind in (int, float):
            try:
                value = kind(text)
                break
            except ValueError:
                pass
        args[name] = value
    return args
