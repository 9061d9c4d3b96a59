"""Pieces of a shared key: how one key's state is spread over several ranges.

A balancer that shares a hot key (`node.core.balancers`) sends its tuples to pieces:
piece 0 is the key itself, piece i > 0 a bytes key made of a reserved mark and the
msgpack of (key, i), which hashes to its own place on the ring. Each piece is an
ordinary key to the ring: its own range, replicas, checkpoints, takeover and dedup.
A read merges the pieces of a key with the reducer's `merge`, so it sees one value
whatever the split. A user's bytes key must not begin with the mark (refused at emit).
"""

from __future__ import annotations

from typing import Callable, Iterable

import msgpack

from node.core.errors import InvalidKey

PIECE_MARK = b"\x00floe:piece\x00"


def piece_key(key, index: int):
    """Piece `index` of `key` (0: the key itself)."""
    if index == 0:
        return key
    return PIECE_MARK + msgpack.packb((key, index))


def is_piece(key) -> bool:
    return type(key) is bytes and key.startswith(PIECE_MARK)


def base_of(key):
    """The key a piece belongs to (a key that is no piece is its own)."""
    if not is_piece(key):
        return key
    base, _index = msgpack.unpackb(key[len(PIECE_MARK):], use_list=False)
    return base


def check_user_key(key) -> None:
    if is_piece(key):
        raise InvalidKey("a bytes key may not begin with the mark reserved for the "
                         "pieces of shared keys (b'\\x00floe:piece\\x00')")


def merge_pieces(items: Iterable[tuple[object, object]],
                 merge: Callable[[object, object], object]) -> dict:
    """{key: state} with every piece merged into its key."""
    merged: dict = {}
    for key, state in items:
        if is_piece(key):
            key = base_of(key)
        merged[key] = merge(merged[key], state) if key in merged else state
    return merged
