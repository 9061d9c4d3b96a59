"""Servers are authenticated like clients: only the node the ring places at an address
may answer there; its port is its own; private keys are private from birth; a durable
cluster keeps its CA."""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import socket
import ssl
import stat
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import grpc
import pytest
from cryptography import x509

from floering.floe.cluster import LocalCluster
from floering.mapper import RingClient
from floering.wire.ring import Ring
from floering.node.transport import tls as tls_module
from floering.wire.channels import ServerNames, server_options
from floering.wire.tls import TlsFiles, server_name
from floering.node.transport.tls import CA_KEY, generate, issue, node_files, reissue, rotate_ca
from floering.v1 import floe_pb2, floe_pb2_grpc
from tests.helpers import floe, wait_for

ROOT = Path(__file__).resolve().parent.parent
WORDS = [f"w{i % 61}" for i in range(4000)]


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# ------------------------------------------------------------------ key files

def test_every_private_key_is_0600_from_its_creation_whatever_the_umask(tmp_path, monkeypatch):
    created: list[tuple[str, int]] = []
    real_open = os.open

    def spying_open(path, flags, mode_=0o777, *args, **kwargs):
        fd = real_open(path, flags, mode_, *args, **kwargs)
        if flags & os.O_CREAT:   # what another user could see the moment it exists
            created.append((str(path), stat.S_IMODE(os.fstat(fd).st_mode)))
        return fd
    monkeypatch.setattr(tls_module.os, "open", spying_open)
    old_umask = os.umask(0)          # nothing masks a mode the code forgot to set
    try:
        d = tmp_path / "tls"
        generate(d, ["n0", "n1"])
        issue(d, "n2", "node", ("127.0.0.1",))
        reissue(d)
        rotate_ca(d, lambda step: None)
        generate(d, ["n0", "n1", "n3"], keep_ca=True)
    finally:
        os.umask(old_umask)
    keys = [(p, m) for p, m in created if p.endswith(".key.tmp")]
    # every key written: 2 nodes + client + operator + CA, n2, 5 re-issued, the next CA,
    # 5 re-issued by the rotation, n3
    assert len(keys) == 5 + 1 + 5 + 1 + 5 + 1
    assert all(m == 0o600 for _, m in keys), keys
    assert all(m == 0o644 for p, m in created if p.endswith(".pem.tmp"))
    assert mode(d) == 0o700
    for key in d.glob("*.key"):
        assert mode(key) == 0o600, key
    assert not list(d.glob(".*.tmp"))


def test_a_write_cut_short_leaves_no_readable_key_and_the_next_one_replaces_it(tmp_path):
    d = generate(tmp_path / "tls", ["n0"])
    stale = d / ".n0.key.tmp"
    stale.write_bytes(b"half a key")
    stale.chmod(0o644)
    reissue(d, ["n0"])
    assert not stale.exists() and mode(d / "n0.key") == 0o600
    node_files(d, "n0")


# ------------------------------------------------------------------ names

def test_a_node_certificate_names_its_node_and_the_role_and_nothing_else_serves():
    assert server_name("n2") == server_name("n2#3") == "n2.node.floe-ring"
    assert server_name("N2") != server_name("n2") and server_name("N2").startswith("h--")
    assert server_name("a--b").startswith("h--")    # a plain label never holds --


def test_server_names_follow_the_ring_and_remember_a_member_that_left():
    ring = Ring.initial({"n0": "h:1", "n1": "h:2"}, 1, 2)
    current = [None]
    names = ServerNames(lambda: current[0])
    assert names("h:1") == "node.floe-ring"                 # a seed: any node
    current[0] = ring
    assert names("h:1") == "n0.node.floe-ring" and names("h:2") == "n1.node.floe-ring"
    current[0] = Ring.initial({"n1": "h:2"}, 1, 2)          # n0 left the ring
    assert names("h:1") == "n0.node.floe-ring"              # nobody else answers there
    assert names("h:9") == "node.floe-ring"


