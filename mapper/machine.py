"""The mapper's decisions, in one pure machine: no I/O, no event loop, no clock of its
own (every time is passed in). The asyncio delivery (`mapper/delivery.py`) and the
deterministic simulation (`tests/support/sim_mapper.py`) both drive it and carry out what it
returns; they only move bytes and keep time.

It owns:
- routing: which undelivered batch goes to which nodes, and when one is delivered
  (the outbox, `mapper/outbox.py`), and the numbers of the Push streams;
- the ring: which fetched view it adopts (`ring_watch.choose_ring`, with the
  orphaned-ring rule: when no node that answered holds our ring any more, its only
  holder died before telling anyone, so the newest view is taken even at our version
  number or below; only a fetch begun at our ring may say so), everything
  undelivered re-fitted and re-routed when it changes;
- ring refreshes: when to ask (no ack for a while, one node silent, a stream
  refused), how long a fetch waits for slow nodes, when reads refused together share
  one fetch, and what a failure means (give up on a batch, watch the ring, fetch it
  once, or just resend).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from floering.mapper.outbox import Outbox, PendingBatch
from floering.mapper.ring_watch import RETIRE_EVERY, STALL, Look, ProgressWatch, choose_ring
from floering.wire.errors import FloeError, Unavailable
from floering.wire.ring import Ring

RING_PATIENCE = 0.2         # seconds a ring fetch waits for slow nodes once one answered
WATCH_LIMIT = 3.0           # seconds a watch polls the ring for a change at most

Sends = list[tuple[PendingBatch, tuple[str, ...]]]


class OnFailure(Enum):
    """What a stream's failure means."""

    GIVE_UP = "give up"         # the ring refuses the batch for good: drop it, report it
    WATCH = "watch"             # the node may be dead: poll the ring until it changes
    REFRESH = "refresh"         # the ring moved on: fetch it once
    RESEND = "resend"           # transient: reopen the stream and resend, nothing more


@dataclass(frozen=True)
class Fetch:
    """A ring fetch on its way: the ring it began at, and when."""

    began_at: Ring | None
    began: float


@dataclass
class Adopted:
    """What a fetch's views changed: the ring adopted (None: kept ours) and what to
    send where on it (every undelivered batch, re-fitted, when the ring changed)."""

    ring: Ring | None = None
    sends: Sends = field(default_factory=list)


