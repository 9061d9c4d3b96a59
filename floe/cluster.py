"""Start, find and stop a local multi-process ring on loopback.

Every process is started here and stopped here by its own PID (checked against its
command line and start time first, so a recycled PID is never signalled). The cluster
is recorded in a JSON file so `floe status` / `floe down` in another shell find it;
what is read back from it is checked, and node commands are built, never read
(floe.records). Everything written here is private (node.files)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import TypedDict
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from floering.floe.records import (check_extra, exited, flag, is_our_node, loaded_node,
                                    not_ours, reducer_refusal, start_time)
from floering.node.config import check_node_id
from floering.wire.errors import FloeError
from floering.node.files import open_private, private_dir, write_private
from floering.wire.channels import server_options
from floering.wire.tls import TlsFiles
from floering.node.transport.tls import generate as generate_tls, issue as issue_tls

DEFAULT_STATE_FILE = "floe-cluster.json"
# wait_ready: how often a starting node is asked whether it serves, and how soon its
# channel tries again while nothing listens at its address yet (gRPC's backoff starts
# at a second). Not the minimum connect timeout: a handshake with a node still
# starting on busy cores may take longer than that.
READY_POLL = 0.02
READY_BACKOFF_MS = 50
READY_OPTIONS = [("grpc.initial_reconnect_backoff_ms", READY_BACKOFF_MS),
                 ("grpc.max_reconnect_backoff_ms", READY_BACKOFF_MS)]


@dataclass
class NodeProcess:
    node_id: str
    address: str
    pid: int
    log: str
    # How it was started: a restart reuses it. Never read from the cluster file: a
    # loaded node's is built from its checked fields (floe.records).
    cmd: list[str] = field(default_factory=list)
    # Set when this process started the node: poll() is exact, and it also covers the
    # instant after fork() before exec(), when the child still has the parent's cmdline.
    popen: subprocess.Popen | None = field(default=None, repr=False, compare=False)
    create_time: float | None = None   # psutil's: a PID is this node only if it matches

    @property
    def events(self) -> str:
        """The node's structured events (JSON lines, node.runtime.events)."""
        return str(Path(self.log).with_suffix(".events.jsonl"))

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return is_our_node(self.pid, self.node_id, self.address, self.create_time)

    def record(self) -> dict:
        """What the cluster file keeps: fields a restart checks and builds the
        command from, never the command itself."""
        kept = {"node_id": self.node_id, "address": self.address, "pid": self.pid,
                "create_time": self.create_time, "log": self.log}
        tokens = flag(self.cmd, "--tokens-per-node")
        if flag(self.cmd, "--peers") is not None and tokens is not None:
            kept.update(peers=flag(self.cmd, "--peers"), join=flag(self.cmd, "--join") or "",
                        tokens_per_node=int(tokens))
        metrics_port = flag(self.cmd, "--metrics-port")
        if metrics_port is not None:     # BASE+i of `floe up`
            kept["metrics_port"] = int(metrics_port)
        return kept


