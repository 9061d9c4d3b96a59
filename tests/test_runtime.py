"""The production runtime (NodeRuntime executing the NodeMachine's effects) in one
event loop, its nodes connected by the in-memory transport: a crash, a handoff and a
leave with exact counts, without gRPC or processes."""

import asyncio
import json
import re
from collections import Counter

from floering.node.config import NodeConfig
from floering.node.core.batch import Batch, encode_payload, encode_seqs
from floering.wire.errors import FloeError
from floering.node.core.handoff import HandoffState
from floering.node.core.reducers import load_reducer
from floering.node.runtime.inbound import StreamState
from floering.node.runtime.node import NodeRuntime
from floering.node.runtime.peers import Network
from floering.node.runtime.service import NodeService
from floering.node.runtime.events import EventLog
from tests.helpers import wait_until

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


async def test_a_crashed_node_is_taken_over_and_nothing_is_lost(tmp_path):
    c = MemoryCluster(tmp_path, nodes=3, replication=1)
    await c.start()
    try:
        await c.push(WORDS[:150])
        c.crash("n1")
        await wait_until(lambda: "n1" not in c.ring().nodes, 5.0)
        await c.push(WORDS[150:])
        await wait_until(lambda: all(r.core.ring.stamp == c.ring().stamp for r in c.live()), 5.0)
        assert c.counts() == c.sent
        events = c.events()
        assert ("n0", "detected") in events or ("n2", "detected") in events, events
        assert any(kind == "taken_over" for _, kind in events), events
        # every protocol record names the machine event that caused it
        caused = [e for e in c.records() if e["kind"] in ("detected", "taken_over")]
        assert all(re.fullmatch(r"n\d:\d+:(ProbeAnswered|RingSeen)", e["stimulus"])
                   for e in caused), caused
    finally:
        await c.stop()


async def test_a_handoff_and_a_leave_keep_every_count(tmp_path):
    c = MemoryCluster(tmp_path, nodes=3, replication=1)
    await c.start()
    try:
        await c.push(WORDS[:100])
        giver = c.runtimes["n0"]
        token = giver.core.ring.tokens_of("n0")[0]
        h = await giver.hand_off({token: "n2"})
        assert h.state == HandoffState.COMMITTED, h.reason
        assert c.ring().owner_of_token(token) == "n2"
        await c.push(WORDS[100:200])
        await c.runtimes["n2"].leave()
        assert c.runtimes["n2"].left.is_set()
        c.network.down.add(c.members["n2"])
        await wait_until(lambda: "n2" not in c.ring().nodes
                       and all(r.core.ring.stamp == c.ring().stamp for r in c.live()), 5.0)
        await c.push(WORDS[200:])
        assert c.counts() == c.sent
    finally:
        await c.stop()


async def test_durable_runtimes_stopped_and_started_on_their_directories_come_back_exact(
        tmp_path):
    data = str(tmp_path / "data" / "{node}")
    c = MemoryCluster(tmp_path, nodes=3, replication=1, data_dir=data)
    await c.start()
    await c.push(WORDS[:150])
    # One more batch, logged but not synced yet when the nodes stop: stopping syncs
    # it, and it comes back.
    for runtime in c.runtimes.values():
        runtime.durable.interval = 5.0
    ring, c.seq = c.ring(), c.seq + 1
    c.sent["late"] += 1
    token = ring.token_for_key("late")
    batch = Batch(ring.stamp, token, "m", c.seq, c.seq, 1, encode_payload(["late"], [1]),
                  encode_seqs([c.seq]))
    for node in ring.destinations(token):
        await c.network.services[ring.address(node)].submit([batch], StreamState())
    await wait_until(lambda: all(r.inbound.empty() for r in c.runtimes.values()), 2.0)
    await c.stop()
    again = MemoryCluster(tmp_path, nodes=3, replication=1, data_dir=data)
    again.seq, again.sent = c.seq, c.sent
    await again.start()
    try:
        await wait_until(lambda: all(r.core.ring.stamp == again.ring().stamp
                                     for r in again.live()), 5.0)
        assert again.counts() == c.sent
        await again.push(WORDS[150:])
        assert again.counts() == again.sent
    finally:
        await again.stop()
