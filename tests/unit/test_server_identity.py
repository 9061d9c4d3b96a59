"""Servers are authenticated like clients: only the node the ring places at an address
may answer there; its port is its own; private keys are private from birth; a durable
cluster keeps its CA."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys

import grpc
import pytest

from floering.wire.ring import Ring
from floering.node.transport import tls as tls_module
from floering.wire.channels import ServerNames
from floering.wire.tls import TlsFiles, server_name
from floering.node.transport.tls import generate, issue, node_files, reissue, rotate_ca
from tests.support.server_identity_shared import ROOT, mode


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


def test_names_placed_from_an_earlier_ring_only_tighten_and_yield_to_the_ring():
    current = [None]
    names = ServerNames(lambda: current[0])
    names.place({"h:1": "n0#2", "h:2": "n1"})
    assert names("h:1") == "n0.node.floe-ring" and names.node_at("h:1") == "n0"
    assert names("h:3") == "node.floe-ring"                 # not placed: any node
    current[0] = Ring.initial({"n5": "h:2", "n0": "h:1"}, 1, 2)
    assert names("h:2") == "n5.node.floe-ring"              # the ring names another
    names.place({"h:2": "n1"})                              # a ring's name is not undone
    assert names("h:2") == "n5.node.floe-ring"
    names.unplace(["h:1", "h:2"])                           # both named by the ring
    assert names("h:1") == "n0.node.floe-ring" and names("h:2") == "n5.node.floe-ring"
    fresh = ServerNames(lambda: None)
    fresh.place({"h:1": "n0"})
    fresh.unplace(["h:1"])
    assert fresh("h:1") == "node.floe-ring" and fresh.node_at("h:1") == ""


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