@dataclass
class LocalCluster:
    nodes: list[NodeProcess]
    replicas: int
    state_file: str
    reducer: str = "count"
    extra_args: list[str] = field(default_factory=list)
    # Durable: the directory holding every node's data directory and the layout
    # (layout.json) that `up` on it brings back; None keeps state in memory only.
    data_dir: str | None = None
    # `up`'s first port: `add_nodes` takes the next free ones from there.
    base_port: int | None = None
    # Loaded from a cluster file whose reducer may not be started (records.
    # reducer_refusal): why; restart and add_nodes refuse with it, starting nothing.
    refused: str | None = None

    # ----------------------------------------------------------- start/stop

    @classmethod
    def up(cls, nodes: int | None = None, replicas: int | None = None, *,
           base_port: int | None = None, workdir: str | Path = ".",
           reducer: str | None = None, tokens_per_node: int | None = None,
           extra_args: list[str] | None = None, ready_timeout: float = 30.0,
           host: str = "127.0.0.1", tls: bool = True,
           data_dir: str | Path | None = None,
           balancer: str | None = None,
           node_args: list[str] | None = None,
           metrics_port: int | None = None) -> "LocalCluster":
        """Start `nodes` node processes (default 4; r=1, the count reducer, 8 tokens
        per node unless given). With `tls` (the default), a throwaway CA and
        certificates for every node, a client and an operator are written to
        floe-cluster/tls/ and every call is mutual TLS (node.transport.tls); callers
        take their credentials from `tls("client")` / `tls("operator")`. `tls=False`
        serves in the clear, for what must be shown without authentication.
        `balancer`: the ring's load-balancing policy (wire.balancers; none).

        With `data_dir` every node is durable (`--data-dir data_dir/<node-id>`) and the
        cluster's layout is kept there (and kept up to date by `add_nodes` and
        `remove`): started again on the same directory (after `down()`,
        `down(kill=True)`, a crash, a reboot), the same nodes come back on the same
        addresses with what they held. Against a kept layout, `nodes`, `replicas`,
        `reducer`, `tokens_per_node`, `balancer` and `base_port` may be left out; given and
        different from the layout, they are refused (`LayoutMismatch`): `wipe`
        deletes the kept cluster first. `node_args`: flags given to every node as they
        are (kept in the layout too, as the nodes' reducer arguments must not change)."""
        if nodes is not None and nodes < 1:
            raise ValueError("a cluster needs at least one node")
        if replicas is not None and replicas < 0:
            raise ValueError("replicas must be >= 0")
        workdir = Path(workdir).resolve()
        state_file = workdir / DEFAULT_STATE_FILE
        _refuse_running(cls, state_file)
        data_dir = None if data_dir is None else Path(data_dir).resolve()
        layout = _layout(data_dir) if data_dir is not None else None
        if layout is not None and data_dir is not None:
            shape = _kept_shape(data_dir, layout, dict(
                nodes=nodes, replicas=replicas, reducer=reducer,
                tokens_per_node=tokens_per_node, base_port=base_port, balancer=balancer,
                node_args=node_args))
        else:
            shape = _new_shape(nodes, replicas, reducer, tokens_per_node, balancer,
                               base_port, host, node_args)
        # every node of the ring, and every one added later, runs the same policy
        extra = ["--balancer", shape.balancer] + list(extra_args or []) + shape.node_args
        # a reducer the policy cannot read back is refused before anything starts
        # (or is kept): the nodes would all exit on it
        check_balancer_reducer(["--node-id", shape.ids[0], "--listen",
                                f"{shape.host}:{shape.ports[0]}", *shape.ring_args(), *extra])
        # what the cluster file will say: `floe` would not read it back otherwise
        check_extra(extra, tls_dir=str(workdir / "floe-cluster" / "tls"))
        log_dir = private_dir(workdir / "floe-cluster" / "logs")
        if tls:
            tls_dir = generate_tls(private_dir(workdir / "floe-cluster" / "tls"), shape.ids,
                                   (shape.host, "localhost"),   # a durable ring keeps its CA
                                   keep_ca=data_dir is not None)
            extra += ["--tls-dir", str(tls_dir)]
        else:
            extra += ["--insecure"]         # in the clear on loopback: said, never implied
        if data_dir is not None:
            extra += ["--data-dir", str(data_dir / "{node}")]
            if layout is None:
                _save_layout(data_dir, shape.layout())
        procs = []
        for index, (node_id, port) in enumerate(zip(shape.ids, shape.ports)):
            log_path = log_dir / f"{node_id}.log"
            cmd = [sys.executable, "-m", "floering.node", "--node-id", node_id,
                   "--listen", f"{shape.host}:{port}", *shape.ring_args(),
                   "--events-file", str(log_path.with_suffix(".events.jsonl")),
                   *extra, *([] if metrics_port is None
                             else ["--metrics-port", str(metrics_port + index)])]
            procs.append(spawn_node(node_id, f"{shape.host}:{port}", cmd, log_path))
        replicas, reducer, base_port = shape.replicas, shape.reducer, shape.base_port
        cluster = cls(procs, replicas, str(state_file), reducer, extra,
                      None if data_dir is None else str(data_dir), base_port)
        return cluster.saved_and_ready(ready_timeout)

    def saved_and_ready(self, timeout: float) -> LocalCluster:
        """Record the cluster's state file, then wait until every node serves; a
        cluster that does not come up is taken down, so no process outlives it."""
        self.save()
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.down()
            raise
        return self

    def wait_ready(self, timeout: float) -> None:
        """Until every node serves. Each node is asked over one channel, which
        reconnects within READY_BACKOFF_MS while the node is not listening yet: one
        TLS handshake per node, not one per look (the handshakes cost the starting
        nodes CPU)."""
        deadline = time.monotonic() + timeout
        tls = self.tls("client")
        for node in self.nodes:
            with channel(node.address, tls, options=READY_OPTIONS) as ready:
                check = health_pb2_grpc.HealthStub(ready).Check
                while not _says_serving(check):
                    if not node.alive():
                        raise RuntimeError(f"node {node.node_id} exited during start:\n"
                                           + _tail(node.log))
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"node {node.node_id} not serving after "
                                           f"{timeout}s:\n" + _tail(node.log))
                    time.sleep(READY_POLL)

    def down(self, grace: float = 5.0, kill: bool = False) -> None:
        """SIGTERM every node we started (graceful: final checkpoint), SIGKILL stragglers;
        with `kill`, SIGKILL every node at once (what a power cut does to a cluster)."""
        for node in self.nodes:
            if node.alive():
                _signal(node.pid, signal.SIGCONT)  # a paused node cannot handle SIGTERM
                _signal(node.pid, signal.SIGKILL if kill else signal.SIGTERM)
        deadline = time.monotonic() + grace
        for node in self.nodes:
            while node.alive() and time.monotonic() < deadline:
                _reap(node.pid)
                time.sleep(0.02)
            if node.alive():
                _signal(node.pid, signal.SIGKILL)
                while node.alive():
                    _reap(node.pid)
                    time.sleep(0.01)
            _reap(node.pid)
        Path(self.state_file).unlink(missing_ok=True)

    # ------------------------------------------------------------ scale

    def add_nodes(self, count: int, *, tokens_per_node: int = 8, ready_timeout: float = 30.0,
                  host: str = "127.0.0.1", base_port: int | None = None,
                  metrics_ports: list[int] | None = None) -> list[NodeProcess]:
        """Start `count` new node processes that join the running ring with no ranges
        (give them ranges with mapper.admin.carry_out). Their ports: the first free ones
        from `base_port` (else `up`'s) that no node of the cluster uses, else any."""
        if count < 1:
            raise ValueError("add at least one node")
        if self.refused:
            raise ValueError(self.refused)
        seeds = ",".join(n.address for n in self.nodes if n.alive())
        if not seeds:
            raise RuntimeError("no running node to join")
        taken = {n.node_id for n in self.nodes}
        ids: list[str] = []
        i = 0
        while len(ids) < count:
            if f"n{i}" not in taken:
                ids.append(f"n{i}")
            i += 1
        base = self.base_port if base_port is None else base_port
        ports = _free_ports(host, count, None) if base is None else \
            _ports_from(host, count, base, {int(n.address.rpartition(":")[2]) for n in self.nodes})
        log_dir = private_dir(Path(self.state_file).parent / "floe-cluster" / "logs")
        added = []
        tls = self.tls()
        for index, (node_id, port) in enumerate(zip(ids, ports)):
            if tls is not None:                    # a certificate from the ring's CA
                issue_tls(tls.ca.parent, node_id, "node", (host, "localhost"))
            log_path = log_dir / f"{node_id}.log"
            address = f"{host}:{port}"
            cmd = [sys.executable, "-m", "floering.node", "--node-id", node_id, "--listen", address,
                   "--peers", f"{node_id}={address}", "--join", seeds,
                   "--replication", str(self.replicas), "--tokens-per-node", str(tokens_per_node),
                   "--reducer", self.reducer,
                   "--events-file", str(log_path.with_suffix(".events.jsonl")), *self.extra_args,
                   *(["--metrics-port", str(metrics_ports[index])] if metrics_ports else [])]
            added.append(spawn_node(node_id, address, cmd, log_path))
        self.nodes += added
        self.save()
        LocalCluster(added, self.replicas, self.state_file,
                     extra_args=self.extra_args).wait_ready(ready_timeout)
        # Serving means joined: from now on `up` on the data directory starts them too.
        self._update_layout(add=[(n.node_id, n.address) for n in added])
        return added

    def remove(self, node_id: str, timeout: float = 60.0, *, forget: bool = True) -> None:
        """Scale-in: the node spreads its ranges over the other members, leaves the
        ring and exits by itself; we wait for the exit and forget it. Durable, it is dropped
        from the layout and its data directory (which holds nothing the ring needs any
        more) is deleted, so `up` does not start it again; `forget=False` keeps both,
        for a restart."""
        from floering.mapper.admin import request_handoff
        node = self.node(node_id)
        if not node.alive():
            if start_time(node.pid) is not None:     # a process, but not this node
                raise RuntimeError(not_ours(node.pid, node_id))
            raise RuntimeError(f"{node_id} is not running (pid {node.pid} is gone): it cannot "
                               f"hand its ranges over; the ring gives them to their replicas "
                               f"itself (`floe status` shows it as dead)")
        try:
            reply = request_handoff(node.address, [], leave=True, timeout=timeout,
                                    tls=self.tls("operator"))
        except FloeError as exc:
            raise RuntimeError(f"{node_id} at {node.address} did not answer ({type(exc).__name__}"
                               f"): is it paused or overloaded?") from None
        if not reply.accepted:
            raise RuntimeError(f"{node_id} did not leave: {reply.detail}")
        deadline = time.monotonic() + 15
        while node.alive() and time.monotonic() < deadline:
            _reap(node.pid)
            time.sleep(0.02)
        if node.alive():
            raise RuntimeError(f"{node_id} left the ring but its process {node.pid} is still running")
        _reap(node.pid)
        self.nodes.remove(node)
        self.save()
        if forget and self.data_dir is not None:
            self._update_layout(drop=[node_id])
            _delete_node_dir(Path(self.data_dir), node_id)

    def restart(self, node_id: str, *, graceful: bool = True, sig: int = signal.SIGKILL,
                timeout: float = 60.0, ready_timeout: float = 30.0) -> NodeProcess:
        """Stop the node's process and start it again with the same command line
        (of a loaded cluster: the one built from the node's checked record). Graceful: it first leaves the ring (hands every range to its first replica).
        Otherwise `sig` (SIGKILL; SIGTERM stops it as a service manager does, leaving
        the ring only with --leave-on-sigterm): unless it left, its ranges are taken
        over as after a crash. Either way the
        new process holds no state and joins as a new member (`floering.node.core.membership`);
        give it ranges with mapper.admin.carry_out."""
        if self.refused:
            raise ValueError(self.refused)
        node = self.node(node_id)
        if not node.cmd:
            raise RuntimeError(f"{node_id} was recorded without its command line; "
                               f"it cannot be restarted from here")
        if not node.alive() and exited(node.pid):   # a crash: nothing to stop or
            self.nodes.remove(node)                 # signal, only to start it again
        elif graceful:
            self.remove(node_id, timeout=timeout, forget=False)
        else:
            self.kill(node_id, sig)
            deadline = time.monotonic() + timeout
            while node.alive():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{node_id} (pid {node.pid}) did not exit on signal {sig}")
                _reap(node.pid)
                time.sleep(0.01)
            _reap(node.pid)
            self.nodes.remove(node)
        fresh = spawn_node(node.node_id, node.address, node.cmd, Path(node.log))
        self.nodes.append(fresh)
        self.save()
        LocalCluster([fresh], self.replicas, self.state_file,
                     extra_args=self.extra_args).wait_ready(ready_timeout)
        return fresh

    def kill(self, node_id: str, sig: int = signal.SIGKILL) -> None:
        node = self.node(node_id)
        if not node.alive():
            raise RuntimeError(not_ours(node.pid, node_id))
        _signal(node.pid, sig)
        if sig == signal.SIGKILL:
            while node.alive():
                _reap(node.pid)
                time.sleep(0.005)

    # ------------------------------------------------------------ records

    def node(self, node_id: str) -> NodeProcess:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise KeyError(f"no node {node_id} in this cluster (its nodes: "
                       f"{', '.join(n.node_id for n in self.nodes)})")

    @property
    def seeds(self) -> list[str]:
        return [n.address for n in self.nodes]

    @property
    def tls_dir(self) -> Path | None:
        """The directory of the ring's CA and certificates, or None in the clear."""
        if "--tls-dir" not in self.extra_args:
            return None
        return Path(self.extra_args[self.extra_args.index("--tls-dir") + 1])

    def tls(self, name: str = "client") -> TlsFiles | None:
        """`name`'s credentials (client, operator or a node id) if the cluster runs
        TLS, else None."""
        directory = self.tls_dir
        return None if directory is None else TlsFiles.in_dir(directory, name)

    @property
    def balancer(self) -> str:
        """The ring's load-balancing policy, as its nodes were started."""
        given = [value for flag, value in zip(self.extra_args, self.extra_args[1:])
                 if flag == "--balancer"]
        return given[-1] if given else DEFAULT_LAYOUT["balancer"]

    def channel(self, address: str, name: str = "client", **kwargs) -> grpc.Channel:
        """A blocking channel to `address` with `name`'s credentials when the cluster
        runs TLS."""
        return channel(address, self.tls(name), **kwargs)

    def save(self) -> None:
        data = {"replicas": self.replicas, "reducer": self.reducer,
                "extra_args": self.extra_args, "data_dir": self.data_dir,
                "base_port": self.base_port,
                "nodes": [n.record() for n in self.nodes]}
        tmp = Path(self.state_file).with_suffix(".tmp")
        write_private(tmp, json.dumps(data, indent=2))
        tmp.replace(self.state_file)

    @classmethod
    def load(cls, state_file: str | Path = DEFAULT_STATE_FILE) -> "LocalCluster":
        path = Path(state_file).resolve()
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"no cluster recorded at {path}; start one with "
                                    f"`floe up`") from None
        replicas, reducer = data.get("replicas"), data.get("reducer", "count")
        extra, data_dir = data.get("extra_args", []), data.get("data_dir")
        if (not isinstance(replicas, int) or not isinstance(reducer, str)
                or not isinstance(extra, list) or not all(isinstance(a, str) for a in extra)
                or not isinstance(data_dir, (str, type(None)))):
            raise ValueError(f"{path} is not a cluster file `floe up` wrote")
        check_extra(extra, tls_dir=str(path.parent / "floe-cluster" / "tls"))
        refused = reducer_refusal(reducer, data_dir)
        nodes = [NodeProcess(**loaded_node(n, workdir=path.parent, replicas=replicas,
                                           reducer=None if refused else reducer,
                                           extra=extra))
                 for n in data["nodes"]]
        return cls(nodes, replicas, str(path), reducer, extra, data_dir, data.get("base_port"),
                   refused)

    def _update_layout(self, add=(), drop=()) -> None:
        """Keep the durable layout in step with the nodes: `add` [(id, address)],
        `drop` [id]. Nothing to do in memory."""
        if self.data_dir is None:
            return
        data_dir = Path(self.data_dir)
        layout = _layout(data_dir)
        if layout is None:
            raise RuntimeError(f"the layout of the cluster in {data_dir} is missing")
        kept = [[i, a] for i, a in layout["nodes"] if i not in set(drop)]
        known = {i for i, _ in kept}
        kept += [[i, a] for i, a in add if i not in known]
        _save_layout(data_dir, {**layout, "nodes": kept})

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.down()


