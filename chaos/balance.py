"""Neighbour load balancing under a skewed stream (the paper's Fig. 6a), measured.

A few hot words, all on one node's ranges, make up most of an open-loop stream fed at a
fixed rate; the node becomes overloaded, hands its hottest ranges to its clockwise
neighbour by itself, and is relieved. Printed: the reaction time (overload -> moved ->
relieved), per-node throughput and the max/mean load ratio before and after, how the
measured split compares with halving the share, and an exact check of every count.

    python -m floering.chaos.balance --seconds 20 --plot docs/elasticity-rate.png
    python -m floering.chaos.balance --rate 16000 --work 4000 --runs 4 --compare-reach
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import msgpack

from floering.floe.cluster import LocalCluster
from floering.chaos.corpus import kjv_lines
from floering.chaos.timeline import node_events
from floering.mapper import RingClient, split_words
from floering.node.core.load import choose_shed, halving_shed
from floering.wire.ring import Ring



def hot_words(ring: Ring, node: str, count: int) -> list[str]:
    """`count` words owned by `node`, each in a different range."""
    words, tokens = [], set()
    for i in range(100_000):
        word = f"hot{i}"
        token = ring.token_for_key(word)
        if ring.owner_of_token(token) == node and token not in tokens:
            words.append(word)
            tokens.add(token)
            if len(words) == count:
                return words
    raise ValueError(f"{node} owns fewer than {count} ranges")


def hot_words_in_one_range(ring: Ring, node: str, count: int) -> list[str]:
    """`count` words all in `node`'s first range."""
    token = ring.tokens_of(node)[0]
    words = [w for w in (f"hot{i}" for i in range(1_000_000))
             if ring.token_for_key(w) == token][:count]
    if len(words) < count:
        raise ValueError(f"found only {len(words)} words in token {token}")
    return words


class OpenLoopFeeder(threading.Thread):
    """Emits `rate` tuples/s in 20 ms ticks; a flush every half second counts what the
    ring acknowledged. Every tuple is sent (no combining): the load it stands for is
    a reduce that costs per tuple on the node."""

    def __init__(self, seeds, rate: float, words: list[str], tls=None) -> None:
        super().__init__(daemon=True)
        self.client = RingClient(seeds, linger=0.01, timeout=60, batch_size=100, tls=tls,
                                 combine=False)
        self.rate, self.words = rate, words
        self.acked, self.stop, self.error = Counter(), threading.Event(), None

    def run(self) -> None:
        try:
            pending, i, tick = [], 0, 0.02
            started = time.monotonic()
            last_flush = started
            while not self.stop.is_set():
                due = int((time.monotonic() - started) * self.rate) - i
                chunk = [self.words[(i + k) % len(self.words)] for k in range(max(0, due))]
                i += len(chunk)
                self.client.emit_many(chunk)
                pending += chunk
                if time.monotonic() - last_flush >= 0.5:
                    self.client.flush()
                    self.acked.update(pending)
                    pending, last_flush = [], time.monotonic()
                time.sleep(tick)
            self.client.flush()
            self.acked.update(pending)
        except Exception as exc:
            self.error = exc


