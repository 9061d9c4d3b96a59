"""Three nodes on three "hosts": each node in its own network namespace with its own
address (10.77.0.1-3), joined by veth pairs to a bridge in a namespace of its own, and
a mapper on a fourth (10.77.0.10). Words are counted exactly; then one node is cut off
from every other (its link to the bridge goes down): the others declare it dead and
take its ranges over, it is fenced once it hears so after the link comes back, and the
counts stay exact throughout.

Needs root and `ip` (iproute2); skipped otherwise. Every namespace and link is made
here and removed in teardown, pass or fail; every process is stopped by its own pid."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from chaos.cluster import node_env
from node.transport.tls import generate

SUBNET = "10.77.0"
PORT = 7000
NODES = {f"n{i}": f"{SUBNET}.{i + 1}" for i in range(3)}
MAPPER_IP = f"{SUBNET}.10"
VOCAB = [f"w{i}" for i in range(300)]

# Runs in the mapper's namespace: `feed SEEDS FILE` sends the file's words and flushes
# (every one is on r+1 nodes when it returns); `scan SEEDS` prints the counts and the
# ring's members with their addresses as JSON.
CLIENT = """
import json, sys
from mapper import RingClient
from node.transport.tls import TlsFiles
command, seeds, tls_dir = sys.argv[1:4]
tls = TlsFiles.in_dir(tls_dir, "client")
with RingClient(seeds, tls=tls, timeout=90) as client:
    if command == "feed":
        client.emit_many(open(sys.argv[4]).read().split())
        client.flush()
        print("fed")
    else:
        ring = client.ring
        print(json.dumps({"counts": dict(client.scan()),
                          "members": {n: ring.address(n) for n in ring.nodes}}))
"""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check,
                          timeout=30)


class Hosts:
    """The namespaces and links of one test, named after its pid so two runs never meet."""

    def __init__(self) -> None:
        tag = f"fl{os.getpid() % 100000}"
        self.bridge_ns = f"{tag}-br"
        self.ns = {n: f"{tag}-{n}" for n in [*NODES, "m"]}
        self.link = {n: f"{tag}{n}" for n in self.ns}      # host side; bridge side + "b"
        self.made: list[str] = []

    def up(self) -> None:
        self._netns(self.bridge_ns)
        ip("-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
        ip("-n", self.bridge_ns, "link", "set", "br0", "up")
        addresses = {**NODES, "m": MAPPER_IP}
        for name, ns in self.ns.items():
            self._netns(ns)
            ip("-n", ns, "link", "set", "lo", "up")
            link, port = self.link[name], self.link[name] + "b"
            ip("link", "add", link, "netns", ns, "type", "veth",
               "peer", "name", port, "netns", self.bridge_ns)
            ip("-n", self.bridge_ns, "link", "set", port, "master", "br0")
            ip("-n", self.bridge_ns, "link", "set", port, "up")
            ip("-n", ns, "addr", "add", f"{addresses[name]}/24", "dev", link)
            ip("-n", ns, "link", "set", link, "up")

    def _netns(self, name: str) -> None:
        ip("netns", "add", name)
        self.made.append(name)

    def cut(self, name: str, up: bool = False) -> None:
        """Take `name`'s link to the bridge down (or up again): nothing reaches it."""
        ip("-n", self.bridge_ns, "link", "set", self.link[name] + "b",
           "up" if up else "down")

    def remove(self) -> None:
        # Deleting a namespace deletes the veth ends in it, and so their peers.
        for name in reversed(self.made):
            ip("netns", "del", name, check=False)
        self.made.clear()


@pytest.fixture
def hosts():
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if shutil.which("ip") is None:
        pytest.skip("the ip command (iproute2) is not installed")
    made = Hosts()
    try:
        made.up()
    except subprocess.CalledProcessError as exc:
        made.remove()
        pytest.skip(f"cannot make network namespaces here: {exc.stderr.strip()[:200]}")
    yield made
    made.remove()


def address(node: str) -> str:
    return f"{NODES[node]}:{PORT}"


def stop(processes: dict) -> None:
    for process in processes.values():
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
    for process in processes.values():
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()


def ready(log: Path) -> bool:
    return log.exists() and "READY " in log.read_text()


