"""Rotating credentials on a live TLS ring, real processes: re-issued certificates, then
a new CA, each followed by a rolling restart (floe.restart), under a feed whose counts
must stay exact. What docs/security.md tells an operator to do, step by step."""


import pytest

from floering.node.transport.tls import reissue, trusted_cas


# ------------------------------------------------------------- the helpers

def test_reissue_keeps_role_name_and_hosts_and_the_ca_steps_go_in_order(tmp_path):
    from cryptography import x509
    from floering.node.transport.tls import (drop_old_cas, generate, holders, issue_from_next_ca,
                                    trust_next_ca)

    def cert(name):
        return x509.load_pem_x509_certificate((d / f"{name}.pem").read_bytes())

    def hosts(c):
        return c.extensions.get_extension_for_class(x509.SubjectAlternativeName).value

    d = generate(tmp_path / "tls", ["n0", "n1"], hosts=("127.0.0.1", "host-a"))
    assert holders(d) == ["client", "n0", "n1", "operator"]
    before = {n: cert(n) for n in holders(d)}
    assert reissue(d, ["n1"]) == ["n1"]
    assert cert("n1").subject == before["n1"].subject and hosts(cert("n1")) == hosts(before["n1"])
    assert cert("n1").serial_number != before["n1"].serial_number
    assert cert("n0") == before["n0"]                      # only what was named
    with pytest.raises(ValueError, match="trust_next_ca first"):
        issue_from_next_ca(d)
    trust_next_ca(d)
    with pytest.raises(ValueError, match="already under way"):
        trust_next_ca(d)
    with pytest.raises(ValueError, match="issue_from_next_ca first"):
        drop_old_cas(d)
    old_ca, new_ca = trusted_cas(d)
    assert old_ca.subject != new_ca.subject
    assert all(cert(n).issuer == old_ca.subject for n in holders(d))   # the old one issues
    issue_from_next_ca(d)
    assert all(cert(n).issuer == new_ca.subject for n in holders(d))
    assert drop_old_cas(d) == [old_ca] and trusted_cas(d) == [new_ca]
    assert sorted(p.name for p in d.glob("ca*")) == ["ca.key", "ca.pem"]


# ------------------------------------------------------------- certificates


# ------------------------------------------------------------------- the CA
