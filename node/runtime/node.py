"""The asyncio shell around NodeCore: a bounded inbound queue with one applier task,
a checkpoint loop, and graceful stop. Network calls go through a `peers` object
(node.transport.peers in production), so this module imports no gRPC.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field

from node.config import NodeConfig
from node.core.batch import Limits
from node.core.errors import FloeError, InvalidArgument
from node.core.node_core import NodeCore, PushResult
from node.core.reducers import Reducer
from node.core.ring import Ring

log = logging.getLogger("floe.node")


@dataclass
class StreamState:
    """One inbound Push stream. After a refused batch the stream is dead: batches
    queued behind it must not be applied, or a gap would open in the source's seqs."""

    failed: bool = False


@dataclass
class _Inbound:
    batches: list
    stream: StreamState
    done: asyncio.Future = field(repr=False)


class NodeRuntime:
    def __init__(self, config: NodeConfig, reducer: Reducer, peers) -> None:
        self.config = config
        self.reducer = reducer
        self.peers = peers
        self.core = self._make_core(config)
        self.inbound: asyncio.Queue[_Inbound] = asyncio.Queue(config.queue_batches)
        self.started_at = time.monotonic()
        self._tasks: list[asyncio.Task] = []
        self._stopping = False

    def _make_core(self, config: NodeConfig) -> NodeCore:
        ring = Ring.initial(dict(config.peers), config.replication, config.tokens_per_node)
        return NodeCore(config.node_id, ring, self.reducer,
                        Limits(max_batch_bytes=config.max_batch_bytes),
                        verify_keys=config.verify_keys)

    def reconfigure(self, config: NodeConfig) -> None:
        """Before start only: the listen address became known after binding."""
        if self._tasks:
            raise RuntimeError("reconfigure after start")
        self.config = config
        self.core = self._make_core(config)

    # ------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._apply_loop(), name="apply"),
                       asyncio.create_task(self._checkpoint_loop(), name="checkpoint")]
        log.info("node %s up on %s, %s", self.config.node_id, self.config.listen,
                 self.core.ring.describe())

    async def stop(self) -> None:
        """Drain what was queued, ship a final checkpoint, stop the loops."""
        self._stopping = True
        while not self.inbound.empty():
            await asyncio.sleep(0.01)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            await asyncio.wait_for(self.checkpoint_once(), self.config.rpc_timeout)
        except (asyncio.TimeoutError, FloeError) as exc:
            log.warning("final checkpoint incomplete: %s", exc)
        await self.peers.close()

    # ------------------------------------------------------------- data path

    async def submit(self, batches, stream: StreamState) -> asyncio.Future:
        """Queue one request's batches; waits while the queue is full (that wait is
        the flow control the sender feels). Returns a future of [(batch id, PushResult)]."""
        done = asyncio.get_running_loop().create_future()
        await self.inbound.put(_Inbound(batches, stream, done))
        return done

    async def _apply_loop(self) -> None:
        core, inbound = self.core, self.inbound
        while True:
            item = await inbound.get()
            if item.done.cancelled():
                continue
            if item.stream.failed:
                item.done.set_exception(InvalidArgument("an earlier batch on this stream was refused"))
                continue
            acks = []
            try:
                for b in item.batches:
                    result = core.receive_batch(b.ring_version, b.token, b.source, b.first_seq,
                                                b.last_seq, b.count, b.payload, b.seqs)
                    acks.append((b.id, result))
            except FloeError as exc:
                item.stream.failed = True
                item.done.set_exception(exc)
            except Exception as exc:  # a reducer bug must not kill the node
                log.exception("batch %s from %s failed", b.id, b.source)
                item.stream.failed = True
                item.done.set_exception(InvalidArgument(f"reducer failed: {exc!r}"))
            else:
                item.done.set_result(acks)

    # ----------------------------------------------------------- checkpoints

    async def _checkpoint_loop(self) -> None:
        interval = self.config.checkpoint_interval
        while True:
            started = time.monotonic()
            try:
                await self.checkpoint_once()
            except Exception:
                log.exception("checkpoint round failed")
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))

    async def checkpoint_once(self) -> None:
        """Cut, ship to every replica concurrently, then merge: one round."""
        core = self.core
        shipments = core.plan_checkpoints()
        if not shipments:
            return
        ring = core.ring

        async def ship(s):
            try:
                need_full, seq = await self.peers.ship_checkpoint(
                    ring.address(s.replica), sender=core.node_id, ring_version=ring.version,
                    checkpoint=s.checkpoint, base_seq=s.base_seq)
            except FloeError as exc:
                log.debug("checkpoint of %s to %s failed: %s", s.checkpoint.token, s.replica, exc)
                core.checkpoint_failed(s.checkpoint.token, s.replica)
            else:
                core.checkpoint_acked(s.checkpoint.token, s.replica, seq, need_full)

        await asyncio.gather(*(ship(s) for s in shipments))
        for token in {s.checkpoint.token for s in shipments}:
            core.checkpoint_done(token)

    # --------------------------------------------------------------- queries

    def stats(self) -> dict:
        return dict(self.core.stats(), node_id=self.config.node_id, address=self.config.listen,
                    queue_length=self.inbound.qsize(), reducer=self.reducer.name,
                    pid=os.getpid(), uptime=time.monotonic() - self.started_at)
