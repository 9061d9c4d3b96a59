"""What `floe ui` shows, read the way `floe status` reads it: the ring and every
member's Stats (through an AsyncRingClient, with the client's credentials), the
processes `floe up` recorded, and the nodes' structured event files (when the
cluster file is at hand). A `Watcher` polls on its own event loop, one round at a
time (every interval, and at once when a recorded process is gone), and publishes
each round as one JSON snapshot:

    ring      version, r, reducer, balancer, and a one-line description
    ranges    per range (start, token] as fractions of the hash space, its primary,
              replicas, extra destinations of a handoff in flight, lost or not
    members   `floe status`'s rows: state (serving, joining, leaving, suspect, dead,
              fenced, removed), rate, queue, keys, ranges under-replicated and lost
    verdict   `floe status`'s one line
    events    the newest timeline entries: the nodes' own events (detections,
              takeovers, handoffs, splits, fencing, rejoins) and changes the watcher
              saw between two rounds (a member's state, ranges changing hands)
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING

from floering.floe.ringview import member_rows, range_rows, unlisted_processes, verdict
from floering.wire.hashing import HASH_SPACE

if TYPE_CHECKING:
    from floering.mapper.aclient import AsyncRingClient
    from floering.wire.ring import Ring

MAX_EVENTS = 300            # timeline entries kept (and sent)
PROCESS_CHECK = 0.1         # seconds between two looks at the recorded processes
TAIL_START = 64 * 1024      # of an event file met for the first time: its last bytes
TAIL_READ = 256 * 1024      # read from one event file per round, at most
MEMBER_FIELDS = ("node_id", "state", "why", "error", "address", "pid", "ring_share",
                 "tokens", "apply_rate", "busy", "overloaded", "queue_length", "keys",
                 "backup_tuples", "under_replicated", "lost_ranges", "ring_version",
                 "metrics")
# The nodes' event kinds the timeline shows (node/runtime/events.py lists them all).
SHOWN = {"detected", "suspected", "taken_over", "handoff_prepared", "handoff_committed",
         "handoff_aborted", "split", "fenced", "started", "left", "lost", "re_replicated",
         "overloaded", "relieved", "removal_refused", "checkpoints_failing",
         "checkpoints_resumed"}


def _names(values) -> str:
    return ", ".join(str(v) for v in values) if isinstance(values, (list, tuple)) \
        else str(values)


def describe_event(e: dict) -> tuple[str, str]:
    """(kind, text) of one of a node's events, as the timeline shows it."""
    kind, node = e.get("kind", "?"), e.get("node", "?")
    if kind == "detected":
        return kind, f"{node} declared {_names(e.get('about', []))} dead"
    if kind == "taken_over":
        return kind, (f"{node} took over {len(e.get('tokens', []))} ranges of "
                      f"{_names(e.get('previous', []))}")
    if kind in ("handoff_prepared", "handoff_committed"):
        done = "handed" if kind == "handoff_committed" else "hands"
        took = f" in {e['ms']:.0f} ms" if isinstance(e.get("ms"), (int, float)) else ""
        return kind, (f"{node} {done} {len(e.get('tokens', []))} ranges to "
                      f"{_names(e.get('to', []))}{took}")
    if kind == "handoff_aborted":
        return kind, f"{node}: handoff to {_names(e.get('to', []))} aborted: {e.get('reason')}"
    if kind == "split":
        token, at = e.get("token"), e.get("at")
        if isinstance(token, int) and isinstance(at, int):
            return kind, f"{node} split the range of token {token:#x} at {at:#x}"
        return kind, f"{node} split a range"
    if kind == "started":
        if e.get("replaces") or e.get("process", node) != node:     # n2 back as n2#1
            return "rejoined", f"{node} rejoined" + (
                f", replacing {e['replaces']}" if e.get("replaces") else "")
        return kind, f"{node} started" + (" (joining)" if e.get("joining") else "")
    if kind == "fenced":
        return kind, f"{node} learnt it was declared dead: serves nothing, rejoins"
    if kind == "suspected":
        return kind, f"{node} suspects {_names(e.get('about', e.get('suspect', '?')))}"
    return kind, f"{node}: {kind.replace('_', ' ')}"


