"""One load-shedding round, decided (paper §VI), pure: what to move, what to cut, whom
to ask first. The caller gathers the neighbours' stats and carries the plan out.

Hottest ranges go to the nearest nodes clockwise that are not busy themselves
(`choose_shed`); a single range hotter than what evens us and our neighbour is cut at
the measured point and its tail handed over (`plan_split`). When no move helps and a
neighbour that would receive is busy, it is asked to shed first: the request cascades
clockwise, at most once round the ring.

A ring running the Ray paper's `halving` or `doubling` plans its round by that
policy instead (`floering.node.core.redistribution`); the caller carries it out the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from floering.node.core.load import choose_shed, clockwise_nodes
from floering.node.core.redistribution import (DOUBLING_FLOOR, DOUBLING_GROWTH, doubling_cuts,
                                               halving_moves)
from floering.wire.ring import Ring
from floering.node.core.split_point import plan_split

# Load shedding splits ranges only while the ring has fewer than this many times the
# tokens its members started with (an operator's `floe split` is not limited).
SPLIT_GROWTH = 4


@dataclass(frozen=True)
class PeerLoad:
    """What a neighbour said about its load; None in `plan_shed`'s map: no answer."""

    apply_rate: float
    overloaded: bool


@dataclass(frozen=True)
class ShedPlan:
    moves: dict = field(default_factory=dict)       # token -> target, whole ranges
    split: tuple[int, int, str] | None = None       # (token, cut position, heir of the tail)
    ask: str = ""                                   # busy heir to ask to shed first
    rates_of: dict = field(default_factory=dict)    # node -> apply rate, for the log
    busy: tuple[str, ...] = ()
    cuts: tuple = ()                                # (position, node): cut there, head to node


def shed_reach(ring: Ring, me: str, reach: int) -> list[str]:
    """The nodes whose load a shedding round of `me` needs (under `doubling` every
    other node: each may get new tokens)."""
    if ring.balancer == "doubling":
        return [n for n in ring.nodes if n != me]
    return sorted({n for t in ring.tokens_of(me) for n in clockwise_nodes(ring, t, reach)})


def plan_shed(ring: Ring, me: str, rates: dict[int, float], peers: dict[str, PeerLoad | None],
              samples: dict[int, dict[int, float]], *, reach: int, tokens_per_node: int,
              depth: int, relieved: str | None = None) -> ShedPlan:
    """`relieved` just shed: its overload verdict lags its move, so it is judged by its
    rate, and it is not asked again."""
    if ring.balancer == "halving":
        return ShedPlan(halving_moves(ring, me))
    if ring.balancer == "doubling":
        return ShedPlan(cuts=doubling_cuts(
            ring, me, max(DOUBLING_FLOOR, DOUBLING_GROWTH * tokens_per_node * len(ring.nodes)),
            tokens_per_node,
            _sampled_load(rates, samples),
            {n: p.apply_rate for n, p in peers.items() if p is not None}))
    rates_of, busy = {}, set()
    for node, peer in peers.items():
        if peer is None:
            busy.add(node)               # unreachable: not a place to move load to
            continue
        rates_of[node] = peer.apply_rate
        if peer.overloaded and node != relieved:
            busy.add(node)
    moves = choose_shed(ring, me, rates, rates_of, busy, reach)
    split = plan_split(ring, me, rates, rates_of, busy, moves, samples,
                       max_tokens=SPLIT_GROWTH * tokens_per_node * len(ring.nodes))
    heirs = sorted({h for t in ring.tokens_of(me) if (h := ring.heir(t))} & busy)
    ask = heirs[0] if relieved is None and heirs and depth < len(ring.nodes) else ""
    return ShedPlan(moves, split, ask, rates_of, tuple(sorted(busy)))


def _sampled_load(rates: dict[int, float],
                  samples: dict[int, dict[int, float]]) -> dict[int, float]:
    """position -> rate: each of our ranges' rate spread over its sampled keys in
    proportion to their weights (empty where nothing was sampled)."""
    load: dict[int, float] = {}
    for token, rate in rates.items():
        table = samples.get(token) or {}
        total = sum(table.values())
        for pos, weight in table.items():
            if total > 0 and rate > 0:
                load[pos] = load.get(pos, 0.0) + rate * weight / total
    return load


def cut_positions(plan: ShedPlan) -> list[int]:
    """Where to cut our ranges before the moves, in order."""
    first = [plan.split[1]] if plan.split is not None else []
    return first + [pos for pos, _ in plan.cuts]


def with_split_tail(plan: ShedPlan, ring: Ring, me: str) -> dict[int, str]:
    """The moves once the planned split and cuts were made in `ring`: the split's
    tail (which kept the token) goes to the heir, a cut's head (the new token) to its
    node, if the token is still ours."""
    moves = dict(plan.moves)
    for pos, node in plan.cuts:
        if ring.has_token(pos) and ring.owner_of_token(pos) == me:
            moves[pos] = node
    if plan.split is not None:
        token, _, heir = plan.split
        if ring.has_token(token) and ring.owner_of_token(token) == me:
            moves[token] = heir
    return moves
