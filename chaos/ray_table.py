"""The Ray consistent-hashing paper's Experiment 1 replayed on the ring alone, with the
planners the nodes run (`floering.node.core.shedding`, `floering.node.core.redistribution`):
its Table 1, side by side.

Each workload's 100 items lie on a fresh 4-node ring laid out as the paper starts
each method: halving from 8 tokens per node (a power of two), doubling from one, the
workload's letters placed for that layout (so that static hashing has the paper's
skew). Two replays, both triggering as the paper does (on the most loaded reducer when
Q_max > Q_s (1 + tau), Q_s the second largest, tau = 0.2; each reducer redistributes
at most `rounds` times, Experiment 1: once):

- `placement`: the loads are where the 100 items land; the ring is redistributed until
  the trigger no longer fires, and S is taken of where they land at the end.
- `processed` (the paper's own measure, its §6.1: messages processed per reducer):
  the paper's pipeline in ticks. Four mappers each push one item of their quarter of
  the (shuffled) input a tick to the reducer the ring names; each reducer takes one
  item a tick from its queue; an item it no longer owns it forwards to the owner's
  queue (the paper's input forwarding) and takes the next; the balancer checks the
  queues after every tick. Each reducer keeps its own counts, merged at the end (the
  paper's state merge), and the merge is checked against a Counter of the input. S
  counts what each reducer processed, before and after the keys moved.

A round is planned by the function the node's machine calls, with what the node
measures: its ranges' rates (items arrived so far) and the sampled positions of its
keys; the others' rates as their stats would say.

    python -m floering.chaos.ray_table
"""

from __future__ import annotations

import random
from collections import Counter, deque

from floering.chaos.skew import PAPER_S, RAY, TOKENS_PER_NODE, ray_items
from floering.chaos.skew_measures import skew
from floering.wire.hashing import position
from floering.wire.ring import Ring
from floering.node.core.shedding import PeerLoad, cut_positions, plan_shed, with_split_tail

TAU = 0.2
START_TOKENS = {"halving": TOKENS_PER_NODE, "doubling": 1}
MAPPERS = 4
SEEDS = range(1, 11)
PERIODS = (1, 20)         # the balancer checks the queues every this many ticks


def redistribute(ring: Ring, node: str, tokens_per_node: int,
                 arrived: Counter | None = None) -> Ring:
    """`node`'s round: planned by the function its machine calls, from the items that
    arrived so far per key (its rates and samples, the others' rates), carried out as
    its runtime does (the cuts, then the moves)."""
    rates: dict[int, float] = {}
    samples: dict[int, dict[int, float]] = {}
    others: Counter = Counter()
    for key, n in (arrived or Counter()).items():
        token = ring.token_for_key(key)
        if ring.owner_of_token(token) == node:
            rates[token] = rates.get(token, 0.0) + n
            table = samples.setdefault(token, {})
            table[position(key)] = table.get(position(key), 0.0) + n
        else:
            others[ring.owner_of_token(token)] += n
    peers = {n: PeerLoad(float(others[n]), False) for n in ring.nodes if n != node}
    plan = plan_shed(ring, node, rates, peers, samples, reach=1,
                     tokens_per_node=tokens_per_node, depth=0)
    for pos in cut_positions(plan):
        ring = ring.split_token(ring.token_for_position(pos), pos)
    return ring.with_owners(with_split_tail(plan, ring, node))


def start_ring(method: str) -> Ring:
    return Ring.initial({f"n{i}": f"h:{i}" for i in range(4)}, 1, START_TOKENS[method], method)


def _fires(queues: dict[str, int], done: Counter, rounds: int) -> str | None:
    top = max(sorted(queues), key=lambda n: queues[n])
    second = max(q for n, q in queues.items() if n != top)
    if queues[top] > second * (1 + TAU) and queues[top] > 0 and done[top] < rounds:
        return top
    return None