# ------------------------------------------------------------------ helpers

def unwind_on_sigterm() -> None:
    """Make SIGTERM unwind like Ctrl-C, so a benchmark or job stopped by its PID stops
    the rings it started on the way out (their context managers run)."""
    signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(*_):
    raise KeyboardInterrupt


def spawn_node(node_id: str, address: str, cmd: list[str], log_path: Path) -> NodeProcess:
    """Start a node; what it writes (data, events) is private from birth (umask 077)."""
    with open_private(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env=node_env(), umask=0o077)
    return NodeProcess(node_id, address, proc.pid, str(log_path), list(cmd), proc,
                       start_time(proc.pid))


def check_balancer_reducer(node_argv: list[str]) -> None:
    """The node's own check that the ring's balancer can read its reducer back (a
    policy that shares keys needs the reducer's merge: node.app.check_config_reducer),
    run here on the flags a node will be started with, so that `floe up` refuses in
    one line (InvalidArgument) before any node starts. The reducer is imported as the
    node would import it (this checkout, the working directory and PYTHONPATH first).
    What this process cannot read or build (a bad flag, a reducer it cannot import)
    is left to the nodes, which report it as before."""
    import contextlib
    import io
    from floering.node.app import check_config_reducer, configured_reducer
    from floering.node.config import load_config
    env = node_env()
    path = [os.getcwd(), *env.get("PYTHONPATH", "").split(os.pathsep)]
    saved = list(sys.path)
    sys.path[:0] = [p for p in path if p and p not in sys.path]
    try:
        with contextlib.redirect_stderr(io.StringIO()):   # argparse's usage, if any
            config = load_config(node_argv, environ=env)
            reducer = configured_reducer(config)
    except (Exception, SystemExit):
        return
    finally:
        sys.path[:] = saved
    check_config_reducer(config, reducer)


