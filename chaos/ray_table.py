"""The Ray consistent-hashing paper's Experiment 1 replayed on the ring alone, with the
planners the nodes run (`floering.node.core.redistribution`): its Table 1, side by side.

Each workload's 100 items lie on a fresh 4-node ring laid out as the paper starts
each method: halving from 8 tokens per node (a power of two), doubling from one, the
workload's letters placed for that layout (so that static hashing has the paper's
skew). As in the paper, the balancer triggers on the most loaded reducer when
Q_max > Q_s (1 + tau) (Q_s the second largest load, tau = 0.2), and each reducer
redistributes at most `rounds` times (Experiment 1, Table 1: once); S is then taken of where the items land. No timing is involved: this is the placement the
policies reach, which the live benchmark (`floering.chaos.skew`) reaches only once a node is
overloaded.

    python -m floering.chaos.ray_table
"""

from __future__ import annotations

from collections import Counter

from floering.chaos.skew import PAPER_S, RAY, TOKENS_PER_NODE, ray_items
from floering.chaos.skew_measures import skew
from floering.node.core.shedding import cut_positions, plan_shed, with_split_tail
from floering.node.core.ring import Ring

TAU = 0.2
START_TOKENS = {"halving": TOKENS_PER_NODE, "doubling": 1}


def redistribute(ring: Ring, node: str, tokens_per_node: int) -> Ring:
    """`node`'s round: planned by the function its machine calls, carried out as its
    runtime does (the cuts, then the moves)."""
    plan = plan_shed(ring, node, {}, {}, {}, reach=1, tokens_per_node=tokens_per_node,
                     depth=0)
    for pos in cut_positions(plan):
        ring = ring.split_token(ring.token_for_position(pos), pos)
    return ring.with_owners(with_split_tail(plan, ring, node))


def replay(name: str, method: str, rounds: int = 1) -> tuple[float, float, int]:
    """(S before, S after, redistributions) of one workload under one method."""
    tokens = START_TOKENS[method]
    items = ray_items(name, tokens)
    ring = Ring.initial({f"n{i}": f"h:{i}" for i in range(4)}, 1, tokens, method)
    before, made, done = None, 0, Counter()
    while True:
        load = Counter(ring.owner(k) for k in items)
        loads = sorted((load[n] for n in ring.nodes), reverse=True)
        before = skew(loads) if before is None else before
        top = max(ring.nodes, key=lambda n: load[n])
        if loads[0] <= loads[1] * (1 + TAU) or done[top] >= rounds:
            return before, skew(loads), made
        done[top] += 1
        ring = redistribute(ring, top, tokens)
        made += 1


def table() -> list[dict]:
    rows = []
    for name in RAY:
        method, paper_before, paper_after = PAPER_S[name]
        for m in (["halving", "doubling"] if method == "both" else [method]):
            before, after, made = replay(name, m)
            rows.append({"workload": name, "method": m, "paper": (paper_before, paper_after),
                         "before": round(before, 3), "after": round(after, 3),
                         "redistributions": made})
    return rows


def main() -> int:
    print(f"{'workload':8} {'method':9} {'paper S':>13} {'ring S':>15} redistributions")
    for r in table():
        p = r["paper"]
        print(f"{r['workload']:8} {r['method']:9} {p[0]:5.2f} -> {p[1]:4.2f} "
              f"{r['before']:6.3f} -> {r['after']:5.3f} {r['redistributions']:6}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
