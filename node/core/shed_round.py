"""One shedding request as a state machine, pure: the node runtime and the simulation
both carry out its effects and feed it what came of them, so both shed alike.

A round plans (the caller gathers the neighbours' loads, lets the node's machine plan
with node.core.shedding, makes the planned cuts and reports the moves), then either
hands the moves off, or asks the busy heir the plan names to shed first (the cascade),
or finishes with nothing to move. When the asked heir moved ranges the round plans once
more at once, judging that heir by its rate (`relieved`) rather than after a cool-down.
A member short of its share of the ring is instead handed the ranges the rule names
(node.core.shares): that round starts at the handoff.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ShedState(StrEnum):
    PLANNING = "planning"
    HANDING = "handing"
    ASKING = "asking"
    DONE = "done"


# The only moves a round makes; anything else is a bug in its caller.
TRANSITIONS: dict[ShedState, frozenset[ShedState]] = {
    ShedState.PLANNING: frozenset({ShedState.HANDING, ShedState.ASKING, ShedState.DONE}),
    ShedState.HANDING: frozenset({ShedState.DONE}),
    ShedState.ASKING: frozenset({ShedState.PLANNING, ShedState.DONE}),
    ShedState.DONE: frozenset(),
}


class ShedStateError(RuntimeError):
    """An event the round's state does not expect (a local protocol error)."""


@dataclass(frozen=True)
class ShedOutcome:
    """What one node's shedding did: `moved` whether it handed ranges away (committed);
    `asked` the neighbour it asked to shed first, and whether that one moved any."""

    detail: str
    moved: bool = False
    asked: str = ""
    asked_moved: bool = False


# ------------------------------------------------------------------ effects

@dataclass(frozen=True)
class PlanRound:
    """Gather the neighbours' loads, plan (judging `relieved` by its rate), make the
    plan's cuts, then report `PlanComputed`."""
    reason: str
    depth: int
    relieved: str | None = None


@dataclass(frozen=True)
class HandOver:
    """Hand these ranges off; report `HandoffDone` or `HandoffRefused`."""
    moves: dict


@dataclass(frozen=True)
class AskToShed:
    """Ask `node` to shed first; report `CascadeAnswered` or `CascadeFailed`."""
    node: str
    depth: int


@dataclass(frozen=True)
class Finished:
    outcome: ShedOutcome


# ------------------------------------------------------------------- events

@dataclass(frozen=True)
class PlanComputed:
    moves: dict
    ask: str = ""


@dataclass(frozen=True)
class HandoffDone:
    committed: bool
    state: str
    reason: str = ""


@dataclass(frozen=True)
class HandoffRefused:
    reason: str


@dataclass(frozen=True)
class CascadeAnswered:
    moved: bool
    detail: str


@dataclass(frozen=True)
class CascadeFailed:
    reason: str


class ShedRound:
    """Drive with `start()`, then `handle(event)` for each report, until `Finished`."""

    def __init__(self, reason: str, depth: int = 0) -> None:
        self.reason, self.depth = reason, depth
        self.state = ShedState.PLANNING
        self.moves: dict = {}
        self.asked = ""
        self.first: ShedOutcome | None = None     # the cascade's outcome before a re-plan
        self.share_to = ""                          # handing a short member its share
        self.outcome: ShedOutcome | None = None

    def _move(self, to: ShedState) -> None:
        if to not in TRANSITIONS[self.state]:
            raise ShedStateError(f"a shedding round cannot go from {self.state} to {to}")
        self.state = to

    @property
    def finished(self) -> bool:
        return self.state == ShedState.DONE

    def start(self) -> list:
        if self.state != ShedState.PLANNING or self.first is not None:
            raise ShedStateError("a shedding round starts once")
        return [PlanRound(self.reason, self.depth)]

    def start_share(self, sender: str, moves: dict) -> list:
        """Asked by `sender`, short of its share: hand it `moves` (none: another member,
        or a handoff under way, gives it ranges)."""
        self.share_to = sender
        if not moves:
            return self._finish(ShedOutcome(f"{sender} is short of its share; another "
                                            f"member (or a handoff under way) gives it "
                                            f"ranges"))
        return self._hand(moves)

    def handle(self, event) -> list:
        match (self.state, event):
            case (ShedState.PLANNING, PlanComputed(moves=moves, ask=ask)):
                if moves:
                    return self._hand(moves)
                if ask and self.first is None:
                    self._move(ShedState.ASKING)
                    self.asked = ask
                    return [AskToShed(ask, self.depth + 1)]
                return self._finish(ShedOutcome("nothing to move"))
            case (ShedState.HANDING, HandoffDone(committed=committed, state=state,
                                                  reason=reason)):
                what = f"{state} {reason}" if reason else f"{state}"
                done = (f"handed {len(self.moves)} ranges to {self.share_to}" if self.share_to
                        else f"moved {len(self.moves)} ranges")
                return self._finish(ShedOutcome(f"{done}: {what}", moved=committed))
            case (ShedState.HANDING, HandoffRefused(reason=reason)):
                what = (f"handing {len(self.moves)} ranges to {self.share_to}" if self.share_to
                        else f"moving {len(self.moves)} ranges")
                return self._finish(ShedOutcome(f"{what} refused: {reason}"))
            case (ShedState.ASKING, CascadeAnswered(moved=moved, detail=detail)):
                asked = ShedOutcome(f"asked {self.asked} to shed first: {detail}",
                                    asked=self.asked, asked_moved=moved)
                if not moved:
                    return self._finish(asked)
                self.first = asked
                self._move(ShedState.PLANNING)
                return [PlanRound(f"{self.reason}, after {self.asked} shed", self.depth,
                                  relieved=self.asked)]
            case (ShedState.ASKING, CascadeFailed(reason=reason)):
                return self._finish(ShedOutcome(f"cascade to {self.asked} failed: {reason}"))
        raise ShedStateError(f"a shedding round in {self.state} got {event!r}")

    def _hand(self, moves: dict) -> list:
        self._move(ShedState.HANDING)
        self.moves = dict(moves)
        return [HandOver(dict(moves))]

    def _finish(self, outcome: ShedOutcome) -> list:
        if self.first is not None:
            outcome = ShedOutcome(f"{self.first.detail}; {outcome.detail}", outcome.moved)
        self._move(ShedState.DONE)
        self.outcome = outcome
        return [Finished(outcome)]