def node_env() -> dict:
    env = dict(os.environ)
    # The node must import this checkout's packages even when not installed: floering
    # (in proto/) finds the others beside it.
    proto = Path(__file__).resolve().parent.parent / "proto"
    if (proto / "floering").is_dir():
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(proto), env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


LAYOUT_FILE = "layout.json"
# What a new cluster gets for what `up` was not given.
class Defaults(TypedDict):
    nodes: int
    replicas: int
    reducer: str
    tokens_per_node: int
    balancer: str


DEFAULT_LAYOUT: Defaults = {"nodes": 4, "replicas": 1, "reducer": "count",
                            "tokens_per_node": 8, "balancer": "none"}
# The `floe up` flag of each setting a kept layout fixes.
LAYOUT_FLAGS = {"nodes": "--nodes", "replicas": "--replicas", "reducer": "--reducer",
                "tokens_per_node": "--tokens-per-node", "base_port": "--base-port",
                "balancer": "--balancer", "node_args": "--"}


class LayoutMismatch(ValueError):
    """`up` on a data directory holding a cluster's layout, with settings that differ
    from it: the kept cluster is not silently started otherwise. `flags`: the `floe up`
    flags that differ."""

    def __init__(self, data_dir: Path, layout: dict,
                 differences: list[tuple[str, object, object]]) -> None:
        self.data_dir, self.layout, self.differences = data_dir, layout, differences
        self.flags = [LAYOUT_FLAGS[k] for k, _, _ in differences]
        given = ", ".join(f"{LAYOUT_FLAGS[k]} {g} (kept: {kept})"
                          for k, g, kept in differences)
        super().__init__(f"the cluster kept in {data_dir} has {describe_layout(layout)}; "
                         f"{given} {'differs' if len(differences) == 1 else 'differ'} "
                         f"from it")


