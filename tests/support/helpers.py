"""The tests' one set of helpers: a tiny in-memory cluster of NodeCores (a mapper that
routes like RingClient, checkpoint shipping by direct calls, no I/O), driving an
in-process handoff, a feeder thread for live clusters, waiting on a condition with a
deadline, and running the `floe` command."""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

from floering.node.core.batch import Batch, encode_payload, encode_seqs
from floering.node.core.handoff import Handoff, HandoffState
from floering.wire.hashing import HASH_SPACE
from floering.node.core.node_core import NodeCore
from floering.node.core.reducers import load_reducer
from floering.wire.ring import Ring


class CoreCluster:
    def __init__(self, nodes: int = 3, replication: int = 1, tokens_per_node: int = 4,
                 reducer: str = "count") -> None:
        members = {f"n{i}": f"127.0.0.1:{7000 + i}" for i in range(nodes)}
        self.ring = Ring.initial(members, replication, tokens_per_node)
        self.cores = {n: NodeCore(n, self.ring, load_reducer(reducer)) for n in members}

    def batches(self, source: str, keys, first_seq: int = 1, value=1):
        """Group (key, value) tuples by token like the mapper: [(token, fields)]."""
        by_token = defaultdict(lambda: ([], [], []))
        for i, key in enumerate(keys):
            k, v, s = by_token[self.ring.token_for_key(key)]
            k.append(key)
            v.append(value)
            s.append(first_seq + i)
        return [(token, dict(ring_stamp=self.ring.stamp, token=token, source=source,
                             first_seq=s[0], last_seq=s[-1], count=len(s),
                             payload=encode_payload(k, v), seqs=encode_seqs(s)))
                for token, (k, v, s) in by_token.items()]

    def push(self, source: str, keys, first_seq: int = 1, only=None) -> int:
        """Multicast every batch to its destinations (or only to `only`)."""
        applied = 0
        for token, fields in self.batches(source, keys, first_seq):
            for node in self.ring.destinations(token):
                if only is None or node in only:
                    result = self.cores[node].receive_batch(Batch(**fields))
                    if node == self.ring.owner_of_token(token):
                        applied += result.applied
        return applied

    def checkpoint(self) -> None:
        for name, core in self.cores.items():
            for s in core.plan_checkpoints():
                cp = s.checkpoint
                need_full, seq = self.cores[s.replica].receive_checkpoint(
                    name, core.ring.stamp, cp.token, cp.seq, s.base_seq, cp.full,
                    dict(cp.states), dict(cp.watermarks))
                core.checkpoint_acked(cp.token, s.replica, seq, need_full)
            for token in core.primaries:
                core.checkpoint_done(token)

    def state(self) -> dict:
        return {k: v for core in self.cores.values() for k, v in core.items()}


def fail(cluster: CoreCluster, *dead: str) -> None:
    """Kill nodes: the survivors adopt the ring without them (as a detector would)."""
    for node in dead:
        del cluster.cores[node]
    ring = next(iter(cluster.cores.values())).ring.without(dead)
    for core in cluster.cores.values():
        core.adopt_ring(ring)
    cluster.ring = ring


# ------------------------------------------------------------- live clusters

@functools.cache
def corpus_words() -> list[str]:
    from floering.chaos.corpus import kjv_lines
    from floering.mapper import split_words
    return [w for line in kjv_lines(8000) for w in split_words(line)]


class Feeder(threading.Thread):
    """Emits WORDS in flushed rounds until stopped; `acked` counts what flush() confirmed.
    `tls`: the client's credentials on a TLS ring (`cluster.tls("client")`)."""

    def __init__(self, seeds, rounds=10_000, tls=None):
        super().__init__(daemon=True)
        from floering.mapper import RingClient
        self.client = RingClient(seeds, linger=0.01, timeout=30, tls=tls)
        self.acked = Counter()
        self.stop = threading.Event()
        self.error = None
        self.rounds = rounds
        self.done = 0                 # rounds flush() confirmed

    def run(self):
        try:
            i = 0
            WORDS = corpus_words()
            while not self.stop.is_set() and i < self.rounds:
                chunk = WORDS[(i * 2000) % len(WORDS):][:2000]
                self.client.emit_many(chunk)
                self.client.flush()
                self.acked.update(chunk)
                i += 1
                self.done = i
        except Exception as exc:   # surfaced by the test
            self.error = exc

    def wait_rounds(self, rounds=3, timeout=30.0):
        """Wait until `rounds` more rounds than now are flushed: the stream is flowing
        (data on the ring before a fault, or still going after one)."""
        target = self.done + rounds
        wait_for(lambda: self.done >= target or self.error is not None or not self.is_alive(),
                 timeout, f"{rounds} flushed feeder rounds")
        assert self.error is None, f"feeder failed: {self.error!r}"
        assert self.done >= target, "feeder stopped"

    def finish(self):
        self.stop.set()
        self.join(60)
        assert not self.is_alive(), "feeder hung"
        assert self.error is None, f"feeder failed: {self.error!r}"
        return self.client

    def finish_exact(self):
        """Stop, then check the ring holds exactly what flush() acknowledged; returns
        the (still open) client for further reads."""
        client = self.finish()
        got = client.scan_all()
        assert got == self.acked, diff(got, self.acked)
        return client


def diff(got, expect):
    keys = [k for k in expect.keys() | got.keys() if got.get(k) != expect.get(k)]
    return f"{len(keys)} keys differ, e.g. " + ", ".join(
        f"{k}: {got.get(k)} != {expect.get(k)}" for k in sorted(keys)[:5])


