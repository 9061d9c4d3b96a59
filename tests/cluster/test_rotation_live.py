"""Rotating credentials on a live TLS ring, real processes: re-issued certificates, then a new
CA, each followed by a rolling restart (floe.restart), under a feed whose counts must stay
exact. What docs/security.md tells an operator to do, step by step.

The tests here start real node processes; the in-process ones are in
tests/unit/test_rotation.py.
"""

import shutil
from collections import Counter

import grpc
import pytest

from floering.floe.cluster import LocalCluster, channel
from floering.floe.restart import rolling_restart
from floering.v1 import floe_pb2, floe_pb2_grpc
from floering.mapper import RingClient
from floering.wire.tls import TlsFiles
from floering.node.transport.tls import reissue, rotate_ca, served_certificate, trusted_cas
from tests.support.helpers import Feeder, corpus_words, diff


CORPUS = corpus_words()[:20_000]


# each restarted node comes back empty and pulls its share after --share-pull-grace,
# again after --share-pull-interval (3 s and 2 s by default): shorter in the 3-node
# test, the same pulls (in the CA rotation's pair it saved no time)
PULLS = ["--share-pull-grace", "0.5", "--share-pull-interval", "0.5"]


def feed(cluster, words) -> Counter:
    """Send `words` with the client credentials now in the directory."""
    with RingClient(cluster.seeds, tls=cluster.tls(), timeout=30) as client:
        client.emit_many(words)
        client.flush()
    return Counter(words)


def scan(cluster) -> dict:
    with RingClient(cluster.seeds, tls=cluster.tls(), timeout=30) as client:
        return dict(client.scan())


def served(cluster) -> dict:
    """{node id: the certificate its process presents}."""
    return {n.node_id: served_certificate(n.address, cluster.tls()) for n in cluster.nodes}


def on_disk(cluster, name: str):
    from cryptography import x509
    return x509.load_pem_x509_certificate(cluster.tls(name).cert.read_bytes())


def restart_under_load(cluster, lines: list[str]) -> Counter:
    """A rolling restart while a client (with the files now in the directory) feeds;
    returns what it had acknowledged."""
    feeder = Feeder(cluster.seeds, tls=cluster.tls())
    feeder.start()
    try:
        rolling_restart(cluster, graceful=True, timeout=60, report=lines.append)
    finally:
        feeder.stop.set()
        feeder.join(60)
    feeder.finish().close()              # it neither hung nor failed
    return feeder.acked


def answers(cluster, files: TlsFiles) -> set[str]:
    """What the nodes answer a caller presenting `files` (OK, or the status and why)."""
    out = set()
    for node in cluster.nodes:
        with channel(node.address, files) as ch:
            try:
                floe_pb2_grpc.ControlPlaneStub(ch).GetRing(floe_pb2.GetRingRequest(),
                                                           timeout=5)
                out.add("OK")
            except grpc.RpcError as exc:
                out.add(f"{exc.code().name}: {exc.details()}")
    return out


def check_ring_intact(cluster, expected: Counter) -> None:
    got = scan(cluster)
    assert got == expected, diff(got, expected)
    with RingClient(cluster.seeds, tls=cluster.tls(), timeout=30) as client:
        ring = client.refresh_ring()
        rows = client.stats()
    assert not ring.lost and all(r["under_replicated"] == 0 for r in rows), rows


@pytest.mark.multiprocess
def test_reissued_certificates_are_served_after_a_rolling_restart_and_counts_stay_exact(
        tmp_path):
    with LocalCluster.up(3, 1, workdir=tmp_path, extra_args=PULLS) as cluster:
        expected = feed(cluster, CORPUS)
        before = served(cluster)
        assert all(before[n].serial_number == on_disk(cluster, n).serial_number
                   for n in before)
        reissue(cluster.tls_dir)               # new keys, new serials, the same CA
        # a running node keeps what it loaded: nothing changes until it restarts
        assert {n: c.serial_number for n, c in served(cluster).items()} == \
            {n: c.serial_number for n, c in before.items()}
        lines: list[str] = []
        expected += restart_under_load(cluster, lines)
        after = served(cluster)
        for node_id, cert in after.items():
            fresh = on_disk(cluster, node_id)
            assert cert == fresh and cert.serial_number != before[node_id].serial_number
        # one line a node, each back as a new member holding its share again
        assert len(lines) == 3 and all("serves as n" in line and "#1, " in line
                                       and "holding 0 " not in line for line in lines), lines
        check_ring_intact(cluster, expected)


def rotate_ca_under_load(cluster, tmp_path) -> Counter:
    """Every step of rotate_ca with a rolling restart under a feed after each; checks
    who is trusted at each step. Returns every tuple acknowledged."""
    directory = cluster.tls_dir
    old_ca = trusted_cas(directory)[0]
    stale = tmp_path / "stale"                 # the client's old-CA credentials
    stale.mkdir()
    for name in ("client.pem", "client.key"):
        shutil.copy(directory / name, stale / name)
    sent = feed(cluster, CORPUS)
    lines: list[str] = []
    steps: list[str] = []

    def restart(step: str) -> None:
        nonlocal sent
        steps.append(step)
        sent += restart_under_load(cluster, lines)
        sent += feed(cluster, CORPUS[:2000])
        old_client = TlsFiles(directory / "ca.pem", stale / "client.pem", stale / "client.key")
        issuers = {c.issuer for c in served(cluster).values()}
        assert answers(cluster, cluster.tls()) == {"OK"}
        if step == "trust_next_ca":            # both trusted, the old one still issues
            assert len(trusted_cas(directory)) == 2 and issuers == {old_ca.subject}
            assert answers(cluster, old_client) == {"OK"}
        elif step == "issue_from_next_ca":     # every node shows the new CA's certificate
            new_ca = trusted_cas(directory)[1]
            assert issuers == {new_ca.subject} and new_ca.subject != old_ca.subject
            assert answers(cluster, old_client) == {"OK"}
        else:                                  # the old CA is trusted no more
            assert [c.subject for c in trusted_cas(directory)] == list(issuers)
            # refused at the handshake (TLS 1.3: the node closes the connection once it
            # has seen the certificate), while the current one is served, above
            refused = answers(cluster, old_client)
            assert all(a.startswith("UNAVAILABLE") for a in refused), refused

    rotate_ca(directory, restart)
    assert steps == ["trust_next_ca", "issue_from_next_ca", "drop_old_cas"], lines
    return sent


@pytest.mark.multiprocess
def test_a_ca_rotation_in_three_rolling_restarts_keeps_counts_exact(tmp_path):
    with LocalCluster.up(2, 1, workdir=tmp_path) as cluster:
        expected = rotate_ca_under_load(cluster, tmp_path)
        check_ring_intact(cluster, expected)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_ca_rotation_of_a_larger_ring_keeps_counts_exact(tmp_path):
    with LocalCluster.up(4, 2, workdir=tmp_path) as cluster:
        expected = rotate_ca_under_load(cluster, tmp_path)
        check_ring_intact(cluster, expected)
