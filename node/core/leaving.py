"""Scale-in as a state machine, pure: the node runtime and the simulation both carry
out its effects, so a node leaves (and fails to) alike in both.

Every range of ours is handed away (node.core.shares.spread_leave), then the node
waits until no range keeps our copy as an extra (its new replicas are not filled yet);
a range that came back meanwhile (its new owner died and our copy made us its holder)
is handed on again, so leaving never drops one. A handoff that is refused or aborted
fails the leave: the caller reports it (the runtime raises to whoever asked) and the
node stays a member. Past the deadline the node goes anyway, with a warning.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from floering.wire.errors import InvalidArgument

if TYPE_CHECKING:
    from floering.node.core.machine import NodeMachine


class LeaveState(StrEnum):
    HANDING = "handing"
    WAITING = "waiting"
    GONE = "gone"
    FAILED = "failed"


TRANSITIONS: dict[LeaveState, frozenset[LeaveState]] = {
    LeaveState.HANDING: frozenset({LeaveState.WAITING, LeaveState.FAILED}),
    LeaveState.WAITING: frozenset({LeaveState.WAITING, LeaveState.HANDING, LeaveState.GONE,
                                   LeaveState.FAILED}),
    LeaveState.GONE: frozenset(),
    LeaveState.FAILED: frozenset(),
}


class LeaveStateError(RuntimeError):
    """An event the leave's state does not expect (a local protocol error)."""


# effects
@dataclass(frozen=True)
class HandAway:
    """Hand these ranges off; report `HandedAway` or `HandingRefused`. `again`: they
    came back to us while we waited."""
    moves: dict
    again: bool = False


@dataclass(frozen=True)
class CheckAgain:
    """Our copy is still in use (or the handoff just ended): exchange rings, wait a
    little, then report `Checked`."""


@dataclass(frozen=True)
class Go:
    """Leave the ring and stop; `warning` says what was left behind, if anything."""
    warning: str = ""


@dataclass(frozen=True)
class LeaveFailed:
    reason: str


# events
@dataclass(frozen=True)
class HandedAway:
    committed: bool
    reason: str = ""


@dataclass(frozen=True)
class HandingRefused:
    reason: str


@dataclass(frozen=True)
class Checked:
    now: float
    copy_in_use: bool
    moves: dict          # what leaving would still hand away (ranges that came back)
    refused: str = ""    # why those could not be computed (we were removed meanwhile)


class Leaving:
    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.state = LeaveState.WAITING
        self.started = False

    def _move(self, to: LeaveState) -> None:
        if to not in TRANSITIONS[self.state]:
            raise LeaveStateError(f"leaving cannot go from {self.state} to {to}")
        self.state = to

    @property
    def finished(self) -> bool:
        return not TRANSITIONS[self.state]

    def start(self, moves: dict) -> list:
        if self.started:
            raise LeaveStateError("leaving starts once")
        self.started = True
        if not moves:
            return [CheckAgain()]
        return self._hand(moves)

    def refused(self, reason: str) -> list:
        """The moves could not even be computed (the node was removed, or is the last)."""
        self.started = True
        self.state = LeaveState.FAILED
        return [LeaveFailed(f"cannot leave: {reason}")]

    def handle(self, event) -> list:
        match (self.state, event):
            case (LeaveState.HANDING, HandedAway(committed=True)):
                self._move(LeaveState.WAITING)
                return [CheckAgain()]
            case (LeaveState.HANDING, HandedAway(reason=reason) | HandingRefused(reason=reason)):
                self._move(LeaveState.FAILED)
                return [LeaveFailed(f"cannot leave: {reason}")]
            case (LeaveState.WAITING, Checked(refused=refused)) if refused:
                self._move(LeaveState.FAILED)
                return [LeaveFailed(f"cannot leave: {refused}")]
            case (LeaveState.WAITING, Checked(now=now, copy_in_use=True)):
                if now > self.deadline:
                    return self._go("leaving while other ranges still use our copy")
                self._move(LeaveState.WAITING)
                return [CheckAgain()]
            case (LeaveState.WAITING, Checked(now=now, moves=moves)):
                if not moves:
                    return self._go("")
                if now > self.deadline:
                    return self._go("leaving with ranges that came back to us")
                return self._hand(moves, again=True)
        raise LeaveStateError(f"leaving in {self.state} got {event!r}")

    def _hand(self, moves: dict, again: bool = False) -> list:
        self._move(LeaveState.HANDING)
        return [HandAway(dict(moves), again)]

    def _go(self, warning: str) -> list:
        self._move(LeaveState.GONE)
        return [Go(warning)]


def begin_leave(machine: NodeMachine, deadline: float) -> tuple[Leaving, list]:
    """A leave of `machine`'s member, to go by `deadline`, and its first effects:
    its ranges handed away, or the leave refused (removed, or the last member)."""
    leaving = Leaving(deadline)
    try:
        moves = machine.leave_moves()
    except InvalidArgument as exc:
        return leaving, leaving.refused(str(exc))
    machine.begin_leaving()
    return leaving, leaving.start(moves)


def check_leave(machine: NodeMachine, leaving: Leaving, now: float) -> list:
    """What a waiting leave does next, from `machine`'s ring as it is `now`."""
    try:
        moves, refused = machine.leave_moves(), ""
    except InvalidArgument as exc:
        moves, refused = {}, str(exc)
    return leaving.handle(Checked(now, machine.copy_in_use(), moves, refused))
