"""README.md's Python examples, run as written against a default `floe up` cluster (4
nodes, r=1, durable, mutual TLS) in its own directory: each prints what its comments
say, found its certificates itself, and a client that disagrees with the ring about
TLS is told so in one line."""

from __future__ import annotations

import os
import random
import re
import socket
import subprocess
import sys

import pytest

from tests.support.helpers import ROOT, floe, floe_run

pytestmark = pytest.mark.multiprocess

README_SEED = "127.0.0.1:7400"


def python_examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def promised(code: str) -> list[str]:
    """What an example's print lines say they print: each comment, up to a ': '."""
    return [line.split("# ", 1)[1].split(": ", 1)[0].strip()
            for line in code.splitlines() if "print(" in line and "# " in line]


def _free_base(count: int = 4) -> int:
    for _ in range(50):
        base = random.randrange(20000, 40000)
        socks = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no free ports")


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "FLOE_TLS_DIR"}
    return dict(env, PYTHONPATH=f"{ROOT}:{ROOT / 'proto'}", **extra)


def _run(cwd, code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env=_env(**env))


def test_the_readme_examples_run_as_written_on_a_default_cluster(tmp_path):
    examples = python_examples()
    assert len(examples) >= 4 and all(README_SEED in c for c in examples[:3])
    base = _free_base()
    try:
        up = floe(tmp_path, "up", "--base-port", str(base))
        assert "mutual TLS" in up and "durable" in up and up.count("pid") == 4
        seed = f"127.0.0.1:{base}"
        for code in examples:
            result = _run(tmp_path, code.replace(README_SEED, seed))
            assert result.returncode == 0, code + result.stdout + result.stderr
            # a ring version depends on how many changes the ring went through
            shown = [re.sub(r"ring v\d+", "ring v?", x) for x in result.stdout.splitlines()]
            said = [re.sub(r"ring v\d+", "ring v?", x) for x in promised(code)]
            assert shown == said, code + result.stdout
        # the counts the examples printed, by an independent client
        from collections import Counter
        fed = Counter(["word", "many", "words", "word"]) + Counter(["many", "many", "words"])
        check = ("from floering.mapper import RingClient\n"
                 f"with RingClient([{seed!r}]) as r: print(sorted(r.scan()))")
        assert _run(tmp_path, check).stdout.strip() == str(sorted(fed.items()))
    finally:
        floe_run(tmp_path, "down", "--kill")


def test_a_client_that_disagrees_about_tls_is_told_the_fix_in_one_line(tmp_path):
    secure, plain, elsewhere = (tmp_path / d for d in ("secure", "plain", "elsewhere"))
    for d in (secure, plain, elsewhere):
        d.mkdir()
    try:
        floe(secure, "up", "--nodes", "2", "--memory")
        floe(plain, "up", "--nodes", "1", "--memory", "--insecure", "--replicas", "0")
        tls_ring = (secure / "floe-cluster.json").read_text().split('"address": "')[1][:50]
        tls_addr = tls_ring.split('"')[0]
        plain_addr = (plain / "floe-cluster.json").read_text().split(
            '"address": "')[1].split('"')[0]
        tls_dir = str(secure / "floe-cluster" / "tls")

        # --ring in the cluster's own directory: its certificates are found
        assert floe(secure, "status", "--ring", tls_addr).splitlines()[-1].startswith(
            "HEALTHY: 2 of 2")
        # elsewhere, without certificates: one line naming the fix
        told = floe_run(elsewhere, "status", "--ring", tls_addr)
        assert told.returncode == 1
        assert told.stderr.splitlines() == [f"floe status: the ring at {tls_addr} speaks TLS: pass "
                        "tls=TlsFiles.in_dir(DIR, 'client') (--tls-dir DIR), set "
                        "FLOE_TLS_DIR=DIR, or run beside its floe-cluster/tls"], told.stderr
        assert "Socket closed" not in told.stderr and "Traceback" not in told.stderr
        # FLOE_TLS_DIR is the next place looked in
        found = subprocess.run([sys.executable, "-m", "floering.floe.cli", "status",
                                "--ring", tls_addr], cwd=elsewhere, capture_output=True,
                               text=True, timeout=60, env=_env(FLOE_TLS_DIR=tls_dir))
        assert found.returncode == 0 and "HEALTHY: 2 of 2" in found.stdout, found.stderr
        # TLS certificates against a ring in the clear
        code = ("from floering.mapper import RingClient\n"
                f"RingClient([{plain_addr!r}], timeout=10)")
        wrong = _run(elsewhere, code, FLOE_TLS_DIR=tls_dir)
        assert wrong.returncode == 1
        assert (f"TlsMismatch: the ring at {plain_addr} speaks plain text, not TLS: pass "
                f"tls=None") in wrong.stderr
        code = ("import asyncio\nfrom floering.mapper import AsyncRingClient\n"
                "async def main():\n"
                f"    async with AsyncRingClient([{tls_addr!r}], timeout=10) as ring:\n"
                "        print(await ring.get('x'))\n"
                "asyncio.run(main())\n")
        told = _run(elsewhere, code)                     # the asyncio client, no certificates
        assert told.returncode == 1
        assert told.stderr.splitlines()[-1] == (
            f"floering.mapper.credentials.TlsMismatch: the ring at {tls_addr} speaks TLS: "
            "pass tls=TlsFiles.in_dir(DIR, 'client') (--tls-dir DIR), set FLOE_TLS_DIR=DIR, "
            "or run beside its floe-cluster/tls")
        assert _run(secure, code).stdout == "None\n"     # beside its cluster: found
        # another CA's certificates: refused, and said so
        other = elsewhere / "tls"
        from floering.node.transport.tls import generate
        generate(other, ["n0"])
        refused = floe_run(elsewhere, "status", "--ring", tls_addr, "--tls-dir", str(other))
        assert refused.returncode == 1 and len(refused.stderr.splitlines()) == 1
        assert f"floe status: the ring at {tls_addr} refused the TLS handshake with the " \
               f"certificates in {other}" in refused.stderr, refused.stderr
        # the ring in the clear, from its own directory: plain, as its file records
        assert floe(plain, "status").splitlines()[-1].startswith("HEALTHY: 1 of 1")
    finally:
        floe_run(secure, "down", "--kill")
        floe_run(plain, "down", "--kill")
