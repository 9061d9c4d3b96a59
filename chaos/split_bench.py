"""Whole-range moves vs. a measured token split, replayed on a skewed stream.

The overloaded node n0 of a 3-node ring (r=1, 8 tokens each) receives a stream whose
hot keys all sit in ONE of its ranges, over a uniform background. The stream is cut into
batches per range as a mapper does, and every batch is fed to the node's own sampler
(`PositionLoad.record`, a few hashed keys per batch); per-range rates are counted
exactly. Then n0's shedding decision is replayed twice with the production functions:
whole ranges only (`choose_shed`), and whole ranges plus a split at the measured point
(`plan_split`). Printed: the max/mean load over n0 and its neighbour n1 (the pair a
move can even) and over all three nodes, for each.

    python -m floering.chaos.split_bench
"""

from __future__ import annotations

import argparse
import random
from collections import Counter, defaultdict

from floering.wire.hashing import position
from floering.node.core.load import choose_shed
from floering.wire.ring import Ring
from floering.node.core.split_point import PositionLoad, plan_split

CASES = {
    "2 hot keys, 45% + 45%": (0.45, 0.45),
    "2 hot keys, 60% + 30%": (0.60, 0.30),
    "3 hot keys, 30% each": (0.30, 0.30, 0.30),
    "4 hot keys, 22.5% each": (0.225, 0.225, 0.225, 0.225),
}


def hot_keys_in_one_range(ring: Ring, node: str, count: int, rnd: random.Random) -> list[str]:
    token = rnd.choice(ring.tokens_of(node))
    keys = []
    while len(keys) < count:
        key = f"hot{rnd.randrange(10 ** 9)}"
        if ring.token_for_key(key) == token:
            keys.append(key)
    return keys


def replay(shares: tuple[float, ...], seed: int, tuples: int = 200_000,
           batch: int = 100) -> dict:
    rnd = random.Random(seed)
    ring = Ring.initial({f"n{i}": f"h:{i}" for i in range(3)}, 1, 8)
    hot = hot_keys_in_one_range(ring, "n0", len(shares), rnd)
    background = [f"w{i}" for i in range(5000)]
    population = hot + background
    weights = list(shares) + [(1 - sum(shares)) / len(background)] * len(background)
    stream = rnd.choices(population, weights, k=tuples)
    counts = Counter(stream)
    rates = Counter()
    sampler = PositionLoad()
    buffers = defaultdict(list)
    for key in stream:                       # batches per range, as a mapper seals them
        token = ring.token_for_key(key)
        rates[token] += 1
        buffers[token].append(key)
        if len(buffers[token]) == batch:
            sampler.record(token, buffers.pop(token))
    for token, keys in buffers.items():
        sampler.record(token, keys)
    per_node = {n: sum(rates[t] for t in ring.tokens_of(n)) for n in ring.nodes}
    mine = {t: float(rates[t]) for t in ring.tokens_of("n0")}
    heirs = {h: float(per_node[h]) for h in ring.nodes if h != "n0"}

    def loads_after(moves: dict[int, str], tail: tuple[int, int, str] | None) -> dict:
        out = dict(per_node)
        for token, heir in moves.items():
            out["n0"] -= rates[token]
            out[heir] += rates[token]
        if tail is not None:
            token, at, heir = tail
            lo, _ = ring.range_of_token(token)
            moved = sum(c for k, c in counts.items() if ring.token_for_key(k) == token
                        and Ring.in_range(position(k), (at, token)))
            out["n0"] -= moved
            out[heir] += moved
        return out

    whole = choose_shed(ring, "n0", mine, heirs, set())
    samples = {t: sampler.samples(t) for t in ring.tokens_of("n0")}
    split = plan_split(ring, "n0", mine, heirs, set(), dict(whole), samples)
    results = {"none": per_node, "whole ranges": loads_after(whole, None),
               "whole ranges + split": loads_after(whole, split)}
    return {name: (ratio({n: r[n] for n in ("n0", "n1")}), ratio(r))
            for name, r in results.items()} | {"split": split is not None}


def ratio(loads: dict[str, float]) -> float:
    values = list(loads.values())
    mean = sum(values) / len(values)
    return max(values) / mean if mean else 0.0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=5, help="random placements per case")
    args = p.parse_args(argv)
    print("max/mean load, n0+n1 pair / all 3 nodes (mean over seeds, worst seed in brackets)")
    print(f"{'case':26} {'no move':>16} {'whole ranges':>18} {'with split':>18}")
    for case, shares in CASES.items():
        runs = [replay(shares, seed) for seed in range(args.seeds)]
        cols = []
        for name in ("none", "whole ranges", "whole ranges + split"):
            pair = [r[name][0] for r in runs]
            every = [r[name][1] for r in runs]
            cols.append(f"{sum(pair) / len(pair):.2f} / {sum(every) / len(every):.2f}"
                        f" [{max(pair):.2f}]")
        splits = sum(r["split"] for r in runs)
        print(f"{case:26} {cols[0]:>16} {cols[1]:>18} {cols[2]:>18}   split in {splits}/{len(runs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
