"""Hosts of their own on one machine: every node and mapper in its own network
namespace with its own address, joined by veth pairs to a bridge (the "switch") in a
namespace of its own, and network faults made at that switch.

    hosts = Hosts(["n0", "n1", "n2", "m0"])      # n0.. get .1, .2, ...; m0.. get .100, ...
    hosts.up()                                   # needs root and iproute2
    hosts.partition(["n0"], ["n1", "n2"])        # m0 (in no group) still reaches everyone
    hosts.heal()
    hosts.lossy("n1", 0.10)                      # 10% of n1's frames lost, both directions
    hosts.cut("n0"); hosts.cut("n0", up=True)     # n0's cable out, and back
    hosts.remove()                               # every namespace and link made here

Faults are made at the switch only, so a host never notices them locally: a
partition or a lost frame is silence, as on a real network (no refused connection,
no ICMP error). Each bridge port gets a `clsact` qdisc and a classic BPF program in
direct-action mode (`tc filter ... bpf da bytecode`): frames toward a host whose
source is on the other side of a partition are dropped, and a lossy port drops a
random share of the IPv4 frames crossing it either way (the kernel's random number,
SKF_AD_RANDOM). That needs only `tc` and cls_bpf, which kernels without netem
(`CONFIG_NET_SCH_NETEM`) or the gact action module still have; ARP is never dropped.

The harness itself (the process that starts the nodes, samples their stats and reads
the ring back) sits on the switch too, as an `observer` host whose end of the veth
lives in the caller's own namespace (`fl<pid>o`, address .254): it reaches every host
whatever the partition, as an operator's machine on a management network would. It
only reads (clients fetch rings, they never hand one to a node), so it never carries
a view across a partition.

Names carry the creating process's pid (`fl<pid>-n0`), so two runs never meet, and
`up()` first removes the namespaces of runs whose process is gone.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

PORT = 7000
OBSERVER = "obs"
ETH_P_IP = 0x0800
TC_ACT_OK, TC_ACT_SHOT = 0, 2
SKF_AD_RANDOM = 0xFFFFF000 + 56        # classic BPF: load a random 32-bit number


class Unavailable(Exception):
    """This machine cannot make the hosts (not root, no iproute2, no namespaces)."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check,
                          timeout=30)


def _tc_batch(ns: str, lines: list[str]) -> None:
    """Several tc commands in one process (`tc -batch`), so a partition of many hosts
    is in place within a few milliseconds rather than one spawn per port."""
    if not lines:
        return
    done = subprocess.run(["ip", "netns", "exec", ns, "tc", "-batch", "-"],
                          input="\n".join(lines) + "\n", capture_output=True, text=True,
                          timeout=30)
    if done.returncode:
        raise subprocess.CalledProcessError(done.returncode, "tc -batch", done.stdout,
                                            done.stderr)


def skip_reason() -> str | None:
    """Why network namespaces cannot be used here, or None. (Whether the kernel lets
    us make them is only known by trying: `Hosts.up` raises `Unavailable`.)"""
    if os.geteuid() != 0:
        return f"network namespaces need root (running as uid {os.geteuid()})"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the {tool} command (iproute2) is not installed"
    return None


