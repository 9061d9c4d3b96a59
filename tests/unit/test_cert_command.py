"""`floe cert`: a caller's certificate with an identity of its own, issued from the
ring's CA into a private directory of its own, and refused with one line for a name
that is not an identity, floe up's shared name, a used directory or no CA key."""

from __future__ import annotations

import stat

from cryptography import x509
from cryptography.x509.oid import NameOID

from floering.node.transport.tls import CA_KEY, generate, issue_identity
from tests.support.helpers import floe_run


def subject(path) -> dict:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    return {oid: cert.subject.get_attributes_for_oid(oid)[0].value
            for oid in (NameOID.ORGANIZATIONAL_UNIT_NAME, NameOID.COMMON_NAME)}


def test_a_certificate_of_its_own_in_a_private_directory(tmp_path):
    generate(tmp_path / "tls", ["n0", "n1"])
    done = floe_run(tmp_path, "--tls-dir", "tls", "cert", "alice", "--out", "alice")
    assert done.returncode == 0, done.stderr
    out = tmp_path / "alice"
    assert sorted(p.name for p in out.iterdir()) == ["ca.pem", "client.key", "client.pem"]
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in out.iterdir())
    assert (out / "ca.pem").read_bytes() == (tmp_path / "tls" / "ca.pem").read_bytes()
    assert subject(out / "client.pem") == {NameOID.ORGANIZATIONAL_UNIT_NAME: "client",
                                           NameOID.COMMON_NAME: "alice"}
    assert not (out / CA_KEY).exists()                 # the CA's key stays where it was
    ops = issue_identity(tmp_path / "tls", tmp_path / "ops", "night-shift", "operator")
    assert subject(ops.cert) == {NameOID.ORGANIZATIONAL_UNIT_NAME: "operator",
                                 NameOID.COMMON_NAME: "night-shift"}


def test_bad_requests_are_refused_with_one_line(tmp_path):
    generate(tmp_path / "tls", ["n0"])
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("")
    (tmp_path / "noca").mkdir()
    (tmp_path / "noca" / "ca.pem").write_bytes((tmp_path / "tls" / "ca.pem").read_bytes())
    cases = {
        ("--tls-dir", "tls", "cert", "../up", "--out", "a"): "identity '../up'",
        ("--tls-dir", "tls", "cert", "x" * 65, "--out", "a"): "1-64 letters",
        ("--tls-dir", "tls", "cert", "client", "--out", "a"): "every caller",
        ("--tls-dir", "tls", "cert", "bob", "--out", "used"): "not an empty directory",
        ("--tls-dir", "noca", "cert", "bob", "--out", "a"): f"no issuing CA key ({CA_KEY})",
        ("--tls-dir", "tls", "cert", "bob", "--out", "a", "--role", "node"): "invalid choice",
    }
    for args, says in cases.items():
        done = floe_run(tmp_path, *args)
        assert done.returncode != 0 and says in done.stderr, (args, done.stderr)
        assert done.stderr.strip().count("\n") <= 1 or "usage" in done.stderr, done.stderr
    assert not (tmp_path / "a").exists()