def run(workdir: str | Path, seconds: float = 20.0, rate: float = 30_000, nodes: int = 3,
        work: int = 1000, hot: int = 4, hot_share: float = 0.9, sample: float = 0.2,
        cooldown: float = 3.0, reach: int = 2, one_range: bool = False,
        policy: str = "floe", wait_us: int = 0) -> dict:
    """`one_range`: every hot word in the same range of n0 (only a split can share it).
    `policy`: the balancer that moves ranges (floe, halving or doubling).
    `work` spins a core per tuple; `wait_us` blocks the node that long per tuple instead,
    which overloads it however busy the machine's other cores are (chaos.costly)."""
    extra = ["--reducer-arg", f"work={work}", "--reducer-arg", f"wait_us={wait_us}",
             "--balancer", policy,
             "--balance-reach", str(reach),
             "--high-queue", "16",
             "--low-queue", "4", "--high-cpu", "0.85", "--low-cpu", "0.7",
             "--balance-cooldown", str(cooldown)]   # the default failure detector
    with LocalCluster.up(nodes, 1, workdir=workdir, reducer="floering.chaos.costly:CostlyCount",
                         tokens_per_node=8, extra_args=extra) as cluster:
        probe = RingClient(cluster.seeds, timeout=30, tls=cluster.tls("client"))
        ring = probe.ring
        hot_keys = hot_words_in_one_range(ring, "n0", hot) if one_range else \
            hot_words(ring, "n0", hot)
        background = [w for line in kjv_lines(2000) for w in split_words(line)]
        stream, b = [], 0
        for i in range(20_000):           # hot_share of the stream on the hot words
            if (i % 100) < hot_share * 100:
                stream.append(hot_keys[i % hot])
            else:
                stream.append(background[b % len(background)])
                b += 1
        feeder = OpenLoopFeeder(cluster.seeds, rate, stream, tls=cluster.tls("client"))
        started = time.time()
        feeder.start()
        samples = []                       # (t, ring, {node: stats dict})
        while time.time() - started < seconds:
            time.sleep(sample)
            try:
                rows = probe.stats()
                ring = probe.refresh_ring()
            except Exception:
                continue
            samples.append((time.time() - started, ring,
                            {r["node_id"]: r for r in rows if "error" not in r}))
        feeder.stop.set()
        feeder.join(120)
        if feeder.error:
            raise feeder.error
        got = probe.scan_all()
        probe.close()
        exact = got == dict(feeder.acked)
        mismatch = {k: (got.get(k), feeder.acked.get(k)) for k in set(got) | set(feeder.acked)
                    if got.get(k) != feeder.acked.get(k)}
        events, handoff_ms, declared, splits = [], [], 0, 0
        for node in cluster.nodes:
            for e in node_events(node.events):
                kind = e.get("kind")
                if kind == "handoff_committed":
                    handoff_ms.append(round(e["ms"]))
                    events.append((e["t"] - started, node.node_id, "moved"))
                elif kind in ("overloaded", "relieved"):
                    events.append((e["t"] - started, node.node_id, kind))
                splits += kind == "split"
                declared += kind == "fenced"
    events.sort()
    result = analyse(samples, events, exact, sum(feeder.acked.values()), seconds)
    result.update(handoff_ms=sorted(handoff_ms), false_declarations=declared,
                  mismatch=mismatch, splits=splits)
    return result


def analyse(samples, events, exact, acked, seconds) -> dict:
    out = {"exact": exact, "acked": acked, "events": events, "samples": samples}
    over = next(((t, n) for t, n, k in events if k == "overloaded"), None)
    if over is None:
        return out
    t_over, node = over
    moved = next((t for t, n, k in events if k == "moved" and n == node and t >= t_over), None)
    # relief counts once it lasts: a ring change pauses the mappers for a moment, and the
    # idle blip that follows is not relief
    mine = [(t, k) for t, n, k in events if n == node and k in ("overloaded", "relieved")]
    relieved = next((t for i, (t, k) in enumerate(mine) if k == "relieved" and t >= t_over
                     and all(t2 - t >= 2.0 for t2, k2 in mine[i + 1:] if k2 == "overloaded")
                     and t <= seconds - 2.0), None)
    out.update(node=node, t_over=t_over, t_moved=moved, t_relieved=relieved)

    def window(lo, hi):
        inside = [(r, s) for t, r, s in samples if lo <= t <= hi]
        rows = [s for _, s in inside]
        # the members at the window's end: a node fenced and back under a new name is
        # one node, not two
        names = sorted(inside[-1][0].nodes) if inside else []
        return {n: sum(s.get(n, {}).get("apply_rate", 0.0) for s in rows) / max(1, len(rows))
                for n in names}
    # before: until the first move (the load is still the unbalanced one)
    before = window(max(0.0, t_over - 2.0), moved if moved is not None else t_over)
    after = window((relieved or moved or t_over) + 1.0, seconds)
    out.update(before=before, after=after, ratio_before=_ratio(before), ratio_after=_ratio(after))
    # the split decision, replayed on the per-range loads measured just before the move
    last = [(r, s) for t, r, s in samples if t <= (moved or t_over)]
    if last:
        ring, stats = last[-1]
        loads = {n: {int(k): v for k, v in msgpack.unpackb(s["load"], strict_map_key=False).items()}
                 for n, s in stats.items()}
        rates = {n: sum(v.values()) for n, v in loads.items()}
        measured = choose_shed(ring, node, loads.get(node, {}),
                               {h: rates.get(h, 0.0) for h in ring.nodes if h != node}, set())
        halved = halving_shed(ring, node)
        out.update(split_measured=_ratio(_after_moves(ring, loads, measured)),
                   split_halving=_ratio(_after_moves(ring, loads, halved)),
                   split_none=_ratio(rates))
    return out