def bpf_program(blocked: list[str], loss: float) -> str:
    """A classic BPF program for cls_bpf in direct-action mode, as `tc ... bytecode`
    takes it: drop an IPv4 frame whose source is in `blocked`, then a random `loss`
    share of the IPv4 frames left; let everything else (ARP) through."""
    # (opcode, jump-if-true, jump-if-false, k); jumps name a label, resolved below
    code: list[tuple] = [(0x28, 0, 0, 12),                      # ldh [12]: ethertype
                         (0x15, 0, "pass", ETH_P_IP)]           # not IPv4: pass
    if blocked:
        code.append((0x20, 0, 0, 26))                           # ld [26]: source address
        code += [(0x15, "drop", 0, int(ipaddress.IPv4Address(a))) for a in blocked]
    if loss > 0:
        code.append((0x20, 0, 0, SKF_AD_RANDOM))                # ld rand
        code.append((0x25, "pass", "drop", min(0xFFFFFFFF, int(loss * 2 ** 32))))
    else:
        code.append((0x05, 0, 0, "pass"))                       # ja pass
    labels = {"drop": len(code), "pass": len(code) + 1}
    code += [(0x06, 0, 0, TC_ACT_SHOT), (0x06, 0, 0, TC_ACT_OK)]

    def resolve(at: int, target) -> int:
        return target if isinstance(target, int) else labels[target] - at - 1
    ops = [(c, resolve(i, jt), resolve(i, jf), resolve(i, k) if c == 0x05 else k)
           for i, (c, jt, jf, k) in enumerate(code)]
    return ",".join([str(len(ops))] + [" ".join(map(str, op)) for op in ops])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> list[str]:
    """Delete the namespaces of earlier runs whose process is gone (killed before
    its cleanup ran). Returns their names."""
    listed = ip("netns", "list", check=False).stdout
    gone = []
    for line in listed.splitlines():
        name = line.split()[0] if line.split() else ""
        found = re.fullmatch(r"fl(\d+)-\w+", name)
        if found and not _alive(int(found.group(1))):
            ip("netns", "del", name, check=False)
            gone.append(name)
    for pid in {int(n[2:].split("-")[0]) for n in gone}:
        ip("link", "del", f"fl{pid}o", check=False)
    return gone


def leftovers(pid: int | None = None) -> list[str]:
    """The namespaces and observer link that runs of process `pid` (this one by
    default) made and did not remove."""
    tag = f"fl{os.getpid() if pid is None else pid}"
    names = [line.split()[0] for line in ip("netns", "list", check=False).stdout.splitlines()
             if line.split()]
    left = [n for n in names if n.startswith(tag + "-")]
    if ip("link", "show", f"{tag}o", check=False).returncode == 0:
        left.append(f"{tag}o")
    return left


def _free_subnet(pid: int) -> str:
    """10.77.X: one no interface or route of ours uses yet (the observer's end
    lives here, so two concurrent runs must not share a subnet)."""
    used = ip("-4", "route", "show", check=False).stdout + \
        ip("-4", "addr", "show", check=False).stdout
    for step in range(250):
        x = (pid + step) % 250 + 1
        if f"10.77.{x}." not in used:
            return f"10.77.{x}"
    raise Unavailable("no free 10.77.X.0/24 subnet")


