"""Without an extra installed (pyspark, matplotlib made unimportable for the process
by a sitecustomize shim), the Spark driver says in one line which extra to install,
and a chaos run and the recovery benchmark print their verdict and results, the
plots skipped in one line."""

from __future__ import annotations

import json
import subprocess
import sys


from tests.support.helpers import ROOT
from tests.support.extras_shared import _env, _run


def test_the_shim_makes_the_import_fail(tmp_path):
    gone = _run(tmp_path, ["-c", "import matplotlib"], "matplotlib")
    assert gone.returncode == 1 and "ModuleNotFoundError" in gone.stderr
    assert _run(tmp_path, ["-c", "import matplotlib"]).returncode == 0


def test_the_spark_driver_names_its_extra_in_one_line(tmp_path):
    result = _run(tmp_path, [str(ROOT / "spark_driver" / "driver.py"), "--ring",
                             "127.0.0.1:1", "--source", "rate:10"], "pyspark")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "error: the Spark driver needs pyspark: pip install 'floe-ring[spark]'"]
    assert result.stdout == ""


def test_launching_the_driver_names_its_extra_before_starting_anything(tmp_path):
    code = ("from floering.spark_driver.launch import SparkDriver\n"
            "try:\n"
            "    SparkDriver(['--ring', '127.0.0.1:1', '--source', 'rate:1'])\n"
            "except FileNotFoundError as exc:\n"
            "    print(exc)\n")
    result = _run(tmp_path, ["-c", code], "pyspark")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "the Spark driver needs pyspark: pip install 'floe-ring[spark]'\n"


def test_the_benchmarks_plots_are_skipped_in_one_line_each(tmp_path):
    code = ("from pathlib import Path\n"
            "from floering.chaos import balance, growth, skew\n"
            "print(balance.plot({}, 'x.png'), growth.plot({}, Path('g')), "
            "skew.plot([], 's'), skew.overload_plot([], 'o'))\n")
    result = _run(tmp_path, ["-c", code], "matplotlib")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "None None [] skipped\n"
    assert result.stderr.splitlines() == [
        "plots skipped: matplotlib is not installed (pip install 'floe-ring[plots]')"] * 4


def test_the_demo_names_the_spark_extra_in_one_line_before_starting_a_ring(tmp_path):
    result = _run(tmp_path, ["-m", "floering.chaos.demo"], "pyspark", timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        "the Spark driver needs pyspark: pip install 'floe-ring[spark]'"]
    assert result.stdout == ""
    assert not (tmp_path / "floe-cluster.json").exists()


def _tls_dir(tmp_path, *flags, env=None) -> str:
    """The certificate directory the Spark driver settles on, from `tmp_path`."""
    code = ("import sys\n"
            "from floering.spark_driver import driver\n"
            "print(driver.parse_args(['--ring', 'x:1', '--source', 'rate:1', *sys.argv[1:]])"
            ".tls_dir)\n")
    result = subprocess.run([sys.executable, "-c", code, *flags], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60,
                            env={**_env(tmp_path), **(env or {})})
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_the_spark_driver_finds_credentials_as_every_client_does(tmp_path):
    """--tls-dir, then FLOE_TLS_DIR, then the cluster's own floe-cluster/tls."""
    clean = {"FLOE_TLS_DIR": ""}
    assert _tls_dir(tmp_path, env=clean) == "None"              # nothing to find: clear
    own = tmp_path / "floe-cluster" / "tls"
    own.mkdir(parents=True)
    (own / "ca.pem").write_text("")
    (tmp_path / "floe-cluster.json").write_text(json.dumps({"extra_args": []}))
    assert _tls_dir(tmp_path, env=clean) == str(own)
    elsewhere = tmp_path / "certs"
    assert _tls_dir(tmp_path, env={"FLOE_TLS_DIR": str(elsewhere)}) == str(elsewhere)
    given = tmp_path / "given"
    assert _tls_dir(tmp_path, "--tls-dir", str(given),
                    env={"FLOE_TLS_DIR": str(elsewhere)}) == str(given)
    (tmp_path / "floe-cluster.json").write_text(json.dumps({"extra_args": ["--insecure"]}))
    assert _tls_dir(tmp_path, env=clean) == "None"              # an --insecure ring
