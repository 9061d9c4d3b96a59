"""Keeping what removed members held, as a state machine, pure: the node runtime and
the simulation both carry out its effects and feed it what came of them, so both keep,
confirm and hand back retired ranges alike (node.core.retired has the rules).

A process keeps the retired ranges of each member it served that the ring removed
(`keep`: the node machine hands them over when it rejoins; a data directory's, at
start-up). A round (`start`, every RETIRED_CHECK seconds) asks each member the ring
places a retired range's pieces on whether it holds them (`AskHeld`); each piece whose
primary answers that it holds it as lost is handed the retired copy's part of it
(`RestoreRetired`, one at a time); then the ranges held on r+1 members at or past
their watermarks are deleted. Idle -> Asking -> HandingOver -> Idle.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import StrEnum

from floering.node.core.chunks import CHUNK_BYTES, column_slices, packed_chunks
from floering.node.core.machine_io import Note, Record
from floering.node.core.node_core import NodeCore
from floering.node.core.retired import (Ask, Held, RetiredRange, RetiredSet, held,
                                        retire_directory)
from floering.node.core.state_wire import plan
from floering.node.core.table_state import table_op
from floering.wire.errors import FloeError
from floering.wire.ring import Ring

RETIRED_CHECK = 1.0      # seconds between two rounds of questions
REPORT_EVERY = 30.0      # seconds between two reports of what is still kept


class RetiringState(StrEnum):
    IDLE = "idle"
    ASKING = "asking"
    HANDING_OVER = "handing_over"


TRANSITIONS: dict[RetiringState, frozenset[RetiringState]] = {
    RetiringState.IDLE: frozenset({RetiringState.ASKING}),
    RetiringState.ASKING: frozenset({RetiringState.HANDING_OVER, RetiringState.IDLE}),
    RetiringState.HANDING_OVER: frozenset({RetiringState.HANDING_OVER, RetiringState.IDLE}),
}


class RetiringStateError(RuntimeError):
    """An event the round's state does not expect (a local protocol error)."""


# ------------------------------------------------------------------ effects

@dataclass(frozen=True)
class WriteRetired:
    """Keep `ranges` as `member`'s retired ranges across a restart, synced (none: its
    file goes). Done before anything else the same event caused."""
    member: str
    ranges: tuple


@dataclass(frozen=True)
class AskHeld:
    """Ask each member at `addresses` how it holds the range of its ask's token under
    `ring_stamp` (Held("", False) for a call that fails); report `HeldAnswers`, in order."""
    asks: tuple
    addresses: tuple
    ring_stamp: int


@dataclass(frozen=True)
class RestoreRetired:
    """Send `chunks` in order to the member at `address` (RestoreRange: the first with
    `watermarks`); report `Restored`, or `RestoreRefused` at the first refused."""
    address: str
    ring_stamp: int
    token: int
    member: str
    retired: int
    chunks: tuple
    watermarks: dict


# ------------------------------------------------------------------- events

@dataclass(frozen=True)
class HeldAnswers:
    answers: tuple


@dataclass(frozen=True)
class Restored:
    pass


@dataclass(frozen=True)
class RestoreRefused:
    reason: str


@dataclass(frozen=True)
class _Handing:
    key: tuple
    token: int
    node: str
    keys: int
    chunks: int


