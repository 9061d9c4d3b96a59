"""Identity on every call, against real node processes with mutual TLS: a member's
certificate speaks only for that member, a certificate of another CA gets nowhere,
and a fenced node says so in its health answer."""

import signal
from collections import Counter

import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from grpc_health.v1 import health_pb2, health_pb2_grpc

from floering.floe.cluster import LocalCluster
from floering.v1 import floe_pb2, floe_pb2_grpc
from floering.mapper import RingClient
from floering.node.core.batch import encode_payload
from floering.wire.codec import pack, pack_entries, unpack_entries
from floering.wire.pieces import PIECE_MARK, fold_key
from floering.wire.ring import Ring
from floering.node.transport import tls
from floering.wire.tls import TlsFiles
from tests.support.helpers import wait_for
from tests.support.tls_shared import status_of
from tests.support.hostile_shared import rss_mib

pytestmark = pytest.mark.multiprocess

WORDS = [f"w{i % 97}" for i in range(5000)]
FORGED = 10 ** 6            # what a forged checkpoint would make every count


def feed(cluster, words) -> Ring:
    with RingClient(cluster.seeds, tls=cluster.tls("client")) as client:
        client.emit_many(words)
        client.flush()
        return client.ring


def range_copy(cluster, node_id: str, token: int) -> tuple[str, dict]:
    """What the node holds of the range: its role and the states (a replica: what a
    takeover would serve, its checkpointed copy plus the batches backed up since)."""
    with cluster.channel(cluster.node(node_id).address) as ch:
        chunks = list(floe_pb2_grpc.QueryPlaneStub(ch).InspectRange(
            floe_pb2.RangeRequest(token=token), timeout=5))
    return chunks[0].role, {k: s for c in chunks for k, s in unpack_entries(c.entries).items()}


# ----------------------------------------------------- forged checkpoints

def test_a_members_certificate_cannot_ship_checkpoints_it_does_not_own(tmp_path):
    with LocalCluster.up(3, 2, workdir=tmp_path) as cluster:
        ring = feed(cluster, WORDS)
        want = Counter(WORDS)
        # a range of n0 backed up on n1 and n2; n1 forges to n2 with its own (valid)
        # certificate, as a member that backs the range up and knows its keys
        candidates = [t for t in ring.tokens_of("n0")
                      if ring.destinations(t) == ("n0", "n1", "n2")]
        assert candidates, ring
        token = max(candidates, key=lambda t: sum(ring.token_for_key(w) == t for w in want))
        in_range = {w: n for w, n in want.items() if ring.token_for_key(w) == token}
        assert in_range
        wait_for(lambda: range_copy(cluster, "n2", token) == ("replica", in_range), 10,
                 "n2's copy of the range is complete")

        def forged(sender: str, incarnation: int) -> floe_pb2.CheckpointFragment:
            # everything a takeover would serve: a full copy, every count made FORGED,
            # a seq far ahead (later real checkpoints would not replace it)
            return floe_pb2.CheckpointFragment(
                sender=sender, ring_stamp=ring.stamp, token=token,
                checkpoint_seq=10 ** 12, base_seq=0, full=True,
                states=pack_entries([(w, FORGED) for w in in_range]),
                watermarks=pack({"forger": 10 ** 12}), incarnation=incarnation)

        with cluster.channel(cluster.node("n2").address, "n1") as ch:
            as_n1 = floe_pb2_grpc.ControlPlaneStub(ch)
            # claiming to be n0, the owner (last with an incarnation n0 never had:
            # accepted, that would also get n0 declared dead as restarted)
            for sender, incarnation in (("n0", 0), ("n0#1", 0), ("n0", 424242)):
                assert status_of(lambda: as_n1.ShipCheckpoint(
                    forged(sender, incarnation), timeout=5)) == \
                    grpc.StatusCode.PERMISSION_DENIED, sender
            # as itself (or a later member of its own process), for a range it does
            # not own: its certificate lets it speak, the ring says it is not the owner
            for sender in ("n1", "n1#1"):
                assert status_of(lambda: as_n1.ShipCheckpoint(forged(sender, 0),
                                                              timeout=5)) == \
                    grpc.StatusCode.FAILED_PRECONDITION, sender

        # a client's certificate may push, but neither as a fold (whose tuples carry
        # whole states, merged in) nor into an outgoing key of a fold
        word = next(iter(in_range))
        primary = cluster.node(ring.owner_of_token(token)).address
        with cluster.channel(primary, "client") as ch:
            data = floe_pb2_grpc.DataPlaneStub(ch)
            for source, key in (("fold:00ff", word),
                                ("rogue", fold_key(word, 1, 0)),
                                ("rogue", PIECE_MARK + b"\xc1")):
                batch = floe_pb2.Batch(ring_stamp=ring.stamp, token=token, source=source,
                                       first_seq=1, last_seq=1, count=1, id=1,
                                       payload=encode_payload([key], [FORGED]))
                assert status_of(lambda: list(data.Push(iter([floe_pb2.PushRequest(
                    batches=[batch])]), timeout=5))) == \
                    grpc.StatusCode.INVALID_ARGUMENT, (source, key)

        # the target's copy is untouched, and so is the ring
        assert range_copy(cluster, "n2", token) == ("replica", in_range)
        with RingClient(cluster.seeds, tls=cluster.tls("client")) as client:
            assert client.ring.stamp == ring.stamp
            assert dict(client.scan()) == want
        # ...and once n0 dies, the range is served from the copies, exactly
        cluster.kill("n0")
        wait_for(lambda: range_copy(cluster, "n1", token)[0] == "primary", 20,
                 "n1 takes the range over")
        assert range_copy(cluster, "n1", token) == ("primary", in_range)
        assert range_copy(cluster, "n2", token) == ("replica", in_range)
        with RingClient([cluster.node(n).address for n in ("n1", "n2")],
                        tls=cluster.tls("client"), timeout=20.0) as client:
            assert dict(client.scan()) == want
            client.emit_many(WORDS)
            client.flush()
            assert dict(client.scan()) == want + Counter(WORDS)


