"""Faults for durable clusters (`--data-dir`), carried out on processes the harness
started, by their PIDs.

- kill-all: every node SIGKILLed at once, then started again on its data directory;
- power-loss: the same, and every node's newest log segment ends in a record only
  partly written before the restart (what a power cut mid-write leaves);
- kill-during-replay: the whole cluster killed and started again, then one node
  SIGKILLed again while it restores from its directory, and started once more;
- disk-full: the size-limited filesystem holding the data directories filled to the
  last byte under load, held, then freed.

Every node started again must come back as the member it was: nobody may be
declared dead but the node killed while restoring. A full disk is a refusal, never a
loss: nodes refuse batches, still serve reads, and take writes again once the space
is back.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import zlib
from dataclasses import replace
from pathlib import Path

from floering.chaos import faults as fault_ops
from floering.floe.cluster import LocalCluster, NodeProcess, serving, spawn_node
from floering.chaos.handoff_faults import read_from
from floering.chaos.timeline import Injected, node_events
from floering.node.storage.segment_log import HEADER, SUFFIX

KINDS = ("kill-all", "power-loss", "kill-during-replay", "disk-full")
RESTARTS = ("kill-all", "power-loss", "kill-during-replay")

# What the nodes' logs say (node.runtime.durability): no structured event exists for
# the data directory, so these lines are what the harness reads.
OPENED = "data directory"
REFUSING = "refusing batches"
WRITES_AGAIN = "takes writes again"
TORN_CUT = "torn tail cut"
READY = "READY "


class Skipped(Exception):
    """The scenario cannot run here (it needs root, or a tmpfs mount); not a failure."""


# ------------------------------------------------------------- the disk itself

def tear_every_log(data_dir: str | Path) -> list[str]:
    """A power loss in the middle of a write: every node's newest log segment ends
    with a record only partly on disk (its header and the first bytes of its
    payload). What was synced, and so acknowledged, is all there; the torn record
    was never acknowledged. Returns the segments torn."""
    torn = []
    for log_dir in sorted(Path(data_dir).glob("*/log")):
        segments = sorted(log_dir.glob("*" + SUFFIX))
        if segments:
            payload = b"\x93" + bytes(range(200))
            with open(segments[-1], "ab") as f:
                f.write(HEADER.pack(len(payload), zlib.crc32(payload)) + payload[:77])
            torn.append(str(segments[-1]))
    return torn


def fill(disk: str | Path) -> Path:
    """Take every free byte of the filesystem holding `disk`."""
    filler = Path(disk) / "filler"
    # Unbuffered: a buffered file would try again to write what did not fit when it
    # is closed, and raise ENOSPC there.
    with open(filler, "wb", buffering=0) as f:
        # Big writes first, then smaller ones down to a byte: a small batch must not
        # find room in what a 64 KiB write left over.
        size = 1 << 16
        while size:
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError:
                size //= 2
    return filler


class SmallDisk:
    """A real size-limited filesystem (tmpfs) mounted at `path` for as long as the
    context lasts. Mounting needs root: `Skipped` otherwise."""

    def __init__(self, path: str | Path, megabytes: int) -> None:
        self.path, self.megabytes = Path(path), megabytes

    def __enter__(self) -> "SmallDisk":
        if os.geteuid() != 0:
            raise Skipped(f"mounting a {self.megabytes} MiB tmpfs for the data "
                          f"directories needs root (running as uid {os.geteuid()})")
        self.path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.megabytes}m",
                               "tmpfs", str(self.path)], capture_output=True, text=True)
        if done.returncode:
            raise Skipped(f"cannot mount a tmpfs at {self.path}: "
                          f"{done.stderr.strip() or done.returncode}")
        return self

    def __exit__(self, *exc) -> None:
        # Every node is stopped before this; lazily only if something still holds it.
        if subprocess.run(["umount", str(self.path)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(self.path)], check=True)


def skip_reason(scenario) -> str | None:
    """Why `scenario` cannot run on this machine, or None."""
    if scenario.disk_mb and os.geteuid() != 0:
        return (f"{scenario.name} mounts a {scenario.disk_mb} MiB tmpfs for the data "
                f"directories, which needs root (running as uid {os.geteuid()})")
    return None


# ------------------------------------------------------------ node processes

class LogTail:
    """What a node's human log gained since a moment (a restarted node appends)."""

    def __init__(self, node: NodeProcess) -> None:
        self.path = node.log
        self.offset = _size(node.log)

    def text(self) -> str:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def has(self, needle: str, unless: str = "") -> bool:
        """Does a line say `needle` (and not `unless`)?"""
        return any(needle in line and not (unless and unless in line)
                   for line in self.text().splitlines())


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def kill_all(cluster: LocalCluster) -> tuple[float, float]:
    """SIGKILL every node back to back; returns when the first signal went and when
    the last process was gone."""
    ids = [n.node_id for n in cluster.nodes]
    at = fault_ops.signal_nodes(cluster, ids, signal.SIGKILL)
    return at, time.time()


