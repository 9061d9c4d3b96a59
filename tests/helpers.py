"""A tiny in-memory cluster of NodeCores: a mapper that routes like RingClient and
checkpoint shipping by direct calls. No I/O, fully deterministic."""

from __future__ import annotations

import functools
import threading
from collections import Counter, defaultdict

from node.core.batch import encode_payload, encode_seqs
from node.core.node_core import NodeCore
from node.core.reducers import load_reducer
from node.core.ring import Ring


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
        return [(token, dict(ring_version=self.ring.stamp, token=token, source=source,
                             first_seq=s[0], last_seq=s[-1], count=len(s),
                             payload=encode_payload(k, v), seqs=encode_seqs(s)))
                for token, (k, v, s) in by_token.items()]

    def push(self, source: str, keys, first_seq: int = 1, only=None) -> int:
        """Multicast every batch to its destinations (or only to `only`)."""
        applied = 0
        for token, fields in self.batches(source, keys, first_seq):
            for node in self.ring.destinations(token):
                if only is None or node in only:
                    result = self.cores[node].receive_batch(**fields)
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
    from chaos.corpus import kjv_lines
    from mapper import split_words
    return [w for line in kjv_lines(8000) for w in split_words(line)]


class Feeder(threading.Thread):
    """Emits WORDS in flushed rounds until stopped; `acked` counts what flush() confirmed."""

    def __init__(self, seeds, rounds=10_000):
        super().__init__(daemon=True)
        from mapper import RingClient
        self.client = RingClient(seeds, linger=0.01, timeout=30)
        self.acked = Counter()
        self.stop = threading.Event()
        self.error = None
        self.rounds = rounds

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
        except Exception as exc:   # surfaced by the test
            self.error = exc

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
        got = dict(client.scan())
        assert got == self.acked, diff(got, self.acked)
        return client


def diff(got, expect):
    keys = [k for k in expect.keys() | got.keys() if got.get(k) != expect.get(k)]
    return f"{len(keys)} keys differ, e.g. " + ", ".join(
        f"{k}: {got.get(k)} != {expect.get(k)}" for k in sorted(keys)[:5])




def events_of(cluster, node_id: str) -> list[dict]:
    """The structured events of a cluster's node (node.runtime.events), oldest first."""
    from chaos.timeline import node_events
    return node_events(cluster.node(node_id).events)