def test_a_second_member_at_a_known_address_does_not_rename_it():
    class View:                 # what no ring holds (its invariants refuse it)
        addresses = (("n1", "h:2"), ("n3#7", "h:2"))
    current = [Ring.initial({"n0": "h:1", "n1": "h:2"}, 1, 2)]
    names = ServerNames(lambda: current[0])
    assert names("h:2") == "n1.node.floe-ring"
    current[0] = View()
    assert names("h:2") == "n1.node.floe-ring"


def test_a_durable_directory_keeps_its_ca_and_reissues_only_what_it_must(tmp_path):
    d = generate(tmp_path / "tls", ["n0", "n1"])
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    # a node certificate from before servers were checked: no server name
    ca = tls_module._issuer(d)
    key = tls_module.ec.generate_private_key(tls_module.ec.SECP256R1())
    old = tls_module._certificate(tls_module._name("n1", "node"), ca[0].subject,
                                  key.public_key(), ca[1], ca=False,
                                  hosts=("127.0.0.1", "localhost"))
    (d / "n1.pem").write_bytes(tls_module._pem(old))
    (d / "n1.key").write_bytes(tls_module._key_bytes(key))
    with pytest.raises(ValueError, match="n1.pem is not a server certificate of node 'n1'"):
        node_files(d, "n1")
    generate(d, ["n0", "n1", "n2"], keep_ca=True)
    after = {p.name: p.read_bytes() for p in d.iterdir()}
    changed = sorted(n for n in after if before.get(n) != after[n])
    assert changed == ["n1.key", "n1.pem", "n2.key", "n2.pem"]
    node_files(d, "n1")
    generate(d, ["n0"])                                     # without keep_ca: a new CA
    assert (d / "ca.pem").read_bytes() != before["ca.pem"]


def test_a_node_with_a_certificate_from_before_servers_were_checked_says_so(tmp_path):
    d = generate(tmp_path / "tls", ["n0"])
    shutil.copy(d / "client.pem", d / "n0.pem")         # not a server's certificate
    shutil.copy(d / "client.key", d / "n0.key")
    result = subprocess.run(
        [sys.executable, "-m", "floering.node", "--node-id", "n0", "--listen",
         "127.0.0.1:0", "--peers", "n0=127.0.0.1:0", "--tls-dir", str(d)],
        capture_output=True, text=True, timeout=60, cwd=ROOT)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "n0.pem is not a server certificate of node 'n0'" in lines[0]


# ------------------------------------------------------------ real processes

@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster.up(3, 1, workdir=tmp_path_factory.mktemp("servers")) as cluster:
        yield cluster


def feed(cluster, sent: Counter, words, seeds=None) -> None:
    with RingClient(seeds or cluster.seeds, tls=cluster.tls("client"), timeout=30.0) as client:
        client.emit_many(words)
        client.flush()
        sent.update(words)


def counts(cluster, seeds=None) -> Counter:
    with RingClient(seeds or cluster.seeds, tls=cluster.tls("client"), timeout=30.0) as client:
        return Counter(dict(client.scan()))


@pytest.mark.multiprocess
def test_a_second_node_on_a_bound_port_exits_naming_it_and_the_first_serves_on(
        cluster, tmp_path):
    sent: Counter = Counter()
    feed(cluster, sent, WORDS)
    node = cluster.node("n2")
    port = node.address.rpartition(":")[2]
    cmd = list(node.cmd)
    cmd[cmd.index("--events-file") + 1] = str(tmp_path / "duplicate.events.jsonl")
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0, result.stderr
    assert lines[-1] == (f"floe node: cannot listen on {node.address}: port {port} is in use "
                         f"(another process, another node perhaps, is bound to it)"), lines
    assert "Traceback" not in result.stderr and "add_port" not in result.stderr
    # nobody binds beside it either, whatever the socket options
    beside = grpc.server(None, options=[("grpc.so_reuseport", 1)])
    with pytest.raises(RuntimeError):
        beside.add_insecure_port(node.address)
    assert node.alive()
    feed(cluster, sent, WORDS[:1000])
    assert counts(cluster) == sent