class Retiring:
    """The retired ranges this process keeps, and the round that confirms them."""

    def __init__(self) -> None:
        self.kept = RetiredSet()
        self.state = RetiringState.IDLE
        self.handed_over = 0             # parts of retired ranges merged into lost ones
        self._reported = 0.0
        self._refusals: dict[tuple, float] = {}    # last time each refusal was logged
        self._ring: Ring | None = None
        self._answers: dict = {}
        self._queue: list[RestoreRetired] = []
        self._handing: list[_Handing] = []
        self._remote: list[tuple[int, Ask]] = []   # the questions other members answer
        self._core: NodeCore | None = None     # the member we are, during a round
        self._node = ""
        self.deleted_last = 0            # ranges the last round deleted

    def _move(self, to: RetiringState) -> None:
        if to not in TRANSITIONS[self.state]:
            raise RetiringStateError(f"a retiring round cannot go from {self.state} to {to}")
        self.state = to

    # ------------------------------------------------------------- keeping

    def keep(self, ranges, why: str, node: str) -> list:
        """Keep `ranges` (those not kept already); `node` records it."""
        fresh = [r for r in ranges if r.key not in self.kept.ranges]
        if not fresh:
            return []
        self.kept.add(fresh)
        out: list = [WriteRetired(m, tuple(self.kept.of(m)))
                     for m in sorted({r.member for r in fresh})]
        keys = sum(len(r.states) for r in fresh)
        out.append(Record(
            "retired", node, (("member", fresh[0].member), ("ranges", len(fresh)),
                              ("keys", keys), ("tokens", sorted(r.token for r in fresh))),
            logging.WARNING, f"{why}: keeping its {len(fresh)} ranges ({keys} keys) until "
            "the ring holds each on r+1 members at or past their watermarks"))
        return out

    def keep_directory(self, former, reducer, limits, now: float, node: str) -> list:
        """Keep what a data directory held for `former` (its loaded member), which the
        ring removed while this process was down; `node` is the member we are now."""
        ring = Ring.from_wire(former.ring_wire) if former.ring_wire else None
        return self.keep(retire_directory(former.node_id, ring, reducer, limits,
                                          former.copies, former.batches, now,
                                          frozenset(former.corrupt)),
                         f"the data directory held {former.node_id}, which the ring removed",
                         node)

    def loaded(self, ranges: list[RetiredRange]) -> list:
        """Ranges a file kept across a restart: kept again, not written."""
        self.kept.add(ranges)
        return [Note(f"keeping {len(ranges)} ranges ({sum(len(r.states) for r in ranges)} "
                     f"keys) of {ranges[0].member if ranges else '?'}, removed from the ring "
                     "before this process started, until the ring holds each on r+1 members",
                     logging.WARNING)]

    # ------------------------------------------------------------- a round

    def start(self, core, now: float) -> list:
        """A round's questions; none while nothing is kept, a round runs, or `core`
        (the member we are) is not serving."""
        self.deleted_last = 0
        if self.state != RetiringState.IDLE or not self.kept.ranges or core.starting \
                or core.fenced:
            return []
        self._move(RetiringState.ASKING)
        ring = self._ring = core.ring
        self._node = core.node_id
        asks = self.kept.asks(ring)
        local = {i: _held_here(core, a) for i, a in enumerate(asks) if a.node == core.node_id}
        remote = [(i, a) for i, a in enumerate(asks) if i not in local]
        self._answers = {i: (a, local[i]) for i, a in enumerate(asks) if i in local}
        self._remote, self._core = remote, core
        if not remote:
            return self._answered(now)
        return [AskHeld(tuple(a for _, a in remote),
                        tuple(ring.address(a.node) for _, a in remote), ring.stamp)]

    def handle(self, event, now: float) -> list:
        match (self.state, event):
            case (RetiringState.ASKING, HeldAnswers(answers=answers)):
                if len(answers) != len(self._remote):
                    raise RetiringStateError(f"{len(answers)} answers to "
                                             f"{len(self._remote)} questions")
                for (i, ask), answer in zip(self._remote, answers):
                    self._answers[i] = (ask, answer)
                return self._answered(now)
            case (RetiringState.HANDING_OVER, Restored()):
                h = self._handing.pop(0)
                self._queue.pop(0)
                self.handed_over += 1
                member, retired = h.key
                out: list = [Record(
                    "retired_handed_over", self._node,
                    (("member", member), ("token", retired), ("into", h.token),
                     ("owner", h.node), ("keys", h.keys)), logging.WARNING,
                    f"the range of token {h.token} was lost on {h.node}: {h.keys} keys of "
                    f"{member}'s retired range of token {retired} merged into it, in "
                    f"{h.chunks} chunks")]
                return out + self._next(now)
            case (RetiringState.HANDING_OVER, RestoreRefused(reason=reason)):
                h = self._handing.pop(0)
                self._queue.pop(0)
                member, retired = h.key
                out = []
                if now - self._refusals.get((h.key, h.token), -REPORT_EVERY) >= REPORT_EVERY:
                    self._refusals[(h.key, h.token)] = now
                    out.append(Note(f"the range of token {h.token} is lost on {h.node}, and "
                                    f"it refused the retired copy of {member}'s range of "
                                    f"token {retired}: {reason}", logging.ERROR))
                return out + self._next(now)
        raise RetiringStateError(f"a retiring round in {self.state} got {event!r}")

    def _answered(self, now: float) -> list:
        """Every question answered: hand over to the primaries that hold a piece as
        lost, one at a time, then confirm."""
        ring, core = self._ring, self._core
        assert ring is not None and core is not None     # set for the round's length
        reducer_frames = table_op(core.reducer) is not None
        for i in sorted(self._answers):
            ask, answer = self._answers[i]
            r = self.kept.ranges.get(ask.key)
            if ask.role == "primary" and answer.lost and r is not None and r.role != "partial":
                part = {k: v for k, v in r.states.items() if ring.token_for_key(k) == ask.token}
                chunks = restore_chunks(part, reducer_frames)
                self._queue.append(RestoreRetired(ring.address(ask.node), ring.stamp,
                                                  ask.token, r.member, r.token,
                                                  tuple(chunks), r.watermarks))
                self._handing.append(_Handing(r.key, ask.token, ask.node, len(part),
                                              len(chunks)))
        return self._next(now)

    def _next(self, now: float) -> list:
        if self._queue:
            self._move(RetiringState.HANDING_OVER)
            return [self._queue[0]]
        return self._confirm(now)

    def _confirm(self, now: float) -> list:
        ring = self._ring
        assert ring is not None                          # set for the round's length
        done = self.kept.confirmed_by(ring, {(a.key, a.token, a.node): h
                                              for a, h in self._answers.values()})
        out: list = [WriteRetired(m, tuple(self.kept.of(m)))
                     for m in sorted({r.member for r in done})]
        for r in done:
            out.append(Record(
                "retired_deleted", self._node,
                (("member", r.member), ("token", r.token), ("keys", len(r.states)),
                 ("ring_version", ring.version)), logging.INFO,
                f"the retired range of token {r.token} of {r.member} is held on r+1 members "
                f"at or past its watermarks (ring v{ring.version}): deleted"))
        if self.kept.ranges and now - self._reported >= REPORT_EVERY:
            self._reported = now
            out.append(Note(
                f"still keeping {len(self.kept.ranges)} retired ranges ({self.kept.keys} "
                f"keys) of {','.join(sorted(self.kept.members()))}: not yet held on r+1 "
                f"members at or past their watermarks in ring v{ring.version}",
                logging.WARNING))
        self._answers, self._remote, self._core, self._ring = {}, [], None, None
        self._move(RetiringState.IDLE)
        self.deleted_last = len(done)
        return out

    def abandon(self) -> None:
        """A round broke off (its executor failed): the next starts afresh."""
        if self.state != RetiringState.IDLE:
            self._answers, self._remote, self._core, self._ring = {}, [], None, None
            self._queue, self._handing = [], []
            self._move(RetiringState.IDLE)

    def stats(self) -> dict:
        return dict(retired_ranges=len(self.kept.ranges), retired_keys=self.kept.keys,
                    retired_deleted=self.kept.confirmed, retired_handed_over=self.handed_over)


def _held_here(core, ask: Ask) -> Held:
    try:
        return held(core, ask.token, ask.want)
    except (FloeError, ValueError):
        return Held("", False)


def restore_chunks(part: dict, frames: bool) -> list[bytes]:
    """A retired copy's part of a range as RestoreRange chunks of at most CHUNK_BYTES
    (an entry larger alone in its chunk): frames of column states for a built-in
    reducer's states (state_wire: a table's int64 states in columns, any other entry
    in a frame's rest; one empty frame for none), else msgpack [keys, states] entries
    (a user-defined reducer's states)."""
    if frames:
        return [piece.encode() for piece in plan(part, 1 << 30, CHUNK_BYTES)]
    return [entries for _, entries in packed_chunks(column_slices(part), CHUNK_BYTES)]
