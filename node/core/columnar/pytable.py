"""The pure-Python state table: the compiled table's interface and behaviour, for where
the extension is not built (or FLOE_PURE=1 asks for this one)."""

from __future__ import annotations

from array import array

import mmh3

from floering.node.core.columnar.buffers import octets, words


def hash_positions(key_data, offsets) -> array:
    """The ring position of each key in `key_data` cut at `offsets` (n + 1 entries)."""
    data = bytes(octets(key_data, "key_data"))
    offs = words(offsets, "offsets", signed=False).cast("Q")
    n = len(offs) - 1
    if n < 0:
        raise ValueError("offsets must hold n + 1 entries")
    out = array("Q", bytes(8 * n))
    hash64 = mmh3.hash64
    for i in range(n):
        a, b = offs[i], offs[i + 1]
        if a > b or b > len(data):
            raise ValueError(f"offsets must not decrease nor pass the end of key_data (key {i})")
        out[i] = hash64(data[a:b], seed=0, x64arch=True, signed=False)[0]
    return out
