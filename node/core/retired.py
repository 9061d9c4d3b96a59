"""What a fenced member held, kept until the ring holds it without that member.

A member removed from the ring (declared dead while paused or cut off, or on a view
it could not refuse) rejoins as a new member with no ranges; what it held is not
thrown away with the member. Each range it was primary for, and each complete copy
it kept for another primary, becomes a *retired range*: its states and per-source
watermarks as they were, read at one point, under the bounds `(lo, token]` it had.

A retired range is deleted only once the current ring holds it on r+1 others: for
every current range that overlaps it, its primary and its r regular replicas each
answer that they hold that range (a primary: not lost; a replica: a complete copy)
with watermarks at or past the retired copy's for every source (an epoch group's
floor counts as the dedup path counts it). Every tuple the retired copy holds is
then on r+1 live members, the way the dedup watermarks tell it: nothing it holds
could be needed again. Until then the range is kept (memory, and with a data
directory a file that survives a restart) and asked about again.

Pure: the asking and answering are plumbing (node.runtime.retiring); the rules are
here, with the owner's answer `held`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from floering.node.core.codec import pack, unpack
from floering.node.core.epochs import effective_mark
from floering.node.core.errors import InvalidArgument
from floering.node.core.node_core import NodeCore, RingChange
from floering.node.core.ring import Ring

FORMAT = 1


@dataclass(frozen=True)
class RetiredRange:
    """A range a fenced member held: as its primary or as a complete copy."""

    member: str                 # the member that held it ("n2")
    token: int
    lo: int                     # its range was (lo, token] in the member's last ring
    role: str                   # "primary" or "replica"
    states: dict = field(hash=False, compare=False)
    watermarks: dict = field(hash=False, compare=False)

    @property
    def key(self) -> tuple[str, int]:
        return self.member, self.token


@dataclass(frozen=True)
class Held:
    """A member's answer about one of its ranges, against a retired copy's marks."""

    role: str                   # "primary", "replica" or "" (not ours)
    holds: bool                 # the range whole, at or past the marks asked about
    lost: bool = False          # we own it, but every copy of it was lost


def covers(have: dict, want: dict) -> bool:
    """Does a range with watermarks `have` hold every tuple one with `want` holds?"""
    return all(effective_mark(have, source) >= seq for source, seq in want.items())


def held(core: NodeCore, token: int, want: dict) -> Held:
    """How this member holds the range of `token` of its ring, against `want`."""
    if core.fenced or core.starting or not core.ring.has_token(token):
        return Held("", False)
    rng = core.primaries.get(token)
    if rng is not None:
        lost = token in core.lost_tokens
        return Held("primary", not lost and covers(rng.watermarks, want), lost)
    copy = core.replicas.ranges.get(token)
    if copy is not None:
        return Held("replica", copy.complete and covers(copy.watermarks, want))
    return Held("", False)


# ------------------------------------------------------------ retiring a member


def retire_core(member: str, ring: Ring, primaries: dict, replicas) -> list[RetiredRange]:
    """The ranges a member held when it was fenced (`ring`: the ring it held them
    under): its primaries, and its complete copies rebuilt as a takeover would
    rebuild them (checkpoint plus backed-up tuples past it). An incomplete copy was
    never the range whole: it is not kept."""
    out = []
    for token, rng in sorted(primaries.items()):
        if ring.has_token(token):
            out.append(RetiredRange(member, token, ring.range_of_token(token)[0], "primary",
                                    rng.state.snapshot(), dict(rng.watermarks)))
    for token, copy in sorted(replicas.ranges.items()):
        if copy.complete and ring.has_token(token):
            states, marks = replicas.rebuild(token, _keys_of(ring, token))
            out.append(RetiredRange(member, token, ring.range_of_token(token)[0], "replica",
                                    states, dict(marks)))
    return out


def retire_copies(member: str, ring: Ring | None, copies: dict) -> list[RetiredRange]:
    """The copies a data directory holds for a member no longer served (node.core.
    restore.DiskCopy), each a consistent (states, watermarks) pair."""
    if ring is None:
        return []
    return [RetiredRange(member, token, ring.range_of_token(token)[0],
                         "primary" if c.primary == member else "replica",
                         dict(c.states), dict(c.watermarks))
            for token, c in sorted(copies.items())
            if ring.has_token(token) and (c.primary == member or c.complete)]


def _keys_of(ring: Ring, token: int):
    def check(keys):
        for key in keys:
            if ring.token_for_key(key) != token:
                raise InvalidArgument(f"a key does not belong to token {token}")
    return check


class RetainingCore(NodeCore):
    """A node core that, when it learns it was removed, keeps what it held as
    `retired` (NodeCore drops it)."""

    retired: list[RetiredRange] | None = None

    def adopt_ring(self, other: Ring) -> RingChange | None:
        before, primaries, replicas = self.ring, dict(self.primaries), self.replicas
        change = super().adopt_ring(other)
        if change is not None and change.fenced and self.retired is None:
            self.retired = retire_core(self.node_id, before, primaries, replicas)
        return change


# ------------------------------------------------------------- confirming


def pieces(ring: Ring, lo: int, token: int) -> list[int]:
    """The tokens of `ring` whose ranges overlap (lo, token]."""
    if lo == token:                      # the whole ring
        return list(ring.tokens)
    inside = {t for t in ring.tokens if Ring.in_range(t, (lo, token))}
    return sorted(inside | {ring.token_for_position(token)})


def holders(ring: Ring, token: int) -> tuple[str, ...]:
    """Who must hold the range of `token`: its primary and its r regular replicas."""
    return (ring.owner_of_token(token), *ring.regular_replicas(token))


@dataclass(frozen=True)
class Ask:
    """Ask `node` whether it holds the range of `token` at `want`, as `role`."""

    key: tuple[str, int]
    token: int
    node: str
    role: str
    want: dict = field(hash=False, compare=False)


class RetiredSet:
    """The retired ranges this process keeps, and the rule that deletes them."""

    def __init__(self) -> None:
        self.ranges: dict[tuple[str, int], RetiredRange] = {}
        self.confirmed = 0               # retired ranges deleted once confirmed

    def add(self, ranges) -> None:
        for r in ranges:
            self.ranges.setdefault(r.key, r)      # the first retired is the older copy

    def members(self) -> set[str]:
        return {member for member, _ in self.ranges}

    def of(self, member: str) -> list[RetiredRange]:
        return [r for (m, _), r in sorted(self.ranges.items()) if m == member]

    @property
    def keys(self) -> int:
        return sum(len(r.states) for r in self.ranges.values())

    def asks(self, ring: Ring) -> list[Ask]:
        """Every question whose answers can confirm a retired range in `ring`."""
        out = []
        for key, r in sorted(self.ranges.items()):
            for token in pieces(ring, r.lo, r.token):
                for i, node in enumerate(holders(ring, token)):
                    out.append(Ask(key, token, node, "primary" if i == 0 else "replica",
                                   r.watermarks))
        return out

    def confirmed_by(self, ring: Ring, answers: dict) -> list[RetiredRange]:
        """Delete, and return, the retired ranges `answers` ({(key, token, node):
        Held}) confirm in `ring`: every range overlapping it held whole, at or past
        its watermarks, by r+1 members."""
        done = []
        for key, r in sorted(self.ranges.items()):
            if all(self._held_by_all(ring, answers, key, token)
                   for token in pieces(ring, r.lo, r.token)):
                done.append(self.ranges.pop(key))
        self.confirmed += len(done)
        return done

    @staticmethod
    def _held_by_all(ring: Ring, answers: dict, key, token: int) -> bool:
        nodes = holders(ring, token)
        if len(nodes) < ring.replication + 1:
            return False                 # the ring cannot place r+1 copies yet
        for i, node in enumerate(nodes):
            answer = answers.get((key, token, node))
            if answer is None or not answer.holds or \
                    answer.role != ("primary" if i == 0 else "replica"):
                return False
        return True


# ------------------------------------------------------------------ the file


def encode(ranges: list[RetiredRange]) -> bytes:
    """The retired ranges of one member, as its file holds them."""
    return pack([FORMAT, [[r.member, r.token, r.lo, r.role, list(r.states.keys()),
                           list(r.states.values()), r.watermarks] for r in ranges]])


def decode(data: bytes) -> list[RetiredRange]:
    version, items = unpack(data)
    if version != FORMAT:
        raise InvalidArgument(f"retired ranges in format {version}, this node reads {FORMAT}")
    return [RetiredRange(member, token, lo, role, dict(zip(keys, states)), dict(marks))
            for member, token, lo, role, keys, states, marks in items]
