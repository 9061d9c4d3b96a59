"""Before a process serves, as a state machine, pure: ask the peers (joining: the
seeds) for their rings until node.core.membership.ready_to_decide says the answers
suffice, then decide who this process is. The node runtime and the simulation both
carry out its effects, so a start-up waits, decides and gives up alike in both.

A joiner none of whose seeds answers stops (it has no ring to join); a founding or
restarted member waits for a running peer's answer, for every founding peer to answer
as starting too, or after its start-up grace for any answer, asking again every
`ASK_AGAIN_SECONDS` and warning every `WAIT_LOG_SECONDS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from floering.node.core.membership import ready_to_decide

WAIT_LOG_SECONDS = 5.0
ASK_AGAIN_SECONDS = 0.2


class StartState(StrEnum):
    ASKING = "asking"
    DECIDED = "decided"
    STOPPED = "stopped"


TRANSITIONS: dict[StartState, frozenset[StartState]] = {
    StartState.ASKING: frozenset({StartState.ASKING, StartState.DECIDED, StartState.STOPPED}),
    StartState.DECIDED: frozenset(),
    StartState.STOPPED: frozenset(),
}


class StartStateError(RuntimeError):
    """An event the start-up's state does not expect (a local protocol error)."""


# effects
@dataclass(frozen=True)
class AskPeers:
    """Ask every target for its ring (after `delay`); report `Answered`. `warning`:
    tell the operator first that we are still waiting."""
    delay: float = 0.0
    warning: str = ""


@dataclass(frozen=True)
class Decide:
    """The answers suffice: decide who we are from these rings (membership.decide_start)."""
    seen: tuple


@dataclass(frozen=True)
class Stop:
    reason: str


# events
@dataclass(frozen=True)
class Answered:
    now: float
    seen: tuple            # the rings that answered
    starting: int          # how many of them are starting peers' founding rings
    asked: int
    errors: tuple = ()     # what the others said


class Startup:
    def __init__(self, me: str, joining: bool, started: float, grace: float) -> None:
        self.me, self.joining = me, joining
        self.started, self.grace = started, grace
        self.log_at = started + WAIT_LOG_SECONDS
        self.state = StartState.ASKING

    def _move(self, to: StartState) -> None:
        if to not in TRANSITIONS[self.state]:
            raise StartStateError(f"a start-up cannot go from {self.state} to {to}")
        self.state = to

    @property
    def finished(self) -> bool:
        return not TRANSITIONS[self.state]

    def start(self) -> list:
        return [AskPeers()]

    def handle(self, event) -> list:
        match (self.state, event):
            case (StartState.ASKING, Answered(now=now, seen=seen, starting=starting,
                                              asked=asked, errors=errors)):
                if self.joining and not seen:
                    self._move(StartState.STOPPED)
                    return [Stop("no seed to join answered: " + "; ".join(errors))]
                waited = now - self.started >= self.grace
                if ready_to_decide(len(seen), starting, asked, self.joining, waited):
                    self._move(StartState.DECIDED)
                    return [Decide(tuple(seen))]
                self._move(StartState.ASKING)
                warning = ""
                if now >= self.log_at:
                    warning = (f"{self.me} is waiting for a running peer to confirm its place "
                               f"in the ring ({len(seen)} of {asked} answered, all "
                               f"starting): {'; '.join(errors) or '-'}")
                    self.log_at += WAIT_LOG_SECONDS
                return [AskPeers(ASK_AGAIN_SECONDS, warning)]
        raise StartStateError(f"a start-up in {self.state} got {event!r}")
