"""How the ring's costs grow with its state and its size, measured on real processes.

    python -m floering.chaos.growth [--keys 100000,1000000,5000000,10000000,20000000]
                           [--nodes 4] [--update-rate 100000] [--scale]
                           [--json FILE] [--plot DIR] [--keep DIR] [--node-arg=FLAG]

For each key count: a fresh ring (r=1, mutual TLS) is filled with that many distinct
keys, then
- memory: the nodes' resident memory over what they held empty, per stored key copy
  (each key is on r+1 nodes);
- checkpoints: under an open-loop stream of updates to existing keys at
  --update-rate tuples/s, the checkpoint bytes shipped and the round time per interval
  (the nodes' own counters);
- a SIGKILL of one node: from the kill, its death declared (`detected`), its ranges
  taken over and applying again (the heirs' events), every key of its ranges
  answering again (a sample of keys from each of its ranges, read until each gives
  its exact count), and every range on r+1 nodes again (`re_replicated`); the heirs'
  peak resident memory during the takeover over their own before the kill;
- exactness: the sampled keys read exactly, and with <= 1 M keys every key.
--scale adds throughput against the number of nodes (one feeder) and of feeder
processes (4 nodes), the same Zipf words every time, exact against a Counter.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import signal
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

from floering.chaos.bench import zipf_words
from floering.floe.cluster import LocalCluster, unwind_on_sigterm
from floering.chaos.timeline import Injected, failure_timelines, read_events
from floering.mapper import RingClient

CHUNK = 50_000
SAMPLE_PER_RANGE = 8


def key_of(i: int) -> str:
    return f"k{i}"


def _rss(pids) -> dict[int, int]:
    out = {}
    for pid in pids:
        try:
            out[pid] = psutil.Process(pid).memory_info().rss
        except psutil.Error:
            out[pid] = 0
    return out


def _fill(client: RingClient, keys: int) -> None:
    for start in range(0, keys, CHUNK):
        client.emit_many([key_of(i) for i in range(start, min(keys, start + CHUNK))])
    client.flush()


def _settled(client: RingClient, timeout: float = 600.0) -> None:
    """Until every replica's checkpoint covers what it backed up (nothing in flight)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = client.stats()
        if all(s.get("backup_tuples", 1) == 0 and s.get("queue_length", 1) == 0
               for s in stats):
            return
        time.sleep(0.2)


def _counter_totals(stats: list[dict]) -> tuple[int, int, float]:
    return (sum(s.get("checkpoint_bytes", 0) for s in stats),
            sum(s.get("checkpoint_rounds", 0) for s in stats),
            sum(s.get("checkpoint_seconds", 0.0) for s in stats))


def checkpoint_cost(client: RingClient, keys: int, rate: float,
                    seconds: float = 4.0) -> tuple[float, float]:
    """(bytes per checkpoint round, seconds per round) across the ring while updates
    to existing keys stream in at `rate` tuples/s; the keys updated are counted."""
    rng = random.Random(7)
    before = _counter_totals(client.stats())
    tick = 0.02
    per_tick = max(1, int(rate * tick))
    started = time.monotonic()
    n = 0
    while time.monotonic() - started < seconds:
        client.emit_many([key_of(rng.randrange(keys)) for _ in range(per_tick)])
        n += 1
        delay = started + n * tick - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    client.flush()
    after = _counter_totals(client.stats())
    rounds = max(1, after[1] - before[1])
    return (after[0] - before[0]) / rounds, (after[2] - before[2]) / rounds


