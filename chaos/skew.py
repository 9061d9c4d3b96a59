"""The skew benchmark: every balancer on the same workloads, side by side in one run.

Each (policy, workload) pair gets a fresh local ring running that policy; the workload
is fed as fast as one mapper goes, over and over for a few seconds, then the counts
are checked exactly against a Counter over what was fed, and the load each node carried is read from its `applied`
counter. Reported per pair: the skew S of the Ray consistent-hashing paper, max/mean
load, the load's standard deviation in % (partial/dynamic key grouping's measure),
DIST_COST (nodes holding a piece of a key, mean over the workload's keys),
ranges handed over, bytes of state moved between nodes (the nodes' `moved_bytes`:
full range copies for handoffs, splits and new replicas, pieces merged back),
throughput, and the p50/p99 of a batch's first emit -> acked.

The mapper sends tuple by tuple (`combine=False`): the policies are compared on the
load of the tuples themselves, as the papers do; `--combine` measures them behind the
mapper's pre-aggregation instead (a node's load is then combined states).

Workloads:
- the Ray paper's WL1-WL5, rebuilt from their definitions on our ring: 100 items
  (letters) laid out so that static hashing on the 4-node ring has the paper's
  no-balancing skew, one variant per method where the paper's differ (`-h`
  halving's, `-d` doubling's); the 100 items repeated in a seeded order;
- Zipf s = 0.8 / 1.1 / 1.5 over 10,000 keys on 8 nodes;
- one key only (WL3 at scale);
- the bundled corpus (King James Bible);
- a shifting Zipf 1.1 whose hot keys change half-way;
- `drifting` (Dalton, Holon): a Zipf 1.1 over 10,000 keys on 8 nodes whose hot keys
  change every 20,000 tuples (each period its own shuffle of the ranks);
- `merge-cost` (FlexD): 32 keys, 4 of them carrying 80% of the tuples, a new 4 every
  10,000 tuples, so every key is hot again and again and a policy that splits hot keys
  leaves it more and more pieces, each a partial state a read must merge (reported per
  pair: pieces per key, mean and most, and the merges a whole scan makes);
- the corpus with one word at every other position (`every-other`), or at half of
  the positions, shuffled (`hot-half`).

`--replayable` sends each workload as a source that may be replayed (a `floe feed`
file: its routing plan made from its first chunk); `--spark` sends the word workloads
through spark-submit (chaos.skew_spark).

    python -m floering.chaos.skew                       # every policy, every workload
    python -m floering.chaos.skew --policies none,pkg --workloads zipf-1.1 --tuples 300000
    python -m floering.chaos.skew --replayable --policies pkg --workloads every-other
    python -m floering.chaos.skew --spark --policies dkg,wchoices --workloads hot-half
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass

from floering.floe.cluster import LocalCluster, unwind_on_sigterm
from floering.chaos.skew_measures import (distribution_cost, imbalance, load_std_percent,
                                         piece_counts, skew)
from floering.v1 import floe_pb2, floe_pb2_grpc
from floering.mapper import RingClient
from floering.wire.balancers import BALANCERS
from floering.wire.codec import unpack_entries
from floering.wire.errors import FloeError
from floering.wire.pieces import base_of
from floering.wire.ring import Ring

# WL name -> (nodes, items on the most loaded node out of 100): S = (W - 25) / 75
RAY = {"wl1-h": 25, "wl1-d": 100, "wl2": 25, "wl3": None, "wl4-h": 85, "wl4-d": 62,
       "wl5-h": 40, "wl5-d": 66}
PAPER_S = {"wl1-h": ("halving", 0.00, 0.08), "wl1-d": ("doubling", 1.00, 0.20),
           "wl2": ("both", 0.00, 0.00), "wl3": ("doubling", 1.00, 0.75),
           "wl4-h": ("halving", 0.80, 0.52), "wl4-d": ("doubling", 0.49, 0.11),
           "wl5-h": ("halving", 0.20, 0.20), "wl5-d": ("doubling", 0.55, 0.12)}
WORKLOADS = [*RAY, "zipf-0.8", "zipf-1.1", "zipf-1.5", "one-key", "corpus", "shifting",
             "drifting", "merge-cost", "every-other", "hot-half"]
DRIFT_EVERY = 20_000        # drifting: the hot keys change every this many tuples
MERGE_KEYS, MERGE_HOT, MERGE_EVERY = 32, 4, 10_000   # merge-cost: 4 of 32 keys hot at a time
PERIODS = {"drifting": DRIFT_EVERY, "merge-cost": MERGE_EVERY}   # loads read per period
HOT = "floe"                # the hot word of every-other and hot-half (not in the corpus)
TOKENS_PER_NODE = 8


@dataclass
class Outcome:
    policy: str
    workload: str
    nodes: int
    tuples: int
    exact: bool
    skew: float
    max_over_mean: float
    load_std_percent: float
    dist_cost: float
    handed_off: int
    seconds: float
    throughput: float
    p50_ms: float
    p99_ms: float
    loads: list
    failure: str = ""           # why the counts could not be read back, if they could not
    moved_bytes: int = 0        # state bytes shipped between nodes: full copies, folds
    pieces_mean: float = 1.0    # partial states a key is held as (pieces, outgoing keys)
    pieces_max: int = 1
    merges: int = 0             # merges a whole scan makes: sum over keys of pieces - 1
    period_max_over_mean: float = 0.0   # drifting, merge-cost: mean over hot-set periods
    period_worst: float = 0.0           # and the worst period's max/mean


def nodes_for(workload: str) -> int:
    return 8 if workload.startswith("zipf") or workload == "drifting" else 4


def letters_by_node(nodes: int, tokens: int = TOKENS_PER_NODE) -> dict[str, list[str]]:
    """Short keys ('a'..'z', then 'aa', ...) grouped by the node owning them on a fresh
    ring (every policy starts from the same token layout)."""
    ring = Ring.initial({f"n{i}": f"h:{i}" for i in range(nodes)}, 1, tokens)
    alphabet = "abcdefghijklmnopqrstuvwxyz"
    pool = itertools.chain(alphabet, ("".join(p) for p in itertools.product(alphabet, repeat=2)))
    mine: dict[str, list[str]] = {n: [] for n in ring.nodes}
    for key in pool:
        mine[ring.owner(key)].append(key)
        if all(len(v) >= 4 for v in mine.values()):
            return mine
    raise AssertionError("no ring leaves a node without letters")


def ray_items(name: str, tokens: int = TOKENS_PER_NODE) -> list[str]:
    """100 letters with the paper's no-balancing skew on our 4-node ring (`tokens`
    per node)."""
    if name == "wl3":
        return ["a"] * 100
    letters = letters_by_node(4, tokens)
    nodes = sorted(letters)
    hot = RAY[name]
    rest = 100 - hot
    counts = [hot] + [rest // 3 + (1 if i < rest % 3 else 0) for i in range(3)]
    items = []
    for node, count in zip(nodes, counts):
        own = letters[node][:4]
        items += [own[i % len(own)] for i in range(count)]
    return items


def workload(name: str, tuples: int, seed: int = 1) -> list:
    pick = random.Random(f"{name}/{seed}")
    if name in RAY:
        items = ray_items(name)
        out = []
        for _ in range(max(1, tuples // len(items))):
            pick.shuffle(items)
            out += items
        return out
    if name == "drifting":
        return _drifting(pick, tuples)
    if name == "merge-cost":
        return _merge_cost(pick, tuples)
    if name.startswith("zipf-") or name == "shifting":
        s = 1.1 if name == "shifting" else float(name.split("-")[1])
        cumulative = list(itertools.accumulate(k ** -s for k in range(1, 10_001)))
        ranks = pick.choices(range(10_000), cum_weights=cumulative, k=tuples)
        if name != "shifting":
            return [f"k{r}" for r in ranks]
        later = list(range(10_000))
        pick.shuffle(later)                     # the hot keys of the second half
        half = tuples // 2
        return [f"k{r}" for r in ranks[:half]] + [f"k{later[r]}" for r in ranks[half:]]
    if name == "one-key":
        return ["hot"] * tuples
    if name in ("corpus", "every-other", "hot-half"):
        from floering.chaos.load import corpus_words
        words = corpus_words()
        if name == "corpus":
            return list(itertools.islice(itertools.cycle(words), tuples))
        half = list(itertools.islice(itertools.cycle(words), tuples // 2))
        if name == "every-other":             # the hot word at every other position
            return [w for word in half for w in (HOT, word)]
        keys = [HOT] * (tuples // 2) + half   # half the tuples, shuffled
        pick.shuffle(keys)
        return keys
    raise ValueError(f"unknown workload {name!r}: one of {', '.join(WORKLOADS)}")


def _drifting(pick: random.Random, tuples: int) -> list:
    """Zipf 1.1 over 10,000 keys, the ranks shuffled anew every DRIFT_EVERY tuples."""
    cumulative = list(itertools.accumulate(k ** -1.1 for k in range(1, 10_001)))
    ranks = pick.choices(range(10_000), cum_weights=cumulative, k=tuples)
    keys, order = [], list(range(10_000))
    for at in range(0, tuples, DRIFT_EVERY):
        pick.shuffle(order)
        keys += [f"k{order[r]}" for r in ranks[at:at + DRIFT_EVERY]]
    return keys


def _merge_cost(pick: random.Random, tuples: int) -> list:
    """MERGE_HOT of MERGE_KEYS keys carry 80% of the tuples, a new set every MERGE_EVERY:
    the keys in a shuffled order, MERGE_HOT at a time, shuffled again once all were hot."""
    names = [f"m{i}" for i in range(MERGE_KEYS)]
    keys, order = [], []
    for at in range(0, tuples, MERGE_EVERY):
        if not order:
            order = pick.sample(names, MERGE_KEYS)
        hot, order = order[:MERGE_HOT], order[MERGE_HOT:]
        n = min(MERGE_EVERY, tuples - at)
        keys += [pick.choice(hot) if pick.random() < 0.8 else pick.choice(names)
                 for _ in range(n)]
    return keys


def raw_holders(cluster: LocalCluster, pieces: dict | None = None) -> dict:
    """{key: nodes holding a piece of it}, from every node's own (unmerged) scan;
    `pieces` gets {key: the pieces (and outgoing keys) of it held anywhere}."""
    holders: dict = {}
    for node in cluster.nodes:
        if not node.alive():
            continue
        with cluster.channel(node.address) as channel:
            for chunk in floe_pb2_grpc.QueryPlaneStub(channel).Scan(
                    floe_pb2.ScanRequest(), timeout=60):
                for key in unpack_entries(chunk.entries):
                    holders.setdefault(base_of(key), set()).add(node.node_id)
                    if pieces is not None:
                        pieces.setdefault(base_of(key), set()).add(key)
    return holders


def _moved(rows: list[dict], before: dict[str, int]) -> int:
    return sum(r.get("moved_bytes", 0) - before.get(r["node_id"], 0) for r in rows
               if "error" not in r)


def run_one(policy: str, name: str, tuples: int, seed: int = 1,
            seconds: float = 0.0, combine: bool = False, replayable: bool = False) -> Outcome:
    """Feed the workload once, or over and over for `seconds` (a sustained load, so
    that a policy reacting to overload has time to). `replayable`: as a source that
    may be sent again (`floe feed`'s files), by the routing plan of its first chunk."""
    keys = workload(name, tuples, seed)
    chunks = [keys[at:at + 10_000] for at in range(0, len(keys), 10_000)]
    chunk_counts = [Counter(c) for c in chunks]
    nodes = nodes_for(name)
    with tempfile.TemporaryDirectory(prefix="floe-skew-") as tmp, \
            LocalCluster.up(nodes, 1, workdir=tmp, balancer=policy,
                            tokens_per_node=TOKENS_PER_NODE) as cluster:
        tls = cluster.tls("client")
        source = f"skew-{policy}-{name}-{seed}" if replayable else None
        with RingClient(cluster.seeds, tls=tls, combine=combine, source=source) as client:
            if replayable:
                from floering.chaos.skew_spark import replayable_plan
                client.rebind(source, 1, replayable_plan(client, keys))
            first = client.stats()
            before = {s["node_id"]: s["applied"] for s in first}
            moved_before = {s["node_id"]: s["moved_bytes"] for s in first}
            start = time.perf_counter()
            counts: Counter = Counter()
            sent, periods, mark = 0, [], dict(before)
            for i in itertools.count():
                client.emit_many(chunks[i % len(chunks)])
                counts.update(chunk_counts[i % len(chunks)])
                sent += len(chunks[i % len(chunks)])
                if PERIODS.get(name) and sent % PERIODS[name] == 0:
                    mark = _period(client, mark, periods)
                if i + 1 >= len(chunks) and time.perf_counter() - start >= seconds:
                    break
            try:
                client.flush()
                failure = ""
            except FloeError as exc:      # e.g. a ring that stopped taking tuples
                failure = f"{type(exc).__name__}: {exc}"
            elapsed = time.perf_counter() - start
            latencies = sorted(s for s, _ in client.delivery_latencies())
            rows = client.stats()
            try:
                got = None if failure else client.scan_all()
            except FloeError as exc:      # e.g. a range reported lost: shown, not hidden
                got, failure = None, f"{type(exc).__name__}: {exc}"
        loads = [r["applied"] - before.get(r["node_id"], 0) for r in rows]
        pieces: dict = {}
        holders = {} if failure else raw_holders(cluster, pieces)
    dist = distribution_cost({k: holders.get(k, ()) for k in counts})
    mean_pieces, most_pieces, merges = piece_counts({k: pieces.get(k, ()) for k in counts})
    exact = got == dict(counts)
    if not exact and not failure:
        failure = _difference(got, counts, rows)
    return Outcome(policy, name, nodes, sent, exact, round(skew(loads), 3),
                   round(1 + imbalance(loads), 3), round(load_std_percent(loads), 2),
                   round(dist, 3), sum(r["handed_off"] for r in rows), round(elapsed, 2),
                   round(sent / elapsed), _ms(latencies, 0.5), _ms(latencies, 0.99),
                   loads, failure, _moved(rows, moved_before), round(mean_pieces, 3),
                   most_pieces, merges,
                   round(sum(periods) / len(periods), 3) if periods else 0.0,
                   round(max(periods), 3) if periods else 0.0)


def _period(client, mark: dict, periods: list) -> dict:
    """One hot-set period ended: flush it (every tuple applied and acknowledged) and
    add its max/mean load, from the nodes' `applied` since `mark`, to `periods`."""
    client.flush()
    now = {s["node_id"]: s["applied"] for s in client.stats()}
    loads = [now[n] - mark.get(n, 0) for n in now]
    if sum(loads):
        periods.append(1 + imbalance(loads))
    return now


def run_spark_one(policy: str, name: str, tuples: int, seed: int = 1) -> Outcome:
    """The workload through spark-submit (chaos.skew_spark), as one Outcome."""
    from floering.chaos.skew_spark import run_spark
    keys = workload(name, tuples, seed)
    nodes = nodes_for(name)
    r = run_spark(policy, name, keys, nodes, TOKENS_PER_NODE)
    loads, failure = r["loads"], r["failure"]
    if not r["exact"] and not failure:
        failure = _difference(r["got"], Counter(keys), r["rows"])
    return Outcome(policy, name, nodes, len(keys), r["exact"], round(skew(loads), 3),
                   round(1 + imbalance(loads), 3), round(load_std_percent(loads), 2), 0.0,
                   sum(x.get("handed_off", 0) for x in r["rows"]), round(r["elapsed"], 2),
                   round(len(keys) / r["elapsed"]), 0.0, 0.0, loads, failure, 0)


def _difference(got: dict, counts: Counter, rows: list[dict]) -> str:
    """How a read-back differs from what was fed, and what the nodes went through."""
    over = sum(max(0, got.get(k, 0) - n) for k, n in counts.items()) + sum(
        v for k, v in got.items() if k not in counts)
    under = sum(max(0, n - got.get(k, 0)) for k, n in counts.items())
    keys = sum(got.get(k) != n for k, n in counts.items()) + sum(k not in counts for k in got)
    seen = {name: sum(r.get(name, 0) for r in rows if "error" not in r)
            for name in ("takeovers", "rejoined", "lost_ranges", "duplicates")}
    return (f"{keys} keys differ: {over} tuples too many, {under} missing; "
            + ", ".join(f"{name} {n}" for name, n in seen.items()))


def run_overload(policy: str, name: str, rate: float, work: int, seconds: float,
                 seed: int = 1, combine: bool = False, wait_us: int = 0) -> dict:
    """Latency under one overload for every policy: the reducer costs `work` loop turns
    and `wait_us` microseconds of blocked wall time per tuple (chaos.costly), and the
    workload is fed open-loop at `rate` tuples/s in
    20 ms ticks. A tuple's latency counts from its tick's due time, not from when it
    could be sent, to its batch's acknowledgement by r+1 nodes, so a ring that falls
    behind shows it (no coordinated omission). Ticks are not flushed one by one: the
    client pipelines them, as a mapper does, so its round trip does not cap the rate."""
    keys = workload(name, max(int(rate * seconds), 1), seed)
    with tempfile.TemporaryDirectory(prefix="floe-skew-") as tmp, \
            LocalCluster.up(nodes_for(name), 1, workdir=tmp, balancer=policy,
                            reducer="floering.chaos.costly:CostlyCount",
                            extra_args=["--reducer-arg", f"work={work}",
                                        "--reducer-arg", f"wait_us={wait_us}"]) as cluster:
        with RingClient(cluster.seeds, tls=cluster.tls("client"), linger=0.005,
                        batch_size=200, combine=combine) as client:
            moved_before = {s["node_id"]: s["moved_bytes"] for s in client.stats()}
            sent, tick = 0, 0.02
            start = time.monotonic()
            for i in itertools.count():
                due = start + i * tick
                if due - start >= seconds:
                    break
                time.sleep(max(0.0, due - time.monotonic()))
                upto = min(len(keys), int((i + 1) * tick * rate))
                client.emit_many(keys[sent:upto], due=due)
                sent = upto
            client.flush()
            elapsed = time.monotonic() - start
            latencies = _weighted(client.delivery_latencies())
            got, fed = client.scan_all(), Counter(keys[:sent])
            exact = got == dict(fed)
            rows = client.stats()
            moved = _moved(rows, moved_before)
    latencies.sort()
    return {"policy": policy, "workload": name, "rate": rate, "work": work,
            "wait_us": wait_us, "sent": sent,
            "offered_seconds": seconds, "elapsed": round(elapsed, 2), "exact": exact,
            "p50_ms": _ms(latencies, 0.5), "p99_ms": _ms(latencies, 0.99),
            "max_ms": round(1000 * latencies[-1], 1) if latencies else 0.0,
            "moved_bytes": moved, "failure": "" if exact else _difference(got, fed, rows)}


def _weighted(samples: list[tuple[float, int]]) -> list[float]:
    """(seconds, tuples) samples as one sorted latency per tuple."""
    return sorted(s for s, n in samples for _ in range(n))


def _ms(sorted_seconds: list[float], q: float) -> float:
    if not sorted_seconds:
        return 0.0
    return round(1000 * sorted_seconds[min(len(sorted_seconds) - 1,
                                           int(q * len(sorted_seconds)))], 1)


NAMES = {"wl1-h": "WL1-h", "wl1-d": "WL1-d", "wl2": "WL2", "wl3": "WL3", "wl4-h": "WL4-h",
         "wl4-d": "WL4-d", "wl5-h": "WL5-h", "wl5-d": "WL5-d", "zipf-0.8": "Zipf 0.8",
         "zipf-1.1": "Zipf 1.1", "zipf-1.5": "Zipf 1.5", "one-key": "one key"}  # others as named


def _bytes(n: int) -> str:
    for unit, size in (("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def markdown(outcomes: list[Outcome]) -> str:
    """The outcomes as docs/balance.md shows them: S per workload and policy, then
    every measure of every pair."""
    names = list(dict.fromkeys(o.workload for o in outcomes))
    policies = list(dict.fromkeys(o.policy for o in outcomes))
    by = {(o.workload, o.policy): o for o in outcomes}
    lines = ["| workload | nodes | " + " | ".join(f"S {p}" for p in policies) + " |",
             "| --- | --- |" + " --- |" * len(policies)]
    for n in names:
        cells = []
        for p in policies:
            o = by.get((n, p))
            cells.append("-" if o is None else "**not exact**" if not o.exact
                         else f"{o.skew:.3f}")
        nodes = next(o.nodes for o in outcomes if o.workload == n)
        lines.append(f"| {NAMES.get(n, n)} | {nodes} | " + " | ".join(cells) + " |")
    lines += ["", "| workload | policy | S | max/mean | max/mean a period: mean / worst "
              "| DIST_COST | pieces a key: mean / most | merges a scan | tuples/s "
              "| ranges moved | bytes moved | exact |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for n in names:
        for p in policies:
            o = by.get((n, p))
            if o is None:
                continue
            period = (f"{o.period_max_over_mean:.2f} / {o.period_worst:.2f}"
                      if o.period_worst else "-")
            lines.append(f"| {NAMES.get(n, n)} | {p} | {o.skew:.3f} | {o.max_over_mean:.2f} "
                         f"| {period} | {o.dist_cost:.2f} | {o.pieces_mean:.2f} / {o.pieces_max} "
                         f"| {o.merges} | {o.throughput / 1e6:.2f} M | {o.handed_off} "
                         f"| {_bytes(o.moved_bytes)} | "
                         + ("yes" if o.exact else f"**no**: {o.failure[:80]}") + " |")
    return "\n".join(lines)


def overload_medians(rows: list[dict]) -> dict[tuple[str, str], dict]:
    """Per (workload, policy): the median p99 over its rounds, the lowest and highest,
    and whether every round was exact."""
    runs: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        runs.setdefault((r["workload"], r["policy"]), []).append(r)
    out = {}
    for pair, rs in runs.items():
        p99s = sorted(r["p99_ms"] for r in rs)
        out[pair] = {"p99_ms": statistics.median(p99s), "low": p99s[0], "high": p99s[-1],
                     "rounds": len(rs), "exact": all(r["exact"] for r in rs)}
    return out


def overload_markdown(rows: list[dict]) -> str:
    """p99 per workload and policy (the median over rounds, with its range when there
    are several), and each over `none`'s."""
    names = list(dict.fromkeys(r["workload"] for r in rows))
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    by = overload_medians(rows)
    lines = ["| workload | " + " | ".join(policies) + " |",
             "| --- |" + " --- |" * len(policies)]
    for n in names:
        base = by.get((n, "none"))
        cells = []
        for p in policies:
            r = by.get((n, p))
            if r is None:
                cells.append("-")
                continue
            cell = f"{r['p99_ms']:.0f} ms"
            if r["rounds"] > 1:
                cell += f" [{r['low']:.0f}-{r['high']:.0f}]"
            if base is not None and p != "none" and base["p99_ms"]:
                cell += f" ({100 * (r['p99_ms'] / base['p99_ms'] - 1):+.0f}%)"
            if not r["exact"]:
                cell += " **not exact**"
            cells.append(cell)
        lines.append(f"| {NAMES.get(n, n)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def print_table(outcomes: list[Outcome]) -> None:
    print(f"{'workload':10} {'policy':8} {'S':>6} {'max/mean':>8} {'std%':>6} "
          f"{'dist':>5} {'moved':>5} {'moved KB':>9} {'tuples/s':>9} {'p50 ms':>7} "
          f"{'p99 ms':>7} exact")
    for o in outcomes:
        print(f"{o.workload:10} {o.policy:8} {o.skew:6.3f} {o.max_over_mean:8.3f} "
              f"{o.load_std_percent:6.2f} {o.dist_cost:5.2f} {o.handed_off:5d} "
              f"{o.moved_bytes / 1000:9.1f} {o.throughput:9.0f} {o.p50_ms:7.1f} "
              f"{o.p99_ms:7.1f} {o.exact}")
    for o in outcomes:
        if o.failure:
            print(f"  {o.workload} {o.policy}: {o.failure}")
    ray = [o for o in outcomes if o.workload in PAPER_S]
    if ray:
        print("\nThe Ray paper's Table 1 (S without / with its balancing), for comparison:")
        for name, (method, before, after) in PAPER_S.items():
            print(f"  {name:6} {method:8} {before:.2f} -> {after:.2f}")


PLOTTED = {"skew": "skew S (0 even, 1 all on one node)", "max_over_mean": "max / mean load",
           "dist_cost": "DIST_COST (nodes holding a piece of a key)",
           "throughput": "input tuples/s", "p99_ms": "p99 emit -> acked (ms)",
           "moved_bytes": "state bytes moved between nodes"}


def plot(outcomes: list[Outcome], directory: str) -> list[str]:
    """One PNG per metric: a bar per policy, grouped by workload."""
    from floering.chaos.plots import pyplot
    plt = pyplot()              # None, said in one line, without the plots extra
    if plt is None:
        return []
    from pathlib import Path
    names = list(dict.fromkeys(o.workload for o in outcomes))
    policies = list(dict.fromkeys(o.policy for o in outcomes))
    by = {(o.workload, o.policy): o for o in outcomes}
    written = []
    for metric, label in PLOTTED.items():
        fig, ax = plt.subplots(figsize=(14, 4.5))
        width = 0.8 / len(policies)
        for j, policy in enumerate(policies):
            ax.bar([i + j * width for i in range(len(names))],
                   [getattr(by[(n, policy)], metric) if (n, policy) in by else 0
                    for n in names], width, label=policy)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(names))], names, rotation=30)
        ax.set_ylabel(label)
        ax.legend(ncol=min(len(policies), 5), fontsize="small")
        fig.tight_layout()
        path = Path(directory) / f"skew-{metric.replace('_', '-')}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(str(path))
    return written


def overload_plot(rows: list[dict], directory: str) -> str:
    """The overload run's median p99 per pair (log scale: a backlog is seconds, a pair
    that keeps up tens of ms), a bar per policy grouped by workload, with the range of
    its rounds as error bars."""
    from floering.chaos.plots import pyplot
    plt = pyplot()              # None, said in one line, without the plots extra
    if plt is None:
        return "skipped"
    from pathlib import Path
    names = list(dict.fromkeys(r["workload"] for r in rows))
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    by = overload_medians(rows)
    fig, ax = plt.subplots(figsize=(12, 4.5))
    width = 0.8 / len(policies)
    for j, policy in enumerate(policies):
        cells = [by.get((n, policy)) for n in names]
        mid = [c["p99_ms"] if c else 0 for c in cells]
        ax.bar([i + j * width for i in range(len(names))], mid, width, label=policy,
               yerr=[[m - (c["low"] if c else 0) for m, c in zip(mid, cells)],
                     [(c["high"] if c else 0) - m for m, c in zip(mid, cells)]],
               capsize=2)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(names))],
                  [NAMES.get(n, n) for n in names])
    ax.set_yscale("log")
    ax.set_ylabel("p99 due -> acked by r+1 (ms)")
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")
    fig.tight_layout()
    path = Path(directory) / "overload-p99.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return str(path)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m floering.chaos.skew", description=__doc__.split("\n\n")[0])
    p.add_argument("--policies", default=",".join(sorted(BALANCERS)),
                   help="comma-separated balancers (default: every one)")
    p.add_argument("--workloads",
                   help="comma-separated workloads (default: every one; with --spark, "
                        "every-other and hot-half)")
    p.add_argument("--tuples", type=int, default=200_000,
                   help="tuples a workload is made of (default 200000)")
    p.add_argument("--seconds", type=float, default=6.0,
                   help="feed each workload over and over for this long, at least once "
                        "(default 6)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--overload", type=float, metavar="RATE",
                   help="instead: latency of every policy under one open-loop overload "
                        "of RATE tuples/s, with a reducer costing --work per tuple")
    p.add_argument("--overload-cores", type=float, metavar="CORES",
                   help="instead: as --overload, at the rate that takes CORES cores of "
                        "this machine with that reducer (measured first)")
    p.add_argument("--work", type=int, default=400,
                   help="--overload: loop turns per tuple in the reducer (default 400)")
    p.add_argument("--wait-us", type=int, default=0,
                   help="--overload: microseconds of wall time per tuple in the reducer, "
                        "blocking the node without using a core, so a node applies "
                        "1e6/WAIT_US tuples/s whatever else runs (default 0)")
    p.add_argument("--rounds", type=int, default=1,
                   help="--overload: run every pair this many times, round by round; the "
                        "table shows each pair's median p99 (default 1)")
    p.add_argument("--combine", action="store_true",
                   help="let the mapper pre-aggregate (its default); without it, it "
                        "sends tuple by tuple, and a node's load is the tuples themselves")
    p.add_argument("--replayable", action="store_true",
                   help="send each workload as a source that may be replayed (as floe feed "
                        "sends a file): by the routing plan made from its first chunk")
    p.add_argument("--spark", action="store_true",
                   help="instead: each word workload through spark-submit local[2], one "
                        "micro-batch per file, every tuple sent (--no-combine), each batch "
                        "by the routing plan the driver records for it")
    p.add_argument("--json", help="also write every outcome to this file")
    p.add_argument("--plot", metavar="DIR", help="write a PNG per metric to DIR")
    p.add_argument("--from-json", metavar="FILE",
                   help="print (and plot) the outcomes of an earlier run instead of running")
    p.add_argument("--markdown", action="store_true",
                   help="with --from-json: print the tables as docs/balance.md shows them")
    return p


