"""Pieces of a shared key: how one key's state is spread over several ranges.

A balancer that shares a hot key (`floering.wire.balancers`) sends its tuples to pieces:
piece 0 is the key itself, piece i > 0 a bytes key made of a reserved mark and the
msgpack of (key, i), which hashes to its own place on the ring. Each piece is an
ordinary key to the ring: its own range, replicas, checkpoints, takeover and dedup.
A read merges the pieces of a key with the reducer's `merge`, so it sees one value
whatever the split. A user's bytes key must not begin with a mark (refused at emit).

A piece no longer used is merged back into its key (`floering.node.core.folding`): its state
leaves it for an outgoing key, FOLD_MARK and the msgpack of (key, index, nonce), kept in
the piece's own range until piece 0 has taken it. An outgoing key's state is
[n, state] while fold n is on its way and [n] once it arrived; reads merge the first as
a piece of the key and skip the second.
"""

from __future__ import annotations

from typing import Callable, Iterable

import mmh3
import msgpack

from floering.wire.errors import InvalidKey

PIECE_MARK = b"\x00floe:piece\x00"
FOLD_MARK = b"\x00floe:fold\x00"
RESERVED = b"\x00floe:"


def piece_key(key, index: int):
    """Piece `index` of `key` (0: the key itself)."""
    if index == 0:
        return key
    return PIECE_MARK + msgpack.packb((key, index))


def is_piece(key) -> bool:
    return type(key) is bytes and key.startswith(PIECE_MARK)


FOLD_SOURCE = "fold:"       # the source of a fold's batch: its tuples carry states
# A mapper that pre-aggregates (mapper/combining.py) sends under a source named so:
# each of its tuples carries the state of several, merged in with the reducer's merge.
COMBINED_SOURCE = "combined:"


def is_fold_source(source: str) -> bool:
    return source.startswith(FOLD_SOURCE)


def carries_states(source: str) -> bool:
    """The source's tuples carry reducer states (merged) rather than values (reduced)."""
    return source.startswith(FOLD_SOURCE) or source.startswith(COMBINED_SOURCE)


def fold_key(key, index: int, nonce: int) -> bytes:
    """An outgoing key of piece `index` of `key`: where its state waits to be merged."""
    return FOLD_MARK + msgpack.packb((key, index, nonce))


def fold_source(out_key: bytes) -> str:
    """The source a fold of outgoing key `out_key` is sent under (its seq: the fold's n)."""
    return FOLD_SOURCE + mmh3.hash_bytes(out_key).hex()


def on_its_way(held) -> bool:
    """Whether an outgoing key's state is a fold on its way: [n, state] (done: [n])."""
    return isinstance(held, (list, tuple)) and len(held) == 2 and type(held[0]) is int


def is_fold_key(key) -> bool:
    return type(key) is bytes and key.startswith(FOLD_MARK)


def parse_piece(key) -> tuple[object, int]:
    """(key, index) of a piece or an outgoing key; raises ValueError for another key."""
    mark = PIECE_MARK if is_piece(key) else FOLD_MARK if is_fold_key(key) else None
    if mark is None:
        raise ValueError("not a piece")
    parts = msgpack.unpackb(key[len(mark):], use_list=False)
    if not isinstance(parts, tuple) or len(parts) != (2 if mark is PIECE_MARK else 3) \
            or type(parts[1]) is not int:
        raise ValueError("malformed piece key")
    return parts[0], parts[1]


def base_of(key):
    """The key a piece (or an outgoing key) belongs to (another key is its own)."""
    if not is_piece(key) and not is_fold_key(key):
        return key
    return parse_piece(key)[0]


MAX_PIECE_INDEX = 1 << 16


def check_pushed_keys(keys) -> None:
    """A pushed batch's bytes keys may use the reserved mark only for well-formed
    pieces: a malformed one would break every read that merges it, and an outgoing key
    is only ever written by its range's owner, never pushed."""
    marked = {k for k in keys if type(k) is bytes and k.startswith(RESERVED)}
    for key in marked:
        if not is_piece(key):
            raise InvalidKey(f"key {key[:40]!r} uses the reserved mark b'\\x00floe:' "
                             f"and is not a piece of a shared key")
        try:
            base, index = parse_piece(key)
        except Exception:            # msgpack raises several unrelated types
            base, index = None, 0
        if type(base) not in (str, bytes, int) or not 1 <= index < MAX_PIECE_INDEX or \
                (type(base) is bytes and base.startswith(RESERVED)):
            raise InvalidKey(f"key {key[:40]!r} is a malformed piece of a shared key")


def check_user_key(key) -> None:
    if type(key) is bytes and key.startswith(RESERVED):
        raise InvalidKey("a bytes key may not begin with b'\\x00floe:', the mark reserved "
                         "for the pieces of shared keys")


def absorb_piece(merged: dict, key, state, merge: Callable[[object, object], object]) -> bool:
    """Merge a piece (or an outgoing key's state on its way) into merged[its key]; False,
    and nothing done, for any other key."""
    if is_fold_key(key):
        if not isinstance(state, (list, tuple)) or len(state) != 2:
            return True                       # merged into its key already (or no fold)
        state = state[1]
    elif not is_piece(key):
        return False
    key = base_of(key)
    merged[key] = merge(merged[key], state) if key in merged else state
    return True


def merge_pieces(items: Iterable[tuple[object, object]],
                 merge: Callable[[object, object], object]) -> dict:
    """{key: state} with every piece merged into its key."""
    merged: dict = {}
    for key, state in items:
        if not absorb_piece(merged, key, state, merge):
            merged[key] = merge(merged[key], state) if key in merged else state
    return merged


def pieces_first(items: list) -> list:
    """A node's scan entries with the pieces and outgoing keys first: a streaming
    reader then knows every shared key once each node's first plain entry came."""
    marked = [kv for kv in items if type(kv[0]) is bytes and kv[0].startswith(RESERVED)]
    if not marked:
        return items
    return marked + [kv for kv in items
                     if not (type(kv[0]) is bytes and kv[0].startswith(RESERVED))]