def layout_differences(layout: dict, **given) -> list[tuple[str, object, object]]:
    """[(setting, given, kept)] for every given (not None) setting that differs."""
    kept = {"nodes": len(layout["nodes"]), "replicas": layout["replicas"],
            "reducer": layout["reducer"], "tokens_per_node": layout["tokens_per_node"],
            "base_port": layout.get("base_port"),
            "balancer": layout.get("balancer", DEFAULT_LAYOUT["balancer"]),
            "node_args": layout.get("node_args", [])}
    return [(k, v, kept[k] if kept[k] is not None else "ports chosen free")
            for k, v in given.items() if v is not None and v != kept[k]]


def describe_layout(layout: dict) -> str:
    ids = [i for i, _ in layout["nodes"]]
    return (f"{len(ids)} nodes ({', '.join(ids)}), r={layout['replicas']}, reducer "
            f"{layout['reducer']}, {layout['tokens_per_node']} tokens per node, balancer "
            f"{layout.get('balancer', DEFAULT_LAYOUT['balancer'])}")


def kept_layout(data_dir: str | Path) -> dict | None:
    """The layout of the cluster kept in `data_dir`, or None if none is."""
    return _layout(data_dir)


@dataclass
class _RingShape:
    """What `up` starts: the nodes' ids and ports and the ring's settings, from a kept
    layout or from the arguments and the defaults."""
    ids: list[str]
    ports: list[int]
    host: str
    replicas: int
    tokens_per_node: int
    reducer: str
    balancer: str
    base_port: int | None
    node_args: list[str]

    def ring_args(self) -> list[str]:
        peers = ",".join(f"{i}={self.host}:{p}" for i, p in zip(self.ids, self.ports))
        return ["--peers", peers, "--replication", str(self.replicas),
                "--tokens-per-node", str(self.tokens_per_node), "--reducer", self.reducer]

    def layout(self) -> dict:
        return dict(nodes=[[i, f"{self.host}:{p}"] for i, p in zip(self.ids, self.ports)],
                    replicas=self.replicas, tokens_per_node=self.tokens_per_node,
                    reducer=self.reducer, base_port=self.base_port, balancer=self.balancer,
                    node_args=self.node_args)