def _after_moves(ring: Ring, loads: dict, moves: dict) -> dict[str, float]:
    totals = {n: 0.0 for n in ring.nodes}
    for node, per_token in loads.items():
        for token, rate in per_token.items():
            owner = moves.get(token, node)
            totals[owner] = totals.get(owner, 0.0) + rate
    return totals


def _ratio(rates: dict[str, float]) -> float:
    values = list(rates.values())
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean else 0.0


def plot(result: dict, path: str) -> None:
    from floering.chaos.plots import pyplot
    plt = pyplot()              # None, said in one line, without the plots extra
    if plt is None:
        return
    names = sorted({n for _, _, s in result["samples"] for n in s})
    fig, ax = plt.subplots(figsize=(8, 4))
    for name in names:
        ts = [t for t, _, s in result["samples"] if name in s]
        ax.plot(ts, [s[name]["apply_rate"] / 1000 for t, _, s in result["samples"] if name in s],
                label=name)
    for key, style, label in (("t_over", "r--", "overloaded"), ("t_moved", "k:", "ranges moved"),
                              ("t_relieved", "g--", "relieved")):
        if result.get(key) is not None:
            ax.axvline(result[key], color=style[0], linestyle=style[1:], label=label)
    ax.set_xlabel("seconds")
    ax.set_ylabel("tuples applied per second (thousands)")
    ax.set_title("per-node rate, skewed stream, neighbour load balancing")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def report(result: dict) -> str:
    lines = [f"acknowledged {result['acked']:,} tuples; exact: {result['exact']}",
             f"handoffs: {len(result.get('handoff_ms', []))}, each took (ms) "
             f"{result.get('handoff_ms')}; nodes wrongly declared dead: "
             f"{result.get('false_declarations', 0)}; token splits: {result.get('splits', 0)}"]
    if "t_over" not in result:
        return "\n".join(lines + ["no node became overloaded"])
    node = result["node"]
    lines.append(f"{node} overloaded at {result['t_over']:.2f} s, moved ranges at "
                 f"{_fmt(result['t_moved'])}, relieved at {_fmt(result['t_relieved'])}")
    if result.get("t_relieved") is not None:
        lines.append(f"reaction time overload -> relief: "
                     f"{result['t_relieved'] - result['t_over']:.2f} s "
                     f"(-> ranges moved: {result['t_moved'] - result['t_over']:.2f} s)")
    for label in ("before", "after"):
        rates = result[label]
        lines.append(f"per-node tuples/s {label:6}: " + ", ".join(
            f"{n} {r:,.0f}" for n, r in sorted(rates.items())) +
            f"  (max/mean {result['ratio_' + label]:.2f})")
    if "split_measured" in result:
        lines.append(f"split replayed on the measured per-range loads, max/mean: none "
                     f"{result['split_none']:.2f}, halving the share {result['split_halving']:.2f}, "
                     f"measured split {result['split_measured']:.2f}")
    return "\n".join(lines)


