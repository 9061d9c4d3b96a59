"""Restart nodes of a local cluster, one at a time, without losing anything.

A restarted process holds no state (without a data dir), so it never comes back as
the member it was: each restart is a graceful leave (every range handed to its first
replica), a new process that joins empty under a new name, and a scale-out that hands
it its share back. The next node restarts only once every range is on r+1 nodes
again, so a rolling restart never leaves a range with fewer copies than one crash
would.
"""

from __future__ import annotations

import time

from floering.chaos.cluster import LocalCluster
from floering.mapper.admin import carry_out, plan_scale_out


def member_at(address: str, seeds: list[str], timeout: float, tls=None) -> str:
    """The ring name the process at `address` serves under, once every node's ring
    view lists it (a restarted process takes a new name: `n0#1`)."""
    from floering.mapper import RingClient
    deadline = time.monotonic() + timeout
    with RingClient(seeds, timeout=timeout, rpc_timeout=1.0, tls=tls) as client:
        while True:
            rows = client.stats()
            names = {r["node_id"] for r in rows if r.get("address") == address
                     and "error" not in r and not r.get("fenced")}
            ring = client.refresh_ring()
            listed = [n for n in names if n in ring.nodes]
            if listed and all("error" in r or r["ring_version"] >= ring.version for r in rows):
                return listed[0]
            if time.monotonic() > deadline:
                raise TimeoutError(f"the process at {address} did not join the ring "
                                   f"within {timeout:.0f}s")
            time.sleep(0.05)


def wait_replicated(seeds: list[str], timeout: float, tls=None) -> None:
    """Until every live node answers and has every range it owns on r+1 nodes."""
    from floering.mapper import RingClient
    deadline = time.monotonic() + timeout
    with RingClient(seeds, timeout=timeout, rpc_timeout=1.0, tls=tls) as client:
        while True:
            client.refresh_ring()
            rows = client.stats()
            if rows and all("error" not in r and r["under_replicated"] == 0 for r in rows):
                return
            if time.monotonic() > deadline:
                behind = {r["node_id"]: r.get("error") or r["under_replicated"] for r in rows}
                raise TimeoutError(f"ranges still under-replicated after {timeout:.0f}s: "
                                   f"{behind}")
            time.sleep(0.1)


def restart_node(cluster: LocalCluster, node_id: str, *, graceful: bool = True,
                 timeout: float = 60.0) -> list[str]:
    """Restart one node and give it its share of the ring back; returns what was done."""
    process = cluster.restart(node_id, graceful=graceful, timeout=timeout)
    seeds = [n.address for n in cluster.nodes if n.alive()]
    client_tls = cluster.tls("client")
    name = member_at(process.address, seeds, timeout, client_tls)
    # When the leave left owners without replicas (n <= r+1), they refill the new
    # member by themselves: plan the rest only from the ring that refill made.
    wait_replicated(seeds, timeout, client_tls)
    from floering.mapper import RingClient
    with RingClient(seeds, timeout=timeout, tls=client_tls) as client:
        ring = client.refresh_ring()
    how = "left the ring and restarted" if graceful else "was killed and restarted"
    lines = [f"{node_id} {how} (pid {process.pid}); it serves as {name}"]
    lines += carry_out(ring, plan_scale_out(ring, [name]), timeout=timeout,
                       tls=cluster.tls("operator"))
    wait_replicated(seeds, timeout, client_tls)
    return lines


def rolling_restart(cluster: LocalCluster, node_ids: list[str] | None = None, *,
                    graceful: bool = True, timeout: float = 60.0, report=print) -> None:
    """Restart `node_ids` (default: every node) one after the other."""
    for node_id in node_ids or [n.node_id for n in list(cluster.nodes)]:
        for line in restart_node(cluster, node_id, graceful=graceful, timeout=timeout):
            report(line)