def start_again(cluster: LocalCluster, node_ids) -> dict[str, LogTail]:
    """Start each dead node again with its own command line (so on its data
    directory, at its address); returns the tail of each one's log from there."""
    tails = {}
    for node_id in node_ids:
        old = cluster.node(node_id)
        if old.alive():
            raise RuntimeError(f"{node_id} (pid {old.pid}) is still running")
        tails[node_id] = LogTail(old)
        fresh = spawn_node(old.node_id, old.address, old.cmd, Path(old.log))
        cluster.nodes[cluster.nodes.index(old)] = fresh
    cluster.save()
    return tails


def wait_serving(cluster: LocalCluster, node_ids, timeout: float = 60.0) -> dict[str, float]:
    """Until every node answers its health check as serving; the wall-clock time
    each was first seen so."""
    tls = cluster.tls("client")
    deadline = time.monotonic() + timeout
    seen: dict[str, float] = {}
    while len(seen) < len(node_ids):
        for node_id in node_ids:
            node = cluster.node(node_id)
            if node_id in seen:
                continue
            if serving(node.address, tls):
                seen[node_id] = time.time()
            elif not node.alive():
                raise RuntimeError(f"{node_id} exited while starting again on its data "
                                   f"directory: " + _tail(node.log))
        if time.monotonic() > deadline:
            missing = sorted(set(node_ids) - set(seen))
            raise TimeoutError(f"{', '.join(missing)} not serving {timeout:.0f}s after "
                               f"starting again")
        time.sleep(0.02)
    return seen


def _tail(path: str, lines: int = 5) -> str:
    try:
        return " | ".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _ms(t: float | None, since: float) -> float | None:
    return None if t is None else round((t - since) * 1e3, 1)


# ------------------------------------------------------------------ the faults

def restart_all(cluster: LocalCluster, data_dir: Path, tear: bool = False) -> Injected:
    """kill-all, or power-loss with `tear`: SIGKILL every node at once, tear every
    log's tail if asked, start every node again on its directory, wait until all
    serve."""
    ids = [n.node_id for n in cluster.nodes]
    at, dead = kill_all(cluster)
    torn = tear_every_log(data_dir) if tear else []
    restarted = time.time()
    tails = start_again(cluster, ids)
    back = wait_serving(cluster, ids)
    return Injected("power-loss" if tear else "kill-all", tuple(ids), at, detail={
        "dead_ms": _ms(dead, at), "restarted_ms": _ms(restarted, at),
        "serving_ms": {n: _ms(t, at) for n, t in sorted(back.items())},
        "back_ms": _ms(max(back.values()), at), "torn_segments": torn,
        "logs": {n: tail.offset for n, tail in tails.items()}})


def kill_during_replay(cluster: LocalCluster, victim: str, lag: float = 0.0,
                       timeout: float = 30.0) -> Injected:
    """The whole cluster killed and started again; `victim` SIGKILLed again once it
    has opened its data directory (plus `lag` seconds), before it serves, and started
    once more. Whether the kill landed before it served is read back from its log."""
    ids = [n.node_id for n in cluster.nodes]
    at, dead = kill_all(cluster)
    restarted = time.time()
    tails = start_again(cluster, ids)
    state = _kill_while_restoring(cluster, victim, tails[victim], lag, timeout)
    killed_again = state.pop("killed_at")
    again = time.time()
    start_again(cluster, [victim])
    back = wait_serving(cluster, ids)
    return Injected("kill-during-replay", tuple(ids), at, detail={
        "dead_ms": _ms(dead, at), "restarted_ms": _ms(restarted, at),
        "again": victim, "lag": lag, **state,
        "killed_again_ms": _ms(killed_again, at),
        "started_once_more_ms": _ms(again, at),
        "serving_ms": {n: _ms(t, at) for n, t in sorted(back.items())},
        "back_ms": _ms(max(back.values()), at),
        "logs": {n: tail.offset for n, tail in tails.items()}})


