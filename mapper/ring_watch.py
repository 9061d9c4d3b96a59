"""What a mapper does about its ring, decided without I/O (the clock is passed in):
which of the views the nodes sent it adopts, and when it looks for a newer ring.

Only the mapper machine (`mapper/machine.py`) calls them; the asyncio delivery and
the deterministic simulation (`tests/support/sim_mapper.py`) drive that machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from floering.wire.ring import Ring

STALL = 0.5                 # seconds of no ack before the mapper looks for a newer ring
RETIRE_EVERY = 10.0         # seconds between looks for channels to nodes the ring has left


def choose_ring(current: Ring | None, current_wire: bytes, views: list[tuple[Ring, bytes]],
                began_at_current: bool) -> tuple[Ring, bytes] | None:
    """The view to adopt among `views` ((ring, its encoding) as nodes sent them), or
    None to keep `current`: the newest one when it is newer than ours; and, when no
    node that answered holds our ring any more (its only holder died before telling
    anyone, e.g. right after a split or a commit), the newest one even at our version
    number or below, so a ring nobody holds does not pin us. Only a fetch begun at our
    ring (`began_at_current`) can say that: one begun before a fetch beside it adopted
    a newer ring holds views older than ours, and would roll us back."""
    if not views:
        return None
    best = max(views, key=lambda v: v[0].version)
    if current is None or best[0].version > current.version:
        return best
    orphaned = began_at_current and best[0].stamp != current.stamp and all(
        wire != current_wire for _, wire in views)
    return best if orphaned else None


class Look(Enum):
    """Something the mapper should do about its ring now."""

    REFRESH = "refresh"         # fetch the ring once
    WATCH = "watch"             # fetch it every few tens of ms until it changes
    RETIRE = "retire"           # close channels to nodes the ring has left


@dataclass
class ProgressWatch:
    """When to look for a newer ring: batches waiting with no ack for `stall` seconds
    (whatever path the failure took); one node that stops acknowledging while the
    others go on (a paused process: watch, so batches re-route as soon as it is
    declared dead rather than after the ack timeout); and, every `retire_every`
    seconds, channels to retire."""

    now: float
    stall: float = STALL
    retire_every: float = RETIRE_EVERY
    last_progress: float = 0.0
    retired_at: float = 0.0

    def __post_init__(self) -> None:
        self.last_progress = self.retired_at = self.now

    def progressed(self, now: float) -> None:
        """An ack came."""
        self.last_progress = now

    def tick(self, now: float, waiting: bool, waited_since: list[float | None]) -> set[Look]:
        """`waiting`: batches are undelivered; `waited_since`: per node stream, when its
        oldest unanswered send went (None: nothing unanswered)."""
        looks = set()
        if waiting and now - self.last_progress > self.stall:
            self.last_progress = now
            looks.add(Look.REFRESH)
        if any(t is not None and now - t > self.stall for t in waited_since):
            looks.add(Look.WATCH)
        if now - self.retired_at > self.retire_every:
            self.retired_at = now
            looks.add(Look.RETIRE)
        return looks
