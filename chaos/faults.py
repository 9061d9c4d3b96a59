"""Carry out planned faults, only on processes the harness started, by their PIDs.

Several nodes killed "at once" get their signals back to back before any is waited
for, so the ring sees them die within a millisecond or so of each other.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import replace

from floering.floe.cluster import LocalCluster
from floering.chaos.mapper_proc import MapperHandle
from floering.chaos.timeline import Injected


def signal_nodes(cluster: LocalCluster, node_ids, sig: int) -> float:
    """Send `sig` to every node in `node_ids` (all must be running processes we
    started); returns the wall-clock time just before the first signal. For SIGKILL,
    returns once every one of them is gone."""
    nodes = [cluster.node(n) for n in node_ids]
    children = []
    for node in nodes:
        if node.popen is None or not node.alive():
            raise RuntimeError(f"node {node.node_id} (pid {node.pid}) is not a running "
                               f"process started by this harness")
        children.append(node.popen)
    at = time.time()
    for node in nodes:
        os.kill(node.pid, sig)     # popen.poll() above: still our child, not reaped
    if sig == signal.SIGKILL:
        deadline = time.monotonic() + 10
        while any(child.poll() is None for child in children):
            if time.monotonic() > deadline:
                raise RuntimeError("SIGKILLed nodes did not exit within 10 s")
            time.sleep(0.002)
    return at


def kill_nodes(cluster: LocalCluster, node_ids) -> Injected:
    return Injected("kill", tuple(node_ids), signal_nodes(cluster, node_ids, signal.SIGKILL))


def restart_nodes(cluster: LocalCluster, node_ids) -> Injected:
    """SIGKILL each node and start it again with the same command at once."""
    at = time.time()
    pids = {}
    for node_id in node_ids:
        pids[node_id] = cluster.restart(node_id, graceful=False).pid
    return Injected("restart", tuple(node_ids), at, detail={"new_pids": pids})


def rolling_restart(cluster: LocalCluster, node_ids) -> Injected:
    """Every node in turn leaves, restarts empty and takes its share back."""
    from floering.floe.restart import rolling_restart as roll
    at = time.time()
    lines: list[str] = []
    roll(cluster, list(node_ids), graceful=True, report=lines.append)
    return Injected("rolling-restart", tuple(node_ids), at,
                    detail={"seconds": round(time.time() - at, 3), "steps": lines})


def pause_nodes(cluster: LocalCluster, node_ids) -> Injected:
    return Injected("pause", tuple(node_ids), signal_nodes(cluster, node_ids, signal.SIGSTOP))


def resume_nodes(cluster: LocalCluster, fault: Injected) -> Injected:
    return replace(fault, resumed=signal_nodes(cluster, fault.victims, signal.SIGCONT))


def kill_mapper_mid_chunk(mapper: MapperHandle, timeout: float = 5.0) -> Injected:
    """SIGKILL the mapper while a chunk is being flushed: handed to the client (its
    batches on the wire) but not acknowledged, i.e. the journal's last line is `S i`.
    Gives up waiting after `timeout` and kills anyway; the detail records whether a
    chunk really was in flight when the signal landed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and mapper.alive():
        state = mapper.journal_state()
        flushing = state["flushing"]
        if flushing and flushing[-1] not in state["acked"] and flushing[-1] not in state["failed"]:
            break
        time.sleep(0.0005)
    at = time.time()
    mapper.kill()
    state = mapper.journal_state()
    in_flight = [i for i in state["emitted"] if i not in state["acked"]]
    return Injected("kill-mapper", (f"mapper-{mapper.mapper}",), at,
                    detail={"mid_chunk": any(i in state["flushing"] for i in in_flight),
                            "in_flight_chunks": in_flight, "pid": mapper.pid})