def came_back_fresh(stats: dict, members: int) -> bool:
    """A fenced process's new member: still empty, or holding no more than a fair share
    that the ring handed it since (what it held before was given up at the fence)."""
    if stats["ring_share"] == 0:
        return stats["keys"] == 0
    return stats["ring_share"] <= 1.25 / members and not stats["fenced"]


def live_ring(cluster):
    """The ring as a client of the cluster's live processes reads it."""
    from floering.mapper import RingClient
    with RingClient([n.address for n in cluster.nodes if n.alive()], timeout=10,
                    rpc_timeout=2.0, tls=cluster.tls()) as client:
        return client.refresh_ring()


def ring_seen_by(cluster, node_id: str):
    """The ring as one member of the cluster holds it (GetRing on that member)."""
    from floering.v1 import floe_pb2, floe_pb2_grpc
    with cluster.channel(cluster.node(node_id).address) as ch:
        return Ring.from_wire(floe_pb2_grpc.ControlPlaneStub(ch).GetRing(
            floe_pb2.GetRingRequest(), timeout=5).ring)


def node_stats(cluster, node_id: str, timeout: float = 5.0):
    """One member's own Stats (a NodeStats message), asked of it alone."""
    from floering.v1 import floe_pb2, floe_pb2_grpc
    with cluster.channel(cluster.node(node_id).address) as ch:
        return floe_pb2_grpc.QueryPlaneStub(ch).Stats(floe_pb2.StatsRequest(),
                                                      timeout=timeout)


def wait_checkpoint_rounds(cluster, rounds=3, nodes=None, timeout=60.0) -> None:
    """Wait until each of `nodes` (default: every node of the cluster) has ended `rounds`
    more checkpoint rounds than now. The second of them began after this call, so its
    cut holds everything acknowledged before it; a durable node queues that cut's write
    to its copies as the round begins, and the third begins a checkpoint interval after
    the second has ended (its shipments acknowledged)."""
    nodes = [n.node_id for n in cluster.nodes] if nodes is None else list(nodes)
    target = {n: node_stats(cluster, n).checkpoint_rounds + rounds for n in nodes}
    wait_for(lambda: all(node_stats(cluster, n).checkpoint_rounds >= t
                         for n, t in target.items()),
             timeout, f"{rounds} more checkpoint rounds on {', '.join(nodes)}")


def events_of(cluster, node_id: str) -> list[dict]:
    """The structured events of a cluster's node (node.runtime.events), oldest first."""
    from floering.chaos.timeline import node_events
    return node_events(cluster.node(node_id).events)


def outcome_codes(futures) -> dict[str, int]:
    """How many of the gRPC call `futures` ended with each status code, by name."""
    import grpc
    codes: dict[str, int] = {}
    for f in futures:
        try:
            f.result()
            code = "OK"
        except grpc.RpcError as exc:
            code = exc.code().name
        codes[code] = codes.get(code, 0) + 1
    return codes


def wait_for(condition, timeout=10.0, what="condition"):
    """Poll `condition` until it is true; returns its (true) value."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)
    return value


async def wait_until(condition, timeout=10.0, what="condition"):
    """wait_for inside an event loop: the loop keeps running while we wait. The
    condition may be a coroutine function (an RPC asked again each time)."""
    deadline = time.monotonic() + timeout
    while not await _truth(condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def _truth(value):
    return await value if inspect.isawaitable(value) else value


# ------------------------------------------------------------ handoffs, in-process

HANDOFF_WORDS = [f"w{i % 97}" for i in range(3000)]


def spread(c: CoreCluster, ring) -> None:
    """Gossip: every core adopts `ring` (and the cluster's mapper routes with it)."""
    for core in c.cores.values():
        core.adopt_ring(ring)
    c.ring = next(iter(c.cores.values())).ring


def run(c: CoreCluster, handoff: Handoff, owner: str, feed, rounds: int = 10):
    """Drive a handoff to its end as the runtime does, pushing between steps."""
    spread(c, handoff.prepare(c.cores[owner], now=0.0))
    for i in range(rounds):
        feed()
        c.checkpoint()
        ring = handoff.step(c.cores[owner], now=float(i))
        if ring is not None:
            c.cores[owner].adopt_ring(ring)
            spread(c, ring)
        if handoff.state != HandoffState.PREPARED:
            return
    raise AssertionError(f"handoff still {handoff.state} after {rounds} rounds")


class Feed:
    def __init__(self, c):
        self.c, self.seq, self.sent = c, 1, Counter()

    def __call__(self, n=300):
        words = HANDOFF_WORDS[self.seq % 2000:][:n]
        self.c.push("m", words, first_seq=self.seq)
        self.seq += len(words)
        self.sent.update(words)


def middle(ring: Ring, token: int) -> int:
    lo, hi = ring.range_of_token(token)
    return (lo + Ring.range_size((lo, hi)) // 2) % HASH_SPACE


# ------------------------------------------------------------ the floe command

ROOT = Path(__file__).resolve().parents[2]


def floe_run(cwd, *args, timeout=120) -> subprocess.CompletedProcess:
    """Run the `floe` command in `cwd` (where `floe up` keeps its cluster file)."""
    return subprocess.run([sys.executable, "-m", "floering.floe.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT / 'proto'}"))


def floe(tmp_path, *args, timeout=120) -> str:
    """Run the `floe` command, which must succeed; its standard output."""
    result = floe_run(tmp_path, *args, timeout=timeout)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def status(tmp_path):
    """`floe status --json`'s rows by node, without members that left the ring."""
    return {n["node_id"]: n for n in json.loads(floe(tmp_path, "status", "--json"))["nodes"]
            if n["state"] != "removed"}


def finish_exact(feeder):
    client = feeder.finish_exact()
    ring = client.refresh_ring()
    client.close()
    return ring
