"""Restart nodes of a local cluster, one at a time, without losing anything.

A restarted process holds no state (without a data dir), so it never comes back as
the member it was: each restart is a graceful leave (its ranges spread over the other
members), a new process that joins empty under a new name, and the ring giving it
its share back by itself (the new member pulls ranges from the members holding the
most, node.core.shares). The next node restarts only once the new member holds its
share and every range is on r+1 nodes again, so a rolling restart never leaves a
range with fewer copies than one crash would.
"""

from __future__ import annotations

import time

from floering.floe.cluster import LocalCluster


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


def wait_share(seeds: list[str], name: str, timeout: float, tls=None):
    """Until `name` owns its share (it pulls no more ranges: node.core.shares) and no
    handoff is under way; returns that ring."""
    from floering.mapper import RingClient
    from floering.node.core.shares import pull_plan
    deadline = time.monotonic() + timeout
    with RingClient(seeds, timeout=timeout, rpc_timeout=1.0, tls=tls) as client:
        while True:
            ring = client.refresh_ring()
            if ring.tokens_of(name) and not ring.extras and not pull_plan(ring, name)[1]:
                return ring
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} was given no ranges within {timeout:.0f}s")
            time.sleep(0.1)


def restart_node(cluster: LocalCluster, node_id: str, *, graceful: bool = True,
                 timeout: float = 60.0) -> list[str]:
    """Restart one node and wait until the ring gave it its share back; returns what
    was done. A node whose process is gone is only started again (on its data
    directory, if the cluster is durable)."""
    running = cluster.node(node_id).alive()
    process = cluster.restart(node_id, graceful=graceful, timeout=timeout)
    seeds = [n.address for n in cluster.nodes if n.alive()]
    client_tls = cluster.tls("client")
    name = member_at(process.address, seeds, timeout, client_tls)
    ring = wait_share(seeds, name, timeout, client_tls)
    wait_replicated(seeds, timeout, client_tls)
    if not running:
        how = "was not running and was started again" + (
            " on its data directory" if cluster.data_dir else "")
    else:
        how = "left the ring and restarted" if graceful else "was killed and restarted"
    same = ("as the same member, with what it held" if name == node_id else
            "as a new member (the ring had declared it dead, or it kept no data)")
    return [f"{node_id} {how} (pid {process.pid}); it serves as {name}, {same}, holding "
            f"{len(ring.tokens_of(name))} ranges ({ring.share_of(name):.0%} of the ring)"]


def start_missing(cluster: LocalCluster, *, timeout: float = 60.0,
                  report=print) -> list[str]:
    """`floe up` against a running cluster: start again each recorded node whose
    process is gone, one at a time, with its own command line (so on its own data
    directory); the running nodes are left alone. Each comes back as the member it
    was if the ring has not declared it dead meanwhile and its data is intact, else
    as a new member that pulls its share back (node.core.shares); the next starts once
    the ring gave it its share and every range is on r+1 nodes. Returns the nodes
    started."""
    missing = [n.node_id for n in cluster.nodes if not n.alive()]
    for node_id in missing:
        for line in restart_node(cluster, node_id, graceful=False, timeout=timeout):
            report(line)
    return missing


def rolling_restart(cluster: LocalCluster, node_ids: list[str] | None = None, *,
                    graceful: bool = True, timeout: float = 60.0, report=print) -> None:
    """Restart `node_ids` (default: every node) one after the other."""
    for node_id in node_ids or [n.node_id for n in list(cluster.nodes)]:
        for line in restart_node(cluster, node_id, graceful=graceful, timeout=timeout):
            report(line)
