"""msgpack encodings of states and watermarks, shared by node and mapper.

Reducer states are exact: an integer outside msgpack's 64-bit range (a count that
passed 2**64 - 1) travels as an extension holding its decimal digits, so a large
state never breaks a range's checkpoints or queries.
"""

from __future__ import annotations

import msgpack

from node.core.errors import InvalidArgument

BIG_INT = 1          # msgpack extension code: a Python int as decimal ASCII


def _default(obj):
    if type(obj) is int:
        return msgpack.ExtType(BIG_INT, str(obj).encode("ascii"))
    raise TypeError(f"cannot encode {type(obj).__name__} {obj!r:.80}")


def _ext_hook(code: int, data: bytes):
    if code != BIG_INT:
        raise ValueError(f"unknown msgpack extension {code}")
    return int(data.decode("ascii"))    # Python bounds the digits (int_max_str_digits)


def pack(obj) -> bytes:
    return msgpack.packb(obj, default=_default)


def unpack(data: bytes):
    try:
        return msgpack.unpackb(data, use_list=False, strict_map_key=False, ext_hook=_ext_hook)
    except Exception as exc:
        raise InvalidArgument(f"not valid msgpack: {exc}") from None


def pack_entries(items) -> bytes:
    """[(key, state), ...] or a dict -> msgpack [keys, states]."""
    if isinstance(items, dict):
        return pack((list(items), list(items.values())))
    keys = [k for k, _ in items]
    return pack((keys, [s for _, s in items]))


def unpack_entries(data: bytes) -> dict:
    if not data:
        return {}
    decoded = unpack(data)
    if type(decoded) is not tuple or len(decoded) != 2 or len(decoded[0]) != len(decoded[1]):
        raise InvalidArgument("entries must be msgpack [keys, states] of equal length")
    return dict(zip(*decoded))
