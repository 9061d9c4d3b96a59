"""Servers are authenticated like clients: only the node the ring places at an address may
answer there; its port is its own; private keys are private from birth; a durable cluster
keeps its CA.

The tests here start real node processes; the in-process ones are in
tests/unit/test_server_identity.py.
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import socket
import ssl
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
from floering.wire.channels import server_options
from floering.wire.tls import TlsFiles, server_name
from floering.node.transport.tls import CA_KEY
from floering.v1 import floe_pb2, floe_pb2_grpc
from tests.support.helpers import floe, wait_for
from tests.support.server_identity_shared import ROOT, mode


WORDS = [f"w{i % 61}" for i in range(4000)]


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
        [sys.executable, "-m", "tests.support.impostor", address, str(cluster.tls_dir), name,
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
