"""Carry out planned faults, only on processes the harness started, by their PIDs.

Several nodes killed "at once" get their signals back to back before any is waited
for, so the ring sees them die within a millisecond or so of each other.
"""

from __future__ import annotations

import os
import signal
import time

from chaos.cluster import LocalCluster
from chaos.mapper_proc import MapperHandle
from chaos.timeline import Injected


def signal_nodes(cluster: LocalCluster, node_ids, sig: int) -> float:
    """Send `sig` to every node in `node_ids` (all must be running processes we
    started); returns the wall-clock time just before the first signal. For SIGKILL,
    returns once every one of them is gone."""
    nodes = [cluster.node(n) for n in node_ids]
    for node in nodes:
        if node.popen is None or not node.alive():
            raise RuntimeError(f"node {node.node_id} (pid {node.pid}) is not a running "
                               f"process started by this harness")
    at = time.time()
    for node in nodes:
        os.kill(node.pid, sig)     # popen.poll() above: still our child, not reaped
    if sig == signal.SIGKILL:
        deadline = time.monotonic() + 10
        while any(n.popen.poll() is None for n in nodes):
            if time.monotonic() > deadline:
                raise RuntimeError("SIGKILLed nodes did not exit within 10 s")
            time.sleep(0.002)
    return at


def kill_nodes(cluster: LocalCluster, node_ids) -> Injected:
    return Injected("kill", tuple(node_ids), signal_nodes(cluster, node_ids, signal.SIGKILL))


def pause_nodes(cluster: LocalCluster, node_ids) -> Injected:
    return Injected("pause", tuple(node_ids), signal_nodes(cluster, node_ids, signal.SIGSTOP))


def resume_nodes(cluster: LocalCluster, fault: Injected) -> Injected:
    resumed = signal_nodes(cluster, fault.victims, signal.SIGCONT)
    return Injected(fault.kind, fault.victims, fault.at, resumed, fault.detail)


def kill_mapper_mid_chunk(mapper: MapperHandle, timeout: float = 5.0,
                          into: float = 0.01) -> Injected:
    """SIGKILL the mapper while a chunk is emitted but not yet acknowledged: the
    journal's last line is `E i`, `into` seconds ago (so some of its batches are on
    the wire). Gives up waiting after `timeout` and kills anyway; the detail records
    whether a chunk really was in flight."""
    deadline = time.monotonic() + timeout
    mid = False
    while time.monotonic() < deadline and mapper.alive():
        state = mapper.journal_state()
        emitted = state["emitted"]
        if emitted and emitted[-1] not in state["acked"] and emitted[-1] not in state["failed"]:
            mid = True
            time.sleep(into)
            break
        time.sleep(0.001)
    at = time.time()
    mapper.kill()
    state = mapper.journal_state()
    in_flight = [i for i in state["emitted"] if i not in state["acked"]]
    return Injected("kill-mapper", (f"mapper-{mapper.mapper}",), at,
                    detail={"mid_chunk": mid and bool(in_flight), "in_flight_chunks": in_flight,
                            "pid": mapper.pid})