class EventTail:
    """Reads the new lines of the nodes' event files, a bounded amount per round."""

    def __init__(self) -> None:
        self._offsets: dict[str, int] = {}
        self._partial: dict[str, bytes] = {}

    def read(self, path: str) -> list[dict]:
        try:
            with open(path, "rb") as f:
                size = f.seek(0, 2)
                offset = self._offsets.get(path)
                if offset is None or size < offset:      # new to us, or started anew
                    offset = max(0, size - TAIL_START)
                    self._partial[path] = b"" if offset == 0 else b"\0"
                f.seek(offset)
                data = f.read(TAIL_READ)
        except OSError:
            return []
        self._offsets[path] = offset + len(data)
        lines = (self._partial.get(path, b"") + data).split(b"\n")
        self._partial[path] = lines.pop()
        out = []
        for line in lines:
            if line.startswith(b"\0"):                  # a line cut by the tail's start
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("kind") in SHOWN:
                out.append(event)
        return out


def range_entries(ring) -> list[dict]:
    """range_rows with the positions as fractions of the hash space, for drawing."""
    out = []
    for row in range_rows(ring):
        start, end = int(row["start"]), int(row["end"])
        out.append({**row, "token": f"{int(row['token']):#018x}",
                    "start": start / HASH_SPACE, "end": end / HASH_SPACE})
    return out


def observed_changes(before: dict | None, after: dict) -> list[tuple[str, str]]:
    """(kind, text) of what changed between two snapshots: members' states, and ranges
    whose primary changed with the ring's version."""
    if before is None:
        return []
    out = []
    was = {m["node_id"]: m["state"] for m in before["members"]}
    for m in after["members"]:
        old = was.get(m["node_id"])
        if old is not None and old != m["state"]:
            why = f" ({m['why']})" if m.get("why") else ""
            out.append(("state", f"{m['node_id']}: {old} -> {m['state']}{why}"))
    if before["ring"].get("version") != after["ring"].get("version"):
        owners = {r["token"]: r["primary"] for r in before["ranges"]}
        moved: dict[tuple[str, str], int] = {}
        for r in after["ranges"]:
            old = owners.get(r["token"])
            if old is not None and old != r["primary"]:
                moved[(old, r["primary"])] = moved.get((old, r["primary"]), 0) + 1
        parts = [f"{n} ranges {a} -> {b}" for (a, b), n in sorted(moved.items())]
        grown = len(after["ranges"]) - len(before["ranges"])
        if grown:
            parts.append(f"{abs(grown)} ranges {'more' if grown > 0 else 'fewer'} "
                         f"({len(after['ranges'])})")
        out.append(("ring", f"ring v{after['ring']['version']}" +
                    (": " + "; ".join(parts) if parts else "")))
    return out


class Recorded:
    """The processes `floe up` recorded ({node: address, pid, alive}) and their event
    files; nothing for a ring named with --ring. The cluster file is read again only
    when it changes (reading it is slow, looking at the processes is not)."""

    def __init__(self, cluster_file: str | None) -> None:
        self.path = cluster_file
        self._seen: tuple[int, int] | None = None
        self._nodes: list = []

    def nodes(self) -> list:
        if self.path is None:
            return []
        try:
            st = os.stat(self.path)
        except OSError:
            self._seen, self._nodes = None, []
            return []
        if (st.st_mtime_ns, st.st_size) != self._seen:
            from floering.floe.cluster import LocalCluster
            try:
                self._nodes = LocalCluster.load(self.path).nodes
            except (OSError, ValueError, KeyError, TypeError):
                self._nodes = []
            self._seen = (st.st_mtime_ns, st.st_size)
        return self._nodes

    def processes(self) -> tuple[dict[str, dict], list[str]]:
        nodes = self.nodes()
        return ({n.node_id: {"address": n.address, "pid": n.pid, "alive": n.alive()}
                 for n in nodes}, [n.events for n in nodes])

    def gone(self) -> set[str]:
        return {n.node_id for n in self.nodes() if not n.alive()}