def _refuse_running(cls, state_file: Path) -> None:
    if state_file.exists():
        existing = cls.load(state_file)
        if any(n.alive() for n in existing.nodes):
            raise RuntimeError(f"a cluster recorded in {state_file} is still running; "
                               f"run `floe down` first")


def _kept_shape(data_dir: Path, layout: dict, given: dict) -> _RingShape:
    """The ring kept in `data_dir`: what was given must agree with it
    (`LayoutMismatch`), and its ports must be free."""
    differ = layout_differences(layout, **given)
    if differ:
        raise LayoutMismatch(data_dir, layout, differ)
    ports = [int(a.rpartition(":")[2]) for _, a in layout["nodes"]]
    host = layout["nodes"][0][1].rpartition(":")[0]
    busy = [p for p in ports if not port_free(host, p)]
    if busy:
        raise OSError(f"the ports of the cluster in {data_dir} are in use: {busy}")
    return _RingShape(
        ids=_layout_ids(data_dir, layout), ports=ports, host=host,
        replicas=int(layout["replicas"]), tokens_per_node=int(layout["tokens_per_node"]),
        reducer=str(layout["reducer"]),
        balancer=str(layout.get("balancer", DEFAULT_LAYOUT["balancer"])),
        base_port=layout.get("base_port"),
        node_args=[str(arg) for arg in layout.get("node_args", [])])


