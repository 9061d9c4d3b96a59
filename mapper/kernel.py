"""The combiner kernel in use: "compiled" (the Cython extension mapper/ccombine.pyx) or
"python" (mapper/pycombine.py, the same interface), used where the extension is missing
or FLOE_PURE=1 asks for it."""

from __future__ import annotations

import os
from types import ModuleType

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
