"""The pure-Python combiner: the interface and meaning of the compiled one
(mapper/ccombine.pyx), used where the extension is missing or FLOE_PURE=1 asks."""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left

import msgpack

from floering.node.core.batch import positions_of

OPS = {"count": 0, "sum": 1, "min": 2, "max": 3, "append": 4}
APPEND = 4
DONE, FULL, OVERFLOW, BAD_KEY, LONG_KEY, NOT_STR = 0, 1, 2, 3, 4, 5
LOWEST, HIGHEST = -(1 << 63), (1 << 63) - 1
_HEADER = bytes((0xC1, 0x02))
ROUTE_AHEAD = 4096    # keys hashed in one call
ENTRY_BYTES = 24      # an entry's bytes in a batch beside its key's (see ccombine)


def check_keys(keys: list, max_key_bytes: int) -> tuple[int, int]:
    """(i, status) of the first key a fold stops at for the key itself (NOT_STR,
    BAD_KEY, LONG_KEY), or (len(keys), DONE) (see ccombine)."""
    if keys and not set(map(type, keys)) - {str} and "".join(keys).isascii() \
            and max(map(len, keys)) <= max_key_bytes:
        return len(keys), DONE
    for i, key in enumerate(keys):
        if type(key) is not str:
            return i, NOT_STR
        try:
            size = len(key.encode())
        except UnicodeEncodeError:
            return i, BAD_KEY
        if size > max_key_bytes:
            return i, LONG_KEY
    return len(keys), DONE


class _Part:
    __slots__ = ("states", "data", "inputs", "nbytes")

    def __init__(self) -> None:
        self.states: dict = {}      # key -> [position, state], in first-seen order
        self.data: dict = {}        # key -> its UTF-8 bytes
        self.inputs = 0
        self.nbytes = 0             # its keys' bytes and ENTRY_BYTES an entry


class _Appended:
    """A part of the append kernel: every tuple an entry of its own, with its seq."""
    __slots__ = ("keys", "data", "positions", "values", "seqs", "nbytes")

    def __init__(self) -> None:
        self.nbytes = 0
        self.keys: list = []
        self.data: list = []
        self.positions: list = []
        self.values: list = []
        self.seqs: list = []

    @property
    def inputs(self) -> int:
        return len(self.keys)