def replay(name: str, method: str, rounds: int = 1) -> tuple[float, float, int]:
    """`placement`: (S before, S after, redistributions) of one workload."""
    tokens = START_TOKENS[method]
    items = ray_items(name, tokens)
    ring = start_ring(method)
    before, made, done = None, 0, Counter()
    while True:
        load = Counter(ring.owner(k) for k in items)
        loads = {n: load[n] for n in ring.nodes}
        before = skew(list(loads.values())) if before is None else before
        top = _fires(loads, done, rounds)
        if top is None:
            return before, skew(list(loads.values())), made
        done[top] += 1
        ring = redistribute(ring, top, tokens, Counter(items))
        made += 1


def pipeline(name: str, method: str, seed: int, rounds: int = 1,
             balance: bool = True, period: int = 1) -> tuple[float, int, int]:
    """`processed`: (S of what each reducer processed, redistributions, items
    forwarded). Raises if the merged counts differ from the input's."""
    tokens = START_TOKENS[method]
    items = ray_items(name, tokens)
    random.Random(f"{name}/{seed}").shuffle(items)
    share = -(-len(items) // MAPPERS)
    inputs = [deque(items[i * share:(i + 1) * share]) for i in range(MAPPERS)]
    ring = start_ring(method)
    queues: dict[str, deque] = {n: deque() for n in ring.nodes}
    state = {n: Counter() for n in ring.nodes}
    arrived: Counter = Counter()
    done, made, forwarded, tick = Counter(), 0, 0, 0
    while any(inputs) or any(queues.values()):
        tick += 1
        for source in inputs:
            if source:
                key = source.popleft()
                arrived[key] += 1
                queues[ring.owner(key)].append(key)
        for node, queue in queues.items():
            while queue:
                key = queue.popleft()
                if ring.owner(key) == node:
                    state[node][key] += 1
                    break
                queues[ring.owner(key)].append(key)       # input forwarding
                forwarded += 1
        checked = balance and tick % period == 0
        top = _fires({n: len(q) for n, q in queues.items()}, done, rounds) if checked else None
        if top is not None:
            done[top] += 1
            ring = redistribute(ring, top, tokens, arrived)
            made += 1
    merged = sum(state.values(), Counter())                # the final state merge
    if merged != Counter(items):
        raise AssertionError(f"{name} {method}: the merged counts differ from the input")
    return skew([sum(state[n].values()) for n in ring.nodes]), made, forwarded


def table(seeds=SEEDS, periods=PERIODS) -> list[dict]:
    rows = []
    for name in RAY:
        method, paper_before, paper_after = PAPER_S[name]
        for m in (["halving", "doubling"] if method == "both" else [method]):
            before, after, made = replay(name, m)
            still = [pipeline(name, m, s, balance=False)[0] for s in seeds]
            row = {"workload": name, "method": m, "paper": (paper_before, paper_after),
                   "before": round(before, 3), "after": round(after, 3),
                   "redistributions": made,
                   "processed_before": round(sum(still) / len(still), 3)}
            for period in periods:
                runs = [pipeline(name, m, s, period=period) for s in seeds]
                row[f"processed_p{period}"] = round(sum(r[0] for r in runs) / len(runs), 3)
                row[f"worst_p{period}"] = round(max(r[0] for r in runs), 3)
                row[f"forwarded_p{period}"] = round(sum(r[2] for r in runs) / len(runs), 1)
            rows.append(row)
    return rows


def main() -> int:
    print("| workload | method | paper: S without -> with | placement: S without -> with "
          "| rounds | processed, no LB | " + " | ".join(
              f"processed, check every {p} tick(s): mean (worst) | forwarded" for p in PERIODS)
          + " |")
    print("|" + " --- |" * (6 + 2 * len(PERIODS)))
    for r in table():
        p = r["paper"]
        cells = [f"{r[f'processed_p{q}']:.3f} ({r[f'worst_p{q}']:.3f}) | {r[f'forwarded_p{q}']}"
                 for q in PERIODS]
        print(f"| {r['workload']} | {r['method']} | {p[0]:.2f} -> {p[1]:.2f} | "
              f"{r['before']:.3f} -> {r['after']:.3f} | {r['redistributions']} | "
              f"{r['processed_before']:.3f} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