def read_line(proc: subprocess.Popen, timeout: float) -> str:
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise AssertionError("the impostor said nothing")
    return proc.stdout.readline().strip()


def start_impostor(cluster, address: str, name: str, calls: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.impostor", address, str(cluster.tls_dir), name,
         str(calls)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert read_line(proc, 60) == "READY"
    return proc


def bind(proc: subprocess.Popen) -> None:
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert read_line(proc, 30) == "SERVING"


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)


def served_name(address: str, files: TlsFiles) -> str:
    """The CN of the certificate served at `address`, checked against the ring's CA
    only (no name check): what answers there is a certificate of the ring."""
    host, port = address.rsplit(":", 1)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.load_verify_locations(cafile=str(files.ca))
    context.load_cert_chain(str(files.cert), str(files.key))
    context.set_alpn_protocols(["h2"])
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        with context.wrap_socket(raw) as conn:
            cert = x509.load_der_x509_certificate(conn.getpeercert(binary_form=True))
    return cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value


def get_ring_status(address: str, files: TlsFiles, name: str | None) -> grpc.StatusCode:
    with grpc.secure_channel(address, files.channel_credentials(),
                             options=server_options(name)) as channel:
        try:
            floe_pb2_grpc.ControlPlaneStub(channel).GetRing(floe_pb2.GetRingRequest(),
                                                            timeout=3)
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def ring_nodes(cluster, address: str) -> tuple[str, ...]:
    with cluster.channel(address) as channel:
        reply = floe_pb2_grpc.ControlPlaneStub(channel).GetRing(floe_pb2.GetRingRequest(),
                                                                timeout=3)
    return Ring.from_wire(reply.ring).nodes


@pytest.mark.multiprocess
def test_an_impostor_on_a_dead_nodes_address_is_refused_by_peers_and_mappers(
        cluster, tmp_path):
    sent = counts(cluster)
    victim = cluster.node("n2")
    survivors = [n.address for n in cluster.nodes if n.node_id != "n2"]
    client_calls, node_calls = tmp_path / "client-impostor.calls", tmp_path / "node.calls"
    impostor = start_impostor(cluster, victim.address, "client", client_calls)
    # one mapper throughout, its seeds n2's address among them
    with RingClient(cluster.seeds, tls=cluster.tls("client"), timeout=30.0) as client:
        try:
            client.emit_many(WORDS)
            client.flush()
            sent.update(WORDS)
            owned = [w for w in set(WORDS) if client.ring.owner(w) == "n2"]
            assert owned                                   # n2 answers these reads
            killed = time.monotonic()
            cluster.kill("n2")
            bind(impostor)                    # the client's certificate on n2's port
            assert served_name(victim.address, cluster.tls("client")) == "client"
            # every read of n2's keys gets the true answer, and a feed then is exact
            for word in owned:
                assert client.get(word) == sent[word]
            client.emit_many(WORDS[:2000])
            client.flush()
            sent.update(WORDS[:2000])
            wait_for(lambda: all("n2" not in ring_nodes(cluster, a) for a in survivors),
                     timeout=20, what="n2 declared dead by both survivors")
            declared = time.monotonic() - killed
            assert declared < 15, declared
            print(f"n2 declared dead {declared:.1f} s after its SIGKILL, impostor bound")
            # a channel that expects n2, or any node, refuses the client's certificate
            for name in (server_name("n2"), None):
                assert get_ring_status(victim.address, cluster.tls("client"), name) == \
                    grpc.StatusCode.UNAVAILABLE
            assert Counter(dict(client.scan())) == sent == counts(cluster, survivors)
            assert not client_calls.exists() or client_calls.read_text() == ""
        finally:
            stop(impostor)

        # another node's certificate on n2's address: it is a node, not n2
        impostor = start_impostor(cluster, victim.address, "n1", node_calls)
        try:
            bind(impostor)
            assert served_name(victim.address, cluster.tls("client")) == "n1"
            assert get_ring_status(victim.address, cluster.tls("client"),
                                   server_name("n2")) == grpc.StatusCode.UNAVAILABLE
            assert get_ring_status(victim.address, cluster.tls("client"),
                                   server_name("n1")) == grpc.StatusCode.UNIMPLEMENTED
            # reached: only the name kept it out above
            assert node_calls.read_text().split() == ["/floering.v1.ControlPlane/GetRing"]
            # the mapper and the nodes remember who was at n2's address: n2, not n1
            client.emit_many(WORDS[:1500])
            client.flush()
            sent.update(WORDS[:1500])
            assert Counter(dict(client.scan())) == sent == counts(cluster, survivors)
            assert all(client.get(w) == sent[w] for w in owned)
            assert node_calls.read_text().split() == ["/floering.v1.ControlPlane/GetRing"]
        finally:
            stop(impostor)