class Hosts:
    """The namespaces and links of one run. `names`: the hosts, nodes first
    (n0, n1, ...: addresses .1, .2, ...), then anything else (mappers m0, m1, ...:
    .100, .101, ...). The observer (the caller's own namespace) is .254."""

    def __init__(self, names: list[str], *, observer: bool = True) -> None:
        self.pid = os.getpid()
        self.tag = f"fl{self.pid}"
        self.names = list(names)
        self.subnet = _free_subnet(self.pid) if observer else "10.77.0"
        self.observer = observer
        nodes = [n for n in self.names if not n.startswith("m")]
        others = [n for n in self.names if n.startswith("m")]
        self.addresses = {n: f"{self.subnet}.{i + 1}" for i, n in enumerate(nodes)}
        self.addresses.update({n: f"{self.subnet}.{100 + i}" for i, n in enumerate(others)})
        if observer:
            self.addresses[OBSERVER] = f"{self.subnet}.254"
        self.bridge_ns = f"{self.tag}-br"
        self.ns = {n: f"{self.tag}-{n}" for n in self.names}
        self.made: list[str] = []
        self.blocked: dict[str, set[str]] = {n: set() for n in self.names}
        self.loss: dict[str, float] = {n: 0.0 for n in self.names}
        self._clsact: set[str] = set()                 # ports with a clsact qdisc
        self._filters: set[tuple[str, str]] = set()     # (port, hook) with a filter

    # ------------------------------------------------------------ make, remove

    def up(self) -> "Hosts":
        reason = skip_reason()
        if reason:
            raise Unavailable(reason)
        remove_stale()
        try:
            self._netns(self.bridge_ns)
            ip("-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
            ip("-n", self.bridge_ns, "link", "set", "br0", "up")
            for name in self.names:
                ns = self._netns(self.ns[name])
                ip("-n", ns, "link", "set", "lo", "up")
                link = self.link(name)
                ip("link", "add", link, "netns", ns, "type", "veth",
                   "peer", "name", self.port(name), "netns", self.bridge_ns)
                self._attach(name)
                ip("-n", ns, "addr", "add", f"{self.addresses[name]}/24", "dev", link)
                ip("-n", ns, "link", "set", link, "up")
            if self.observer:
                link = f"{self.tag}o"
                ip("link", "add", link, "type", "veth", "peer", "name", self.port(OBSERVER),
                   "netns", self.bridge_ns)
                self._attach(OBSERVER)
                ip("addr", "add", f"{self.addresses[OBSERVER]}/24", "dev", link)
                ip("link", "set", link, "up")
        except subprocess.CalledProcessError as exc:
            self.remove()
            raise Unavailable(f"cannot make network namespaces here: "
                              f"{(exc.stderr or '').strip()[:200]}") from None
        return self

    def _netns(self, name: str) -> str:
        ip("netns", "add", name)
        self.made.append(name)
        return name

    def _attach(self, name: str) -> None:
        ip("-n", self.bridge_ns, "link", "set", self.port(name), "master", "br0")
        ip("-n", self.bridge_ns, "link", "set", self.port(name), "up")

    def remove(self) -> None:
        """Delete every namespace made here; that deletes the veth ends in them, and
        so their peers (the observer's end included)."""
        for name in reversed(self.made):
            ip("netns", "del", name, check=False)
        self.made.clear()
        if self.observer:
            ip("link", "del", f"{self.tag}o", check=False)

    def __enter__(self) -> "Hosts":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.remove()

    def leftovers(self) -> list[str]:
        """Namespaces and the observer link of this run still present (none after
        `remove`)."""
        return leftovers(self.pid)

    # ------------------------------------------------------------------ names

    def link(self, name: str) -> str:
        """The host's end of its veth (in its namespace)."""
        return f"{self.tag}{name}"

    def port(self, name: str) -> str:
        """The bridge's end of the host's veth (in the bridge namespace)."""
        return f"{self.tag}{name}b"

    def address(self, name: str, port: int = PORT) -> str:
        return f"{self.addresses[name]}:{port}"

    def exec_prefix(self, name: str) -> list[str]:
        """Prefix a command with this to run it on host `name` (`ip netns exec`
        execs the command: its pid is the command's)."""
        return ["ip", "netns", "exec", self.ns[name]]

    # ------------------------------------------------------------------ faults

    def cut(self, name: str, up: bool = False) -> None:
        """Take `name`'s cable out of the switch (its port down), or put it back."""
        ip("-n", self.bridge_ns, "link", "set", self.port(name), "up" if up else "down")

    def partition(self, *groups) -> None:
        """Hosts in different groups cannot reach each other (frames dropped at the
        switch, both ways); hosts in no group (the observer, a mapper left out)
        still reach everyone. Replaces any earlier partition."""
        sides = [set(g) for g in groups]
        for g in sides:
            unknown = g - set(self.names)
            if unknown:
                raise ValueError(f"unknown hosts {sorted(unknown)}")
        changed = {n for n, b in self.blocked.items() if b}
        for name in self.names:
            mine = [g for g in sides if name in g]
            others = set().union(*(g for g in sides if not (mine and g is mine[0])))
            self.blocked[name] = {self.addresses[o] for o in others} if mine else set()
            if self.blocked[name]:
                changed.add(name)
        self._apply(sorted(changed))

    def heal(self) -> None:
        """Every partition gone (loss stays)."""
        self.partition()

    def lossy(self, name: str, loss: float) -> None:
        """Drop a random `loss` share (0..1) of the IPv4 frames on `name`'s link, in
        each direction; 0 makes it clean again."""
        if not 0 <= loss < 1:
            raise ValueError("loss is a share of frames, 0 <= loss < 1")
        self.loss[name] = loss
        self._apply([name])

    def _apply(self, names: list[str]) -> None:
        """Install the filters of `names`' ports as their state now says, all in one
        tc batch: toward the host, the partition and the loss; from it, the loss."""
        lines = []
        for name in names:
            port = self.port(name)
            blocked, loss = sorted(self.blocked[name]), self.loss[name]
            for hook, program in (("egress", bpf_program(blocked, loss)
                                   if blocked or loss else None),
                                  ("ingress", bpf_program([], loss) if loss else None)):
                if (port, hook) in self._filters:
                    lines.append(f"filter del dev {port} {hook}")
                    self._filters.discard((port, hook))
                if program is None:
                    continue
                if port not in self._clsact:
                    lines.append(f"qdisc add dev {port} clsact")
                    self._clsact.add(port)
                lines.append(f'filter add dev {port} {hook} pref 1 bpf da bytecode "{program}"')
                self._filters.add((port, hook))
        _tc_batch(self.bridge_ns, lines)


# ------------------------------------------------------------------ a ring on the hosts

def start_nodes(hosts: Hosts, node_ids: list[str], replicas: int, workdir: str | Path, *,
                reducer: str = "count", tokens_per_node: int = 8,
                extra_args: list[str] | None = None, tls: bool = True,
                ready_timeout: float = 60.0):
    """A LocalCluster whose nodes each run on their own host (`ip netns exec`), on
    port 7000 of the host's address, mutual TLS on every call (certificates naming
    every host's address). The harness's process reaches them through the observer;
    `LocalCluster.down()` stops them by pid as usual."""
    from floering.floe.cluster import DEFAULT_STATE_FILE, LocalCluster, spawn_node
    from floering.node.transport.tls import generate as generate_tls
    workdir = Path(workdir).resolve()
    log_dir = workdir / "floe-cluster" / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    peers = ",".join(f"{n}={hosts.address(n)}" for n in node_ids)
    extra = ["--balancer", "none", *(extra_args or [])]
    if tls:
        tls_dir = generate_tls(workdir / "floe-cluster" / "tls", node_ids,
                               sorted(set(hosts.addresses.values())))
        extra += ["--tls-dir", str(tls_dir)]
    procs = []
    for node_id in node_ids:
        log_path = log_dir / f"{node_id}.log"
        cmd = [*hosts.exec_prefix(node_id), sys.executable, "-m", "floering.node",
               "--node-id", node_id, "--listen", hosts.address(node_id), "--peers", peers,
               "--replication", str(replicas), "--tokens-per-node", str(tokens_per_node),
               "--reducer", reducer,
               "--events-file", str(log_path.with_suffix(".events.jsonl")), *extra]
        procs.append(spawn_node(node_id, hosts.address(node_id), cmd, log_path))
    cluster = LocalCluster(procs, replicas, str(workdir / DEFAULT_STATE_FILE), reducer, extra)
    return cluster.saved_and_ready(ready_timeout)


# ------------------------------------------------------------ faults of a chaos round

def partition_fault(hosts: Hosts, planned, nodes: list[str], mappers: list[str]):
    """Cut the planned minority (the victims) off from the other nodes; the mappers'
    hosts go with the side the plan says (`both`: in no group, they reach everyone).
    Returns the `Injected` fault (chaos.timeline) with its sides."""
    from floering.chaos.timeline import Injected
    minority = set(planned.victims)
    majority = set(planned.apart or set(nodes) - minority)
    if planned.mappers_with == "majority":
        majority |= set(mappers)
    elif planned.mappers_with == "minority":
        minority |= set(mappers)
    at = time.time()
    hosts.partition(minority, majority)
    in_place = time.time() - at
    return Injected("partition", tuple(planned.victims), at, tokens=dict(planned.ranges),
                    detail={"mappers_with": planned.mappers_with, "hold": planned.hold,
                            "in_place_ms": round(in_place * 1e3, 1),
                            "bystanders": sorted(set(nodes) - minority - majority),
                            "minority": sorted(minority), "majority": sorted(majority)})


def lossy_fault(hosts: Hosts, planned):
    from floering.chaos.timeline import Injected
    (victim,) = planned.victims
    at = time.time()
    hosts.lossy(victim, planned.loss)
    return Injected("lossy-link", (victim,), at,
                    detail={"loss": planned.loss, "hold": planned.hold})


def heal_fault(hosts: Hosts, injected):
    """The partition healed, or the link clean again; `resumed` is when."""
    from dataclasses import replace
    if injected.kind == "partition":
        hosts.heal()
    else:
        for victim in injected.victims:
            hosts.lossy(victim, 0.0)
    return replace(injected, resumed=time.time())


def chunk_latencies(journal: str) -> list[tuple[float, float]]:
    """(emitted, acknowledged) wall-clock times of every acknowledged chunk of a
    mapper's journal (chaos.mapper_proc)."""
    emitted: dict[str, float] = {}
    out: list[tuple[float, float]] = []
    try:
        text = Path(journal).read_text()
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split(" ")
        if len(parts) >= 3 and parts[0] in ("E", "A"):
            if parts[0] == "E":
                emitted[parts[1]] = float(parts[2])
            elif parts[1] in emitted:
                out.append((emitted[parts[1]], float(parts[2])))
    return out


def judge(injected, events: list[dict], members: dict[str, dict], journals: list[str],
          errors: list[str], samples: Sequence[dict] = ()):
    """What a network fault must leave, read from every node's structured events
    (dicts, with `_node`: the node as started), the last stats of every member and
    the mappers' journals (and the harness's stats samples, for what a declared node
    applied while it did not know it: batches never acknowledged by all r+1 nodes,
    dropped when it is fenced). Returns the fault with its measurements; appends to
    `errors` what went wrong:

    - partition: every node the majority declared dead was fenced once the network
      healed and rejoined as a new, empty member (`n0#1`, no range), and no node of
      the minority declared anyone; a node not declared is still a member as itself;
      every member ends on the same ring version (the views converged);
    - lossy-link: how often the lossy node was suspected and declared, and how long
      chunks waited for their acknowledgements while the link lost frames. A lossy
      node declared dead must have been fenced and rejoined like a cut-off one."""
    from dataclasses import replace
    d = dict(injected.detail)
    healed = injected.resumed
    victims = set(injected.victims)
    declared: dict = {}
    for e in events:
        if e.get("kind") == "detected" and e["t"] >= injected.at - 0.001:
            for about in e.get("about", []):
                declared.setdefault(about, []).append((e["t"], e["_node"]))
    d["declared"] = {v: [{"ms": round((t - injected.at) * 1e3, 1), "by": by}
                         for t, by in sorted(declared.get(v, []))] for v in sorted(victims)}
    fenced = {e["_node"]: e for e in events if e.get("kind") == "fenced"
              and e["t"] >= injected.at - 0.001}
    suspected = [e for e in events if e.get("kind") == "suspected"
                 and e["t"] >= injected.at - 0.001 and set(e.get("about", [])) & victims
                 and (healed is None or e["t"] <= healed + 1.0)]
    d["suspicions"] = len(suspected)
    if healed is not None:
        d["healed_s"] = round(healed - injected.at, 3)
    for victim in sorted(victims):
        if victim in declared:
            since = min(t for t, _ in declared[victim])
            seen = [x["nodes"][victim]["applied"] for x in samples
                    if x["t"] >= since and victim in x["nodes"]]
            if seen:
                d.setdefault("applied_after_declared", {})[victim] = max(seen) - seen[0]
            f = fenced.get(victim)
            if f is None:
                errors.append(f"{injected.kind}: {victim} was declared dead but never "
                              f"fenced")
                continue
            d.setdefault("fenced_after_heal_ms", {})[victim] = \
                None if healed is None else round((f["t"] - healed) * 1e3, 1)
            rejoined = f.get("rejoins_as")
            if healed is not None and f["t"] < healed - 0.001 and \
                    injected.kind == "partition" and d.get("mappers_with") != "minority":
                errors.append(f"partition: {victim} was fenced before the partition healed, "
                              f"though nothing of the majority reached it")
            if rejoined not in members:
                # (it rejoins empty; an owner may refill it by a handoff afterwards)
                errors.append(f"{injected.kind}: {victim} was fenced but {rejoined} is not "
                              f"a member at the end (members: {sorted(members)})")
            if victim in members:
                errors.append(f"{injected.kind}: {victim} was declared dead but is still "
                              f"a member")
        elif victim not in members:
            errors.append(f"{injected.kind}: {victim} was never declared dead, yet is no "
                          f"member at the end")
    if injected.kind == "partition":
        minority = set(d["minority"])
        for about, who in declared.items():
            for t, by in who:
                if by in minority and about not in minority:
                    errors.append(f"partition: {by}, cut off with the minority, declared "
                                  f"{about} dead at {t - injected.at:+.3f}s")
    versions = {m: row.get("ring_version") for m, row in members.items()}
    if len(set(versions.values())) > 1:
        errors.append(f"the members did not converge on one ring: versions {versions}")
    d["final_ring_versions"] = sorted(set(versions.values()))
    # How long chunks waited for acknowledgement, emitted while the fault held
    until = healed if healed is not None else float("inf")
    waits = sorted(a - e for j in journals for e, a in chunk_latencies(j)
                   if injected.at <= e <= until)
    before = sorted(a - e for j in journals for e, a in chunk_latencies(j)
                    if e < injected.at)
    # a chunk emitted just before the fault was in place may have its last
    # acknowledgements in flight: only chunks emitted once it was in place count
    in_place = injected.at + d.get("in_place_ms", 0.0) / 1e3
    after = [a for j in journals for e, a in chunk_latencies(j) if e >= in_place]
    d["chunks_during"] = len(waits)
    d["chunk_wait_ms"] = _spread(waits)
    d["chunk_wait_before_ms"] = _spread(before)
    # the first acknowledgement of a chunk emitted once the fault was in place
    d["first_ack_after_fault_ms"] = round((min(after) - injected.at) * 1e3, 1) if after \
        else None
    # chunks emitted once the fault was in place and acknowledged before it healed
    d["acked_during"] = sum(1 for j in journals for e, a in chunk_latencies(j)
                            if in_place <= e and a <= until)
    acks = sorted(a for j in journals for e, a in chunk_latencies(j)
                  if injected.at <= a <= until)
    d["longest_ack_gap_ms"] = _longest_gap(acks, injected.at, until)
    return replace(injected, detail=d)


def _spread(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    values = sorted(values)
    return {"n": len(values), "p50": round(values[len(values) // 2] * 1e3, 1),
            "p99": round(values[min(len(values) - 1, int(len(values) * 0.99))] * 1e3, 1),
            "max": round(values[-1] * 1e3, 1)}


def _longest_gap(times: list[float], start: float, end: float) -> float | None:
    if end == float("inf"):
        return None
    marks = [start, *times, end]
    return round(max(b - a for a, b in zip(marks, marks[1:])) * 1e3, 1)
