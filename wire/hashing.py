"""Stable key hashing: 64-bit MurmurHash3 of the key's bytes, the same in every process
(never the built-in hash(), which is salted per process)."""

from __future__ import annotations

import mmh3

from floering.wire.errors import InvalidKey, inert

HASH_SPACE = 2 ** 64


def key_bytes(key) -> bytes:
    kind = type(key)
    if kind is str:
        try:
            return key.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidKey(f"key {inert(key)} is not valid UTF-8: {exc.reason}") from None
    if kind is bytes:
        return key
    if kind in (bytearray, memoryview):
        return bytes(key)
    if kind is int:
        # A prefix keeps int 5 and str "5" apart.
        return b"\x00i" + str(key).encode("ascii")
    raise InvalidKey(f"key must be str, bytes or int, not {kind.__name__}")


def position(key) -> int:
    return mmh3.hash64(key_bytes(key), seed=0, x64arch=True, signed=False)[0]