class Watcher:
    """Polls the ring every `interval` seconds (one round at a time, each bounded by
    the client's timeouts) and publishes the snapshot: `body` (JSON bytes), `seq`
    (rounds published) and `wait_newer(seq)` for the page's stream."""

    def __init__(self, seeds: list[str], tls, cluster_file: str | None,
                 interval: float = 0.5, rpc_timeout: float = 2.0,
                 timeout: float = 5.0) -> None:
        self.seeds, self.tls, self.recorded = seeds, tls, Recorded(cluster_file)
        self.interval, self.rpc_timeout, self.timeout = interval, rpc_timeout, timeout
        self.events: deque[dict] = deque(maxlen=MAX_EVENTS)
        self.tail = EventTail()
        self.snapshot: dict | None = None
        self.body = b"{}"
        self.seq = 0
        self._ring: Ring | None = None    # the last ring read, for a round that failed
        self._published = asyncio.Event()
        self._client: AsyncRingClient | None = None
        self._wake = asyncio.Event()

    async def run(self) -> None:
        from floering.mapper.aclient import AsyncRingClient
        client = self._client = AsyncRingClient(self.seeds, tls=self.tls,
                                                timeout=self.timeout,
                                                rpc_timeout=self.rpc_timeout)
        watch = asyncio.ensure_future(self._watch_processes())
        try:
            while True:
                started = time.monotonic()
                self._wake.clear()
                self.publish(await self.round())
                rest = max(0.05, self.interval - (time.monotonic() - started))
                try:
                    await asyncio.wait_for(self._wake.wait(), rest)
                except asyncio.TimeoutError:
                    pass
        finally:
            watch.cancel()
            await client.close()

    async def _watch_processes(self) -> None:
        """A recorded process gone starts the next read at once, so a member killed
        shows dead without waiting out the interval."""
        gone = self.recorded.gone()
        while True:
            await asyncio.sleep(PROCESS_CHECK)
            now = self.recorded.gone()
            if now - gone:
                self._wake.set()
            gone = now

    async def round(self) -> dict:
        recorded, event_files = self.recorded.processes()
        error = None
        ring: Ring | None
        try:
            client = self._client
            if client is None:
                raise RuntimeError("the watcher reads the ring only while it runs")
            ring = await asyncio.wait_for(client.refresh_ring(), self.timeout)
            stats = await asyncio.wait_for(
                client.stats(also=unlisted_processes(ring, recorded)), self.timeout)
            self._ring = ring
        except Exception as exc:          # the ring does not answer: say so, keep polling
            error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            ring = self._ring
            stats = [] if ring is None else [
                {"node_id": n, "address": a, "error": "not answering"}
                for n, a in ring.addresses]
        now = time.time()
        for path in event_files:
            for e in self.tail.read(path):
                kind, text = describe_event(e)
                self.events.append({"t": e.get("t", now), "kind": kind, "node": e.get("node"),
                                    "text": text})
        return self.build(ring, stats, recorded, error, now)

    def build(self, ring: Ring | None, stats: list[dict], recorded: dict, error: str | None,
              now: float) -> dict:
        if ring is None:
            members = [{"node_id": n, "address": p["address"], "pid": p["pid"],
                        "state": "dead" if not p["alive"] else "suspect",
                        "error": error or "not asked"} for n, p in sorted(recorded.items())]
            return {"t": now, "ring": {}, "ranges": [], "members": members,
                    "verdict": "UNKNOWN: the ring does not answer", "error": error,
                    "events": list(self.events)}
        rows = member_rows(ring, stats, recorded)
        line = verdict(ring, rows)
        members = [{k: r[k] for k in MEMBER_FIELDS if k in r} for r in rows]
        snap = {"t": now, "error": error, "verdict": line,
                "ring": {"version": ring.version, "replication": ring.replication,
                         "reducer": ring.reducer, "balancer": ring.balancer},
                "ranges": range_entries(ring), "members": members}
        for kind, text in observed_changes(self.snapshot, snap):
            self.events.append({"t": now, "kind": kind, "node": None, "text": text})
        snap["events"] = sorted(self.events, key=lambda e: e["t"])
        return snap

    def publish(self, snap: dict) -> None:
        self.snapshot = snap
        self.body = json.dumps(snap, default=str, separators=(",", ":")).encode()
        self.seq += 1
        published, self._published = self._published, asyncio.Event()
        published.set()

    async def wait_newer(self, seq: int, timeout: float) -> bool:
        """Until a snapshot newer than `seq` is published (False after `timeout`)."""
        if self.seq > seq:
            return True
        try:
            await asyncio.wait_for(self._published.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True