def _new_shape(nodes: int | None, replicas: int | None, reducer: str | None,
               tokens_per_node: int | None, balancer: str | None, base_port: int | None,
               host: str, node_args: list[str] | None) -> _RingShape:
    count = DEFAULT_LAYOUT["nodes"] if nodes is None else nodes
    return _RingShape(
        ids=[f"n{i}" for i in range(count)], ports=_free_ports(host, count, base_port),
        host=host, replicas=DEFAULT_LAYOUT["replicas"] if replicas is None else replicas,
        tokens_per_node=(DEFAULT_LAYOUT["tokens_per_node"] if tokens_per_node is None
                         else tokens_per_node),
        reducer=DEFAULT_LAYOUT["reducer"] if reducer is None else reducer,
        balancer=DEFAULT_LAYOUT["balancer"] if balancer is None else balancer,
        base_port=base_port, node_args=list(node_args or []))


def _layout(data_dir: str | Path) -> dict | None:
    path = Path(data_dir) / LAYOUT_FILE
    return json.loads(path.read_text()) if path.exists() else None


def _layout_ids(data_dir: Path, layout: dict) -> list[str]:
    """The node ids of a kept layout, each one checked: an id names a directory, a
    certificate and a log, and must not lead out of the cluster's."""
    try:
        return [check_node_id(n, incarnation=False) for n, _ in layout["nodes"]]
    except ValueError as exc:
        raise ValueError(f"{data_dir / LAYOUT_FILE}: {exc}; nothing started") from None


