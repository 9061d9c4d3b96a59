"""The column buffers a state table takes and gives, checked and normalised.

A batch or an export is five columns of one length n: kinds (one byte per key: 0 str,
1 bytes, 2 int), key_data (every key's bytes, as hashing.key_bytes gives them, end to
end), offsets (n + 1 uint64: key i is key_data[offsets[i]:offsets[i + 1]]), positions
(n uint64: each key's ring position) and values (n int64). Every field may come from
another process: a malformed one is refused here with TypeError, ValueError or
OverflowError, before a table reads it.
"""

from __future__ import annotations

from array import array

from floering.wire.errors import InvalidKey
from floering.wire.hashing import key_bytes

KIND_STR, KIND_BYTES, KIND_INT = 0, 1, 2
_KIND_OF = {str: KIND_STR, bytes: KIND_BYTES, int: KIND_INT}
_INTEGER_FORMATS = frozenset("bBhHiIlLqQnN")
INT_KEY_PREFIX = b"\x00i"
MAX_INT_KEY_DIGITS = 4300       # Python's own limit on int <-> str conversion


def words(obj, name: str, signed: bool) -> memoryview:
    """`obj` as a C-contiguous byte view of n 8-byte integers."""
    code = "q" if signed else "Q"
    try:
        view = memoryview(obj)
    except TypeError:
        try:
            return memoryview(array(code, obj)).cast("B")
        except OverflowError:
            raise OverflowError(f"{name}: a value is outside the {'int64' if signed else 'uint64'}"
                                f" range") from None
        except TypeError:
            raise TypeError(f"{name} must be a buffer or a sequence of int") from None
    fmt = view.format.lstrip("@=")
    if view.ndim != 1 or fmt not in _INTEGER_FORMATS:
        raise TypeError(f"{name} must be a one-dimensional integer buffer, got format "
                        f"{view.format!r} ndim {view.ndim}")
    if view.itemsize == 8 and (fmt in "qln") == signed:
        return view.cast("B") if view.c_contiguous else memoryview(view.tobytes())
    try:
        return memoryview(array(code, view.tolist())).cast("B")
    except OverflowError:
        raise OverflowError(f"{name}: a value is outside the {'int64' if signed else 'uint64'}"
                            f" range") from None


def octets(obj, name: str) -> memoryview:
    try:
        view = memoryview(obj)
    except TypeError:
        raise TypeError(f"{name} must be a bytes-like buffer, not {type(obj).__name__}") from None
    if view.ndim != 1 or view.itemsize != 1:
        raise TypeError(f"{name} must be a one-dimensional byte buffer")
    view = view.cast("B") if view.format != "B" else view
    return view if view.c_contiguous else memoryview(view.tobytes())


def columns(kinds, key_data, offsets, positions, values=None):
    """The five columns as byte views (values None: only the key columns); ValueError
    when their lengths disagree. Offsets and kinds are checked key by key by the table."""
    kinds, key_data = octets(kinds, "kinds"), octets(key_data, "key_data")
    offsets = words(offsets, "offsets", signed=False)
    positions = words(positions, "positions", signed=False)
    n = len(kinds)
    if len(offsets) != 8 * (n + 1):
        raise ValueError(f"offsets must hold n + 1 = {n + 1} entries, got {len(offsets) // 8}")
    if len(positions) != 8 * n:
        raise ValueError(f"positions must hold n = {n} entries, got {len(positions) // 8}")
    if values is not None:
        values = words(values, "values", signed=True)
        if len(values) != 8 * n:
            raise ValueError(f"values must hold n = {n} entries, got {len(values) // 8}")
    return kinds, key_data, offsets, positions, values


def key_parts(key) -> tuple[int, bytes]:
    """(kind, bytes) of a key; InvalidKey for a type that is not a key."""
    kind = _KIND_OF.get(type(key))
    if kind is None:
        raise InvalidKey(f"key must be str, bytes or int, not {type(key).__name__}")
    return kind, key_bytes(key)


def encode_keys(keys) -> tuple[bytes, bytes, array]:
    """kinds, key_data and offsets of a sequence of keys."""
    kinds, parts, offsets, end = bytearray(), [], array("Q", [0]), 0
    for key in keys:
        kind, data = key_parts(key)
        kinds.append(kind)
        parts.append(data)
        end += len(data)
        offsets.append(end)
    return bytes(kinds), b"".join(parts), offsets


def decode_key(kind: int, data: bytes):
    if kind == KIND_STR:
        return data.decode("utf-8")
    if kind == KIND_BYTES:
        return data
    return int(data[2:])


def decode_keys(kinds, key_data, offsets) -> list:
    data = bytes(key_data)
    offs = memoryview(offsets).cast("B").cast("Q") if not isinstance(offsets, array) else offsets
    return [decode_key(kinds[i], data[offs[i]:offs[i + 1]]) for i in range(len(kinds))]


def valid_key(kind: int, data: bytes) -> bool:
    """Whether `data` is what key_bytes gives for some key of this kind."""
    if kind == KIND_BYTES:
        return True
    if kind == KIND_STR:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return False
        return True
    if kind != KIND_INT or not data.startswith(INT_KEY_PREFIX):
        return False
    digits = data[2:]
    body = digits[1:] if digits[:1] == b"-" else digits
    return (0 < len(body) <= MAX_INT_KEY_DIGITS and body.isdigit() and body.isascii()
            and (body == b"0" or body[:1] != b"0") and digits != b"-0")


def in_range(pos: int, lo: int, hi: int) -> bool:
    """Ring membership, as Ring.in_range: (lo, hi], wrapping; lo == hi is the whole ring."""
    if lo < hi:
        return lo < pos <= hi
    if lo > hi:
        return pos > lo or pos <= hi
    return True