def main(argv=None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    unwind_on_sigterm()     # the ring in use is stopped on the way out
    if args.markdown:
        return _print_markdown(p, args)
    policies = [x for x in args.policies.split(",") if x]
    names = [x for x in (args.workloads or ("every-other,hot-half" if args.spark else
                                             ",".join(WORKLOADS))).split(",") if x]
    _check_args(p, args, policies, names)
    if args.overload_cores:
        from floering.chaos.costly import tuples_per_core_second
        per_core = tuples_per_core_second(args.work)
        args.overload = round(args.overload_cores * per_core, -2)
        print(f"one core applies {per_core:,.0f} tuples/s at work={args.work}: "
              f"{args.overload_cores} cores is {args.overload:,.0f} tuples/s", flush=True)
    if args.overload:
        return _run_overloads(args, policies, names)
    return _run_balances(args, policies, names)


def _print_markdown(p: argparse.ArgumentParser, args) -> int:
    if not args.from_json:
        p.error("--markdown needs --from-json")
    with open(args.from_json) as fh:
        rows = json.load(fh)
    overload = bool(rows) and "rate" in rows[0]
    print(overload_markdown(rows) if overload
          else markdown([Outcome(**o) for o in rows]))
    if overload and args.plot:
        print("plot:", overload_plot(rows, args.plot))
    return 0


def _check_args(p: argparse.ArgumentParser, args, policies: list[str],
                names: list[str]) -> None:
    from floering.chaos.skew_spark import SPARK_WORKLOADS
    if args.spark and (args.replayable or args.combine or args.overload
                       or args.overload_cores):
        p.error("--spark sends every tuple by the driver's plans: alone")
    if args.spark and set(names) - set(SPARK_WORKLOADS):
        p.error(f"--spark runs word workloads only: {', '.join(SPARK_WORKLOADS)}")
    for x in policies:
        if x not in BALANCERS:
            p.error(f"unknown policy {x!r}: one of {', '.join(sorted(BALANCERS))}")
    for x in names:
        if x not in WORKLOADS:
            p.error(f"unknown workload {x!r}: one of {', '.join(WORKLOADS)}")
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if args.overload and args.overload_cores:
        p.error("--overload and --overload-cores: one or the other")
    if args.wait_us < 0:
        p.error("--wait-us must be at least 0")
    if args.overload_cores and args.wait_us:
        p.error("--overload-cores measures CPU work: give --overload with --wait-us")


def _run_overloads(args, policies: list[str], names: list[str]) -> int:
    rows = []
    for round_ in range(1, args.rounds + 1):
        # Round by round, each starting the policies one further along: a machine
        # whose speed drifts weighs on every policy alike.
        turn = policies[round_ - 1:] + policies[:round_ - 1]
        for name, policy in ((n, p) for n in names for p in turn):
            rows.append(run_overload(policy, name, args.overload, args.work,
                                     args.seconds, args.seed, args.combine,
                                     args.wait_us))
            r = rows[-1]
            r["round"] = round_
            print(f"round {round_} {r['workload']:10} {r['policy']:8} rate "
                  f"{r['rate']:.0f}/s: sent "
                  f"{r['sent']} in {r['elapsed']:.1f} s (offered "
                  f"{r['offered_seconds']:.0f} s), p50 {r['p50_ms']} ms, p99 "
                  f"{r['p99_ms']} ms, max {r['max_ms']} ms, moved "
                  f"{r['moved_bytes'] / 1000:.1f} KB, exact {r['exact']}", flush=True)
            if args.json:             # after every pair: a long run stopped keeps them
                with open(args.json, "w") as fh:
                    json.dump(rows, fh, indent=1)
    print(overload_markdown(rows))
    if args.plot:
        print("plot:", overload_plot(rows, args.plot))
    return 0 if all(r["exact"] for r in rows) else 1


def _run_balances(args, policies: list[str], names: list[str]) -> int:
    outcomes = []
    if args.from_json:
        with open(args.from_json) as fh:
            outcomes = [Outcome(**o) for o in json.load(fh)]
        names = []
    for name in names:
        for policy in policies:
            outcomes.append(run_spark_one(policy, name, args.tuples, args.seed)
                            if args.spark else
                            run_one(policy, name, args.tuples, args.seed, args.seconds,
                                    args.combine, args.replayable))
            o = outcomes[-1]
            print(f"# {name} {policy}: S {o.skew:.3f}, max/mean {o.max_over_mean:.3f}, "
                  f"moved {o.moved_bytes / 1000:.1f} KB, exact {o.exact}", flush=True)
            if args.json:                 # after every pair: a long run stopped keeps them
                with open(args.json, "w") as fh:
                    json.dump([asdict(o) for o in outcomes], fh, indent=1)
    print()
    print_table(outcomes)
    if args.plot:
        print("plots:", ", ".join(plot(outcomes, args.plot)))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump([asdict(o) for o in outcomes], fh, indent=1)
    median = statistics.median(o.throughput for o in outcomes) if outcomes else 0
    print(f"\nmedian throughput {median:.0f} tuples/s; every count exact: "
          f"{all(o.exact for o in outcomes)}")
    return 0 if all(o.exact for o in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