def _fmt(t):
    return "-" if t is None else f"{t:.2f} s"


def summary_row(result: dict) -> dict:
    """The numbers of one run that a series compares."""
    def since_over(key):
        t = result.get(key)
        return None if t is None or "t_over" not in result else t - result["t_over"]
    return {"exact": result["exact"], "overloaded": "t_over" in result,
            "moved": since_over("t_moved"),
            "relieved": since_over("t_relieved"), "handoffs": len(result.get("handoff_ms", [])),
            "false": result.get("false_declarations", 0),
            "before": result.get("ratio_before"), "after": result.get("ratio_after")}


def compare(rows: dict[int, list[dict]]) -> str:
    """Side by side: per reach, the median reaction times and balance over the runs."""
    from statistics import median

    def med(values):
        values = [v for v in values if v is not None]
        return median(values) if values else None
    lines = ["reach | runs | exact | overloaded | relief <= 1 s | overload -> moved (median) | "
             "overload -> relief (median) | handoffs (median) | max/mean after (median)"]
    meds = {}
    for reach, runs in sorted(rows.items()):
        rs = [r for r in runs if r["overloaded"]]
        relieved = [r["relieved"] for r in rs]
        meds[reach] = (med(relieved), med([r["after"] for r in rs]))
        lines.append(f"{reach} | {len(runs)} | {sum(r['exact'] for r in runs)}/{len(runs)} | "
                     f"{len(rs)}/{len(runs)} | "
                     f"{sum(1 for v in relieved if v is not None and v <= 1.0)}/{len(rs)} | "
                     f"{_fmt(med([r['moved'] for r in rs]))} | {_fmt(meds[reach][0])} | "
                     f"{med([r['handoffs'] for r in rs])} | {meds[reach][1] or 0:.2f}")
    if 1 in meds and 2 in meds and all(meds[k][0] for k in (1, 2)):
        lines.append(f"median relief time, reach 2 / reach 1: {meds[2][0] / meds[1][0]:.2f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--rate", type=float, default=30_000, help="tuples/s fed")
    p.add_argument("--work", type=int, default=1000, help="CPU spins per tuple in the reducer")
    p.add_argument("--wait-us", type=int, default=0,
                   help="microseconds per tuple the reducer blocks its node (no CPU)")
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--hot", type=int, default=4,
                   help="hot words, each in its own range (all in one with --one-range)")
    p.add_argument("--cooldown", type=float, default=3.0, help="seconds between two moves of a node")
    p.add_argument("--reach", type=int, default=2,
                   help="nodes clockwise a shed range may go (1: the neighbour only)")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--compare-reach", action="store_true",
                   help="alternate runs with reach 1 and 2 and compare them side by side")
    p.add_argument("--plot", help="write the per-node rate plot (PNG) of the first run here")
    p.add_argument("--one-range", action="store_true",
                   help="put every hot word in the same range (only a token split shares it)")
    p.add_argument("--policy", choices=["floe", "halving", "doubling"], default="floe",
                   help="the balancer that moves ranges (default floe)")
    args = p.parse_args(argv)
    reaches = [1, 2] if args.compare_reach else [args.reach]
    rows: dict[int, list[dict]] = {r: [] for r in reaches}
    ok = True
    for i in range(args.runs):
        for reach in reaches:
            with tempfile.TemporaryDirectory() as tmp:
                result = run(tmp, args.seconds, args.rate, nodes=args.nodes, work=args.work,
                             hot=args.hot, cooldown=args.cooldown, reach=reach,
                             one_range=args.one_range, policy=args.policy,
                             wait_us=args.wait_us)
            print(f"--- run {i + 1}, reach {reach}")
            print(report(result), flush=True)
            rows[reach].append(summary_row(result))
            ok = ok and result["exact"]
            if args.plot and i == 0 and reach == reaches[-1]:
                plot(result, args.plot)
                print(f"plot: {args.plot}")
    if args.runs > 1 or len(reaches) > 1:
        print(compare(rows))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

