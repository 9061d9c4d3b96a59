"""Helpers of tests/property/test_columns.py that other test files use too: KEYS, MALFORMED,
VALUES, fields, pack, spoiled.
"""

import struct

import msgpack

from floering.node.core.columns import BYTES, STR
from floering.wire.hashing import position
from floering.wire.pieces import PIECE_MARK


def fields(keys, values, kinds=None):
    """The five fields of a well-formed format 2 payload, to spoil one at a time."""
    data = [k.encode() if type(k) is str else k for k in keys]
    offsets = [0]
    for d in data:
        offsets.append(offsets[-1] + len(d))
    kinds = kinds if kinds is not None else bytes([STR if type(keys[0]) is str else BYTES])
    return [kinds, b"".join(data), struct.pack(f"<{len(offsets)}Q", *offsets),
            struct.pack(f"<{len(keys)}Q", *map(position, keys)),
            struct.pack(f"<{len(values)}q", *values)]


def pack(f, version=2) -> bytes:
    return bytes((0xC1, version)) + msgpack.packb(f, use_bin_type=True)


KEYS, VALUES = ["ab", "c", "déf"], [1, 2, 3]


def spoiled(i, value):
    f = fields(KEYS, VALUES)
    f[i] = value
    return pack(f)


MALFORMED = {
    "unknown format": (bytes((0xC1, 3)) + b"\x90", "formats 1"),
    "mark alone": (b"\xc1", "formats 1"),
    "not msgpack": (b"\xc1\x02\xc1", "msgpack"),
    "four fields": (pack(fields(KEYS, VALUES)[:4]), "5 bin fields"),
    "a str field": (pack([f.decode("latin-1") if i == 0 else f
                          for i, f in enumerate(fields(KEYS, VALUES))]), "5 bin fields"),
    "short offsets": (spoiled(2, struct.pack("<3Q", 0, 2, 3)), "offsets"),
    "short values": (spoiled(4, struct.pack("<2q", 1, 2)), "values"),
    "long positions": (spoiled(3, b"\x00" * 32), "positions"),
    "kinds of 2": (spoiled(0, b"\x00\x00"), "kinds"),
    "kind 7": (spoiled(0, b"\x07"), "kinds"),
    "offsets decrease": (spoiled(2, struct.pack("<4Q", 0, 3, 1, 7)), "decrease"),
    "last offset short": (spoiled(2, struct.pack("<4Q", 0, 2, 3, 6)), "offsets"),
    "first offset not 0": (spoiled(2, struct.pack("<4Q", 1, 2, 3, 7)), "offsets"),
    "wrong position": (spoiled(3, struct.pack("<3Q", position("ab"), 7, position("déf"))),
                       "hash"),
    "invalid UTF-8": (pack([b"\x00", b"ab\xff\xfe", struct.pack("<2Q", 0, 4),
                            struct.pack("<Q", position(b"ab\xff\xfe")), struct.pack("<q", 1)]),
                      "UTF-8"),
    "key cuts a character": (pack([b"\x00", "é".encode(), struct.pack("<3Q", 0, 1, 2),
                                   struct.pack("<2Q", position(b"\xc3"), position(b"\xa9")),
                                   struct.pack("<2q", 1, 1)]), "UTF-8"),
    "a surrogate": (pack([b"\x00", b"\xed\xb2\x80", struct.pack("<2Q", 0, 3),
                          struct.pack("<Q", position(b"\xed\xb2\x80")), struct.pack("<q", 1)]),
                    "UTF-8"),
    "reserved mark": (pack(fields([b"\x00floe:fold\x00x"], [1])), "reserved"),
    "malformed piece": (pack(fields([PIECE_MARK + b"junk"], [1])), "malformed piece"),
    "key over the limit": (pack(fields(["k" * (64 * 1024 + 1)], [1])), "limit"),
}
