"""Assemble and run one node: config -> reducer -> runtime -> gRPC server."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import signal

from floering.node.config import NodeConfig
from floering.wire.balancers import balancer, check_reducer
from floering.node.core.reducers import load_reducer, parse_reducer_args
from floering.node.core.table_state import state_kernel
from floering.node.loop_lag import LoopLag
from floering.node.runtime.events import EventLog
from floering.node.runtime.node import NodeRuntime
from floering.node.runtime.retiring import Retiring
from floering.node.transport.peers import PeerPool
from floering.node.transport.server import (listen_host, message_bytes, node_tls, set_health,
                                            start_server)
from floering.node.transport.snapshots import RetiredCalls

log = logging.getLogger("floe.node")


class RunningNode:
    """A started node; `stop()` is the graceful shutdown SIGTERM triggers."""

    def __init__(self, runtime, server, health, port, metrics=None, retiring=None,
                 lag=None):
        self.runtime, self.server, self.health, self.port = runtime, server, health, port
        self.metrics, self.retiring, self.lag = metrics, retiring, lag
        self.address = runtime.config.advertise     # where peers and clients reach it
        self._reporting = asyncio.create_task(self._report_health())

    async def _report_health(self) -> None:
        """Keep the health status in step with the node: NOT_SERVING while it is
        fenced and not yet back in the ring as a new member."""
        shown = True                      # start_node set it once the node started
        while True:
            serving = self.runtime.serving
            if serving != shown:
                await set_health(self.health, serving)
                shown = serving
            await asyncio.sleep(0.1)

    async def stop(self) -> None:
        self._reporting.cancel()
        await self.health.enter_graceful_shutdown()   # health checks now say NOT_SERVING
        await self.server.stop(self.runtime.config.shutdown_grace)
        await self.runtime.stop()                      # drain queue, final checkpoint
        if self.retiring is not None:
            await self.retiring.stop()
        if self.metrics is not None:
            self.metrics.close()
        if self.lag is not None:
            self.lag.close()
        self.runtime.events.record("stopped", self.runtime.core.node_id)
        self.runtime.events.close()


def with_view_and_retired_stats(runtime, retiring: Retiring) -> None:
    """The node's stats (NodeStats, `floe status --json`) also count the ring views it
    took a step at a time, refused and held (node.core.evidence), the views moving a
    live member's range it held and refused (node.core.move_evidence), and what a removed
    member of this process kept (node.runtime.retiring)."""
    base = runtime.stats

    def stats() -> dict:
        views = runtime.machine.guard.counters
        moves = runtime.machine.guard.moves.counters
        return dict(base(), **retiring.stats(), views_absorbed=views["views_absorbed"],
                    views_refused=views["removals_refused"] + views["own_removal_refused"]
                    + moves["moves_refused"],
                    views_held=views["views_held"] + moves["moves_held"])
    runtime.stats = stats


def with_kernel_and_lag(runtime, lag: LoopLag) -> None:
    """The node's stats also say what holds its built-in reducers' states (the compiled
    state table or dicts) and the longest event-loop lag of the last seconds."""
    base, kernel = runtime.stats, state_kernel(runtime.reducer)
    runtime.stats = lambda: dict(base(), state_kernel=kernel, loop_lag_ms=lag.worst_ms())


def configured_reducer(config: NodeConfig):
    """The reducer `config` names, built with its arguments (UnknownReducer,
    InvalidArgument or the constructor's own error if it cannot be)."""
    reducer = load_reducer(config.reducer, **parse_reducer_args(
        [f"{k}={v}" for k, v in config.reducer_args]))
    reducer.name = config.reducer
    return reducer


def check_config_reducer(config: NodeConfig, reducer) -> None:
    """Refuse (InvalidArgument) a reducer the ring's balancer cannot read back: a
    policy that shares keys needs its merge. `floe up` runs the same check before it
    starts any node."""
    check_reducer(balancer(config.balancer), reducer)


def freeze_heap() -> int:
    """Move every object alive now (modules, classes, the started node's machinery)
    out of the collector's generations: a full collection no longer walks them
    (25-36 ms of CPU in one event-loop step at 5 M keys over 4 nodes). Objects made
    later are collected as before. Returns how many objects are frozen."""
    gc.freeze()
    return gc.get_freeze_count()


async def start_node(config: NodeConfig) -> RunningNode:
    reducer = configured_reducer(config)
    check_config_reducer(config, reducer)
    tls = node_tls(config)
    # a peer sends and takes no message over message_bytes: neither do we to it
    peers = PeerPool(config.rpc_timeout, message_bytes(config),
                     tls.channel_credentials() if tls else None,
                     chunk_entries=config.checkpoint_chunk_entries)
    runtime = NodeRuntime(config, reducer, peers,
                          events=EventLog(config.events_file, config.node_id))
    peers.follow(lambda: runtime.core.ring)     # each peer is checked as its member
    metrics = None
    if config.metrics_port:   # prometheus_client: imported only when serving metrics
        from floering.node.transport.metrics import NodeMetrics
        metrics = NodeMetrics(runtime)
    server, health, port = await start_server(runtime, metrics)
    if config.listen.endswith(":0"):
        # Bound to an ephemeral port (tests): publish the real address in the ring.
        listen = f"{config.listen.rpartition(':')[0]}:{port}"
        address = config.advertise
        if address.endswith(":0"):
            address = f"{address.rpartition(':')[0]}:{port}"
        named = tuple((n, address if n == config.node_id else a) for n, a in config.peers)
        runtime.reconfigure(dataclasses.replace(config, listen=listen, advertise=address,
                                                peers=named))
    seeds = [s.strip() for s in config.join.split(",") if s.strip()] if config.join else None
    # What a member removed from the ring held is kept until r+1 others hold it.
    retiring = Retiring.attach(runtime, RetiredCalls(peers, config.rpc_timeout))
    with_view_and_retired_stats(runtime, retiring)
    lag = LoopLag()
    with_kernel_and_lag(runtime, lag)
    lag.start()
    try:
        if metrics is not None:       # up while the node waits to join: that shows too
            await metrics.serve(listen_host(config.listen), config.metrics_port)
        await runtime.confirm_membership(seeds)
        retiring.began()
        await runtime.start()
        retiring.start()
        await set_health(health, True)
        freeze_heap()
    except BaseException:
        if metrics is not None:
            metrics.close()
        lag.close()
        await server.stop(0)
        raise
    return RunningNode(runtime, server, health, port, metrics, retiring, lag)


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
    runtime = node.runtime
    if stop.is_set() and config.leave_on_sigterm and not runtime.left.is_set():
        try:
            await runtime.leave()
        except Exception as exc:   # the ring takes our ranges over as after a crash
            log.warning("could not leave the ring before stopping: %s", exc)
    log.info("node %s stopping", config.node_id)
    await node.stop()
    log.info("node %s stopped", config.node_id)