def _kill_while_restoring(cluster: LocalCluster, victim: str, tail: LogTail, lag: float,
                          timeout: float) -> dict:
    """Poll the victim's log (every 0.5 ms: the window is a few tens of ms) until it
    has opened its data directory, then SIGKILL it; say how far it had got."""
    node = cluster.node(victim)
    started_at = time.time()
    deadline = time.monotonic() + timeout
    while not tail.has(OPENED):
        if not node.alive():
            raise RuntimeError(f"{victim} exited before opening its data directory: "
                               + _tail(node.log))
        if tail.has(READY) or time.monotonic() > deadline:
            break                   # never saw the line: killed anyway, judged below
        time.sleep(0.0005)
    opened = time.time()
    if lag:
        time.sleep(lag)
    killed_at = fault_ops.signal_nodes(cluster, [victim], signal.SIGKILL)
    text = tail.text()
    started = [e for e in node_events(node.events)
               if e.get("kind") == "started" and e.get("t", 0) >= started_at]
    if READY in text:
        state = "serving"
    elif started:
        state = "restored, not yet serving"      # writing its copies whole again
    elif OPENED in text:
        state = "restoring"
    else:
        state = "starting"
    return {"state_when_killed": state, "in_restore": state in ("restoring",
                                                                "restored, not yet serving"),
            "ms_from_open_to_kill": round((killed_at - opened) * 1e3, 1),
            "killed_at": killed_at}


def disk_full(cluster: LocalCluster, disk: Path, hold: float, key: str,
              recovery: float = 10.0) -> Injected:
    """Fill the data directories' filesystem under load, hold it full for `hold`
    seconds (reading `key` once every node refuses, or half-way), free it, and wait
    until every node that refused batches takes them again: they retry every second,
    so one still refusing after `recovery` seconds never will, and the round stops
    there (the load could not go on)."""
    ids = [n.node_id for n in cluster.nodes]
    tails = {n.node_id: LogTail(n) for n in cluster.nodes}
    at = time.time()
    filler = fill(disk)
    filled = time.time()
    refusing = _first_seen(tails, REFUSING, hold / 2)
    read = _read(cluster, key, at)
    time.sleep(max(0.0, filled + hold - time.time()))
    filler.unlink()
    freed = time.time()
    refused = {n: tails[n] for n in refusing}
    again = _first_seen(refused, WRITES_AGAIN, recovery, unless=REFUSING)
    stuck = sorted(set(refusing) - set(again))
    if stuck:
        raise RuntimeError(f"disk-full: {', '.join(stuck)} still refused batches "
                           f"{recovery:.0f}s after the disk was freed: "
                           + "; ".join(_tail(cluster.node(n).log, 2) for n in stuck))
    return Injected("disk-full", tuple(ids), at, detail={
        "filled_ms": _ms(filled, at), "freed_ms": _ms(freed, at), "hold": hold,
        "refusing_ms": {n: _ms(t, at) for n, t in sorted(refusing.items())},
        "writes_again_ms": {n: _ms(t, at) for n, t in sorted(again.items())},
        "read_while_full": read})


def _read(cluster: LocalCluster, key: str, since: float) -> dict:
    """One read through a fresh client: served, or why not."""
    from floering.mapper import RingClient
    started = time.time()
    try:
        with RingClient(cluster.seeds, timeout=5, rpc_timeout=2,
                        tls=cluster.tls("client")) as reader:
            value = reader.get(key)
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": True, "key": key, "found": value is not None,
            "at_ms": _ms(started, since), "ms": _ms(time.time(), started)}


def _first_seen(tails: dict[str, LogTail], needle: str, timeout: float,
                unless: str = "") -> dict[str, float]:
    """When each log was first seen to say `needle` (polled every 50 ms)."""
    seen: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(seen) < len(tails) and time.monotonic() < deadline:
        for node_id, tail in tails.items():
            if node_id not in seen and tail.has(needle, unless):
                seen[node_id] = time.time()
        time.sleep(0.05)
    return seen


# ------------------------------------------------------------------- judging

def may_be_declared(injected: Injected) -> tuple[str, ...]:
    """Who a durable fault may leave declared dead: only a node killed as it restored
    (its peers may have heard of it before); the others come back as themselves."""
    again = injected.detail.get("again")
    return (again,) if again else ()


