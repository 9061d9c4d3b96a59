"""The Ray consistent-hashing paper's two keyspace redistributions (its §4.2), decided
by the overloaded node itself: there is no central balancer, so the node that finds
itself overloaded (`floering.node.core.load`) redistributes its own share.

- `halving`: the node gives up every other one of its tokens. In the paper a token
  given up is removed, so its keys go to the next token clockwise; here the token
  stays and its range is handed to the owner of the next token kept (the same keys
  to the same node), its state moved by a handoff instead of the paper's forwarded
  tuples and final merge. A node with one token left has nothing to halve (the
  paper's "running out of halving").
- `doubling`: every other node doubles its tokens, a node's k-th token at the hash of
  "token-<node>-<k>" as in the paper. A new token inside one of our ranges takes the
  keys before it from us: exactly those are made (our range cut at the new token's
  position, the head handed to its node). New tokens that land in other nodes'
  ranges would only reshuffle keys between nodes that are not overloaded, which the
  paper names doubling's downside; their owners did not ask, so they are not made.
  A round's doublings are counted in generations, so a round never repeats the last
  one's positions; with the node's measured load it takes as many as lower the
  ring's top load most, and makes only the new tokens that carry that load
  (`doubling_cuts`).

Both are exact for the same reason as every move: a handoff moves a range with its
state, its watermarks and its replicas' copies (`floering.node.core.handoff`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping

from floering.wire.hashing import position
from floering.wire.ring import Ring

# Doubling stops cutting once the ring holds this many times the tokens it started with,
# or DOUBLING_FLOOR tokens if that is more (a ring started from one token a node).
DOUBLING_GROWTH = 8
DOUBLING_FLOOR = 256
# Doublings one round may take at most (the ring's token bound stops it first).
GENERATIONS = 12
# A round leaves out the cuts that do not help while it weighs at most this many.
PRUNED = 16


def halving_moves(ring: Ring, me: str) -> dict[int, str]:
    """token -> new owner: every other one of our tokens (in ring order), each to the
    owner of the next token clockwise that we keep or that is not ours."""
    mine = ring.tokens_of(me)
    given = set(mine[1::2])
    moves = {}
    for token in sorted(given):
        heir = _next_kept_owner(ring, token, given)
        if heir != me:
            moves[token] = heir
    return moves


def _next_kept_owner(ring: Ring, token: int, given: set[int]) -> str:
    i, n = ring.token_index(token), len(ring.tokens)
    for step in range(1, n):
        following = ring.tokens[(i + step) % n]
        if following not in given:
            return ring.owner_of_token(following)
    return ring.owner_of_token(token)


def generation(ring: Ring, me: str, start: int, g: int) -> list[tuple[int, str]]:
    """(position, node): the cuts the ring's g-th doubling (g >= 1) makes in our ranges:
    every other node's tokens k in [start * 2^(g-1), start * 2^g), at the hash of
    "token-<node>-<k>", where they fall inside a range of ours and are not made yet."""
    cuts = []
    for node in ring.nodes:
        if node == me:
            continue
        for k in range(start << (g - 1), start << g):
            pos = position(f"token-{node}-{k}")
            token = ring.token_for_position(pos)
            if pos != token and ring.owner_of_token(token) == me:
                cuts.append((pos, node))
    return cuts


def doubling_cuts(ring: Ring, me: str, max_tokens: int, start: int = 0,
                  load: Mapping[int, float] | None = None,
                  others: Mapping[str, float] | None = None) -> tuple[tuple[int, str], ...]:
    """(position, node): the cuts of this round's doublings, in position order, within
    `max_tokens` (without a measured load: whole generations).

    A doubling is a generation of every other node's tokens (`generation`), numbered
    from `start` tokens a node (the ring's tokens per node; 0: the mean the ring holds
    now). The paper doubles every node but the overloaded one each round, wherever the
    new tokens fall; only those falling in our ranges take keys from us, and only those
    are made, so a generation whose cuts are all made (or fall elsewhere) is passed
    over: a round never repeats the cuts of the last (which stalled the ring).

    Without a measure of where our load lies (`load`: position -> rate, our sampled
    keys; `others`: node -> rate) a round is the next generation with a cut. With one,
    it takes as many generations (within the ring's bound) as bring the ring's highest
    load lowest, counting what each cut's head carries to its node, and of their new
    tokens only those that carry measured load and lower the top (`_carrying`,
    `_pruned`): the fewest cuts within 5% of the lowest top, none if no doubling lowers
    it, but a hot key that moves whole to a node ending no busier than the busiest now
    is moved."""
    room = max(0, max_tokens - len(ring.tokens))
    start = start or max(1, len(ring.tokens) // max(1, len(ring.nodes)))
    taken: list[tuple[int, str]] = []
    found: list[tuple[float, list]] = []
    now = max([sum(load.values()) if load else 0.0, *(others or {}).values()])
    for g in range(1, GENERATIONS + 1):
        cuts = generation(ring, me, start, g)
        if not cuts:
            continue
        if len(taken) + len(cuts) > room:
            break
        taken = sorted(set(taken) | set(cuts))
        if not load:
            return tuple(taken)
        kept = _carrying(ring, me, taken, load)
        if len(kept) <= PRUNED:
            kept = _pruned(ring, me, kept, load, others or {})
        top, moved = _highest_after(ring, me, kept, load, others or {})
        if moved > 0 and top <= now:
            found.append((top, kept))
    if not found:
        return ()
    lowest = min(top for top, _ in found)
    # the fewest cuts that come within 5% of the lowest top: every cut is a split
    fewest: list = min((c for top, c in found if top <= lowest * 1.05), key=len)
    return tuple(fewest)


def _carrying(ring: Ring, me: str, cuts: list[tuple[int, str]],
              load: Mapping[int, float]) -> list[tuple[int, str]]:
    """`cuts` less those whose head carries none of our measured load (leaving one out
    hands its head to the range after it, which moves nothing measured)."""
    where = [pos for pos, _ in cuts]
    used = set()
    for pos in load:
        token = ring.token_for_position(pos)
        if ring.owner_of_token(token) != me:
            continue
        i = bisect_left(where, pos)
        if i < len(where) and ring.token_for_position(where[i]) == token and where[i] != token:
            used.add(i)
    return [cuts[i] for i in sorted(used)]


def _highest_after(ring: Ring, me: str, cuts: list[tuple[int, str]],
                   load: Mapping[int, float], others: Mapping[str, float]) -> tuple[float, float]:
    """(the highest load once `cuts` are made, the load they move off us): a sampled
    key goes with the first cut at or after it inside its range, else stays ours."""
    at = sorted(cuts)
    where = [pos for pos, _ in at]
    gained: dict[str, float] = {}
    for pos, rate in load.items():
        token = ring.token_for_position(pos)
        if ring.owner_of_token(token) != me:
            continue
        i = bisect_left(where, pos)
        if i < len(where) and ring.token_for_position(where[i]) == token and where[i] != token:
            gained[at[i][1]] = gained.get(at[i][1], 0.0) + rate
    moved = sum(gained.values())
    mine = sum(load.values()) - moved
    return max([mine] + [others.get(n, 0.0) + r for n, r in gained.items()]), moved


def _pruned(ring: Ring, me: str, cuts: list[tuple[int, str]], load: Mapping[int, float],
            others: Mapping[str, float]) -> list[tuple[int, str]]:
    """`cuts` less those whose leaving out lowers the highest load, one at a time,
    the best first (a cut left out leaves its head with the range after it)."""
    cuts = sorted(cuts)
    top = _highest_after(ring, me, cuts, load, others)[0]
    while len(cuts) > 1:
        trials = [(_highest_after(ring, me, cuts[:i] + cuts[i + 1:], load, others)[0], i)
                  for i in range(len(cuts))]
        best, i = min(trials)
        if best >= top:
            return cuts
        top, cuts = best, cuts[:i] + cuts[i + 1:]
    return cuts
