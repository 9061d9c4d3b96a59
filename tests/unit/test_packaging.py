"""The package as installed: version ranges the tested versions satisfy, Spark and
plotting as extras the core never imports, the license, the type marker, and the one
public place of the API."""

import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
PACKAGES = {"floering": ROOT / "proto" / "floering", "floering.node": ROOT / "node",
            "floering.mapper": ROOT / "mapper", "floering.floe": ROOT / "floe",
            "floering.chaos": ROOT / "chaos",
            "floering.spark_driver": ROOT / "spark_driver"}


def requirements(extra: str | None = None) -> list[Requirement]:
    lines = PROJECT["dependencies"] if extra is None else PROJECT["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


def test_runtime_dependencies_are_ranges_and_hold_what_runs_here():
    for req in requirements():
        assert not any(s.operator == "==" for s in req.specifier), f"{req} is a pin"
        assert req.specifier.contains(metadata.version(req.name)), \
            f"{req.name} {metadata.version(req.name)} is outside {req.specifier}"


def test_the_constraints_file_pins_versions_the_ranges_allow():
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            pins[req.name] = next(iter(req.specifier)).version
    declared = requirements() + [r for extra in PROJECT["optional-dependencies"]
                                 if extra != "storage-bench" for r in requirements(extra)]
    for req in declared:
        assert req.name in pins, f"constraints.txt does not pin {req.name}"
        assert req.specifier.contains(pins[req.name]), f"{req.name}=={pins[req.name]} vs {req}"


def test_spark_and_plotting_are_extras_only():
    core = {r.name for r in requirements()}
    assert not core & {"pyspark", "matplotlib"}
    assert [r.name for r in requirements("spark")] == ["pyspark"]
    assert [r.name for r in requirements("plots")] == ["matplotlib"]
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert "-c constraints.txt -e '.[spark,plots,dev]'" in setup


def test_the_core_runs_without_pyspark_or_matplotlib():
    # None in sys.modules makes their import fail, as on an install without the extras.
    code = """
import runpy, sys
sys.modules["pyspark"] = sys.modules["matplotlib"] = None
import floering.node, floering.node.app, floering.node.__main__, floering.mapper
import floering.mapper.admin, floering.floe.cli, floering.floe.cluster
import floering.chaos.harness, floering.spark_driver.launch
print("status exit", floering.floe.cli.main(["--cluster-file", sys.argv[1], "status"]))
sys.argv = ["node", "--help"]
try:
    runpy.run_module("floering.node", run_name="__main__")
except SystemExit as exc:
    print("node exit", exc.code)
"""
    result = subprocess.run([sys.executable, "-c", code, str(ROOT / "no-such-cluster.json")],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "node exit 0" in result.stdout and "--metrics-port" in result.stdout
    assert "status exit 1" in result.stdout and "no-such-cluster.json" in result.stderr


def test_license_is_the_spdx_expression_with_its_file():
    assert PROJECT["license"] == "MIT"
    assert PROJECT["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]
    assert "setuptools>=77" in build["requires"]      # the first that takes this form


def test_every_package_is_marked_typed_and_ships_the_marker():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for name, folder in PACKAGES.items():
        assert (folder / "py.typed").is_file(), name
        assert "py.typed" in data["package-data"][name], name


def test_the_public_api_is_exported_from_mapper():
    import floering.mapper as mapper
    from floering.mapper.client import RingClient
    from floering.wire import errors
    from floering.node.core.reducers import Reducer
    assert mapper.RingClient is RingClient and mapper.Reducer is Reducer
    for name in ("FloeError", "Unavailable", "RangeLost", "InvalidArgument", "InvalidKey",
                 "StaleRing", "ReducerMismatch"):
        assert getattr(mapper, name) is getattr(errors, name)
    assert {"RingClient", "Reducer", "FloeError", "Unavailable"} <= set(mapper.__all__)
    assert all(hasattr(mapper, name) for name in mapper.__all__)


def test_process_tables_come_from_psutil_not_hand_read_proc():
    """/proc is read through psutil everywhere; the one write left is the storage
    benchmark dropping the page cache, which psutil cannot do."""
    root = Path(__file__).resolve().parents[2]
    hits = [f"{path.relative_to(root)}:{n}"
            for folder in ("node", "mapper", "floe", "chaos", "spark_driver")
            for path in (root / folder).rglob("*.py")
            for n, line in enumerate(path.read_text().splitlines(), 1)
            if "/proc" in line and "drop_caches" not in line]
    assert not hits, hits


def test_the_wheel_installs_one_namespace_that_runs_on_its_own(tmp_path):
    """Every module ships under floering/ (nothing like a top-level `node` or `chaos`
    to clash with another distribution), and the wheel's own files import and run
    without this checkout: a node's --help, the floe entry point's target."""
    import zipfile
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                            "--no-build-isolation", "-w", str(tmp_path), str(ROOT)],
                           capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    wheel = next(tmp_path.glob("floe_ring-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        z.extractall(tmp_path / "site")
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"floering"}, tops
    for shipped in ("floering/node/py.typed", "floering/chaos/data/kjv.txt.gz",
                    "floering/floe/data/ui.html", "floering/floe/data/grafana-dashboard.json",
                    "floering/spark_driver/log4j2.properties", "floering/v1/floe_pb2.py"):
        assert shipped in names, shipped
    assert any(n.startswith("floering/node/core/columnar/ctable.") and n.endswith(".so")
               for n in names), "the compiled state table is not in the wheel"
    assert any(n.startswith("floering/mapper/ccombine.") and n.endswith(".so")
               for n in names), "the compiled combiner is not in the wheel"
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "floe = floering.floe.cli:main" in (tmp_path / "site" / entry).read_text()
    code = f"""
import importlib.util, runpy, sys
sys.path.insert(0, {str(tmp_path / 'site')!r})
import floering.floe.cli, floering.mapper
assert floering.mapper.__file__.startswith({str(tmp_path / 'site')!r}), floering.mapper.__file__
assert all(importlib.util.find_spec(n) is None for n in ("node", "mapper", "floe", "chaos", "spark_driver"))
import floering.node.core.columnar as columnar
assert columnar.KERNEL == "compiled" and columnar.StateTable.__module__.endswith("ctable")
import floering.mapper.combining as combining
assert combining.COMBINE_KERNEL == "compiled", combining.COMBINE_KERNEL
sys.argv = ["floering.node", "--help"]
runpy.run_module("floering.node", run_name="__main__")
"""
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path, env=env)
    assert ran.returncode == 0, ran.stderr
    assert "--node-id" in ran.stdout
