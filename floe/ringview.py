"""What `floe status`, `floe ring` and `floe locate` show: every member's state, a
one-line verdict, the ranges with their holders, and where a key lives.

A member's state comes from what the ring and the nodes' Stats replies say, plus the
processes `floe up` recorded:

    serving   a member answering, holding ranges
    joining   answering but holding no range yet (or started, not yet a member)
    leaving   handing its ranges over before it exits
    suspect   a member that does not answer us, or that a peer's failure detector
              suspects; the ring has not declared it dead (yet)
    dead      its recorded process is gone (the ring takes, or took, its ranges over)
    fenced    declared dead or restarted, yet still running: it serves nothing
    removed   no longer a member, and no process of it is known (it left or died)
"""

from __future__ import annotations

from collections.abc import Sequence

from floering.wire.hashing import HASH_SPACE, position
from floering.wire.ring import Ring

SERVING, JOINING, LEAVING, SUSPECT, DEAD, FENCED, REMOVED = (
    "serving", "joining", "leaving", "suspect", "dead", "fenced", "removed")


def base_name(node: str) -> str:
    """A restarted member comes back as `n0#1`: its process is still `n0`'s."""
    return node.partition("#")[0]


def unlisted_processes(ring: Ring, recorded: dict[str, dict]) -> dict[str, str]:
    """{node: address} of recorded running processes that are not members under their
    name or a later incarnation's (fenced, or not joined yet): asked for stats too."""
    members = {base_name(n) for n in ring.nodes}
    return {n: p["address"] for n, p in recorded.items()
            if p["alive"] and n not in members}


def member_rows(ring: Ring, rows: list[dict], recorded: dict[str, dict]) -> list[dict]:
    """Every row of `rows` (Stats replies, or errors) with its `state`, then a row for
    every recorded process that is gone and every removed member not otherwise shown
    (those, like every row without stats, carry an `error`).
    `recorded`: {node: {"address", "pid", "alive"}} from the cluster file."""
    members = set(ring.nodes)
    suspected = {s for r in rows if "error" not in r for s in r.get("suspects", ())}
    by_pid = {p["pid"]: n for n, p in recorded.items()}
    out = []
    for row in rows:
        node = row["node_id"]
        mine = recorded.get(node) or recorded.get(by_pid.get(row.get("pid"), ""), None)
        if mine is not None and "error" in row:
            row["pid"] = mine["pid"]
        row["state"] = _state(row, ring, members, suspected, mine)
        if row["state"] not in (SERVING, REMOVED):
            row["why"] = why(row, members, mine)
        out.append(row)
    shown = {base_name(r["node_id"]) for r in out} | {r["node_id"] for r in out}
    for node, proc in sorted(recorded.items()):
        if node not in shown:
            row = {"node_id": node, "address": proc["address"], "pid": proc["pid"],
                   "state": DEAD if not proc["alive"] else SUSPECT,
                   "error": "not running" if not proc["alive"] else "not asked"}
            out.append({**row, "why": why(row, members, proc)})
            shown.add(node)
    for node in sorted(ring.removed):
        if node not in shown and base_name(node) not in shown:
            out.append({"node_id": node, "address": "-", "state": REMOVED,
                        "error": "not a member"})
    return out


def _state(row: dict, ring: Ring, members: set, suspected: set, mine: dict | None) -> str:
    node = row["node_id"]
    if "error" in row:
        gone = mine is not None and not mine["alive"]
        return DEAD if gone or ring.is_removed(node) else SUSPECT
    if row.get("fenced") or (node not in members and ring.is_removed(node)):
        return FENCED
    if row.get("leaving"):
        return LEAVING
    if node not in members or not row.get("tokens"):
        return JOINING
    return SUSPECT if node in suspected else SERVING


