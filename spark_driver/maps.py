"""Map steps: a function from one input value (a line of text, a rate row's number) to
the keys it emits, or to (key, value) pairs. Named by import path `package.module:name`.

A map step must be deterministic: a replayed micro-batch must emit the same tuples in
the same order, since the ring deduplicates by position.
"""

from __future__ import annotations

import importlib
from typing import Callable, Iterable

from mapper.words import split_words

MapStep = Callable[[object], Iterable]

DEFAULT_TEXT_MAP = "mapper.words:split_words"
DEFAULT_RATE_MAP = "spark_driver.maps:rate_bucket"


def rate_bucket(value) -> list[int]:
    """The rate source's numbers folded into 100 keys (0..99)."""
    return [int(value) % 100]


def words(line) -> list[str]:
    return split_words(line) if line else []


def load_map(spec: str) -> MapStep:
    """Resolve `package.module:function`; a clear error when it cannot."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"map step {spec!r} must be package.module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import the map step's module {module_name!r}: {exc}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"{module_name} has no function {attr!r}")
    return fn
