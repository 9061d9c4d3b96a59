"""Handing token ranges from their owner to other nodes while tuples keep flowing.

A handoff of {token: target} runs on the tokens' owner A as two ring changes:

1. prepare: every node that will be a destination of the token once the target owns
   it, and is not one now, becomes an *extra* destination. Mappers send it the token's
   tuples from then on and A's checkpoint rounds ship it a full copy. A brand-new node
   taking a range thus first serves as a replica (the paper's "delayed transition");
   A's first replica, which already holds checkpoint + backups, needs nothing extra
   itself, only its own replica becomes an extra.
2. commit: once every future destination has acknowledged a checkpoint of the range
   cut no earlier than the prepare (A's final checkpoint), A gives the token to the
   target (generation + 1, extras cleared). The target rebuilds the range from its
   complete copy exactly as a failover heir does; the stamps on every batch make a
   mapper resend whatever was routed with the old ring.

If A dies at any point the failover path takes over (its first replica has a complete
copy, and so do the extras once prepared). If a target dies or the handoff times out,
the extras are cleared and A keeps the range. Pure: the caller passes `now` and carries
out the rings this returns.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

from floering.wire.errors import InvalidArgument, Overloaded, TooLarge, inert
from floering.wire.ring import Ring
from floering.node.core.shares import spread_leave


class HandoffState(StrEnum):
    NEW = "new"
    PREPARED = "prepared"
    COMMITTED = "committed"
    ABORTED = "aborted"


# The only moves a handoff makes; anything else is a bug in its caller, not a no-op.
TRANSITIONS: dict[HandoffState, frozenset[HandoffState]] = {
    HandoffState.NEW: frozenset({HandoffState.PREPARED, HandoffState.ABORTED}),
    HandoffState.PREPARED: frozenset({HandoffState.COMMITTED, HandoffState.ABORTED}),
    HandoffState.COMMITTED: frozenset(),
    HandoffState.ABORTED: frozenset(),
}


class HandoffStateError(RuntimeError):
    """A transition the table does not allow (a local protocol error)."""


@dataclass
class Handoff:
    node_id: str
    moves: dict[int, str]
    deadline: float
    state: HandoffState = HandoffState.NEW
    reason: str = ""
    marks: dict[int, int] = field(default_factory=dict)  # checkpoint seq at prepare
    prepared_at: float = 0.0
    settle_until: float = 0.0      # a requested handoff may wait until then to prepare

    def _move(self, to: HandoffState, reason: str = "") -> None:
        if to not in TRANSITIONS[self.state]:
            raise HandoffStateError(f"a handoff cannot go from {self.state} to {to}")
        self.state, self.reason = to, reason

    def abort(self, reason: str) -> None:
        self._move(HandoffState.ABORTED, reason)

    @property
    def finished(self) -> bool:
        return not TRANSITIONS[self.state]

    def prepare(self, core, now: float) -> Ring:
        """Validate against the core and return the ring that adds the extras."""
        ring = core.ring
        if core.fenced:
            raise InvalidArgument(f"{self.node_id} was removed from the ring")
        if not self.moves:
            raise InvalidArgument("nothing to hand off")
        for token, target in self.moves.items():
            if token not in core.primaries:
                raise InvalidArgument(f"{self.node_id} does not own token {token} in ring "
                                      f"version {ring.version}")
            if target == self.node_id or target not in ring.nodes:
                raise InvalidArgument(f"cannot hand token {token} to {inert(target)}: not another "
                                      f"member of ring version {ring.version}")
            if token in core.lost_tokens:
                raise InvalidArgument(f"token {token}'s range is lost; it cannot move")
            if ring.extras_of(token):
                raise InvalidArgument(f"token {token} is already being handed off")
        self.marks = {t: core.primaries[t].checkpoint_seq for t in self.moves}
        for token in self.moves:
            core.primaries[token].force_checkpoint()   # the final checkpoint
        self._move(HandoffState.PREPARED)
        self.prepared_at = now
        return self._extras_ring(ring) or ring.with_version(ring.version + 1)

    def _extras_ring(self, ring: Ring) -> Ring | None:
        """The ring pinning every future destination as an extra, or None. Pinned, not
        left to the clockwise walk: a concurrent handoff elsewhere may change the walk,
        and a node that stops being a destination drops its copy."""
        future = ring.with_owners(self.moves)
        needed = {}
        for token in self.moves:
            want = tuple(sorted({x for x in future.destinations(token) if x != self.node_id}
                                | set(ring.extras_of(token))))
            if want != ring.extras_of(token):
                needed[token] = want
        return ring.with_extras(needed) if needed else None

    def future_destinations(self, ring: Ring, token: int) -> tuple[str, ...]:
        return ring.with_owners(self.moves).destinations(token)

    def ready(self, core) -> bool:
        """Every future destination acknowledged a checkpoint cut after the prepare (so
        it held the pinned ring, and a complete copy)."""
        ring = core.ring
        for token in self.moves:
            rng = core.primaries.get(token)
            if rng is None:
                return False
            for node in self.future_destinations(ring, token):
                if node == self.node_id:
                    continue
                seq = rng.replica_seq.get(node)
                if seq is None or seq <= self.marks[token]:
                    return False
        return True

    def step(self, core, now: float) -> Ring | None:
        """The next ring to adopt (re-prepare, commit or abort), or None to wait."""
        if self.state != HandoffState.PREPARED:
            return None
        ring = core.ring
        if core.fenced:
            self._move(HandoffState.ABORTED, "this node was removed from the ring")
            return None
        mine = [t for t in self.moves if ring.owner_of_token(t) == self.node_id]
        gone = sorted({x for x in self.moves.values() if x not in ring.nodes})
        if len(mine) < len(self.moves) or gone or now > self.deadline:
            self._move(HandoffState.ABORTED,
                       f"target {', '.join(gone)} left the ring" if gone else
                       "a token changed owner meanwhile" if len(mine) < len(self.moves)
                       else "timed out before every destination held the range")
            return unpinned(ring, mine)
        again = self._extras_ring(ring)
        if again is not None:
            return again               # the ring changed (a failure): prepare anew
        if not self.ready(core):
            return None
        self._move(HandoffState.COMMITTED)
        return commit_ring(ring, self.moves, complete_copies(core))


def unpinned(ring: Ring, tokens) -> Ring | None:
    """A handoff of `tokens` ended without a commit: drop the extras it pinned, but
    keep the former holders of a complete copy (their marks say the regular replicas
    are not filled yet: the owner's death must still give the range to one of them)."""
    change = {}
    for t in tokens:
        if ring.has_token(t) and ring.extras_of(t):
            held = tuple(sorted(x for tt, x in ring.retiring if tt == t))
            if held != ring.extras_of(t):
                change[t] = held
    return ring.with_extras(change) if change else None


def complete_copies(core) -> dict[int, set[str]]:
    """Per range we own, the nodes known to hold a complete copy: those whose
    acknowledgement of a checkpoint counts (a full one, then every one after it)."""
    return {t: set(rng.replica_seq) for t, rng in core.primaries.items()}


def commit_ring(ring: Ring, moves: dict[int, str],
                complete: dict[int, set[str]] | None = None) -> Ring:
    """Give the tokens to their targets. Every node that stops being a destination of
    any token (the old owner of a moved one, or a replica whose place in a neighbour's
    clockwise walk the move took) stays an extra destination, keeping its complete copy
    until the token's owner has the new replicas filled (`retired_extras`).
    `complete`: per token the committer owns, the nodes it knows hold a complete copy
    (`complete_copies`); only those (and the owner itself) are marked holding: a node
    that just became a destination by someone else's move may have nothing yet."""
    complete = complete or {}
    committed = ring.with_owners(moves)
    retiring, holding = {}, set()
    for token in ring.tokens:
        old = set(ring.destinations(token))
        if token not in moves:
            # pinned future destinations of someone's prepare do not hold a copy yet
            old -= set(ring.extras_of(token)) - {x for t, x in ring.retiring if t == token}
        new = committed.destinations(token)
        leaving = old - set(new)
        # A node the move adds to a range it does not own holds nothing of it yet, so
        # the destinations that stay keep their complete copies marked until the
        # owner has filled it: the owner's death must not hand the range to it.
        staying = (old & set(new)) - {new[0]} if token not in moves and set(new) - old \
            else set()
        keep = sorted(leaving | staying | (set(committed.extras_of(token)) - {new[0]}))
        # A regular replica that the move pushed out of the clockwise walk but that
        # stays as someone's pinned extra still holds its complete copy: it must
        # stay marked as holding, or the owner's death would give the range to the
        # new walk's node, which has no copy yet.
        demoted = {x for x in ring.regular_replicas(token) if x in keep
                   and x not in committed.regular_replicas(token)
                   and (token, x) not in ring.retiring}
        if keep != list(committed.extras_of(token)) or demoted:
            retiring[token] = keep
            held = {(t, x) for t, x in ring.retiring if t == token and x in keep}
            if token in complete:
                known = complete[token] | {ring.owner_of_token(token)}
                holding |= {(token, x) for x in leaving | demoted | staying if x in known}
            elif token in moves or not held:
                holding |= {(token, x) for x in leaving | demoted | staying}
            # else: the token still keeps former holders, so its owner has not filled
            # its regular replicas yet; one the move pushes out may hold nothing, and
            # marking it would let the owner's death hand the range to it (lost) rather
            # than to a holder.
            holding |= held
    ring = committed.with_extras(retiring, holding) if retiring else committed
    return ring.with_version(committed.version)


def retired_extras(core, busy=()) -> Ring | None:
    """The owner's cleanup: drop the extras of its tokens (not in `busy`, i.e. not being
    handed off) once every regular replica acknowledged a checkpoint."""
    ring = core.ring
    done = {}
    for token, rng in core.primaries.items():
        if token in busy or not ring.extras_of(token):
            continue
        if all(rng.replica_seq.get(r) is not None for r in ring.regular_replicas(token)):
            done[token] = ()
    return ring.with_extras(done) if done else None


def leave_moves(ring: Ring, me: str) -> dict[int, str]:
    """Scale-in: `me`'s ranges spread over the other members, each to its first replica
    while that one stays within the mean share (node.core.shares.spread_leave).
    Refused for the last member, which would leave no ring behind."""
    if not [n for n in ring.nodes if n != me]:
        raise InvalidArgument("the last node cannot leave the ring")
    return spread_leave(ring, me)


def split_ring(ring: Ring, me: str, position: int, fenced: bool = False) -> tuple[int, Ring]:
    """Cut `me`'s range holding `position` at it: (the range's token, the new ring).
    Only the owner splits, and never a range being handed off or a removed node."""
    if fenced:
        raise InvalidArgument(f"{me} was removed from the ring")
    token = ring.token_for_position(position)
    if ring.owner_of_token(token) != me:
        raise InvalidArgument(f"{me} does not own the range holding {position:#x} (token "
                              f"{token:#x} is {ring.owner_of_token(token)}'s)")
    try:
        return token, ring.split_token(token, position)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None


class SplitBudget:
    """Every split is a ring change gossiped to all: bounded like any load, in tokens
    (`max_tokens`) and in splits per minute."""

    def __init__(self, max_tokens: int, per_minute: int) -> None:
        self.max_tokens = max_tokens
        self.per_minute = per_minute
        self.recent: deque[float] = deque()     # when the last minute's splits were made

    def check(self, tokens: int, now: float) -> None:
        if tokens >= self.max_tokens:
            raise TooLarge(f"the ring has {tokens} tokens, the limit (--max-tokens); no "
                           f"more splits")
        recent = self.recent
        while recent and recent[0] <= now - 60:
            recent.popleft()
        if len(recent) >= self.per_minute:
            raise Overloaded(f"{len(recent)} splits in the last minute, the limit "
                             f"(--max-splits-per-minute); try again later")

    def spend(self, now: float) -> None:
        self.recent.append(now)