# ------------------------------------------------- a certificate of another CA

def rogue(cluster, tmp_path, name: str, role: str) -> TlsFiles:
    """A certificate named like one of the ring's (same O, OU, CN) from a throwaway
    CA that even copies the ring CA's name; the files trust the ring's real CA, so
    only the node's own check of the caller can refuse it."""
    real_ca = tls.trusted_cas(cluster.tls_dir)[0]
    key = ec.generate_private_key(ec.SECP256R1())
    ca = tls._certificate(real_ca.subject, real_ca.subject, key.public_key(), key, ca=True)
    directory = tmp_path / "rogue"
    directory.mkdir(exist_ok=True)
    files = tls.issue(directory, name, role, ["127.0.0.1", "localhost"], ca, key)
    return TlsFiles(cluster.tls("client").ca, files.cert, files.key)


REFUSED = {grpc.StatusCode.UNAVAILABLE,          # the TLS handshake failed
           grpc.StatusCode.UNAUTHENTICATED}


def test_a_certificate_of_another_ca_gets_nowhere_and_the_node_keeps_serving(tmp_path):
    with LocalCluster.up(3, 1, workdir=tmp_path) as cluster:
        ring = feed(cluster, WORDS)
        target = cluster.node("n1")
        token = ring.tokens_of("n1")[0]
        with cluster.channel(target.address, "n0") as ch:    # the real n0, for contrast
            real = floe_pb2_grpc.ControlPlaneStub(ch)
            assert status_of(lambda: real.Heartbeat(floe_pb2.HeartbeatRequest(
                sender="n0", ring_stamp=ring.stamp), timeout=5)) == grpc.StatusCode.OK
            view = real.GetRing(floe_pb2.GetRingRequest(), timeout=5)
        before = rss_mib(target.pid)
        for name, role in (("n0", "node"), ("client", "client"), ("operator", "operator")):
            files = rogue(cluster, tmp_path, name, role)
            options = [("grpc.max_reconnect_backoff_ms", 200)]
            with grpc.secure_channel(target.address, files.channel_credentials(),
                                     options=options) as ch:
                control = floe_pb2_grpc.ControlPlaneStub(ch)
                query = floe_pb2_grpc.QueryPlaneStub(ch)
                data = floe_pb2_grpc.DataPlaneStub(ch)
                health = health_pb2_grpc.HealthStub(ch)
                batch = floe_pb2.Batch(ring_stamp=ring.stamp, token=token, source="rogue",
                                       first_seq=1, last_seq=1, count=1, id=1,
                                       payload=encode_payload(["w1"], [FORGED]))
                calls = {
                    # node methods: each would do harm if it got through
                    "ExchangeRing": lambda: control.ExchangeRing(floe_pb2.RingView(
                        version=view.version + 1,
                        ring=Ring.from_wire(view.ring).without(["n2"]).to_wire(),
                        sender=name), timeout=5),
                    "Heartbeat": lambda: control.Heartbeat(floe_pb2.HeartbeatRequest(
                        sender=name, ring_stamp=ring.stamp, incarnation=777), timeout=5),
                    "ShipCheckpoint": lambda: control.ShipCheckpoint(
                        floe_pb2.CheckpointFragment(
                            sender=ring.owner_of_token(ring.tokens_of("n0")[0]),
                            ring_stamp=ring.stamp, token=ring.tokens_of("n0")[0],
                            checkpoint_seq=10 ** 12, full=True,
                            states=pack_entries([("w1", FORGED)]), watermarks=pack({})),
                        timeout=5),
                    "RequestShed": lambda: control.RequestShed(floe_pb2.ShedRequest(
                        sender=name, depth=0), timeout=5),
                    "Leave": lambda: control.Leave(floe_pb2.LeaveRequest(), timeout=5),
                    # client methods, and what every role may read
                    "Push": lambda: list(data.Push(iter([floe_pb2.PushRequest(
                        batches=[batch])]), timeout=5)),
                    "Get": lambda: query.Get(floe_pb2.GetRequest(key=pack("w1")), timeout=5),
                    "Top": lambda: query.Top(floe_pb2.TopRequest(k=3), timeout=5),
                    "Scan": lambda: list(query.Scan(floe_pb2.ScanRequest(), timeout=5)),
                    "Stats": lambda: query.Stats(floe_pb2.StatsRequest(), timeout=5),
                    "GetRing": lambda: control.GetRing(floe_pb2.GetRingRequest(), timeout=5),
                    "Check": lambda: health.Check(health_pb2.HealthCheckRequest(), timeout=5),
                }
                for method, call in calls.items():
                    code = status_of(call)
                    assert code in REFUSED, (name, method, code)
        assert rss_mib(target.pid) - before < 32
        # the node kept serving, nothing changed
        with RingClient(cluster.seeds, tls=cluster.tls("client")) as client:
            assert client.ring.stamp == ring.stamp
            assert dict(client.scan()) == Counter(WORDS)
            client.emit_many(WORDS)
            client.flush()
            assert dict(client.scan()) == Counter(WORDS) + Counter(WORDS)