def verdict(ring: Ring, rows: list[dict]) -> str:
    """One line: HEALTHY only when every member the ring or the cluster file records
    is serving and every range is on r+1 nodes; else DEGRADED (or DATA LOST), then how
    many serve, what is under-replicated or lost, and who is not serving and why."""
    members = set(ring.nodes)
    counted = [r for r in rows if r["state"] != REMOVED]
    serving = [r for r in counted if r["state"] == SERVING]
    answering = [r for r in rows if "error" not in r and r["node_id"] in members]
    lost = max([len(ring.lost)] + [r["lost_ranges"] for r in answering])
    under = sum(r["under_replicated"] for r in answering)
    by_state: dict[str, list[str]] = {}
    for r in counted:
        if r["state"] != SERVING:
            by_state.setdefault(r["state"], []).append(
                f"{r['node_id']} ({r.get('why') or why(r, members, None)})")
    if lost:
        word = "DATA LOST"
    elif by_state or under or not answering:
        word = "DEGRADED"
    else:
        word = "HEALTHY"
    parts = [f"{len(serving)} of {len(counted)} members serving"]
    if under:
        parts.append(f"{under} ranges under-replicated")
    if lost:
        parts.append(f"{lost} ranges lost")
    elif not under:
        parts.append("every range on r+1 nodes")
    for state in (SUSPECT, DEAD, FENCED, JOINING, LEAVING):
        if state in by_state:
            parts.append(f"{state}: " + ", ".join(by_state[state]))
    return f"{word}: " + "; ".join(parts)


def why(row: dict, members: set, mine: dict | None) -> str:
    """Why a member is not serving, in a few words. `mine`: its recorded process."""
    state, node = row["state"], row["node_id"]
    if state == DEAD:
        if mine is not None and not mine["alive"]:
            return f"process {mine['pid']} gone"
        return "declared dead by the ring"
    if state == SUSPECT:
        if "error" in row:
            return "not answering" + ("" if row["error"] == "not asked" else f": {row['error']}")
        return "suspected by a peer"
    if state == FENCED:
        return "declared dead, still running, serves nothing"
    if state == JOINING:
        return "holds no range yet" if node in members else "missing from the ring"
    if state == LEAVING:
        return "handing its ranges over"
    return state


def describe_ring(ring: Ring) -> str:
    reducer = ring.reducer or "not recorded"
    return (f"ring v{ring.version}: {len(ring.nodes)} members, {len(ring.tokens)} ranges, "
            f"r={ring.replication}, reducer {reducer}, balancer {ring.balancer}")


def range_rows(ring: Ring, show=str) -> list[dict]:
    """One row per range, clockwise: (start, token] with its primary, replicas and
    extra destinations: `extras` all of them, `keeping` those that hold a complete copy
    (a former holder keeping it until the owner has filled its new replicas), so the
    others are destinations of a handoff in flight, receiving their copy."""
    rows = []
    for token in ring.tokens:
        lo, hi = ring.range_of_token(token)
        extras = ring.extras_of(token)
        rows.append({"token": show(token), "start": show(lo), "end": show(hi),
                     "share": Ring.range_size((lo, hi)) / HASH_SPACE,
                     "primary": ring.owner_of_token(token),
                     "replicas": list(ring.regular_replicas(token)),
                     "extras": list(extras),
                     "keeping": [x for x in extras if (token, x) in ring.retiring],
                     "lost": token in ring.lost})
    return rows


def locate(ring: Ring, key, show=str) -> dict:
    """Where `key` lives: its ring position, the range holding it and that range's
    holders."""
    pos = position(key)
    token = ring.token_for_position(pos)
    row = next(r for r in range_rows(ring, show) if r["token"] == show(token))
    return {"key": key, "position": show(pos), **row}


def table(rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns, two spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def member_named(ring: Ring, given: str) -> str:
    """The ring member an operator means by `given`, with or without its `#k`: `n1`
    is `n1#1` once that restarted member holds the name."""
    if given in ring.nodes:
        return given
    same = [n for n in ring.nodes if base_name(n) == base_name(given)]
    return same[0] if len(same) == 1 else given


def process_ids(args) -> None:
    """`floe scale --remove` and `floe restart` name processes `floe up` started, with
    or without a member's `#k`: `n1#1` runs in `n1`'s process."""
    if getattr(args, "command", None) == "scale" and args.remove:
        args.remove = base_name(args.remove)
    if getattr(args, "command", None) == "restart":
        args.nodes = [base_name(n) for n in args.nodes]


HEALTH_EXIT = {"HEALTHY": 0, "DEGRADED": 3, "DATA LOST": 4}


def check_exit(line: str) -> int:
    """`floe status --check`'s exit code for a verdict: 0 HEALTHY, 3 DEGRADED, 4 DATA
    LOST (1 stays a failure to ask, 2 a usage error)."""
    return HEALTH_EXIT[line.partition(":")[0]]
