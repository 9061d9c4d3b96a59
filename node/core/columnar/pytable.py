"""The pure-Python state table: the compiled table's interface and behaviour, for where
the extension is not built (or FLOE_PURE=1 asks for this one)."""

from __future__ import annotations

import sys
from array import array
from itertools import islice
from operator import le
from typing import Any

import mmh3

from floering.node.core.columnar.buffers import (columns, decode_keys, in_range, key_parts,
                                                 octets, valid_key, words)


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


# -- frames of column states (node.core.state_wire): the columns' part of a frame --------

_CODES = ((1, "b", 1 << 7), (2, "h", 1 << 15), (4, "i", 1 << 31), (8, "q", 1 << 63))
_WIDTHS = {1: "b", 2: "h", 4: "i", 8: "q"}
_BIG_ENDIAN = sys.byteorder == "big"


def _le(arr: array) -> bytes:
    if _BIG_ENDIAN:
        arr = array(arr.typecode, arr)
        arr.byteswap()
    return arr.tobytes()


def _from_le(code: str, view) -> array:
    out = array(code)
    out.frombytes(view)
    if _BIG_ENDIAN:
        out.byteswap()
    return out


def pack_frame_columns(kinds, key_data, offsets, values, start: int,
                       end: int) -> tuple[int, bytes]:
    """(width, body) of entries start to end of columns (kinds, key_data, offsets of
    n + 1, values): body is the kinds, the offsets from 0 as uint32, the key bytes and
    the values in `width` bytes each (the least of 1, 2, 4, 8 that holds them), all
    little-endian, as a frame of column states lays them out."""
    kv, dv = octets(kinds, "kinds"), octets(key_data, "key_data")
    offs = words(offsets, "offsets", signed=False).cast("Q")
    vals = words(values, "values", signed=True).cast("q")
    n = len(kv)
    if len(offs) != n + 1 or len(vals) != n:
        raise ValueError(f"offsets must hold n + 1 = {n + 1} entries and values n")
    if not 0 <= start <= end <= n:
        raise ValueError(f"entries {start} to {end} are outside the columns of {n}")
    part = offs[start:end + 1].tolist()
    if not all(map(le, part, islice(part, 1, None))) or offs[end] > len(dv):
        raise ValueError("offsets must not decrease nor pass the end of key_data")
    base = part[0]
    if part[-1] - base >= 1 << 32:
        raise OverflowError("a frame's keys are 4 GiB or more: cut it smaller")
    chosen = vals[start:end].tolist()
    low, high = min(chosen, default=0), max(chosen, default=0)
    width, code = next((w, c) for w, c, bound in _CODES if -bound <= low and high < bound)
    return width, b"".join((bytes(kv[start:end]), _le(array("I", [o - base for o in part])),
                            bytes(dv[base:part[-1]]), _le(array(code, chosen))))


def unpack_frame_columns(frame, at: int, n: int, nkeys: int,
                         width: int) -> tuple[bytes, bytes, array, array]:
    """The columns of a frame whose header says `n` entries, `nkeys` key bytes and
    values `width` bytes wide, read from byte `at`: (kinds, key_data, offsets as uint64
    n + 1, values as int64), checked (ValueError: a kind other than 0, 1, 2; offsets
    not 0 first, nkeys last, never decreasing; a frame too short) before any is read."""
    view = octets(frame, "frame")
    if width not in _WIDTHS:
        raise ValueError(f"value width {width}: 1, 2, 4 or 8 bytes")
    if n < 0 or at < 0 or len(view) < at + (5 + width) * n + 4 + nkeys:
        raise ValueError(f"the frame is shorter than its {n} entries and {nkeys} key bytes")
    kinds = bytes(view[at:at + n])
    if kinds.translate(None, b"\x00\x01\x02"):
        raise ValueError("a kind other than 0 (str), 1 (bytes) or 2 (int)")
    at += n
    offsets = array("Q", _from_le("I", view[at:at + 4 * (n + 1)]))
    at += 4 * (n + 1)
    if offsets[0] != 0 or offsets[n] != nkeys or \
            not all(map(le, offsets, islice(offsets, 1, None))):
        raise ValueError(f"offsets must go from 0 to {nkeys} without decreasing")
    keys = bytes(view[at:at + nkeys])
    at += nkeys
    values = _from_le(_WIDTHS[width], view[at:at + width * n])
    return kinds, keys, offsets, values if width == 8 else array("q", values)


OPS = ("count", "sum", "min", "max")
_LOW, _HIGH = -2 ** 63, 2 ** 63


def _five(buffers) -> tuple[Any, Any, Any, Any, Any]:
    if not isinstance(buffers, (tuple, list)) or len(buffers) != 5:
        raise TypeError("buffers must be (kinds, key_data, offsets, positions, values)")
    kinds, key_data, offsets, positions, values = buffers
    return kinds, key_data, offsets, positions, values


def _error(at: int, what: str) -> ValueError:
    return ValueError(f"key {at} {what}; the batch changed nothing")