class Combiner:
    """Open partial states per token of `tokens` for reducer `op` (see ccombine)."""

    def __init__(self, op: str, tokens, max_key_bytes: int) -> None:
        if op not in OPS:
            raise ValueError(f"no combining for reducer {op!r}: one of {sorted(OPS)}")
        self.op = OPS[op]
        self.tokens = tuple(tokens)
        if not self.tokens:
            raise ValueError("a ring has at least one token")
        if any(b <= a for a, b in zip(self.tokens, self.tokens[1:])):
            raise ValueError("ring tokens must be increasing")
        self.max_key_bytes = max_key_bytes
        self._part = _Appended if self.op == APPEND else _Part
        self.parts = [self._part() for _ in self.tokens]
        self.opened: list[int] = []
        self.routes: dict = {}      # key -> (token index, position, bytes)

    def count(self, t: int) -> tuple[int, int]:
        part = self.parts[t]
        return part.inputs if isinstance(part, _Appended) else len(part.states), part.inputs

    def _route(self, keys: list, i: int):
        """(token index, position, bytes) of keys[i], None for a key that is not a str,
        not UTF-8 or too long; the keys after it up to ROUTE_AHEAD are hashed with it."""
        routes = self.routes
        if len(routes) > 1 << 20:
            routes.clear()
        distinct, data = [], []
        for key in dict.fromkeys(keys[i:i + ROUTE_AHEAD]):
            if type(key) is not str or key in routes:
                continue
            try:
                raw = key.encode()
            except UnicodeEncodeError:
                continue
            if len(raw) <= self.max_key_bytes:
                distinct.append(key)
                data.append(raw)
        last, tokens = len(self.tokens), self.tokens
        for key, raw, pos in zip(distinct, data, positions_of(data) if data else ()):
            t = bisect_left(tokens, pos)
            routes[key] = (0 if t == last else t, pos, raw)
        return routes.get(keys[i]) if type(keys[i]) is str else None

    def fold(self, keys: list, start: int, value: int, values, size: int, most: int,
             seq0: int = 0, max_bytes: int = 0):
        if values is not None and len(values) != len(keys):
            raise ValueError(f"{len(keys)} keys but {len(values)} values")
        most_bytes = max_bytes if max_bytes > 0 else 1 << 62
        if self.op == APPEND:
            return self._append(keys, start, value, values, size, seq0, most_bytes)
        op, parts, routes = self.op, self.parts, self.routes
        for i in range(start, len(keys)):
            key = keys[i]
            route = routes.get(key) if type(key) is str else None
            if route is None:
                route = self._route(keys, i)
                if route is None:
                    return i, -1, self._why(key)
            t, pos, raw = route
            part = parts[t]
            v = values[i] if values is not None else value
            held = part.states.get(key)
            if held is None:
                if not part.states:
                    self.opened.append(t)
                part.states[key] = [pos, v]
                part.data[key] = raw
                part.nbytes += len(raw) + ENTRY_BYTES
            elif op <= 1:
                if not LOWEST <= held[1] + v <= HIGHEST:
                    return i, t, OVERFLOW
                held[1] += v
            elif (v < held[1]) if op == 2 else (v > held[1]):
                held[1] = v
            part.inputs += 1
            if len(part.states) >= size or part.inputs >= most or part.nbytes >= most_bytes:
                return i + 1, t, FULL
        return len(keys), -1, DONE

    def fold_utf8(self, data, offsets, width: int, start: int, stop: int, value: int,
                  values, size: int, most: int, seq0: int = 0, max_bytes: int = 0):
        """fold() over UTF-8 keys data[offsets[i]:offsets[i + 1]] (see ccombine)."""
        if width not in (4, 8):
            raise ValueError("offsets are 4 or 8 bytes wide")
        raw = bytes(memoryview(data).cast("B")) if data is not None else b""
        offs = memoryview(offsets).cast("B")
        if start < 0 or stop < start or len(offs) < (stop + 1) * width:
            raise ValueError(f"{len(offs)} bytes of offsets for keys {start}..{stop}")
        at = array("i" if width == 4 else "q", offs[:(stop + 1) * width].tobytes())
        if sys.byteorder != "little":
            at.byteswap()
        vals = None
        if values is not None:
            vals = array("q", memoryview(values).cast("B").tobytes())
            if len(vals) < stop:
                raise ValueError(f"{stop} keys but {len(vals)} values")
        keys: list = []
        for i in range(start, stop):
            a, b = at[i], at[i + 1]
            if a < 0 or b < a or b > len(raw):
                break
            try:
                keys.append(raw[a:b].decode())
            except UnicodeDecodeError:
                break
        bad = start + len(keys) < stop
        # fold() indexes keys and values from 0: shift them by `start`
        i, t, status = self.fold(keys, 0, value,
                                 None if vals is None else vals[start:start + len(keys)],
                                 size, most, seq0 + start, max_bytes)
        if status == NOT_STR or (status == DONE and bad):
            return start + i, -1, BAD_KEY
        return start + i, t, status

    def take_columns(self, t: int):
        """Token index t's entries as (key data, int64 offsets, int64 values)."""
        part = self.parts[t]
        self.parts[t] = self._part()
        if isinstance(part, _Appended):
            data, values = part.data, part.values
        else:
            data, values = list(part.data.values()), [s for _, s in part.states.values()]
        offsets = array("q", [0])
        total = 0
        for raw in data:
            total += len(raw)
            offsets.append(total)
        return b"".join(data), offsets.tobytes(), array("q", values).tobytes()

    def _append(self, keys: list, start: int, value: int, values, size: int, seq0: int,
                most_bytes: int):
        routes, parts = self.routes, self.parts
        for i in range(start, len(keys)):
            key = keys[i]
            route = routes.get(key) if type(key) is str else None
            if route is None:
                route = self._route(keys, i)
                if route is None:
                    return i, -1, self._why(key)
            t, pos, raw = route
            part = parts[t]
            if not part.keys:
                self.opened.append(t)
            part.keys.append(key)
            part.data.append(raw)
            part.positions.append(pos)
            part.values.append(values[i] if values is not None else value)
            part.seqs.append(seq0 + i)
            part.nbytes += len(raw) + ENTRY_BYTES
            if len(part.keys) >= size or part.nbytes >= most_bytes:
                return i + 1, t, FULL
        return len(keys), -1, DONE

    def take_seqs(self, t: int) -> tuple[int, int, bytes]:
        part = self.parts[t]
        if not isinstance(part, _Appended):
            raise ValueError("only the append kernel keeps its tuples' seqs")
        seqs = part.seqs
        if not seqs:
            raise ValueError("no tuple in this part")
        contiguous = seqs[-1] - seqs[0] + 1 == len(seqs)
        return seqs[0], seqs[-1], b"" if contiguous else msgpack.packb(seqs)

    def _why(self, key) -> int:
        if type(key) is not str:
            return NOT_STR
        try:
            key.encode()
        except UnicodeEncodeError:
            return BAD_KEY
        return LONG_KEY

    def take(self, t: int, form: int = 2):
        part = self.parts[t]
        if isinstance(part, _Appended):
            self.parts[t] = _Appended()
            out = _columns_of(part.data, part.positions, part.values) if form == 2 else \
                msgpack.packb((part.keys, part.values))
            return out, len(part.keys), len(part.keys)
        states, data = part.states, part.data
        out = _columns(states, data) if form == 2 else \
            msgpack.packb((list(states), [s for _, s in states.values()]))
        counts = len(states), part.inputs
        self.parts[t] = _Part()
        return out, counts[0], counts[1]


