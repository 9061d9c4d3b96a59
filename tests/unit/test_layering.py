"""The package layering, checked on the source by allow-lists: each package declares
in its __init__.py (`__may_import__`) the project's modules it may import, and, for the
pure core, every other module too ("*": any module outside the project). An import
counts however it is written: at any depth, relative, aliased, or through importlib
with a constant name; an importlib call with a computed name is allowed only where
DYNAMIC_IMPORTS says why."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Where each package of `floering` lives in the checkout.
PACKAGES = {"floering.node": "node", "floering.wire": "wire", "floering.mapper": "mapper",
            "floering.floe": "floe", "floering.chaos": "chaos",
            "floering.spark_driver": "spark_driver", "floering.v1": "proto/floering/v1"}
# Packages with their own declaration, innermost first.
DECLARED = ("floering.node.core", "floering.node.runtime", "floering.node.transport",
            "floering.node.storage", "floering.node", "floering.wire", "floering.mapper",
            "floering.spark_driver", "floering.floe", "floering.chaos")
# Files that import a module whose name they compute, and why.
DYNAMIC_IMPORTS = {
    "node/core/reducers.py": "a user's reducer is loaded by the name an operator gives",
    "spark_driver/maps.py": "a user's map function is loaded by the name given to the driver",
}


def path_of(module: str) -> Path | None:
    """The file or package directory of a `floering` module in the checkout."""
    for package, folder in PACKAGES.items():
        if module == package or module.startswith(package + "."):
            rel = module[len(package):].lstrip(".").replace(".", "/")
            base = ROOT / folder / rel if rel else ROOT / folder
            for candidate in (base.with_suffix(".py"), base / "__init__.py"):
                if candidate.exists():
                    return candidate
    return None


def module_of(path: Path) -> str:
    for package, folder in PACKAGES.items():
        try:
            rel = path.relative_to(ROOT / folder).with_suffix("")
        except ValueError:
            continue
        parts = [p for p in rel.parts if p != "__init__"]
        return ".".join([package, *parts])
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)     # tests/


def _absolute(path: Path, node: ast.ImportFrom, module: str) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[:len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(path: Path, module: str | None = None) -> list[str]:
    """Every module a file imports, at any depth (lazy imports count too): `from a
    import b` is `a.b` when that is a module of the project, else `a`; relative
    imports are resolved; importlib calls with a constant name count, and one with a
    computed name is "<computed>"."""
    tree = ast.parse(path.read_text(), str(path))
    here = module or module_of(path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(path, node, here)
            out += [f"{base}.{a.name}" if path_of(f"{base}.{a.name}") else base
                    for a in node.names]
        elif isinstance(node, ast.Call) and _called(node.func) in ("import_module",
                                                                  "__import__"):
            first = node.args[0] if node.args else None
            out.append(first.value if isinstance(first, ast.Constant)
                       and isinstance(first.value, str) else "<computed>")
    return out


def _called(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def within(module: str, packages) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def declared(package: str) -> tuple[str, ...]:
    """A package's `__may_import__` (a literal in its __init__.py)."""
    tree = ast.parse(path_of(package).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__may_import__"
                                                for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{package} declares no __may_import__")


def refused(path: Path, module: str | None = None) -> list[str]:
    """The imports of `path` (the module `module`, by default the one its place in
    the checkout names) its package does not declare."""
    module = module or module_of(path)
    package = next(p for p in DECLARED if within(module, (p,)))
    allowed = declared(package)
    inside = [a for a in allowed if a.startswith("floering")]
    bad = []
    for name in imports(path, module):
        if name == "<computed>":
            if not path.is_relative_to(ROOT) or \
                    str(path.relative_to(ROOT)) not in DYNAMIC_IMPORTS:
                bad.append(name)
        elif within(name, ("floering",)):
            if not within(name, inside):
                bad.append(name)
        elif "*" not in allowed and name.split(".")[0] not in allowed:
            bad.append(name)
    return bad


SOURCES = [p for package in ("node", "wire", "mapper", "floe", "chaos", "spark_driver")
           for p in files(package)]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_module_imports_only_what_its_package_declares(path):
    bad = refused(path)
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_the_operator_command_does_not_import_the_chaos_harness():
    """floering.chaos builds on floering.floe (the local cluster), never the reverse."""
    assert not within("floering.chaos", declared("floering.floe"))
    assert not [a for a in declared("floering.floe") if within(a, ("floering.chaos",))]


def test_the_core_declares_no_io():
    allowed = declared("floering.node.core")
    assert "*" not in allowed
    assert not set(allowed) & {"asyncio", "grpc", "socket", "subprocess", "threading", "time",
                               "random", "selectors", "multiprocessing", "signal"}
    assert [a for a in allowed if a.startswith("floering")] == ["floering.node.core",
                                                                *PURE_WIRE]


# The modules of floering.wire the core may use: none speaks gRPC or touches a file.
PURE_WIRE = [f"floering.wire.{m}" for m in ("errors", "hashing", "codec", "balancers",
                                            "pieces", "epochs", "ring", "ring_wire",
                                            "ring_merge")]


@pytest.mark.parametrize("module", PURE_WIRE)
def test_the_wire_modules_the_core_uses_are_pure(module):
    """Each pure wire module imports only others of them and nothing from the list of
    what does I/O: the core's own rule, applied to what it borrows."""
    own = [a for a in imports(path_of(module)) if a.startswith("floering")]
    assert set(own) <= set(PURE_WIRE), own
    assert not {a.split(".")[0] for a in imports(path_of(module))} & {
        "asyncio", "grpc", "socket", "subprocess", "threading", "time", "random",
        "selectors", "multiprocessing", "signal", "pathlib", "cryptography"}


def test_every_dynamic_import_is_where_its_reason_says():
    for name in DYNAMIC_IMPORTS:
        assert "<computed>" in imports(ROOT / name), f"{name} imports nothing by a computed name"


def test_the_checker_sees_relative_aliased_and_importlib_imports(tmp_path):
    sample, module = tmp_path / "sample.py", "floering.node.core.sample"
    sample.write_text("def f(name):\n"
                      "    import grpc as g\n"
                      "    from ..runtime import node\n"
                      "    from . import load\n"
                      "    from floering.node import transport as t\n"
                      "    import importlib\n"
                      "    importlib.import_module('floering.mapper.client')\n"
                      "    __import__(name)\n")
    assert imports(sample, module) == [
        "grpc", "floering.node.runtime.node", "floering.node.core.load",
        "floering.node.transport", "importlib", "floering.mapper.client", "<computed>"]
    assert refused(sample, module) == ["grpc", "floering.node.runtime.node",
                                       "floering.node.transport", "floering.mapper.client",
                                       "<computed>"]


def test_no_private_names_imported_across_modules():
    bad = []
    for package in ("node", "wire", "mapper", "floe", "chaos", "spark_driver"):
        for path in files(package):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                        and within(node.module, ("floering",)):
                    bad += [f"{path.relative_to(ROOT)}: {node.module}.{a.name}"
                            for a in node.names if a.name.startswith("_")]
    assert not bad, bad


# The protocol's decisions: only the node machine (node.core.machine) and durable
# mode's DiskPlan (node.core.persistence) call them, and the mapper's ring rules only the
# mapper machine (mapper.machine). The runtimes and the simulation
# are executors of their effects.
DECISIONS = {"floering.node.core.detector": {"combine", "indirect_vias"},
             "floering.node.core.handoff": {"retired_extras", "leave_moves", "split_ring",
                                   "commit_ring"},
             "floering.node.core.membership": {"refill_moves", "rejoin_name", "restarted",
                                      "ready_to_decide"},
             "floering.node.core.load": {"choose_shed", "clockwise_nodes"},
             "floering.node.core.split_point": {"plan_split"},
             "floering.node.core.shedding": {"plan_shed", "with_split_tail"},
             "floering.node.core.persistence": {"held_ranges", "disk_image", "overlapping"},
             # the mapper's: only its machine (mapper.machine) calls them
             "floering.mapper.ring_watch": {"choose_ring", "ProgressWatch"}}


def decisions_imported(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    return [f"{node.module}.{a.name}" for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module in DECISIONS
            for a in node.names if a.name in DECISIONS[node.module]]


@pytest.mark.parametrize("path", [*files("node/runtime"), ROOT / "tests" / "support" / "simulation.py",
                                  ROOT / "tests" / "support" / "sim_disk.py",
                                  ROOT / "tests" / "support" / "sim_durable.py",
                                  ROOT / "tests" / "support" / "sim_mapper.py",
                                  *(ROOT / "mapper" / f"{name}.py"
                                    for name in ("delivery", "client", "aclient", "common",
                                                 "batching", "queries"))],
                         ids=lambda p: p.name)
def test_only_the_machine_makes_protocol_decisions(path):
    bad = decisions_imported(path)
    assert not bad, f"{path.name} decides for itself: {bad}"


def test_the_simulation_drives_the_production_machines():
    assert "floering.node.core.machine" in imports(ROOT / "tests" / "support" / "simulation.py")
    assert "floering.mapper.machine" in imports(ROOT / "tests" / "support" / "sim_mapper.py")
    # shedding, leaving, start-up, the handoff driver and inbound requests: the runtime
    # and the simulation run the same machines
    for machine, users in (("shed_round", ("node/runtime/balancing.py", "tests/support/simulation.py")),
                           ("handoff_driver", ("node/runtime/node.py", "tests/support/simulation.py")),
                           ("calls", ("node/runtime/probing.py", "tests/support/simulation.py")),
                           ("requests", ("node/runtime/service.py", "tests/support/simulation.py")),
                           ("leaving", ("node/runtime/balancing.py", "tests/support/simulation.py")),
                           ("startup_round", ("node/runtime/startup.py", "tests/support/simulation.py",
                                              "tests/support/sim_durable.py"))):
        for user in users:
            assert f"floering.node.core.{machine}" in imports(ROOT / user), (machine, user)


# A ceiling, not a steering rule: where code goes follows what it does. An exception
# names its file and why.
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 900, 100
SIZE_EXCEPTIONS: dict[str, str] = {}


@pytest.mark.parametrize("path", [path for package in ("node", "wire", "mapper", "floe", "chaos",
                                                     "spark_driver")
                                   for path in files(package) if "_pb2" not in path.name],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_and_functions_stay_small(path):
    if str(path.relative_to(ROOT)) in SIZE_EXCEPTIONS:
        return
    source = path.read_text()
    assert source.count("\n") <= MAX_MODULE_LINES, f"{path.name}: split it"
    long = [f"{n.name} ({n.end_lineno - n.lineno + 1} lines)" for n in ast.walk(ast.parse(source))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{path.name}: {long}"


def test_the_decision_checker_sees_a_decision(tmp_path):
    sample = tmp_path / "x.py"
    sample.write_text("from floering.node.core.detector import combine, Probe\n")
    assert decisions_imported(sample) == ["floering.node.core.detector.combine"]


def test_the_simulation_brings_in_neither_grpc_nor_the_chaos_harness():
    """It runs the production machines over a fake network and clock: gRPC, the node's
    transport and runtime, the chaos harness and the operator CLI stay out of its
    process (checked on the modules a fresh interpreter loads, not on import lines)."""
    import subprocess
    import sys
    probe = ("import sys; import tests.support.simulation, tests.support.sim_mapper, tests.support.sim_disk, "
             "tests.support.sim_durable; print(' '.join(sorted(m for m in sys.modules if m == 'grpc' "
             "or m.startswith(('grpc.', 'floering.chaos', 'floering.node.transport', "
             "'floering.node.runtime', 'floering.floe')))))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=True).stdout.split()
    assert out == [], f"the simulation loads {out}"