@pytest.mark.multiprocess
def test_floe_up_on_a_durable_cluster_keeps_its_ca_and_every_certificate_handed_out(
        tmp_path):
    words = [("alpha", "beta", "gamma")[i % 3] for i in range(600)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(" ".join(words))
    tls = tmp_path / "floe-cluster" / "tls"
    kept = tmp_path / "handed-out"
    floe(tmp_path, "up", "--nodes", "3", "--replicas", "1")
    try:
        floe(tmp_path, "feed", str(corpus))
        kept.mkdir()
        for name in ("ca.pem", "client.pem", "client.key"):
            shutil.copy(tls / name, kept / name)
        ca_key = (tls / CA_KEY).read_bytes()
    finally:
        floe(tmp_path, "down")
    floe(tmp_path, "up")
    try:
        assert (tls / CA_KEY).read_bytes() == ca_key
        assert mode(tls) == 0o700 and all(mode(k) == 0o600 for k in tls.glob("*.key"))
        addresses = LocalCluster.load(tmp_path / "floe-cluster.json").seeds
        handed = TlsFiles(kept / "ca.pem", kept / "client.pem", kept / "client.key")
        with RingClient(addresses, tls=handed, timeout=30.0) as client:
            assert Counter(dict(client.scan())) == Counter(words)
    finally:
        floe(tmp_path, "down")


async def test_a_channel_accepts_only_the_server_name_it_expects(tmp_path):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_health.v1.health import aio as health_aio
    from floering.node.transport.binding import SERVER_OPTIONS
    from floering.wire.channels import open_channel
    d = generate(tmp_path / "tls", ["n1", "n2"])
    caller = TlsFiles.in_dir(d, "client").channel_credentials()

    async def answers(serving_as: str, name: str | None) -> grpc.StatusCode:
        server = grpc.aio.server(options=SERVER_OPTIONS)
        health_pb2_grpc.add_HealthServicer_to_server(health_aio.HealthServicer(), server)
        port = server.add_secure_port("127.0.0.1:0",
                                      TlsFiles.in_dir(d, serving_as).server_credentials())
        await server.start()
        channel = open_channel(f"127.0.0.1:{port}", caller, [], name)
        try:
            await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=3)
            return grpc.StatusCode.OK
        except grpc.RpcError as exc:
            return exc.code()
        finally:
            await channel.close()
            await server.stop(0)
    ok, refused = grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE
    assert await answers("n2", server_name("n2")) == ok
    assert await answers("n2", None) == ok                  # a seed: any node
    assert await answers("n1", server_name("n2")) == refused
    for impostor in ("client", "operator"):
        assert await answers(impostor, server_name("n2")) == refused
        assert await answers(impostor, None) == refused
