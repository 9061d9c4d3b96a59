"""The combiner kernel in use: "compiled" (the Cython extension mapper/ccombine.pyx) or
"python" (mapper/pycombine.py, the same interface), used where the extension is missing
or FLOE_PURE=1 asks for it."""

from __future__ import annotations

import os
from types import ModuleType
from typing import Protocol

from floering.mapper import pycombine

kernel: ModuleType
try:
    if os.environ.get("FLOE_PURE", "") not in ("", "0"):
        raise ImportError("FLOE_PURE asks for the pure-Python combiner")
    from floering.mapper import ccombine as kernel
except ImportError:
    kernel = pycombine
COMBINE_KERNEL = "python" if kernel is pycombine else "compiled"
INT64_LOW, INT64_HIGH = -(1 << 63), (1 << 63) - 1


class Combiner(Protocol):
    """What the batchers use of a kernel's Combiner (ccombine's or pycombine's): open
    parts per token index of `tokens`, `opened` the indexes whose part went from empty
    to holding a key since the caller last emptied it. A fold returns (the index of the
    next key, the token index it stopped at or -1, DONE, FULL or why it stopped)."""

    @property
    def tokens(self) -> tuple: ...

    @property
    def opened(self) -> list[int]: ...

    def fold(self, keys: list, start: int, value: int, values, size: int, most: int,
             seq0: int = 0, max_bytes: int = 0) -> tuple[int, int, int]: ...

    def fold_utf8(self, data, offsets, width: int, start: int, stop: int, value: int,
                  values, size: int, most: int, seq0: int = 0,
                  max_bytes: int = 0) -> tuple[int, int, int]: ...

    def take_seqs(self, t: int) -> tuple[int, int, bytes]: ...

    def take(self, t: int, form: int = 2) -> tuple[bytes, int, int]: ...


def new_combiner(op: str, tokens: tuple, max_key_bytes: int) -> Combiner:
    """The kernel's Combiner for reducer `op` ("count", "sum", "min", "max", "append")
    over the ring's `tokens`."""
    return kernel.Combiner(op, tokens, max_key_bytes)


class KernelBuffer:
    """A token's open buffer held in a kernel (its part `index`)."""
    __slots__ = ("since", "tokens", "index")

    def __init__(self, now: float, tokens: tuple, index: int) -> None:
        self.since = now
        self.tokens = tokens
        self.index = index


def kernel_value(value) -> bool:
    """Whether a kernel takes `value` (an int64)."""
    return type(value) is int and INT64_LOW <= value <= INT64_HIGH
