"""Autoscaling a local cluster: add or remove node processes by the ring's load."""

from __future__ import annotations

import msgpack

from floering.mapper.admin import carry_out, plan_scale_out


def autoscale_loop(cluster, *, seconds: float, min_nodes: int, max_nodes: int,
                   interval: float = 0.5, cooldown: float = 3.0, log=print,
                   changes: list | None = None, until=None) -> list[tuple[float, str]]:
    """Watch the ring for `seconds` (or until `until(changes)` is true); add or remove
    nodes by the autoscale rule, one change at a time and at most one per cool-down.
    Returns [(time, what)] (also appended to `changes` as they happen)."""
    import time
    from floering.mapper import RingClient
    from floering.node.core.load import autoscale
    changes = [] if changes is None else changes
    started = time.monotonic()
    last = float("-inf")
    with RingClient(cluster.seeds, timeout=30, tls=cluster.tls()) as client:
        while time.monotonic() - started < seconds and not (until and until(changes)):
            time.sleep(interval)
            if time.monotonic() - last < cooldown:
                continue
            try:
                ring = client.refresh_ring()
                stats = {s["node_id"]: s for s in client.stats() if "error" not in s}
            except Exception as exc:    # a node in the middle of leaving
                log(f"autoscale: no view this round ({exc})")
                continue
            what, node = autoscale(ring, stats, min_nodes=min_nodes, max_nodes=max_nodes)
            if what == "hold":
                continue
            at = time.monotonic() - started
            if what == "add":
                added = cluster.add_nodes(1)
                names = [n.node_id for n in added]
                deadline = time.monotonic() + 30
                while not set(names) <= set(client.refresh_ring().nodes):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{names} did not join")
                    time.sleep(0.05)
                ring = client.ring
                load = {s["node_id"]: {int(t): v for t, v in msgpack.unpackb(
                    s["load"], strict_map_key=False).items()}
                    for s in client.stats() if "error" not in s and s.get("load")}
                carry_out(ring, plan_scale_out(ring, names, load), tls=cluster.tls("operator"))
                changes.append((at, f"added {names[0]}"))
            else:
                cluster.remove(node)
                changes.append((at, f"removed {node}"))
            log(f"autoscale: {changes[-1][1]} at {at:.1f} s")
            last = time.monotonic()
    return changes
