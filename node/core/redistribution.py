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

Both are exact for the same reason as every move: a handoff moves a range with its
state, its watermarks and its replicas' copies (`floering.node.core.handoff`).
"""

from __future__ import annotations

from floering.node.core.hashing import position
from floering.node.core.ring import Ring

# Doubling stops cutting once the ring holds this many times the tokens it started with.
DOUBLING_GROWTH = 8


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


def doubling_cuts(ring: Ring, me: str, max_tokens: int) -> tuple[tuple[int, str], ...]:
    """(position, node): where the other nodes' doubled tokens fall inside our ranges,
    in position order, as many as keep the ring within `max_tokens`."""
    room = max(0, max_tokens - len(ring.tokens))
    cuts = []
    for node in ring.nodes:
        if node == me:
            continue
        have = len(ring.tokens_of(node))
        for k in range(have, 2 * have):
            pos = position(f"token-{node}-{k}")
            token = ring.token_for_position(pos)
            if pos != token and ring.owner_of_token(token) == me:
                cuts.append((pos, node))
    return tuple(sorted(cuts)[:room])