class MapperMachine:
    """The mapper's state and rules; see the module's docstring."""

    def __init__(self, now: float, stall: float = STALL,
                 retire_every: float = RETIRE_EVERY) -> None:
        self.outbox = Outbox()
        self.ring: Ring | None = None
        self.wire = b""                      # our ring as a node sent it
        self.watch = ProgressWatch(now, stall=stall, retire_every=retire_every)
        self.shared: Fetch | None = None     # the reads' shared fetch, the latest begun
        self.streams = 0                     # the last Push stream's number

    @property
    def known_ring(self) -> Ring:
        """The ring in use: there is one from the first fetch on."""
        if self.ring is None:
            raise RuntimeError("no ring yet: the client has not fetched one")
        return self.ring

    @property
    def undelivered(self) -> dict[int, PendingBatch]:
        return self.outbox.undelivered

    # ------------------------------------------------------------ routing

    def submit(self, batch: PendingBatch) -> Sends:
        """A new batch: what to send where on our ring."""
        return self.outbox.add(batch, self.known_ring)

    def acked(self, batch: PendingBatch, node: str, now: float) -> float | None:
        """`node` acknowledged `batch` at `now`: the seconds from its first emit to
        now when that completes its delivery, else None."""
        self.watch.progressed(now)
        if self.outbox.acked(batch, node):
            return now - batch.born
        return None

    def give_up(self, batch: PendingBatch) -> None:
        """A batch the ring refuses for good (bad input)."""
        self.outbox.drop(batch)

    def next_stream(self, wall_us: int) -> int:
        """The next Push stream's number: wall-clock microseconds (`wall_us`), never
        less than the previous number + 1. Numbers must grow across client
        incarnations that reuse a source (a retried Spark task resends its partition
        under the same source), or the nodes would refuse the newer one as replaced."""
        self.streams = max(self.streams + 1, wall_us)
        return self.streams

    # --------------------------------------------------------------- ring

    def adopt(self, ring: Ring, wire: bytes | None = None) -> Sends:
        """Take `ring` (as a node sent it: `wire`); every undelivered batch re-fitted
        to it and routed anew, in resend order, each destination to ack anew."""
        old = self.ring
        self.ring = ring
        if wire is not None:
            self.wire = wire
        return [] if old is None else self.outbox.reroute(ring)

    def begin_fetch(self, now: float) -> Fetch:
        return Fetch(self.ring, now)

    def fetch_wait(self, first_view: float | None, now: float) -> float | None:
        """How much longer a fetch waits for the nodes still to answer (None: until
        one does): a paused node neither answers nor refuses, so once one node has
        sent its view the others get RING_PATIENCE more (each call has its deadline)."""
        if first_view is None:
            return None
        return max(0.0, first_view + RING_PATIENCE - now)

    def has_news(self, versions: list[int]) -> bool:
        """A view newer than ours came: the fetch adopts it now, without waiting for
        slower nodes (a later refresh finds anything newer)."""
        return self.ring is not None and any(v > self.ring.version for v in versions)

    def fetched(self, fetch: Fetch, views: list[tuple[Ring, bytes]],
                errors: list[BaseException], asked: str = "") -> Adopted:
        """A fetch ended with `views` ((ring, its encoding) as nodes sent them) and
        `errors` from the others. Raises the first error that retrying cannot help
        (e.g. ReducerMismatch), or Unavailable when no node answered; otherwise adopts
        what `choose_ring` picks (the orphaned-ring rule included)."""
        for err in errors:
            if not getattr(err, "retriable", True):
                raise err          # not a FloeError: retriable, as any unknown failure
        if not views:
            raise Unavailable(f"no ring node reachable at {asked}: "
                              f"{errors[0] if errors else 'no reply'}")
        chosen = choose_ring(self.ring, self.wire, views,
                             began_at_current=self.ring is fetch.began_at)
        if chosen is None:
            return Adopted()
        return Adopted(chosen[0], self.adopt(*chosen))

    def share_fetch(self, refused_at: float, running: bool, now: float) -> bool:
        """A read refused at `refused_at` needs the ring: True when it must begin a
        new shared fetch (none `running`, or the running one began before the refusal
        and may hold the very ring that was refused), False when it waits for the
        running one. Reads refused together when their node dies would otherwise each
        ask every node, a burst on the heirs while they take over."""
        if running and self.shared is not None and self.shared.began >= refused_at:
            return False
        self.shared = self.begin_fetch(now)
        return True

    def watching(self, since: Ring | None, deadline: float, now: float) -> bool:
        """Whether a watch begun at ring `since` polls on: batches still undelivered,
        the ring not changed yet (another ring of the same version number counts as a
        change: the orphaned-ring rule adopted it), before `deadline`."""
        return bool(self.undelivered) and self.ring is since and now < deadline

    # ----------------------------------------------------------- failures

    def on_failure(self, exc: FloeError) -> OnFailure:
        """What a stream's failure `exc` means."""
        if not exc.retriable and not exc.refresh_ring:
            return OnFailure.GIVE_UP
        if isinstance(exc, Unavailable):
            # The node may be dead: its heir takes its ranges over within the failure
            # detector's few hundred ms. Poll the ring until that shows instead of
            # waiting for the stream's backoff.
            return OnFailure.WATCH
        return OnFailure.REFRESH if exc.refresh_ring else OnFailure.RESEND

    def on_refresh_error(self, exc: FloeError) -> bool:
        """A background refresh failed: True when that is fatal (retrying cannot help)."""
        return not exc.retriable

    def tick(self, now: float, waited_since: list[float | None]) -> set[Look]:
        """Called periodically: `waited_since` per node stream, when its oldest
        unanswered send went (None: nothing unanswered); what to do about the ring."""
        return self.watch.tick(now, bool(self.undelivered), waited_since)