def client(hosts: Hosts, tmp_path: Path, *args: str) -> str:
    done = subprocess.run(["ip", "netns", "exec", hosts.ns["m"], sys.executable,
                           str(tmp_path / "client.py"), args[0], args[1],
                           str(tmp_path / "tls"), *args[2:]],
                          capture_output=True, text=True, env=node_env(), timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def scan(hosts: Hosts, tmp_path: Path, seeds: list[str]) -> dict:
    return json.loads(client(hosts, tmp_path, "scan", ",".join(seeds)))


def feed(hosts: Hosts, tmp_path: Path, seeds: list[str], words: list[str], name: str):
    path = tmp_path / f"{name}.words"
    path.write_text(" ".join(words))
    return subprocess.Popen(["ip", "netns", "exec", hosts.ns["m"], sys.executable,
                             str(tmp_path / "client.py"), "feed", ",".join(seeds),
                             str(tmp_path / "tls"), str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=node_env())


def fed(process: subprocess.Popen) -> None:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0 and out.strip() == "fed", err[-3000:]


def events(tmp_path: Path, node: str) -> list[dict]:
    path = tmp_path / f"{node}.events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for(what, timeout: float, explain) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, explain()
        time.sleep(0.25)


class Ring3:
    """Three nodes started on the hosts, the words fed so far, and what they count."""

    def __init__(self, hosts: Hosts, tmp_path: Path) -> None:
        self.hosts, self.tmp_path = hosts, tmp_path
        self.processes: dict[str, subprocess.Popen] = {}
        self.rng = random.Random(7)
        self.expected: Counter = Counter()
        self.seeds = [address(n) for n in NODES]
        self.survivors = self.seeds[1:]

    def start(self) -> None:
        generate(self.tmp_path / "tls", list(NODES), hosts=list(NODES.values()))
        (self.tmp_path / "client.py").write_text(CLIENT)
        peers = ",".join(f"{n}={address(n)}" for n in NODES)
        for node in NODES:
            with open(self.tmp_path / f"{node}.log", "w") as out:
                self.processes[node] = subprocess.Popen(
                    ["ip", "netns", "exec", self.hosts.ns[node], sys.executable, "-m", "node",
                     "--node-id", node, "--listen", address(node), "--peers", peers,
                     "--replication", "1", "--tls-dir", str(self.tmp_path / "tls"),
                     "--events-file", str(self.tmp_path / f"{node}.events.jsonl")],
                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env=node_env(), start_new_session=True)
        for node in NODES:                      # a node prints READY once it serves
            log = self.log(node)
            wait_for(lambda: ready(log) or self.processes[node].poll() is not None, 60,
                     lambda: log.read_text()[-3000:])
            assert ready(log), log.read_text()[-3000:]

    def log(self, node: str) -> Path:
        return self.tmp_path / f"{node}.log"

    def words(self):
        words = self.rng.choices(VOCAB, k=5000)
        self.expected.update(words)
        return words

    def feed(self, seeds: list[str], name: str) -> subprocess.Popen:
        return feed(self.hosts, self.tmp_path, seeds, self.words(), name)

    def scan(self, seeds: list[str]) -> dict:
        return scan(self.hosts, self.tmp_path, seeds)

    def partition(self) -> None:
        """Counted, then n0 (primary of some ranges, replica of others) cut off from
        every other host while words go on: the others declare it dead and count on."""
        fed(self.feed(self.seeds, "before"))
        view = self.scan(self.seeds)
        assert view["counts"] == self.expected
        assert view["members"] == {n: address(n) for n in NODES}
        self.hosts.cut("n0")
        during = self.feed(self.survivors, "during")
        wait_for(lambda: "n0" not in self.scan(self.survivors)["members"], 30,
                 lambda: self.log("n1").read_text()[-3000:])
        fed(during)
        view = self.scan(self.survivors)
        assert view["counts"] == self.expected
        assert set(view["members"]) == {"n1", "n2"}
        kinds = {e["kind"] for e in events(self.tmp_path, "n1") + events(self.tmp_path, "n2")}
        assert {"detected", "taken_over"} <= kinds
        for node, process in self.processes.items():
            assert process.poll() is None, self.log(node).read_text()[-3000:]


@pytest.fixture
def ring3(hosts, tmp_path):
    ring = Ring3(hosts, tmp_path)
    try:
        yield ring
    finally:
        stop(ring.processes)


@pytest.mark.multiprocess
def test_three_hosts_count_exactly_while_one_is_cut_off(ring3):
    ring3.start()
    ring3.partition()
    fed(ring3.feed(ring3.survivors, "after"))        # and on, without it
    assert ring3.scan(ring3.survivors)["counts"] == ring3.expected


@pytest.mark.multiprocess
def test_a_healed_partition_fences_the_cut_off_node_and_loses_nothing(ring3):
    ring3.start()
    ring3.partition()
    # n0 alone has meanwhile suspected its peers, long enough to have declared them
    # had it not known that it reached no third node either
    time.sleep(3)
    assert not any(e["kind"] == "detected" for e in events(ring3.tmp_path, "n0"))
    ring3.hosts.cut("n0", up=True)
    wait_for(lambda: any(e["kind"] == "fenced" for e in events(ring3.tmp_path, "n0")), 30,
             lambda: ring3.log("n0").read_text()[-3000:])

    def rejoined() -> bool:
        members = ring3.scan(ring3.survivors)["members"]
        return any(n.startswith("n0#") and a == address("n0") for n, a in members.items())
    wait_for(rejoined, 30, lambda: ring3.log("n0").read_text()[-3000:])
    fed(ring3.feed(ring3.seeds, "healed"))
    for seed in ring3.seeds:                          # every host answers the same, exactly
        view = ring3.scan([seed])
        assert view["counts"] == ring3.expected, seed
        assert {n for n in view["members"] if not n.startswith("n0")} == {"n1", "n2"}