class MemorySampler(threading.Thread):
    """Resident memory of some processes every `interval` seconds: the peak of each."""

    def __init__(self, pids, interval: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.pids, self.interval = list(pids), interval
        self.peak = {pid: 0 for pid in self.pids}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for pid, rss in _rss(self.pids).items():
                self.peak[pid] = max(self.peak[pid], rss)
            time.sleep(self.interval)


class Trickle(threading.Thread):
    """Fresh keys u0, u1, ... at about `rate` tuples/s until stopped, then flushed."""

    def __init__(self, seeds, tls, rate: float = 20_000) -> None:
        super().__init__(daemon=True)
        self.seeds, self.tls, self.rate = seeds, tls, rate
        self.stop = threading.Event()
        self.sent = 0
        self.error: Exception | None = None

    def run(self) -> None:
        tick = 0.01
        per_tick = max(1, int(self.rate * tick))
        try:
            with RingClient(self.seeds, tls=self.tls, timeout=600) as client:
                while not self.stop.is_set():
                    client.emit_many([f"u{i}" for i in range(self.sent, self.sent + per_tick)])
                    self.sent += per_tick
                    time.sleep(tick)
        except Exception as exc:      # reported as inexact
            self.error = exc


def _answering(client: RingClient, sample: list[str], expect: dict, started: float,
               timeout: float = 600.0) -> float | None:
    """Seconds from `started` (wall) until every sampled key has read its exact count.
    Each key is read over and over by a reader of its own, all at once, so a key's time
    is its own and not the sum of the reads of the keys before it."""
    answered: dict[str, float] = {}
    deadline = time.monotonic() + timeout

    def watch(key: str) -> None:
        while time.monotonic() < deadline:
            try:
                if client.get(key) == expect[key]:
                    answered[key] = time.time() - started
                    return
            except Exception:
                pass                  # a range not served yet, or a stale ring
            time.sleep(0.01)

    with client, ThreadPoolExecutor(max_workers=max(1, len(sample))) as pool:
        list(pool.map(watch, sample))
    return max(answered.values(), default=0.0) if len(answered) == len(sample) else None


def measure(keys: int, nodes: int, update_rate: float, keep: str | None = None,
            node_args: list[str] | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="floe-growth-") as scratch:
        workdir = scratch
        if keep:   # the nodes' logs and events stay for reading afterwards
            Path(keep).mkdir(parents=True, exist_ok=True)
            workdir = tempfile.mkdtemp(prefix=f"{keys}-", dir=Path(keep).resolve())
        with LocalCluster.up(nodes, 1, workdir=workdir, node_args=node_args) as cluster:
            tls = cluster.tls("client")
            pids = [n.pid for n in cluster.nodes]
            empty = _rss(pids)
            with RingClient(cluster.seeds, tls=tls, timeout=600) as client:
                fill_started = time.perf_counter()
                _fill(client, keys)
                fill_seconds = time.perf_counter() - fill_started
                _settled(client)
                full = _rss(pids)
                per_copy = (sum(full.values()) - sum(empty.values())) / (keys * 2)
                ck_bytes, ck_seconds = checkpoint_cost(client, keys, update_rate)
                _settled(client)
                ring = client.refresh_ring()
                # what the updates added, to read back exactly afterwards
                victim = ring.nodes[1]
                tokens = ring.tokens_of(victim)
                rng = random.Random(3)
                sample = []
                for i in rng.sample(range(keys), min(keys, 200_000)):
                    if ring.owner(key_of(i)) == victim and len(sample) < \
                            SAMPLE_PER_RANGE * len(tokens):
                        sample.append(key_of(i))
                expect = {k: client.get(k) for k in sample}
            heirs = [n for n in cluster.nodes if n.node_id != victim]
            steady = _rss([n.pid for n in heirs])
            sampler = MemorySampler([n.pid for n in heirs])
            sampler.start()
            # New keys keep arriving through the kill, so every range shows when it
            # applies again; they are read back exactly at the end.
            trickle = Trickle([n.address for n in heirs], tls)
            trickle.start()
            reader = RingClient([n.address for n in heirs], tls=tls, timeout=5, rpc_timeout=1)
            time.sleep(0.5)
            killed_at = time.time()
            cluster.kill(victim, signal.SIGKILL)
            answer = _answering(reader, sample, expect, killed_at)
            deadline = time.monotonic() + 600
            timeline = None
            while time.monotonic() < deadline:
                events = [e for n in heirs for e in read_events(n.node_id, n.events)]
                timeline = failure_timelines([Injected("kill", (victim,), killed_at,
                                                       tokens={victim: tokens})], events)[0]
                if timeline.complete:
                    break
                time.sleep(0.1)
            sampler.stop.set()
            sampler.join()
            trickle.stop.set()
            trickle.join()
            peak = max(sampler.peak[p] / steady[p] for p in steady if steady[p])
            with RingClient([n.address for n in heirs], tls=tls, timeout=600) as client:
                exact = trickle.error is None and all(
                    client.get(k) == v for k, v in expect.items())
                if keys <= 1_000_000:
                    got = dict(client.scan())
                    fresh = {k: v for k, v in got.items() if k.startswith("u")}
                    exact = exact and len(got) == keys + trickle.sent and \
                        fresh == dict.fromkeys(fresh, 1) and \
                        all(got[k] == v for k, v in expect.items())
    result = {"keys": keys, "nodes": nodes, "fill_s": round(fill_seconds, 2),
              "bytes_per_key_copy": round(per_copy, 1),
              "checkpoint_bytes_per_round": round(ck_bytes),
              "checkpoint_seconds_per_round": round(ck_seconds, 4),
              "every_key_answering_s": None if answer is None else round(answer, 3),
              "heir_peak_over_steady": round(peak, 2), "exact": exact,
              "sampled_keys": len(sample)}
    if timeline is not None:
        for stage in ("detected", "taken_over", "applying", "re_replicated"):
            ms = timeline.ms(stage)
            result[f"{stage}_s"] = None if ms is None else round(ms / 1e3, 3)
    return result


def _feeder(seeds, tls_dir, words, start, results) -> None:
    from floering.mapper import TlsFiles
    tls = TlsFiles.in_dir(tls_dir, "client") if tls_dir else None
    with RingClient(seeds, tls=tls, timeout=600) as client:
        start.wait()
        for i in range(0, len(words), CHUNK):
            client.emit_many(words[i:i + CHUNK])
        client.flush()
    results.put(time.time())


def throughput(nodes: int, feeders: int, words: list[str]) -> tuple[float, bool]:
    """Input tuples/s with `feeders` processes each feeding `words` (exact or not)."""
    from collections import Counter
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="floe-growth-") as workdir:
        with LocalCluster.up(nodes, 1, workdir=workdir) as cluster:
            start, results = ctx.Event(), ctx.Queue()
            tls_dir = str(cluster.tls_dir) if cluster.tls_dir else None
            procs = [ctx.Process(target=_feeder, args=(cluster.seeds, tls_dir, words,
                                                      start, results)) for _ in range(feeders)]
            for p in procs:
                p.start()
            time.sleep(3.0)                      # every feeder connected and waiting
            began = time.time()
            start.set()
            ends = [results.get(timeout=900) for _ in procs]
            for p in procs:
                p.join(60)
            rate = feeders * len(words) / (max(ends) - began)
            with RingClient(cluster.seeds, tls=cluster.tls("client")) as client:
                exact = dict(client.scan()) == {k: feeders * v for k, v in
                                                Counter(words).items()}
    return rate, exact


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", default="100000,1000000,5000000,10000000,20000000",
                        help="comma-separated key counts (default: %(default)s)")
    parser.add_argument("--nodes", type=int, default=4, help="(default: %(default)s)")
    parser.add_argument("--update-rate", type=float, default=100_000,
                        help="tuples/s of updates while checkpoints are measured "
                             "(default: %(default)s)")
    parser.add_argument("--scale", action="store_true",
                        help="also throughput against nodes (2, 4, 8) and feeders (1, 2, 3)")
    parser.add_argument("--scale-words", type=int, default=2_000_000,
                        help="words per feeder in --scale runs (default: %(default)s)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--plot", help="write growth PNGs into this directory")
    parser.add_argument("--keep", help="run each ring in a folder made here and keep it "
                                       "(the nodes' logs and events)")
    parser.add_argument("--node-arg", action="append", default=[],
                        help="a flag given to every node as it is, e.g. "
                             "--node-arg=--repair-delay=0.5 (repeatable)")
    args = parser.parse_args(argv)
    unwind_on_sigterm()     # the ring in use is stopped on the way out
    results: dict = {"state": [], "scale": []}
    exact = True
    for keys in map(int, args.keys.split(",")):
        r = measure(keys, args.nodes, args.update_rate, args.keep, args.node_arg or None)
        results["state"].append(r)
        exact = exact and r["exact"]
        print(f"{keys:>11,} keys: {r['bytes_per_key_copy']:.0f} B per key copy; "
              f"checkpoint {r['checkpoint_bytes_per_round'] / 1e3:.0f} kB and "
              f"{r['checkpoint_seconds_per_round'] * 1e3:.0f} ms per round; after a SIGKILL "
              f"detected {r.get('detected_s')} s, taken over {r.get('taken_over_s')} s, "
              f"applying {r.get('applying_s')} s, every key answering "
              f"{r['every_key_answering_s']} s, re-replicated {r.get('re_replicated_s')} s; "
              f"heir peak {r['heir_peak_over_steady']:.2f}x steady; exact={r['exact']}",
              flush=True)
    if args.scale:
        words = zipf_words(args.scale_words)
        for nodes, feeders in ((2, 1), (4, 1), (8, 1), (4, 2), (4, 3)):
            rate, ok = throughput(nodes, feeders, words)
            exact = exact and ok
            results["scale"].append({"nodes": nodes, "feeders": feeders,
                                     "tuples_per_s": round(rate), "exact": ok})
            print(f"{nodes} nodes, {feeders} feeder(s): {rate / 1e6:.2f} M input tuples/s "
                  f"(exact={ok})", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    if args.plot:
        plot(results, Path(args.plot))
    return 0 if exact else 1


def plot(results: dict, out: Path) -> None:
    from floering.chaos.plots import pyplot
    plt = pyplot()              # None, said in one line, without the plots extra
    if plt is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    state = results["state"]
    if state:
        keys = [r["keys"] for r in state]
        fig, ax = plt.subplots(figsize=(7, 4))
        for field, label in (("detected_s", "detected"), ("applying_s", "applying again"),
                             ("every_key_answering_s", "every key answering"),
                             ("re_replicated_s", "re-replicated")):
            ax.plot(keys, [r.get(field) for r in state], marker="o", label=label)
        ax.set_xscale("log")
        ax.set_xlabel("distinct keys in the ring")
        ax.set_ylabel("seconds after a SIGKILL")
        ax.legend()
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "growth-recovery.png", dpi=110)
        plt.close(fig)
    if results["scale"]:
        fig, ax = plt.subplots(figsize=(7, 4))
        labels = [f"{r['nodes']}n/{r['feeders']}f" for r in results["scale"]]
        ax.bar(labels, [r["tuples_per_s"] / 1e6 for r in results["scale"]])
        ax.set_ylabel("M input tuples/s")
        ax.set_xlabel("nodes / feeder processes (2 cores)")
        fig.tight_layout()
        fig.savefig(out / "growth-scale.png", dpi=110)
        plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
