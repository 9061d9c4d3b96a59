"""Mutual TLS on a real cluster: who may call what is decided by the caller's
certificate, not by a field of its message."""

from collections import Counter

import grpc
import pytest

from floering.floe.cluster import LocalCluster
from floering.v1 import floe_pb2, floe_pb2_grpc
from floering.mapper import RingClient
from floering.node.config import NodeConfig
from floering.wire.errors import Unavailable
from floering.node.transport.server import node_tls
from tests.support.tls_shared import status_of

pytestmark = pytest.mark.multiprocess

WORDS = [f"w{i % 37}" for i in range(3000)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster.up(3, 1, workdir=tmp_path_factory.mktemp("tls")) as cluster:   # TLS by default
        yield cluster


def channel(cluster, name: str | None, index: int = 0):
    address = cluster.nodes[index].address
    if name is None:
        return grpc.insecure_channel(address)
    return grpc.secure_channel(address, cluster.tls(name).channel_credentials())


def test_a_client_with_its_certificate_pushes_and_queries_exactly(cluster):
    with RingClient(cluster.seeds, tls=cluster.tls("client")) as client:
        before = Counter(dict(client.scan()))
        client.emit_many(WORDS)
        client.flush()
        assert Counter(dict(client.scan())) == before + Counter(WORDS)
        assert client.get("w0") == before["w0"] + WORDS.count("w0")


def test_without_a_certificate_nothing_gets_through(cluster):
    with pytest.raises(Unavailable):
        RingClient(cluster.seeds, timeout=2.0, rpc_timeout=0.5)
    with channel(cluster, None) as plain:
        stub = floe_pb2_grpc.ControlPlaneStub(plain)
        assert status_of(lambda: stub.GetRing(floe_pb2.GetRingRequest(), timeout=2)) == \
            grpc.StatusCode.UNAVAILABLE


def test_each_role_may_call_only_its_own_methods(cluster):
    with channel(cluster, "client") as c, channel(cluster, "operator") as o, \
            channel(cluster, "n1") as n:
        as_client, as_operator = floe_pb2_grpc.ControlPlaneStub(c), floe_pb2_grpc.ControlPlaneStub(o)
        as_node = floe_pb2_grpc.ControlPlaneStub(n)
        ring = as_client.GetRing(floe_pb2.GetRingRequest(), timeout=5)     # everyone reads
        denied = grpc.StatusCode.PERMISSION_DENIED
        # a client forging ring views, heartbeats or moves is refused by its certificate
        assert status_of(lambda: as_client.ExchangeRing(ring, timeout=5)) == denied
        assert status_of(lambda: as_client.Heartbeat(floe_pb2.HeartbeatRequest(
            sender="n1", ring_stamp=1), timeout=5)) == denied
        assert status_of(lambda: as_client.Move(floe_pb2.MoveRequest(
            tokens=[1], target="n1"), timeout=5)) == denied
        # an operator may not act as a node, a node not as an operator
        assert status_of(lambda: as_operator.Heartbeat(floe_pb2.HeartbeatRequest(
            sender="n1"), timeout=5)) == denied
        assert status_of(lambda: as_node.Leave(floe_pb2.LeaveRequest(), timeout=5)) == denied
        # a node's certificate names it: it may not speak as another node
        assert status_of(lambda: as_node.Heartbeat(floe_pb2.HeartbeatRequest(
            sender="n2", ring_stamp=1), timeout=5)) == denied
        assert status_of(lambda: as_node.Heartbeat(floe_pb2.HeartbeatRequest(
            sender="n1", ring_stamp=1), timeout=5)) == grpc.StatusCode.OK
        # and an operator may split (a range of the node it talks to)
        from floering.wire.ring import Ring
        r = Ring.from_wire(ring.ring)
        token = r.tokens_of(cluster.nodes[0].node_id)[0]
        lo, _ = r.range_of_token(token)
        reply = as_operator.Split(floe_pb2.SplitRequest(at=(lo + 1000) % 2 ** 64), timeout=10)
        assert reply.accepted


def test_a_nodes_message_names_exactly_its_certificates_node(cluster):
    from floering.wire.ring import Ring
    denied = grpc.StatusCode.PERMISSION_DENIED
    with channel(cluster, "n1") as n:
        as_node = floe_pb2_grpc.ControlPlaneStub(n)
        view = as_node.GetRing(floe_pb2.GetRingRequest(), timeout=5)
        stamp = Ring.from_wire(view.ring).stamp

        def heartbeat(sender):
            return status_of(lambda: as_node.Heartbeat(floe_pb2.HeartbeatRequest(
                sender=sender, ring_stamp=stamp), timeout=5))
        # n1, or a later member of the same process: n1#<decimal number>
        for sender in ("n1", "n1#1", "n1#12"):
            assert heartbeat(sender) == grpc.StatusCode.OK, sender
        # nothing else: no empty sender, no other suffix, no other node's name
        for sender in ("", "n1#", "n1#x", "n1#1x", "n1#-1", "n1#+1", "n1#01", "n1#1#2",
                       "n1# 1", "n1#\u0661", "n1#1\n", "n1\n", "n10", "n1x", "n", "N1",
                       "n0", "n0#1", "n2#n1", "#1", "n1" + "#1" * 1000):
            assert heartbeat(sender) == denied, repr(sender)
        # every node method with a sender field refuses an empty (or forged) one
        for sender in ("", "n1#evil"):
            assert status_of(lambda: as_node.ExchangeRing(floe_pb2.RingView(
                version=view.version, ring=view.ring, sender=sender), timeout=5)) == denied
            assert status_of(lambda: as_node.ShipCheckpoint(floe_pb2.CheckpointFragment(
                sender=sender, ring_stamp=stamp, token=1, checkpoint_seq=1, full=True),
                timeout=5)) == denied
            assert status_of(lambda: as_node.RequestShed(floe_pb2.ShedRequest(
                sender=sender, depth=5), timeout=5)) == denied
        # a method without a sender field is not affected
        assert status_of(lambda: as_node.Probe(floe_pb2.ProbeRequest(
            target="n0", timeout=0.5), timeout=5)) == grpc.StatusCode.OK


def test_a_killed_node_is_taken_over_over_tls(cluster):
    victim = cluster.nodes[2]
    with RingClient(cluster.seeds, tls=cluster.tls("client")) as client:
        before = dict(client.scan())
        client.emit_many(WORDS)
        client.flush()
    cluster.kill(victim.node_id)
    with RingClient([n.address for n in cluster.nodes[:2]], tls=cluster.tls("client"),
                    timeout=20.0) as client:
        client.emit_many(WORDS)
        client.flush()
        assert dict(client.scan()) == Counter(before) + Counter(WORDS) + Counter(WORDS)


@pytest.mark.parametrize("listen", [
    "10.1.2.3:7000", "0.0.0.0:7000", "[::]:7000", "[2001:db8::1]:7000",
    "127.evil.com:80", "127.0.0.1.evil.com:80", "localhost.evil.com:80", "evil-localhost:80",
    "[::1].evil.com:80", "host-a:7000", "ipv4:127.0.0.1:7000", "[127.0.0.1]:7000",
    "::1:7000", "[::ffff:10.0.0.1]:7000"])
def test_a_node_refuses_to_serve_in_the_clear_beyond_loopback(listen):
    # --insecure or not: beyond loopback only with credentials; the bind address
    # decides (a wildcard one needs --advertise, here a loopback one to show that)
    for insecure in (False, True):
        config = NodeConfig(node_id="n0", listen=listen, advertise="127.0.0.1:7000",
                            peers=(("n0", "127.0.0.1:7000"),), insecure=insecure)
        with pytest.raises(ValueError, match="not a loopback address.*--tls-dir"):
            node_tls(config)


@pytest.mark.parametrize("listen", [
    "127.0.0.1:7000", "127.1.2.3:7000", "localhost:7000", "LocalHost:7000", "[::1]:7000",
    "[0:0:0:0:0:0:0:1]:7000", "[::ffff:127.0.0.1]:7000", "127.0.0.1:0"])
def test_a_node_serves_in_the_clear_on_loopback(listen):
    for insecure in (False, True):
        assert node_tls(NodeConfig(node_id="n0", listen=listen, peers=(("n0", listen),),
                                   insecure=insecure)) is None


def test_credentials_allow_any_address(tmp_path):
    from floering.node.transport.tls import generate
    generate(tmp_path, ["n0"])
    tls = node_tls(NodeConfig(node_id="n0", listen="10.1.2.3:7000",
                              peers=(("n0", "10.1.2.3:7000"),), tls_dir=str(tmp_path)))
    assert tls is not None and tls.cert.name == "n0.pem"


def test_the_floe_command_runs_a_tls_ring_end_to_end(tmp_path):
    import json
    from tests.support.helpers import floe, floe_run
    words = [("alpha", "beta", "gamma", "delta")[i % 4] for i in range(500)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(" ".join(words))
    floe(tmp_path, "up", "--nodes", "3", "--replicas", "1")            # TLS by default
    try:
        assert (tmp_path / "floe-cluster" / "tls" / "ca.pem").exists()
        floe(tmp_path, "feed", str(corpus))
        assert floe(tmp_path, "get", "gamma").strip() == str(words.count("gamma"))
        rows = json.loads(floe(tmp_path, "status", "--json"))["nodes"]
        assert len(rows) == 3 and all("error" not in r for r in rows)
        added = floe(tmp_path, "scale", "--add", "1")       # a new node's certificate too
        assert "added n3" in added
        assert floe(tmp_path, "get", "gamma").strip() == str(words.count("gamma"))
        found = floe_run(tmp_path, "--ring", rows[0]["address"], "get", "gamma")
        assert found.stdout.strip() == str(words.count("gamma"))   # its own certificates
        (tmp_path / "elsewhere").mkdir()
        plain = floe_run(tmp_path / "elsewhere", "--ring", rows[0]["address"], "--timeout",
                         "3", "get", "gamma")
        assert plain.returncode != 0                        # no certificate, no answer
        assert "speaks TLS" in plain.stderr and "FLOE_TLS_DIR" in plain.stderr
    finally:
        floe(tmp_path, "down")
