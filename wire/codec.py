"""msgpack encodings of states and watermarks, shared by node and mapper.

Reducer states are exact: an integer outside msgpack's 64-bit range (a count that
passed 2**64 - 1) travels as an extension holding its decimal digits, so a large
state never breaks a range's checkpoints or queries.
"""

from __future__ import annotations

from io import BytesIO
from itertools import chain, islice
from operator import itemgetter
from typing import Iterable, Iterator

import msgpack

from floering.wire.errors import InvalidArgument

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


# Entries are msgpack [keys, states]: two arrays of equal length. A key may occur more
# than once; the last occurrence wins (a full checkpoint sends its range's master and
# then, over it, the keys changed since).

SLICE = 8192         # entries per step of the sliced encoders below


def entry_columns(items) -> tuple[int, Iterable, Iterable]:
    """(count, keys, states) of a dict, of a mapping made of `layers` (dicts, each one
    laid over the ones before it), or of a sequence of (key, state) pairs."""
    layers = items.layers if hasattr(items, "layers") else \
        (items,) if isinstance(items, dict) else None
    if layers is None:
        return len(items), map(itemgetter(0), items), map(itemgetter(1), items)
    return (sum(map(len, layers)), chain.from_iterable(layers),
            chain.from_iterable(layer.values() for layer in layers))


def entry_count(items) -> int:
    """How many entries pack_entries(items) encodes (a key of several layers counts
    once per layer)."""
    return entry_columns(items)[0]


def pack_entries(items) -> bytes:
    """[(key, state), ...], a dict or a layered mapping -> msgpack [keys, states]."""
    if isinstance(items, dict):
        return pack((list(items), list(items.values())))
    _, keys, states = entry_columns(items)
    return pack((list(keys), list(states)))


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x90 | n,))
    return (b"\xdc" + n.to_bytes(2, "big")) if n < 1 << 16 else (b"\xdd" + n.to_bytes(4, "big"))


def _array_in_slices(n: int, values: Iterable, size: int) -> Iterator[bytes]:
    yield _array_header(n)
    it = iter(values)
    for start in range(0, n, size):
        chunk = list(islice(it, size))
        if len(chunk) != min(size, n - start):
            raise RuntimeError("entries changed while they were packed")
        yield memoryview(pack(chunk))[len(_array_header(len(chunk))):]


def pack_entries_sliced(items, size: int = SLICE) -> Iterator[bytes]:
    """pack_entries(items) in pieces, each the work of at most `size` entries; joined,
    they are exactly pack_entries(items). Between two pieces the caller may do other
    work, as long as `items` does not change meanwhile."""
    n, keys, states = entry_columns(items)
    yield _array_header(2)
    yield from _array_in_slices(n, keys, size)
    yield from _array_in_slices(n, states, size)


def unpack_columns(data: bytes) -> tuple[tuple, tuple]:
    """msgpack [keys, states] -> (keys, states), checked to be two arrays of equal
    length."""
    if not data:
        return (), ()
    decoded = unpack(data)
    if type(decoded) is not tuple or len(decoded) != 2 or \
            type(decoded[0]) is not tuple or type(decoded[1]) is not tuple or \
            len(decoded[0]) != len(decoded[1]):
        raise InvalidArgument("entries must be msgpack [keys, states] of equal length")
    return decoded


def unpack_entries(data: bytes) -> dict:
    return dict(zip(*unpack_columns(data)))


def _take(unpacker: msgpack.Unpacker, n: int) -> list:
    got = list(islice(unpacker, n))
    if len(got) != n:
        raise InvalidArgument("not valid msgpack: entries cut short")
    return got


def _pairs_reader(data: bytes) -> tuple[msgpack.Unpacker, int]:
    """An unpacker over msgpack [keys, states] read past the keys' array header, and
    the number of keys. Read from the bytes as they are (fed, they would be copied
    first, in one go); the limits on lengths are those unpack() puts on `data`."""
    unpacker = msgpack.Unpacker(BytesIO(data), read_size=min(len(data), 1 << 20),
                                use_list=False, strict_map_key=False, ext_hook=_ext_hook,
                                max_buffer_size=len(data))
    if unpacker.read_array_header() != 2:
        raise InvalidArgument("entries must be msgpack [keys, states] of equal length")
    return unpacker, unpacker.read_array_header()


def _entries_in_slices(out: dict, data: bytes, size: int) -> Iterator[None]:
    unpacker, n = _pairs_reader(data)
    keys: list = []
    while len(keys) < n:
        keys += _take(unpacker, min(size, n - len(keys)))
        yield
    if unpacker.read_array_header() != n:
        raise InvalidArgument("entries must be msgpack [keys, states] of equal length")
    for start in range(0, n, size):
        out.update(zip(keys[start:start + size], _take(unpacker, min(size, n - start))))
        yield
    if unpacker.tell() != len(data):
        raise InvalidArgument("not valid msgpack: extra data after the entries")


def _columns_in_slices(out: list, data: bytes, size: int) -> Iterator[None]:
    unpacker, n = _pairs_reader(data)
    columns: list[list] = []
    for _ in range(2):
        if columns and unpacker.read_array_header() != n:
            raise InvalidArgument("entries must be msgpack [keys, states] of equal length")
        column: list = []
        while len(column) < n:
            column += _take(unpacker, min(size, n - len(column)))
            yield
        columns.append(column)
    if unpacker.tell() != len(data):
        raise InvalidArgument("not valid msgpack: extra data after the entries")
    out[:] = [tuple(columns[0]), tuple(columns[1])]


def unpack_columns_sliced(out: list, data: bytes, size: int = SLICE) -> Iterator[None]:
    """unpack_columns(data) into the empty list `out` ([keys, states] once done), at
    most `size` entries per step: yields between two steps. Refuses what
    unpack_columns refuses (a malformed column as not valid msgpack)."""
    if not data:
        out[:] = [(), ()]
        return
    try:
        yield from _columns_in_slices(out, data, size)
    except InvalidArgument:
        raise
    except Exception as exc:
        raise InvalidArgument(f"not valid msgpack: {exc}") from None


def unpack_entries_sliced(out: dict, data: bytes, size: int = SLICE) -> Iterator[None]:
    """unpack_entries(data) into the empty dict `out`, at most `size` entries per step:
    yields between two steps (the caller may do other work, leaving `out` alone).
    Refuses what unpack_entries refuses (and [keys, states] that are not arrays)."""
    if not data:
        return
    try:
        yield from _entries_in_slices(out, data, size)
    except InvalidArgument:
        raise
    except Exception as exc:
        raise InvalidArgument(f"not valid msgpack: {exc}") from None
