"""Helpers of tests/unit/test_runtime.py that other test files use too: FAST, MemoryCluster,
WORDS.
"""

import asyncio
import json
from collections import Counter

from floering.node.config import NodeConfig
from floering.node.core.batch import Batch, encode_payload, encode_seqs
from floering.wire.errors import FloeError
from floering.node.core.reducers import load_reducer
from floering.node.runtime.inbound import StreamState
from floering.node.runtime.node import NodeRuntime
from floering.node.runtime.peers import Network
from floering.node.runtime.service import NodeService
from floering.node.runtime.events import EventLog


FAST = dict(heartbeat_interval=0.02, checkpoint_interval=0.05, suspect_min=0.1,
            suspect_max=0.3, probe_timeout=0.05, suspicion=0.3, startup_grace=0.5,
            rpc_timeout=0.5, tokens_per_node=4)


class MemoryCluster:
    def __init__(self, logs, nodes: int = 3, replication: int = 1, data_dir: str = "") -> None:
        self.logs = logs
        self.network = Network(timeout=0.5)
        self.members = {f"n{i}": f"mem:{i}" for i in range(nodes)}
        self.runtimes = {}
        for name, address in self.members.items():
            config = NodeConfig(node_id=name, listen=address, replication=replication,
                                peers=tuple(self.members.items()), data_dir=data_dir, **FAST)
            runtime = NodeRuntime(config, load_reducer("count"), self.network.peers(),
                                  events=EventLog(str(logs / f"{name}.jsonl"), name))
            self.runtimes[name] = runtime
            self.network.services[address] = NodeService(runtime)
        self.seq = 0
        self.sent = Counter()

    async def start(self) -> None:
        await asyncio.gather(*(r.confirm_membership() for r in self.runtimes.values()))
        for runtime in self.runtimes.values():
            await runtime.start()

    async def stop(self) -> None:
        for name, runtime in self.runtimes.items():
            if self.members[name] not in self.network.down:
                await runtime.stop()

    def crash(self, name: str) -> None:
        """Its process is gone: every call to it is refused, its loops stop."""
        self.network.down.add(self.members[name])
        self.runtimes[name].halt()

    def live(self):
        return [r for n, r in self.runtimes.items() if self.members[n] not in self.network.down]

    def ring(self):
        return max((r.core.ring for r in self.live()), key=lambda r: r.version)

    async def push(self, words: list[str]) -> None:
        """Like a mapper: each batch to every destination of its token, resent with a
        fresh ring until every destination acknowledged it."""
        for word in words:
            self.seq += 1
            self.sent[word] += 1
            while not await self._deliver(word, self.seq):
                await asyncio.sleep(0.02)

    async def _deliver(self, word: str, seq: int) -> bool:
        ring = self.ring()
        token = ring.token_for_key(word)
        batch = Batch(ring.stamp, token, "m", seq, seq, 1, encode_payload([word], [1]),
                      encode_seqs([seq]))
        for node in ring.destinations(token):
            service = self.network.services[ring.address(node)]
            if ring.address(node) in self.network.down:
                return False
            try:
                await (await service.submit([batch], StreamState()))
            except FloeError:
                return False
        return True

    def records(self) -> list[dict]:
        return [e for name in self.members
                for e in map(json.loads, (self.logs / f"{name}.jsonl").read_text().splitlines())]

    def events(self) -> list[tuple[str, str]]:
        return [(e["node"], e["kind"]) for e in self.records()]

    def counts(self) -> Counter:
        ring = self.ring()
        total = Counter()
        for runtime in self.live():
            assert runtime.core.ring.stamp == ring.stamp
            total.update(dict(runtime.core.items()))
        return total


WORDS = [f"w{i % 23}" for i in range(300)]