def _columns(states: dict, data: dict) -> bytes:
    return _columns_of(data.values(), [p for p, _ in states.values()],
                       [s for _, s in states.values()])


def _columns_of(data, positions: list, values: list) -> bytes:
    offsets = array("Q", [0])
    total = 0
    for raw in data:
        total += len(raw)
        offsets.append(total)
    fields = (b"\x00", b"".join(data), _little(offsets), _little(array("Q", positions)),
              _little(array("q", values)))
    return _HEADER + msgpack.packb(fields, use_bin_type=True)


def _little(arr: array) -> bytes:
    import sys
    if sys.byteorder != "little":
        arr = array(arr.typecode, arr)
        arr.byteswap()
    return arr.tobytes()


def split_words(data, offsets, width: int, start: int, stop: int, validity=None,
                bit_offset: int = 0) -> tuple[bytes, bytes, int]:
    """The words of lines start..stop-1 of an Arrow string array as
    mapper.words.split_words gives them: (word data, int64 offsets, words) (see
    ccombine)."""
    from floering.mapper.words import split_words as split
    if width not in (4, 8):
        raise ValueError("offsets are 4 or 8 bytes wide")
    raw = bytes(memoryview(data).cast("B")) if data is not None else b""
    offs = memoryview(offsets).cast("B")
    if start < 0 or stop < start or len(offs) < (stop + 1) * width:
        raise ValueError(f"{len(offs)} bytes of offsets for lines {start}..{stop}")
    at = array("i" if width == 4 else "q", offs[:(stop + 1) * width].tobytes())
    bits = bytes(memoryview(validity).cast("B")) if validity is not None else None
    words: list[bytes] = []
    for i in range(start, stop):
        bit = bit_offset + i
        if bits is not None and not (bits[bit >> 3] >> (bit & 7)) & 1:
            continue
        a, b = at[i], at[i + 1]
        if a < 0 or b < a or b > len(raw):
            raise ValueError(f"line {i}'s offsets leave the data")
        words.extend(w.encode() for w in split(raw[a:b].decode(errors="replace")))
    ends = array("q", [0])
    total = 0
    for w in words:
        total += len(w)
        ends.append(total)
    return b"".join(words), ends.tobytes(), len(words)
