"""Routing plans: where a replayable source sends each tuple of a shared key.

A source whose seqs may be sent again by another process (a retried Spark task, a
batch replayed after a driver restart, a rerun of `floe feed` on the same file) must
send a seq to the same piece every time: each range deduplicates by (source, seq). So
its choice is a pure function of what is replayed: (plan, source, seq, key). The plan
is fixed before the first attempt and recorded where every attempt finds it (the
Spark driver's checkpoint, per batch; the feed's state, per file).

Within a plan a tuple's piece is drawn by a hash of (source, seq), weighted by the
plan: tuples of a hot key spread over its pool whatever their positions (a hot key at
every other position goes to every piece of its pool, not to one).

A plan holds:
- `ring`: the ring it was decided on. The choice reads where pieces lay from it, never
  from the ring of the attempt: a ring changed by a failure between two attempts
  changes where the pieces are sent, never which piece a seq goes to;
- `heads`: hot key -> its pool, ((cumulative weight, piece index), ...), the weights out
  of 2**64;
- `pairs`: for every other key, whose candidates are its pieces 0 and 1 (or 0 only,
  `dkg` and `smalops`: a cold key stays on its own node), (node of piece 0, node of
  piece 1) on the plan's ring -> piece 0's weight out of 2**64.

`make_plan` decides one from the keys' measured shares (a Space-Saving sketch of
earlier epochs, or a sample): the ring's load is filled unit by unit, each unit of a
key (a 1/UNITS of all tuples, or less) to the least loaded node among its candidates,
as partial key grouping does per tuple. The plan with no record (`EVEN`) draws piece 0
or 1 evenly for every key and needs no ring. No I/O here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

import mmh3
import msgpack

from floering.wire.balancers import balancer
from floering.wire.pieces import piece_key
from floering.wire.ring import Ring
from floering.node.core.sketch import SpaceSaving

SPACE = 1 << 64
MASK = SPACE - 1
HALF = 1 << 63
UNITS = 4096               # the load is filled in units of this share of all tuples
PLAN_VERSION = 1
HEAD_KEYS = 256          # keys measured one by one for a plan; the rest as a whole


@dataclass(frozen=True)
class Plan:
    policy: str = ""
    ring: Ring | None = None
    heads: dict = field(default_factory=dict)   # key -> ((cumulative weight, piece), ...)
    pairs: dict = field(default_factory=dict)   # (node, node) -> piece 0's weight
    single: bool = False                        # cold keys stay on piece 0 (dkg, smalops)

    def encode(self) -> bytes:
        return msgpack.packb({
            "v": PLAN_VERSION, "policy": self.policy, "single": self.single,
            "ring": self.ring.to_wire() if self.ring is not None else None,
            "heads": [[k, [[min(w, MASK), i] for w, i in pool]]
                      for k, pool in self.heads.items()],
            "pairs": [[a, b, min(w, MASK)] for (a, b), w in self.pairs.items()]},
            use_bin_type=True)

    @classmethod
    def decode(cls, data: bytes) -> "Plan":
        d = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=False)
        if not isinstance(d, dict) or d.get("v") != PLAN_VERSION:
            raise ValueError("not a routing plan of this version")
        ring = Ring.from_wire(d["ring"]) if d.get("ring") is not None else None
        return cls(str(d["policy"]), ring,
                   {k: tuple((_weight(w), int(i)) for w, i in pool) for k, pool in d["heads"]},
                   {(str(a), str(b)): _weight(w) for a, b, w in d["pairs"]},
                   bool(d.get("single")))


def _weight(w) -> int:
    """A weight as encoded (2**64 does not fit msgpack's integers: sent as 2**64 - 1)."""
    w = int(w)
    return SPACE if w >= MASK else w


EVEN = Plan()


def draw(salt: int, seq: int) -> int:
    """A 64-bit number spread evenly from (source, seq) (splitmix64's finaliser)."""
    x = ((salt ^ seq) + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def salt_of(source: str) -> int:
    """A source's 64-bit salt, the same in every process (unlike hash())."""
    return mmh3.hash64(source.encode(), seed=0x5EED, signed=False)[0]


class PlanChooser:
    """The replayable piece chooser: place(key, seq) -> (piece, its token), a pure
    function of (plan, source, seq, key); the token is the current ring's."""

    def __init__(self, plan: Plan, source: str, max_cached: int = 1 << 20) -> None:
        self.plan, self.salt, self.max_cached = plan, salt_of(source), max_cached
        # hot key -> ((cumulative weight, piece), ...), the last weight 2**64
        self._pools = {k: tuple((w, piece_key(k, i)) for w, i in pool[:-1])
                       + ((SPACE, piece_key(k, pool[-1][1])),)
                       for k, pool in plan.heads.items()}
        self._weights: dict = {}          # key -> (piece 0's weight, piece 1), plan-fixed

    def piece(self, key, seq: int):
        """The piece `seq` of `key` goes to."""
        u = draw(self.salt, seq)
        pool = self._pools.get(key)
        if pool is not None:
            return next(p for w, p in pool if u < w)
        weight, other = self._weight(key)
        return key if u < weight else other

    def _weight(self, key) -> tuple:
        found = self._weights.get(key)
        if found is None:
            plan, other = self.plan, piece_key(key, 1)
            if plan.ring is None:
                weight = HALF
            else:
                a, b = plan.ring.owner(key), plan.ring.owner(other)
                weight = SPACE if plan.single or a == b else plan.pairs.get((a, b), HALF)
            if len(self._weights) >= self.max_cached:
                self._weights.clear()
            found = self._weights[key] = (weight, other)
        return found

    def placer(self, ring: Ring, route):
        pools, weights, find, salt = self._pools, self._weights, self._weight, self.salt

        def place(key, seq):
            # draw(), inlined: this runs once per tuple
            x = ((salt ^ seq) + 0x9E3779B97F4A7C15) & MASK
            x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
            x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
            u = x ^ (x >> 31)
            pool = pools.get(key)
            if pool is not None:
                for weight, piece in pool:
                    if u < weight:
                        return piece, route(piece)
            weight, other = weights.get(key) or find(key)
            if u < weight:
                return key, route(key)
            return other, route(other)
        return place


def candidates(policy, ring: Ring, key, share: float) -> list[tuple[int, str]]:
    """(piece index, node) a hot key may go to under `policy`: pieces 0 and 1 for
    `pkg`; else the first piece on each node the key's pieces reach, as many as
    `dchoices` needs (ceil(share * n) + 1) or all of them."""
    if policy.name == "pkg":
        return [(0, ring.owner(key)), (1, ring.owner(piece_key(key, 1)))]
    wanted = len(ring.nodes)
    if policy.name == "dchoices":
        wanted = min(wanted, math.ceil(share * len(ring.nodes)) + 1)
    chosen, nodes = [], set()
    for i in range(policy.pieces):
        node = ring.owner(piece_key(key, i))
        if node not in nodes:
            chosen.append((i, node))
            nodes.add(node)
            if len(chosen) == wanted:
                break
    return chosen


def make_plan(policy, ring: Ring, counts: Mapping, total: float,
              head_share: float | None = None) -> Plan:
    """A plan for `policy` on `ring` from the measured `counts` of the hottest keys out
    of `total` tuples. A key of at least `head_share` of them (default 1 / (8 n)) gets
    a pool; the rest is spread as the ring's shares of the hash space would."""
    if policy.pieces == 1 or total <= 0:
        return EVEN
    nodes = list(ring.nodes)
    head_share = head_share if head_share is not None else 1 / (8 * len(nodes))
    heads = {k: c / total for k, c in counts.items() if c / total >= head_share}
    single = policy.name in ("dkg", "smalops")
    share = {n: ring.share_of(n) for n in nodes}
    # the other keys measured, where they are; the rest as the hash space is shared
    known: dict = {}
    for k, c in counts.items():
        if k not in heads:
            at = ring.owner(k)
            pair = (at, at) if single else (at, ring.owner(piece_key(k, 1)))
            known[pair] = known.get(pair, 0.0) + c / total
    rest = max(0.0, 1.0 - sum(heads.values()) - sum(known.values()))
    # (mass, candidates, pair) in the order filled; a head key's have no pair
    items: list[tuple[float, list[tuple[int, str]], tuple[str, str] | None]] = []
    for a in nodes:
        for b in ([a] if single else nodes):
            mass = known.get((a, b), 0.0) + rest * share[a] * (1 if single else share[b])
            items.append((mass, [(0, a), (1, b)] if a != b else [(0, a)], (a, b)))
    tail = len(items)
    items += [(p, candidates(policy, ring, k, p), None) for k, p in heads.items()]
    # a heavy key moves whole under smalops: one piece
    filled = fill(items, nodes, whole_from=tail if policy.name == "smalops" else None)
    pairs = {pair: SPACE * units.get(0, 0) // max(1, sum(units.values()))
             for (_, cands, pair), units in zip(items[:tail], filled) if len(cands) == 2}
    pools = {k: cumulative(cands, [units.get(i, 0) for i, _ in cands])
             for k, (_, cands, _), units in zip(heads, items[tail:], filled[tail:])}
    return Plan(policy.name, ring, pools, pairs, single)


def cumulative(cands: list, weights: list) -> tuple:
    """((cumulative weight out of 2**64, piece index), ...) of the pieces with units."""
    total, run, pool = sum(weights) or 1, 0, []
    for (index, _), w in zip(cands, weights):
        if w:
            run += w
            pool.append((SPACE * run // total, index))
    return tuple(pool) or ((SPACE, cands[0][0]),)


def fill(items: list, nodes: list, whole_from: int | None = None) -> list[dict]:
    """Per item, {piece index: units} filled least loaded first. Units are interleaved
    in proportion to the items' masses (the k-th of m units at (k + 0.5) / m), as a
    stream mixing them would bring them. From item `whole_from` on (if given), each
    item is one unit taken whole, heaviest first, after every other."""
    load = dict.fromkeys(nodes, 0.0)
    order = []
    for i, (mass, _, _) in enumerate(items):
        if mass <= 0:
            continue
        if whole_from is not None and i >= whole_from:
            order.append((2.0 - mass, i, mass))
            continue
        units = max(1, round(mass * UNITS))
        order += [((k + 0.5) / units, i, mass / units) for k in range(units)]
    order.sort()
    out: list[dict] = [dict() for _ in items]
    for _, i, mass in order:
        index, node = min(items[i][1], key=lambda c: load[c[1]])
        load[node] += mass
        out[i][index] = out[i].get(index, 0) + 1
    return out


class History:
    """The keys' measured load over earlier epochs, for the next epoch's plan: a
    Space-Saving sketch of `capacity` counters and the tuples counted, both decayed by
    `decay` before each epoch's counts are added (recent epochs weigh most)."""

    def __init__(self, capacity: int = 256, decay: float = 0.5) -> None:
        self.sketch, self.decay, self.total = SpaceSaving(capacity), decay, 0.0

    def add(self, counts: Mapping, total: float) -> None:
        """One epoch: the counts of its hottest keys out of `total` tuples."""
        if self.total:
            self.sketch.decay(self.decay)
            self.total *= self.decay
        for key, count in sorted(counts.items(), key=lambda kv: kv[1]):
            self.sketch.add(key, count)
        self.total += total

    def plan(self, ring: Ring, policy=None) -> Plan:
        """The plan on `ring` for its balancer (or `policy`)."""
        return make_plan(policy or balancer(ring.balancer), ring,
                         dict(self.sketch.top(self.sketch.capacity)), self.total)


def shares_keys(ring: Ring) -> bool:
    """Whether the ring's balancer spreads keys over pieces (a plan then matters)."""
    return balancer(ring.balancer).pieces > 1


def plan_of_keys(policy, ring: Ring, keys: list) -> Plan:
    """A plan from a run of keys to come (e.g. the first chunk of a file): their own
    shares, the hottest `HEAD_KEYS` of them measured exactly."""
    from collections import Counter
    return make_plan(policy, ring, dict(Counter(keys).most_common(HEAD_KEYS)), len(keys))
