"""Per key state of the built-in reducers (count, sum, min, max) as a table of int64
states, and key hashing over packed key columns.

KERNEL names the implementation in use: "compiled" (the Cython extension ctable) or
"python" (pytable, the same interface). FLOE_PURE=1 in the environment forces "python".
"""

from __future__ import annotations

import os
from types import ModuleType

from floering.node.core.columnar import pytable

_compiled: ModuleType | None
try:
    if os.environ.get("FLOE_PURE", "") not in ("", "0"):
        raise ImportError("FLOE_PURE asks for the pure-Python table")
    from floering.node.core.columnar import ctable as _compiled
except ImportError:
    _compiled = None

_kernel: ModuleType = pytable if _compiled is None else _compiled
KERNEL = "python" if _compiled is None else "compiled"
hash_positions, StateTable = _kernel.hash_positions, _kernel.StateTable
# A frame of column states' columns (node.core.state_wire), packed and checked
pack_frame_columns = _kernel.pack_frame_columns
unpack_frame_columns = _kernel.unpack_frame_columns

# The reducers whose states a table holds (int64 states; None for min/max is "absent").
TABLE_OPS = ("count", "sum", "min", "max")

__all__ = ["KERNEL", "StateTable", "TABLE_OPS", "hash_positions", "pack_frame_columns",
           "unpack_frame_columns"]