def judge(injected: Injected, cluster: LocalCluster, acked_at: list[float],
          members: set[str], flushes=()) -> tuple[Injected, list[str]]:
    """Add what the logs and journals say to the fault's detail; the errors that
    fail the round. `flushes`: (began, returned) per acknowledged chunk."""
    d = dict(injected.detail)
    errors: list[str] = []
    after = [t for t in acked_at if t > injected.at]
    d["first_ack_after_ms"] = _ms(min(after, default=None), injected.at)
    # A chunk flushed just before the kill may see its acknowledgements, sent before
    # the signal, after it: only a flush begun after the fault says when the ring
    # took writes again.
    d["first_flush_after_acked_ms"] = _ms(
        min((t for began, t in flushes if began > injected.at), default=None), injected.at)
    if injected.kind in RESTARTS:
        errors += _came_back(injected, d, cluster, members)
        if not after:
            errors.append(f"{injected.kind}: no chunk was acknowledged after the restart: "
                          f"the load did not ride through the outage")
    else:
        errors += _refused_and_recovered(injected, d, acked_at)
    return replace(injected, detail=d), errors


def _came_back(injected: Injected, d: dict, cluster: LocalCluster, members: set[str]) -> list[str]:
    """Every node back as the member it was (the node killed while restoring may
    have been declared dead and rejoined empty), torn tails cut."""
    errors = []
    again = d.get("again")
    logs = {n.node_id: read_from(n.log, d["logs"][n.node_id]) for n in cluster.nodes}
    d["came_back_as"] = {n: sorted(m for m in members if m.split("#")[0] == n)
                         for n in sorted(logs)}
    for node_id, names in d["came_back_as"].items():
        if node_id != again and names != [node_id]:
            errors.append(f"{node_id} did not come back as itself: the ring has "
                          f"{names or 'none of it'}")
    for node_id, text in logs.items():
        if OPENED not in text:
            errors.append(f"{node_id} did not open its data directory when started again")
    if injected.kind == "power-loss":
        d["torn_tail_cut"] = sorted(n for n, text in logs.items() if TORN_CUT in text)
        torn = {Path(p).parent.parent.name for p in d["torn_segments"]}
        if not torn:
            errors.append("power-loss: no log segment to tear")
        for node_id in sorted(torn - set(d["torn_tail_cut"])):
            errors.append(f"{node_id}'s torn log tail was not reported cut")
    if injected.kind == "kill-during-replay" and not d["in_restore"]:
        errors.append(f"the kill of {again} missed the restore window: it was "
                      f"{d['state_when_killed']!r} when the signal landed")
    return errors


def _refused_and_recovered(injected: Injected, d: dict, acked_at: list[float]) -> list[str]:
    errors = []
    if not d["refusing_ms"]:
        errors.append("disk-full: the disk filled but no node refused a batch")
    if not d["read_while_full"]["ok"]:
        errors.append(f"disk-full: a read while the disk was full failed: "
                      f"{d['read_while_full'].get('error')}")
    # Chunks acknowledged while every refusing node was refusing: none can be, since
    # each needs every holder's synced log record.
    if d["refusing_ms"]:
        since = injected.at + max(d["refusing_ms"].values()) / 1e3
        until = injected.at + d["freed_ms"] / 1e3
        d["acked_while_full"] = sum(1 for t in acked_at if since < t < until)
    freed = injected.at + d["freed_ms"] / 1e3
    if not any(t > freed for t in acked_at):
        errors.append("disk-full: no chunk was acknowledged after the disk was freed")
    return errors


def summary_cells(injected: dict) -> tuple[str, str, str, str]:
    """Four cells of the harness's summary row for a durable fault (from result.json)."""
    d = injected["detail"]
    first_ack = _seconds(d.get("first_ack_after_ms"))
    if injected["kind"] == "disk-full":
        read = d["read_while_full"]
        return (f"{len(d['refusing_ms'])}/{len(injected['victims'])} refusing",
                f"read while full: {'served' if read['ok'] else 'FAILED'}",
                f"writes again by {_seconds(max(d['writes_again_ms'].values(), default=None))}",
                f"acked while full: {d.get('acked_while_full', '-')}")
    cells = (f"serving again {_seconds(d['back_ms'])}", f"first ack {first_ack}")
    if injected["kind"] == "power-loss":
        return (*cells, f"{len(d.get('torn_tail_cut', []))}/{len(d['torn_segments'])} torn "
                        f"tails cut", "")
    if injected["kind"] == "kill-during-replay":
        names = ",".join(d.get("came_back_as", {}).get(d["again"], [])) or "?"
        return (*cells, f"{d['again']} killed {d['state_when_killed']}", f"back as {names}")
    return (*cells, "", "")


def _seconds(ms: float | None) -> str:
    return "-" if ms is None else f"{ms / 1e3:.2f} s"