class StateTable:
    """int64 states of one built-in reducer, keyed by (kind, key bytes, position): a
    dict {(kind, key bytes): [position, state]} and the set of keys changed."""

    def __init__(self, op: str) -> None:
        if op not in OPS:
            raise ValueError(f"a state table's op is one of {', '.join(OPS)}, not {op!r}")
        self.op = op
        self._code = OPS.index(op)
        self._d: dict[tuple[int, bytes], list] = {}
        self._dirty: set[tuple[int, bytes]] = set()

    def _run(self, kinds, key_data, offsets, positions, values, start: int,
             overwrite: bool, mark: bool) -> None:
        kv, dv, ov, pv, vv = columns(kinds, key_data, offsets, positions, values)
        m = len(kv)
        if not 0 <= start <= m:
            raise ValueError(f"start {start} is outside the batch of {m}")
        data, offs = bytes(dv), ov.cast("Q")
        poss, vals = pv.cast("Q"), vv.cast("q")
        table, code, changed = self._d, self._code, []
        new: dict = {}
        hash64 = mmh3.hash64
        for t in range(start, m):
            kind, a, b = kv[t], offs[t], offs[t + 1]
            if kind > 2:
                raise _error(t, "has a kind other than 0 (str), 1 (bytes) or 2 (int)")
            if a > b or b > len(data):
                raise _error(t, "has offsets that decrease or pass the end of key_data")
            key, p, v = (kind, data[a:b]), poss[t], vals[t]
            entry = new.get(key) or table.get(key)
            if entry is None or entry[0] != p:
                if not valid_key(kind, key[1]):
                    raise _error(t, "is not what its kind encodes (str: UTF-8; int: \\0i and"
                                    " a decimal)")
                if hash64(key[1], seed=0, x64arch=True, signed=False)[0] != p:
                    raise _error(t, "has a position that is not its key's hash")
            if entry is None or overwrite:
                state = v
            elif code <= 1:
                state = entry[1] + v
                if not _LOW <= state < _HIGH:
                    raise OverflowError(f"{self.op} of key {t} goes beyond int64; the batch "
                                        f"changed nothing")
            elif (v < entry[1]) if code == 2 else (v > entry[1]):
                state = v
            else:
                continue
            new[key] = [p, state]
            changed.append(key)
        table.update(new)
        if mark:
            self._dirty.update(changed)

    def apply(self, kinds, key_data, offsets, positions, values, start: int = 0) -> None:
        """Fold the batch's tuples from `start` on with the op: all of them, or (an
        error raised) none."""
        self._run(kinds, key_data, offsets, positions, values, start, False, True)

    def merge(self, buffers, mark_dirty: bool = True) -> None:
        """Fold exported states in with the op (a count's state is its value)."""
        self._run(*_five(buffers), 0, False, mark_dirty)

    def install(self, buffers, mark_dirty: bool = False) -> None:
        """Set the states of the buffers' keys to theirs; all or nothing as apply."""
        self._run(*_five(buffers), 0, True, mark_dirty)

    def install_parts(self, parts, mark_dirty: bool = False) -> None:
        """Set the states of the keys of `parts`, each (kinds, key_data, offsets of
        n + 1, values), as install does, in one call (positions hashed here); a key
        given twice takes its later state; all or nothing (ValueError naming the
        entry, counted across the parts)."""
        kinds, data, offsets, values, end = bytearray(), [], array("Q", [0]), array("q"), 0
        for part in parts:
            if not isinstance(part, (tuple, list)) or len(part) != 4:
                raise TypeError("a part must be (kinds, key_data, offsets, values)")
            kv, dv = octets(part[0], "kinds"), octets(part[1], "key_data")
            ov = words(part[2], "offsets", signed=False).cast("Q")
            vv = words(part[3], "values", signed=True).cast("q")
            if len(ov) != len(kv) + 1 or len(vv) != len(kv):
                raise ValueError(f"a part of {len(kv)} keys must hold n + 1 offsets and n "
                                 f"values, got {len(ov)} and {len(vv)}")
            for i, kind in enumerate(kv):
                a, b = ov[i], ov[i + 1]
                if kind > 2:
                    raise _error(len(kinds) + i, "has a kind other than 0 (str), 1 (bytes) "
                                                 "or 2 (int)")
                if a > b or b > len(dv) or b - a >= 0xFFFFFFFF:
                    raise _error(len(kinds) + i, "has offsets that decrease or pass the end "
                                                 "of key_data")
                data.append(bytes(dv[a:b]))
                end += b - a
                offsets.append(end)
            kinds += kv
            values.extend(vv)
        key_data = b"".join(data)
        self._run(bytes(kinds), key_data, offsets, hash_positions(key_data, offsets), values,
                  0, True, mark_dirty)

    def _export(self, keys) -> tuple:
        table = self._d
        rows = sorted((table[key][0], key[0], key[1], table[key][1]) for key in keys)
        offsets, end = array("Q", [0]), 0
        for row in rows:
            end += len(row[2])
            offsets.append(end)
        return (bytes(row[1] for row in rows), b"".join(row[2] for row in rows), offsets,
                array("Q", [row[0] for row in rows]), array("q", [row[3] for row in rows]))

    def export(self, lo: int = 0, hi: int = 0, ordered: bool = True) -> tuple:
        """The keys at positions in (lo, hi] (lo == hi: all), in position order (not
        ordered: as they are kept; here sorted all the same), as (kinds, key_data,
        offsets, positions, values)."""
        lo, hi = _bound(lo), _bound(hi)
        return self._export([key for key, entry in self._d.items()
                             if in_range(entry[0], lo, hi)])

    def take_dirty(self, ordered: bool = True) -> tuple:
        """The keys changed since the previous take (in position order: `ordered`
        is taken for the compiled table's interface); from now on none is changed."""
        out = self._export(self._dirty)
        self._dirty = set()
        return out

    @property
    def dirty_count(self) -> int:
        return len(self._dirty)

    def discard(self, lo: int = 0, hi: int = 0) -> None:
        """Remove the keys at positions in (lo, hi] (lo == hi: all)."""
        lo, hi = _bound(lo), _bound(hi)
        gone = [key for key, entry in self._d.items() if in_range(entry[0], lo, hi)]
        for key in gone:
            del self._d[key]
        self._dirty.difference_update(gone)

    def reserve(self, keys: int, key_bytes: int) -> None:
        """Room for `keys` more keys (the compiled table makes it now; a dict grows
        as it goes)."""
        if keys < 0:
            raise ValueError(f"cannot reserve room for {keys} more keys")

    def grow_index(self, keys: int, most: int) -> bool:
        """Grow the index for `keys` more keys, a share of the work a call: True when
        it holds them already (the compiled table grows it over calls, False after
        each that did a share; a dict grows as it goes)."""
        if keys < 0 or most < 1:
            raise ValueError(f"cannot grow the index for {keys} more keys, {most} a call")
        return True

    def cut(self) -> "TableCut":
        """A TableCut of the table as it is now (every key, as export gives them)."""
        return TableCut(self.export())

    def take_dirty_cut(self) -> "TableCut":
        """As take_dirty, as a TableCut."""
        return TableCut(self.take_dirty())

    def get(self, key, default=None):
        entry = self._d.get(key_parts(key))
        return default if entry is None else entry[1]

    def __contains__(self, key) -> bool:
        return key_parts(key) in self._d

    def items(self, lo: int = 0, hi: int = 0) -> list:
        """(key, state) pairs in position order."""
        kinds, data, offsets, _, values = self.export(lo, hi)
        return list(zip(decode_keys(kinds, data, offsets), values))

    def __len__(self) -> int:
        return len(self._d)

    @property
    def nbytes(self) -> int:
        """Memory the table holds, roughly (dict, tuples, lists and key bytes)."""
        return sys.getsizeof(self._d) + sum(
            sys.getsizeof(key) + sys.getsizeof(key[1]) + sys.getsizeof(entry) + 32
            for key, entry in self._d.items())


