"""What `floe` believes of a cluster file (floe-cluster.json): only what it checks.

The file names processes and how to start them again, and anyone who could write it
could otherwise make `floe restart` run a command of their choosing or `floe down`
signal a process of their choosing. So a node's command is never read from it: it
is built here from fields that are checked one by one (the node id, its address,
peers, seeds, the node flags `floe up` gives, each parsed by the node's own parser),
and a recorded PID is signalled only while it is that node of this cluster: its
command line runs `floering.node` with that node id and listen address, and it
started when the recorded process did (psutil's create time).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path

import psutil

from floering.node.config import build_parser, check_node_id, load_config, parse_peers
from floering.wire.errors import inert
from floering.node.core.reducers import BUILTINS

# psutil derives a start time from the boot time and clock ticks: equal to well
# within this for one process, whoever reads it.
SAME_START = 0.05


def flag(argv: list[str], name: str) -> str | None:
    """The value after `name` in `argv` (the last one given), or None."""
    found = None
    for i, item in enumerate(argv[:-1]):
        if item == name:
            found = argv[i + 1]
    return found


def start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def exited(pid: int) -> bool:
    """No process holds `pid` any more, or only a zombie (it exited, not reaped yet)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def is_our_node(pid: int, node_id: str, address: str, created: float | None) -> bool:
    """Whether `pid` is, now, node `node_id` of the cluster that recorded it: a live
    process running floering.node with that --node-id and --listen, started when the
    recorded one was. A recycled PID, a zombie or any other process is not."""
    if created is None or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False  # a zombie has exited
        cmdline, started = proc.cmdline(), proc.create_time()
    except psutil.Error:
        return False
    return (abs(started - created) <= SAME_START and flag(cmdline, "-m") == "floering.node"
            and flag(cmdline, "--node-id") == node_id and flag(cmdline, "--listen") == address)


def not_ours(pid: int, node_id: str) -> str:
    """Why a recorded node is not signalled: its process is gone, or is another."""
    if start_time(pid) is None:
        return f"{node_id} is not running (pid {pid} is gone)"
    return (f"pid {pid} is not {node_id} of this cluster (its command line or start "
            f"time differ from the recorded node's): it was not signalled")


def node_argv(node_id: str, address: str, *, peers: str, join: str, replicas: int,
              tokens_per_node: int, reducer: str, events_file: str,
              extra: list[str]) -> list[str]:
    """The flags a `floe up` node is started with."""
    argv = ["--node-id", node_id, "--listen", address, "--peers", peers]
    if join:
        argv += ["--join", join]
    return argv + ["--replication", str(replicas), "--tokens-per-node", str(tokens_per_node),
                   "--reducer", reducer, "--events-file", events_file, *extra]


def _parsed(argv: list[str], node_id: str):
    try:
        with contextlib.redirect_stderr(io.StringIO()):     # argparse's usage
            return build_parser().parse_args(argv)
    except SystemExit:
        raise ValueError(f"the cluster file gives {node_id} flags a node does not take: "
                         f"{' '.join(argv)[:200]}") from None


def _refuse(node_id: str, bad: list[str]) -> None:
    if bad:
        raise ValueError(f"settings a `floe up` cluster never gives {node_id}: "
                         f"{', '.join(sorted(bad))} (not started)")


def check_extra(extra: list[str], *, tls_dir: str) -> None:
    """The flags every node of the cluster gets: known to the node's parser, naming
    no node, address, file of settings or events of their own, no TLS directory but
    the cluster's, and a data directory only as an absolute path with {node} in it
    (ValueError otherwise)."""
    args = _parsed(extra, "every node")
    bad = [k for k in ("node_id", "listen", "peers", "join", "events_file", "config",
                       "advertise") if getattr(args, k) is not None]
    bad += ["tls_dir"] if args.tls_dir not in (None, tls_dir) else []
    if args.data_dir is not None and not (Path(args.data_dir).is_absolute()
                                          and Path(args.data_dir).name == "{node}"):
        bad.append("data_dir")
    _refuse("every node", bad)


def checked_command(argv: list[str], *, node_id: str, address: str,
                    events_file: str) -> list[str]:
    """`python -m floering.node` with `argv`, once the node's own parser reads in it
    exactly this node, address and events file, and a valid config (ValueError
    otherwise). Its other flags are the cluster's, checked by check_extra."""
    args = _parsed(argv, node_id)
    wanted = {"node_id": node_id, "listen": address, "events_file": events_file}
    _refuse(node_id, [k for k, v in wanted.items() if getattr(args, k) != v])
    load_config(argv, environ={})          # ids, addresses, numbers: ValueError
    return [sys.executable, "-m", "floering.node", *argv]


def reducer_refusal(reducer: str, data_dir: str | None) -> str | None:
    """Why a node may not be started with the cluster file's `reducer` (None: it may).
    `--reducer` imports the module it names, so only a built-in name is taken, or the
    very reducer the cluster was started with as its kept layout records it (the
    layout.json `floe up` writes in the data directory, private to this user; a
    cluster kept in memory records none)."""
    if reducer in BUILTINS:
        return None
    if data_dir is not None:
        path = Path(data_dir) / "layout.json"
        try:
            st = os.stat(path)
            layout = json.loads(path.read_text()) if st.st_uid == os.getuid() \
                and not st.st_mode & 0o022 else None
        except (OSError, ValueError):
            layout = None
        if isinstance(layout, dict) and layout.get("reducer") == reducer:
            return None
    return (f"the cluster file names reducer {inert(reducer)}, neither a built-in "
            f"({', '.join(BUILTINS)}) nor the reducer the cluster's kept layout records: "
            f"no node is started from it")


def loaded_node(record: dict, *, workdir: Path, replicas: int, reducer: str | None,
                extra: list[str]) -> dict:
    """The fields of a NodeProcess from one node's record, checked; its command is
    built, not read (from `extra` that check_extra passed, and a `reducer` that
    reducer_refusal took; None: no command), and its log is where `floe up` puts it."""
    node_id = check_node_id(record.get("node_id"), incarnation=False)
    address = record.get("address")
    if not isinstance(address, str):
        raise ValueError(f"the cluster file gives {node_id} no address")
    log = workdir / "floe-cluster" / "logs" / f"{node_id}.log"
    created = record.get("create_time")
    pid = record.get("pid")
    node = {"node_id": node_id, "address": address, "log": str(log),
            "pid": pid if isinstance(pid, int) and not isinstance(pid, bool) else 0,
            "create_time": float(created) if isinstance(created, (int, float)) else None,
            "cmd": []}
    peers, join = record.get("peers"), record.get("join", "")
    tokens = record.get("tokens_per_node")
    if not isinstance(peers, str) or not isinstance(join, str) or not isinstance(tokens, int):
        return node                # recorded by an older floe: it cannot be started again
    if reducer is None:
        return node                # a reducer refused: it is not started from this file
    for peer, _ in parse_peers(peers):
        check_node_id(peer)
    argv = node_argv(node_id, address, peers=peers, join=join, replicas=replicas,
                     tokens_per_node=tokens, reducer=reducer,
                     events_file=str(log.with_suffix(".events.jsonl")), extra=extra)
    metrics = record.get("metrics_port")      # floe up --metrics-port: BASE+i
    if isinstance(metrics, int) and not isinstance(metrics, bool) and 0 < metrics < 65536:
        argv += ["--metrics-port", str(metrics)]
    node["cmd"] = checked_command(argv, node_id=node_id, address=address,
                                  events_file=str(log.with_suffix(".events.jsonl")))
    return node