def _save_layout(data_dir: Path, layout: dict) -> None:
    """Written whole to a temporary file, synced, then renamed over the old one: a
    crash leaves the old layout or the new, never a torn one."""
    private_dir(data_dir)
    tmp = data_dir / (LAYOUT_FILE + ".tmp")
    write_private(tmp, json.dumps(layout, indent=1), sync=True)
    tmp.replace(data_dir / LAYOUT_FILE)


def _node_dirs(data_dir: Path, node_id: str) -> list[Path]:
    """A node's data directory and those set aside as corrupt (`<id>.corrupt-<time>`)."""
    check_node_id(node_id, incarnation=False)
    return [p for p in (data_dir / node_id, *data_dir.glob(f"{node_id}.corrupt-*"))
            if p.is_dir()]


def _delete_node_dir(data_dir: Path, node_id: str) -> None:
    for path in _node_dirs(data_dir, node_id):
        shutil.rmtree(path)


def wipe(data_dir: str | Path) -> list[str]:
    """Delete the cluster kept in `data_dir`: every node's data directory the layout
    names, then the layout (so a crash midway leaves it wipeable again), then
    `data_dir` itself if nothing else is in it. Only what the cluster wrote is
    touched. Returns the node ids deleted; [] if no cluster is kept there. The
    cluster must not be running (`floe down --wipe` stops it first)."""
    data_dir = Path(data_dir).resolve()
    layout = _layout(data_dir)
    if layout is None:
        return []
    listening = [a for _, a in layout["nodes"]
                 if not port_free(a.rpartition(":")[0], int(a.rpartition(":")[2]))]
    if listening:
        raise RuntimeError(f"the cluster kept in {data_dir} may still be running: "
                           f"{', '.join(listening)} in use; stop it first")
    ids = [i for i, _ in layout["nodes"]]
    for node_id in ids:
        _delete_node_dir(data_dir, node_id)
    (data_dir / LAYOUT_FILE).unlink()
    (data_dir / (LAYOUT_FILE + ".tmp")).unlink(missing_ok=True)
    try:
        data_dir.rmdir()
    except OSError:
        pass          # something else lives there: left alone
    return ids


def _free_ports(host: str, count: int, base: int | None) -> list[int]:
    if base is not None:
        given = list(range(base, base + count))
        for port in given:
            if not port_free(host, port):
                raise OSError(f"port {port} on {host} is in use; pick another --base-port")
        return given
    ports: list[int] = []
    socks = []
    try:  # let the kernel pick, holding each until all are chosen
        for _ in range(count):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def _ports_from(host: str, count: int, base: int, taken: set[int]) -> list[int]:
    """The first `count` free ports from `base` on, skipping `taken`."""
    ports = []
    for port in range(base, 65536):
        if port not in taken and port_free(host, port):
            ports.append(port)
            if len(ports) == count:
                return ports
    raise OSError(f"no {count} free ports from {base} on {host}")


def port_free(host: str, port: int) -> bool:
    """Free as a node's server (or its metrics endpoint) binds it: SO_REUSEADDR, so a
    port whose last connections are in TIME_WAIT (a cluster just stopped, a scrape
    just ended) is free, and a listening one is not."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def channel(address: str, tls: TlsFiles | None = None, options=None) -> grpc.Channel:
    """A blocking channel: mutual TLS with `tls`, else in the clear."""
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, tls.channel_credentials(),   # to a node only
                               options=[*(options or []), *server_options()])


def serving(address: str, tls: TlsFiles | None = None) -> bool:
    with channel(address, tls) as health:
        return _says_serving(health_pb2_grpc.HealthStub(health).Check)


def _says_serving(check) -> bool:
    try:
        reply = check(health_pb2.HealthCheckRequest(), timeout=0.5)
    except grpc.RpcError:
        return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _tail(path: str, lines: int = 20) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