class TableCut:
    """A state table as it was at `StateTable.cut()`, given a slice at a time: take(k)
    gives its next k entries (kinds, key_data, offsets from 0, positions, values);
    an empty slice once all were given. (Here the cut is the table's export, made
    at once: the compiled table keeps the states of a cut as batches change them.)"""

    def __init__(self, buffers: tuple) -> None:
        self._buffers: tuple | None = buffers
        self.size = len(buffers[0])
        self._at = 0
        self._parts: list[tuple] = []

    def __len__(self) -> int:
        return self.size

    @property
    def taken(self) -> int:
        return self.size if self._buffers is None else self._at

    def take(self, most: int) -> tuple:
        if most < 1:
            raise ValueError("a slice takes at least one entry")
        if self._buffers is None:
            return b"", b"", array("Q", [0]), array("Q"), array("q")
        kinds, data, offsets, positions, values = self._buffers
        lo = self._at
        hi = min(self.size, lo + most)
        base = offsets[lo]
        out = (kinds[lo:hi], data[base:offsets[hi]],
               array("Q", [o - base for o in offsets[lo:hi + 1]]), positions[lo:hi],
               values[lo:hi])
        self._at = hi
        if hi >= self.size:
            self.close()
        return out

    def part(self, i: int, most: int) -> tuple | None:
        """Slice i of the cut (take's, made once and kept), slices made as needed of
        at most `most` entries each; None past the last."""
        if i < 0:
            raise ValueError("a slice's index is 0 or more")
        while len(self._parts) <= i and self._buffers is not None:
            got = self.take(most)
            if len(got[0]):
                self._parts.append(got)
        return self._parts[i] if i < len(self._parts) else None

    def close(self) -> None:
        self._buffers = None


def _bound(x) -> int:
    if type(x) is not int or not 0 <= x < 2 ** 64:
        raise OverflowError(f"a position bound must be an int in [0, 2**64), got {x!r}")
    return x