# --------------------------------------------------------- health when fenced

def health_of(cluster, node_id: str, service: str = ""):
    with cluster.channel(cluster.node(node_id).address) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=2).status


def test_a_node_declared_dead_rejoins_as_a_new_member_and_serves_once_its_peers_know_it(tmp_path):
    """A paused node the others declared dead learns it from its peers' answers (a view
    pushed on one member's word does not fence it: tests/simulation/test_member_attacks.py), drops
    its state and rejoins as a new, empty member; it serves again once a peer's ring
    holds that member (the window in between, NOT_SERVING, is held open and checked in
    tests/unit/test_bounds.py, where the peers can be cut off at will)."""
    SERVING = health_pb2.HealthCheckResponse.SERVING
    with LocalCluster.up(3, 1, workdir=tmp_path) as cluster:
        feed(cluster, WORDS)
        assert health_of(cluster, "n2") == SERVING
        cluster.kill("n2", signal.SIGSTOP)
        try:
            def ring_without_n2():
                with cluster.channel(cluster.node("n0").address) as ch:
                    view = floe_pb2_grpc.ControlPlaneStub(ch).GetRing(
                        floe_pb2.GetRingRequest(), timeout=2)
                return "n2" not in Ring.from_wire(view.ring).nodes
            wait_for(ring_without_n2, 20, "n2 declared dead")
        finally:
            cluster.kill("n2", signal.SIGCONT)

        def rejoined():
            with cluster.channel(cluster.node("n2").address) as ch:
                stats = floe_pb2_grpc.QueryPlaneStub(ch).Stats(floe_pb2.StatsRequest(),
                                                               timeout=2)
            return stats.node_id == "n2#1" and stats.rejoined == 1
        wait_for(rejoined, 20, "n2 rejoins as n2#1")
        wait_for(lambda: health_of(cluster, "n2") == SERVING, 20, "n2 SERVING again")
        assert health_of(cluster, "n2", "floering.v1.DataPlane") == SERVING
        with RingClient([cluster.node(n).address for n in ("n0", "n1")],
                        tls=cluster.tls("client"), timeout=20.0) as client:
            assert dict(client.scan()) == Counter(WORDS)
