"""msgpack encodings of states and watermarks, shared by node and mapper."""

from __future__ import annotations

import msgpack

from node.core.errors import InvalidArgument


def pack(obj) -> bytes:
    return msgpack.packb(obj)


def unpack(data: bytes):
    try:
        return msgpack.unpackb(data, use_list=False, strict_map_key=False)
    except Exception as exc:
        raise InvalidArgument(f"not valid msgpack: {exc}") from None


def pack_entries(items) -> bytes:
    """[(key, state), ...] or a dict -> msgpack [keys, states]."""
    if isinstance(items, dict):
        return msgpack.packb((list(items), list(items.values())))
    keys = [k for k, _ in items]
    return msgpack.packb((keys, [s for _, s in items]))


def unpack_entries(data: bytes) -> dict:
    if not data:
        return {}
    decoded = unpack(data)
    if type(decoded) is not tuple or len(decoded) != 2 or len(decoded[0]) != len(decoded[1]):
        raise InvalidArgument("entries must be msgpack [keys, states] of equal length")
    return dict(zip(*decoded))
