"""Who runs this node's handoffs, in what order, and how fast: a pure state machine the
node machine (node.core.machine) keeps, so the runtime and the simulation drive
handoffs alike.

One handoff (node.core.handoff) runs at a time; requests arriving meanwhile wait in
line (at most MAX_WAITING, further ones are refused as overload) and start, in order,
when it ends. A request carries the id its executor chose to tell the one waiting for
it how it ended (0: nobody waits, e.g. the node's own refill). A request whose waiter
went away is dropped, or aborted if it runs. While a handoff runs, its steps come at the
ends of checkpoint rounds, so rounds follow each other every ROUND_SECONDS; otherwise
every interval, or as soon as full copies held back after a member left fall due.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

from floering.wire.errors import Overloaded

ROUND_SECONDS = 0.01        # between checkpoint rounds while a handoff runs
MAX_WAITING = 16            # requests in line behind the running handoff
# past the end of the repair delay a round waits for: timers may fire a clock
# resolution early, and a round a hair early holds the full copies a tick more
REPAIR_SLACK = 0.005


class DriverState(StrEnum):
    IDLE = "idle"
    RUNNING = "running"


# RUNNING -> RUNNING: the handoff ended and the next in line starts.
TRANSITIONS: dict[DriverState, frozenset[DriverState]] = {
    DriverState.IDLE: frozenset({DriverState.RUNNING}),
    DriverState.RUNNING: frozenset({DriverState.IDLE, DriverState.RUNNING}),
}


class DriverStateError(RuntimeError):
    """A transition the table does not allow (a local protocol error)."""


@dataclass(frozen=True)
class Request:
    moves: dict = field(hash=False)   # token -> target
    timeout: float                    # seconds from its start
    request: int = 0                  # the executor's id for its waiter; 0: nobody
    why: str = ""
    # The node's own rounds (shed, leave, share pulls) hand what is still theirs when
    # their turn comes: the handoff before may have moved one of their tokens away.
    # An operator's move is handed as asked, or refused.
    still_ours: bool = False


class HandoffDriver:
    def __init__(self, default_timeout: float = 10.0, interval: float = 1.0) -> None:
        self.default_timeout = default_timeout   # a request naming none gets this
        self.interval = interval                 # seconds between regular rounds
        self.state = DriverState.IDLE
        self.current: Request | None = None
        self.waiting: deque[Request] = deque()

    def _move(self, to: DriverState) -> None:
        if to not in TRANSITIONS[self.state]:
            raise DriverStateError(f"the handoff driver cannot go from {self.state} to {to}")
        self.state = to

    def request(self, moves: dict, timeout: float = 0.0, request: int = 0,
                why: str = "", still_ours: bool = False) -> Request | None:
        """A new request: returned when it starts now, None when it waits in line."""
        req = Request(dict(moves), timeout if timeout > 0 else self.default_timeout,
                      request, why, still_ours)
        if self.state == DriverState.IDLE:
            self._move(DriverState.RUNNING)
            self.current = req
            return req
        if len(self.waiting) >= MAX_WAITING:
            raise Overloaded(f"{len(self.waiting)} handoffs already wait for the running "
                             f"one; try again later")
        self.waiting.append(req)
        return None

    def ended(self) -> tuple[Request | None, Request | None]:
        """The running handoff ended: (the request it served, the next to start)."""
        done, self.current = self.current, None
        if done is None:
            raise DriverStateError("no handoff runs")
        if self.waiting:
            self._move(DriverState.RUNNING)
            self.current = self.waiting.popleft()
        else:
            self._move(DriverState.IDLE)
        return done, self.current

    def abandoned(self, request: int) -> bool:
        """The waiter of `request` went away: True when it is the running one (the
        caller aborts it; 0 names the running one, whoever asked); one in line is
        dropped here."""
        if self.current is not None and (not request or self.current.request == request):
            return True
        self.waiting = deque(r for r in self.waiting if r.request != request)
        return False

    def pause(self, now: float, started: float, full_copies_in: float) -> float:
        """Seconds from `now` to the next checkpoint round, the last one having begun at
        `started`; `full_copies_in`: until held-back full copies may go (0: now)."""
        if self.state == DriverState.RUNNING:
            return ROUND_SECONDS
        pause = max(0.0, self.interval - (now - started))
        if 0.0 < full_copies_in < pause:      # the round starts when they fall due
            pause = full_copies_in + REPAIR_SLACK
        return pause
