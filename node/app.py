"""Assemble and run one node: config -> reducer -> runtime -> gRPC server."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal

from node.config import NodeConfig
from node.core.reducers import load_reducer, parse_reducer_args
from node.runtime.node import NodeRuntime
from node.transport.peers import PeerPool
from node.transport.server import start_server

log = logging.getLogger("floe.node")


class RunningNode:
    """A started node; `stop()` is the graceful shutdown SIGTERM triggers."""

    def __init__(self, runtime, server, health, port):
        self.runtime, self.server, self.health, self.port = runtime, server, health, port
        self.address = runtime.config.listen

    async def stop(self) -> None:
        await self.health.enter_graceful_shutdown()   # health checks now say NOT_SERVING
        await self.server.stop(self.runtime.config.shutdown_grace)
        await self.runtime.stop()                      # drain queue, final checkpoint


async def start_node(config: NodeConfig) -> RunningNode:
    reducer = load_reducer(config.reducer, **parse_reducer_args(
        [f"{k}={v}" for k, v in config.reducer_args]))
    reducer.name = config.reducer
    runtime = NodeRuntime(config, reducer, PeerPool(config.rpc_timeout, config.max_message_bytes))
    server, health, port = await start_server(runtime)
    if config.listen.endswith(":0"):
        # Bound to an ephemeral port (tests): publish the real address in the ring.
        address = f"{config.listen.rpartition(':')[0]}:{port}"
        peers = tuple((n, address if n == config.node_id else a) for n, a in config.peers)
        runtime.reconfigure(dataclasses.replace(config, listen=address, peers=peers))
    if config.join:
        await _join(runtime, config)
    await runtime.start()
    if config.join:
        runtime.sync_ring()
    return RunningNode(runtime, server, health, port)


async def _join(runtime: NodeRuntime, config: NodeConfig) -> None:
    from node.core.errors import FloeError, Unavailable
    from node.core.ring import Ring
    errors = []
    for seed in filter(None, (s.strip() for s in config.join.split(","))):
        try:
            ring = Ring.from_wire(await runtime.peers.get_ring(seed))
        except FloeError as exc:
            errors.append(f"{seed}: {exc}")
            continue
        if ring.replication != config.replication:
            raise ValueError(f"the ring runs r={ring.replication}, this node was started "
                             f"with --replication {config.replication}")
        runtime.join(ring)
        return
    raise Unavailable("no seed to join answered: " + "; ".join(errors))


async def serve(config: NodeConfig) -> None:
    node = await start_node(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"READY {config.node_id} {node.address}", flush=True)
    left = asyncio.create_task(node.runtime.left.wait())
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait({left, stopped}, return_when=asyncio.FIRST_COMPLETED)
    left.cancel()
    stopped.cancel()
    log.info("node %s stopping", config.node_id)
    await node.stop()
    log.info("node %s stopped", config.node_id)
