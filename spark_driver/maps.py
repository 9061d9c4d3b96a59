"""Map steps: a function from one input value (a line of text, a rate row's number) to
the keys it emits, or to (key, value) pairs. Named by import path `package.module:name`.

A map step must be deterministic: a replayed micro-batch must emit the same tuples in
the same order, since the ring deduplicates by position.
"""

from __future__ import annotations

import importlib
from typing import Callable, Iterable

from floering.mapper.words import split_words

MapStep = Callable[[object], Iterable]

DEFAULT_TEXT_MAP = "floering.mapper.words:split_words"
DEFAULT_RATE_MAP = "floering.spark_driver.maps:rate_bucket"

# mapper.words in Spark SQL: explode(regexp_extract_all(lower(line), WORD_PATTERN, 0)).
# Both lower-case first and match ASCII letters only, so the only non-ASCII input that
# can become part of a word is what lower-cases into ASCII (U+0130 -> "i" + U+0307,
# the Kelvin sign -> "k"), and Java and Python lower-case those alike; both regex
# engines are backtracking and leftmost-first. tests/spark/test_spark_driver.py checks the
# two agree on apostrophes, unicode letters, digits and such.
WORD_PATTERN = r"[a-z]+(?:'[a-z]+)*"
# The map steps Spark SQL does instead of Python (the Arrow path).
SQL_WORD_MAPS = frozenset({DEFAULT_TEXT_MAP, "floering.spark_driver.maps:words"})


def rate_bucket(value) -> list[int]:
    """The rate source's numbers folded into 100 keys (0..99)."""
    return [int(value) % 100]


def words(line) -> list[str]:
    return split_words(line) if line else []


def sql_words(column):
    """The Spark SQL column of a line column's words, in order (one row per word)."""
    from pyspark.sql import functions as F
    return F.explode(sql_word_arrays(column))


def sql_word_arrays(column):
    """The Spark SQL column of each line's words as an array: split_words in the JVM."""
    from pyspark.sql import functions as F
    return F.regexp_extract_all(F.lower(column), F.lit(WORD_PATTERN), F.lit(0))


def split_in_sql(spec: str) -> bool:
    """Whether the map step is the default word split, which Spark SQL does in the JVM
    (and the tasks get Arrow batches of words) when pyarrow and pandas are installed."""
    return spec in SQL_WORD_MAPS and arrow_available()


def arrow_available() -> bool:
    """DataFrame.mapInArrow needs pyarrow and pandas (the `spark` extra installs them)."""
    try:
        from pyspark.sql.pandas.utils import (require_minimum_pandas_version,
                                              require_minimum_pyarrow_version)
        require_minimum_pyarrow_version()
        require_minimum_pandas_version()
    except Exception:
        return False
    return True


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
