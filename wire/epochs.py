"""Epoch sources: deterministic sources whose dedup state stays bounded.

Plain dedup keeps one watermark per (range, source) forever. A driver that replays
work after a failure (Spark's micro-batches) needs sources that are the same on every
retry, and would otherwise add watermarks without end. An *epoch source* is named
`"<group>#<member>"` (for Spark: query id and partition id) and numbers its tuples
`seq = (epoch << 32) + position + 1` (epoch = batch id).

The group promises one thing: it starts sending epoch `e` only once every tuple of
every earlier epoch is acknowledged by all its nodes (Spark commits batch e-1 before it
plans batch e). So the first batch of epoch `e` a range applies proves epochs below
`e` final for the whole group: the range keeps one *floor* for the group, `e << 32`,
and forgets every member watermark the floor covers. A member's effective watermark is
the higher of its own and its group's floor, so a late resend of a finished epoch (a
zombie task attempt) is still dropped. State per range: one floor per group plus the
members of the newest epoch.

The floor is stored in the same `{source: seq}` map as the watermarks, under the key
`"<group>#"` (a source name no mapper may use), so checkpoints, replicas and
takeovers carry it without any change to the wire format.
"""

from __future__ import annotations

from typing import Iterable, Protocol, TypeVar

from floering.wire.errors import InvalidArgument, inert

EPOCH_BITS = 32
MAX_POSITION = (1 << EPOCH_BITS) - 2   # position + 1 must stay below 1 << EPOCH_BITS
SEPARATOR = "#"


def epoch_source(group: str, member: object) -> str:
    """The source name of one member of a group."""
    if not group or SEPARATOR in group:
        raise ValueError(f"epoch group {group!r} must be non-empty and contain no "
                         f"{SEPARATOR!r}")
    member = str(member)
    if not member:
        raise ValueError("epoch member must be non-empty")
    return f"{group}{SEPARATOR}{member}"


def epoch_seq(epoch: int, position: int) -> int:
    """The seq of the tuple at `position` (0-based) of an epoch."""
    if epoch < 0 or not 0 <= position <= MAX_POSITION:
        raise ValueError(f"epoch {epoch} / position {position} out of range "
                         f"(positions go up to {MAX_POSITION})")
    return (epoch << EPOCH_BITS) + position + 1


def epoch_of(seq: int) -> int:
    return seq >> EPOCH_BITS


def floor_key(source: str) -> str | None:
    """The key of the group floor that covers `source`, or None for a plain source."""
    cut = source.find(SEPARATOR)
    if cut <= 0 or cut == len(source) - 1:
        return None
    return source[:cut + 1]


def check_source(source: str) -> None:
    """Refuse a source name that collides with a floor key, or with a snapshot
    import's mark (`import:`, node.core.snapshot_format.IMPORT_SOURCE: kept for good,
    it must not be a name a pusher can take)."""
    if source.startswith("import:"):
        raise InvalidArgument(f"source {inert(source)} begins with 'import:': that name is "
                              f"reserved for the marks of snapshot imports")
    if source.endswith(SEPARATOR):
        raise InvalidArgument(f"source {inert(source)} ends with {SEPARATOR!r}: that name is "
                              f"reserved for the dedup floor of an epoch group")


def effective_mark(watermarks: dict[str, int], source: str) -> int:
    """Every seq of `source` at or below this is known applied."""
    mark = watermarks.get(source, 0)
    key = floor_key(source)
    if key is not None:
        floor = watermarks.get(key, 0)
        if floor > mark:
            return floor
    return mark


def raise_floor(watermarks: dict[str, int], source: str, first_seq: int) -> int:
    """After applying a batch of `source` whose first seq is `first_seq`: raise its
    group's floor to the start of that epoch and drop the member watermarks the floor
    covers. Returns how many were dropped (0 for a plain source)."""
    key = floor_key(source)
    if key is None:
        return 0
    floor = epoch_of(first_seq) << EPOCH_BITS
    if floor <= watermarks.get(key, 0):
        return 0
    watermarks[key] = floor
    covered = [s for s, mark in watermarks.items()
               if mark <= floor and s != key and s.startswith(key)]
    for s in covered:
        del watermarks[s]
    return len(covered)


class Sequenced(Protocol):
    @property
    def first_seq(self) -> int: ...


E = TypeVar("E", bound=Sequenced)


def replay_order(entries: Iterable[tuple[str, E]]) -> list[tuple[str, E]]:
    """Backed-up batches in an order safe to replay: a batch of epoch e raises its
    group's floor, so every batch of an earlier epoch must be replayed before it.
    A stable sort by epoch keeps each source's batches in seq order."""
    def epoch(item: tuple[str, E]) -> int:
        source, entry = item
        return epoch_of(entry.first_seq) if floor_key(source) is not None else 0
    return sorted(entries, key=epoch)
