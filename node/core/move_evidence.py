"""What a node needs before a ring view may move a range away from a member it holds
live. Pure.

A token's owner changes under a higher generation only by a handoff its owner
commits (the owner gives it away: handoffs, sheds, leaves and refills all commit on
the giver), or by a takeover after the owner's removal. The view carries neither the
handoff's agreement nor a signature, and any member's certificate can send a view, so
a view that gives away a range of a member we hold live (and that it does not remove:
removals are judged by node.core.evidence) is taken only on that member's own word:

- the giver's word is the latest view it sent us itself (pushed under its certificate,
  or its answer to our exchange with it at its address). It backs a move of one of
  its tokens when, at that token, it names the same owner under the same generation,
  or the giver under a newer generation holds it no more. A view from the giver backs
  its own moves at once, so a committed handoff reaching its target or a third member
  from the giver costs nothing;
- a move no word backs yet holds the view (at most MAX_PENDING, MAX_PER_SENDER from
  one sender) and asks each giver for its ring (one exchange per giver, again every
  ASK_EVERY while held). Its answer backs the move, or, heard after the view arrived
  and still saying the giver holds the token, refuses the view, loudly; a view no
  answer backs within PATIENCE is refused too;
- a move away from us is backed by our own ring only: we commit our handoffs first.

Moves away from a member the view removes (a takeover) are not judged here: the
removal is, by our own probes, before the view is merged. A pulled view without a
sender (our own start-up decision) is not judged either.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from floering.node.core.membership import base_name
from floering.wire.ring_merge import absorbed_version

if TYPE_CHECKING:
    from floering.wire.ring import Ring

MAX_PENDING = 4            # views held while their moves wait for their givers' word
MAX_PER_SENDER = 2         # of them, from one sender
MAX_WORDS = 256            # members whose latest own view is kept (the oldest goes)
ASK_EVERY = 1.0            # a held view's givers are asked again this often
PATIENCE = 5.0             # seconds a held view waits for its givers' word

Claims = dict[str, dict[int, tuple[str, int]]]     # giver -> token -> (new owner, generation)


def move_claims(ring: "Ring", view: "Ring") -> Claims:
    """The ranges `view` would move away from members live in `ring`: per giver, each
    token the merge would give another owner (a higher generation, or the same one in
    a newer view). A range of a member the view removes or hears restarted (a
    takeover) is the heir's to give: the member our own takeover rule gives it to
    (`Ring.without` of our ring: a retiring holder of a full copy, else the next
    owner clockwise). A takeover giving it to the heir, or to a member our ring names
    as a handoff's destination of it, is no move; one giving it to anybody else is
    judged as a move away from the heir."""
    if not ring.tokens:
        return {}
    live = set(ring.nodes)
    gone = set(view.removed) | {n for n, i in view.incarnations
                                if ring.incarnation_of(n) not in (0, i)}
    heirs = ring.without(gone & live) if gone & live else ring
    newer = (absorbed_version(ring, view), view.stamp) > (ring.version, ring.stamp)
    claims: Claims = {}
    for token, owner, generation in zip(view.tokens, view.owners, view.generations):
        i = ring.token_index(token)
        held, ours = ring.owners[i], ring.generations[i]
        if owner == held or held not in live:
            continue
        if held in gone:                       # a takeover: the heir's to give
            if not (generation > ours or (generation == ours and newer)):
                continue
            held = heirs.owners[i]
            if owner == held or owner in ring.extras_of(ring.tokens[i]):
                continue
            claims.setdefault(held, {})[token] = (owner, generation)
            continue
        if generation > ours or (generation == ours and newer):
            claims.setdefault(held, {})[token] = (owner, generation)
    return claims


def backs(word: "Ring", giver: str, token: int, owner: str, generation: int) -> bool | None:
    """Does `giver`'s own view back giving `token` to `owner` at `generation`? None
    when it cannot tell yet: the view is older than the move and names another owner
    than the giver (an heir that has not heard of the takeover)."""
    if not word.tokens:
        return False
    i = word.token_index(token)
    if word.generations[i] == generation:
        return word.owners[i] == owner
    if word.generations[i] > generation:
        return word.owners[i] != giver
    return False if word.owners[i] == giver else None


class MoveGuard:
    """The givers' latest words, the views held for them, and what was refused."""

    def __init__(self) -> None:
        self.words: dict[str, tuple["Ring", float]] = {}   # base name -> (its view, when)
        # stamp -> (the event, sender, when first seen, givers)
        self.pending: dict[int, tuple[object, str, float, frozenset[str]]] = {}
        self.asked: dict[str, float] = {}                  # giver -> when last asked
        self.counters = dict(moves_held=0, moves_refused=0)

    def reset(self) -> None:
        self.words.clear()
        self.pending.clear()
        self.asked.clear()

    def heard(self, sender: str, view: "Ring", now: float, ring: "Ring") -> bool:
        """`sender` sent `view` itself. Kept only for a member of `ring` (a name made
        up in the clear keeps nothing). Returns whether a held view waits for its word."""
        if not sender or sender.startswith("@"):
            return False
        key = base_name(sender)
        if not any(base_name(n) == key for n in ring.nodes):
            return False
        held = self.words.get(key)
        if held is not None and (held[0].version, held[0].stamp) >= (view.version, view.stamp):
            if held[0].stamp == view.stamp:
                self.words[key] = (view, now)     # heard again: its word is fresh
            return False
        self.words.pop(key, None)
        self.words[key] = (view, now)
        if len(self.words) > MAX_WORDS:
            self.words.pop(next(iter(self.words)))
        return any(key in {base_name(g) for g in held_view[3]}
                   for held_view in self.pending.values())

    def judge(self, claims: Claims, me: str, own: "Ring", since: float) -> tuple[set[str], set[str]]:
        """(givers whose word refuses a move, givers whose word is still awaited)."""
        refused: set[str] = set()
        awaited: set[str] = set()
        for giver, moves in claims.items():
            word: Ring | None = own
            when = since
            if giver != me:
                heard = self.words.get(base_name(giver))
                word, when = heard if heard is not None else (None, -1.0)
            said = {backs(word, giver, t, o, g) for t, (o, g) in moves.items()} \
                if word is not None else {None}
            if said == {True}:
                continue
            # Our own ring is our word at once; a giver's answer heard since the view
            # came refuses it when it says otherwise, and makes it wait when it cannot
            # tell yet (an heir that has not heard of the takeover).
            final = giver == me or (False in said and when >= since)
            (refused if final else awaited).add(giver)
        return refused, awaited

    def since(self, stamp: int, now: float) -> float:
        held = self.pending.get(stamp)
        return held[2] if held is not None else now

    def hold(self, event, stamp: int, sender: str, givers: set[str], now: float) -> list[str]:
        """Hold the view while `givers` are asked; returns those to ask now."""
        since = self.since(stamp, now)
        if stamp not in self.pending:
            mine = [s for s, held in self.pending.items() if held[1] == sender]
            if sender and len(mine) >= MAX_PER_SENDER:
                self.drop(mine[0])
            elif len(self.pending) >= MAX_PENDING:
                count = Counter(held[1] for held in self.pending.values())
                most = max(count.values())
                self.drop(next(s for s, held in self.pending.items() if count[held[1]] == most))
            self.counters["moves_held"] += 1
        self.pending[stamp] = (event, sender, since, frozenset(givers))
        return self.to_ask(givers, now)

    def to_ask(self, givers, now: float) -> list[str]:
        due = sorted(g for g in givers if now - self.asked.get(g, -ASK_EVERY) >= ASK_EVERY)
        for giver in due:
            self.asked[giver] = now
        return due

    def drop(self, stamp: int, refused: bool = True) -> None:
        if self.pending.pop(stamp, None) is not None and refused:
            self.counters["moves_refused"] += 1

    def settled(self, stamp: int) -> None:
        """The view is judged (backed, or refused and counted by the caller)."""
        self.pending.pop(stamp, None)

    def recheck(self) -> list:
        """Every held view, to judge again (a giver's word arrived)."""
        return [held[0] for held in self.pending.values()]

    def expired(self, now: float) -> int:
        """Refuse the views held past PATIENCE; returns how many."""
        old = [s for s, held in self.pending.items() if now - held[2] > PATIENCE]
        for stamp in old:
            self.drop(stamp)
        self.asked = {g: t for g, t in self.asked.items() if now - t < PATIENCE}
        return len(old)

    def due(self, now: float) -> list[str]:
        """Givers of held views to ask again now."""
        return self.to_ask({g for held in self.pending.values() for g in held[3]}, now)
