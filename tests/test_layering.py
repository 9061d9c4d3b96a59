"""The package layering, checked on the source: the pure core does no I/O, the mapper
uses only the node's shared vocabulary, the Spark driver only the mapper."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# No clock, randomness, threads, processes or network in the protocol core: it is
# driven with an explicit `now` by the runtime and by the simulation alike.
CORE_FORBIDDEN = ("asyncio", "grpc", "grpc_health", "floering.v1", "socket", "subprocess",
                  "threading", "time", "random", "floering.node.runtime",
                  "floering.node.transport", "floering.node.app", "floering.mapper",
                  "floering.chaos", "floering.spark_driver")
# What the mapper may use of the node: the shared wire vocabulary.
# The wire's vocabulary, plus the ring's balancer, the pieces of shared keys, the
# sketch that finds hot keys, and the reducers (whose merge a read of a shared key needs).
MAPPER_ALLOWED_NODE = tuple(f"floering.node.{m}" for m in (
    "core.ring", "core.hashing", "core.batch", "core.codec", "core.errors", "core.epochs",
    "transport.status", "transport.tls", "transport.channels", "core.balancers", "core.pieces", "core.reducers",
    "core.sketch"))


def imports(path: Path) -> list[str]:
    """Every module a file imports, at any depth (lazy imports count too)."""
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append(node.module)
    return out


def within(module: str, packages) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("path", files("node/core"), ids=lambda p: p.name)
def test_the_core_imports_no_io(path):
    bad = [m for m in imports(path) if within(m, CORE_FORBIDDEN)]
    assert not bad, f"{path.name} imports {bad}"


@pytest.mark.parametrize("path", files("mapper"), ids=lambda p: p.name)
def test_the_mapper_uses_only_the_nodes_wire_vocabulary(path):
    bad = [m for m in imports(path)
           if within(m, ("floering.node",)) and not within(m, MAPPER_ALLOWED_NODE)]
    bad += [m for m in imports(path) if within(m, ("floering.chaos", "floering.spark_driver"))]
    assert not bad, f"{path.name} imports {bad}"


@pytest.mark.parametrize("path", files("spark_driver"), ids=lambda p: p.name)
def test_the_spark_driver_imports_only_the_mapper(path):
    bad = [m for m in imports(path)
           if within(m, ("floering.node", "floering.chaos", "floering.v1"))]
    assert not bad, f"{path.name} imports {bad}"


def test_no_private_names_imported_across_modules():
    bad = []
    for package in ("node", "mapper", "chaos", "spark_driver"):
        for path in files(package):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                        and within(node.module, ("floering",)):
                    bad += [f"{path.relative_to(ROOT)}: {node.module}.{a.name}"
                            for a in node.names if a.name.startswith("_")]
    assert not bad, bad


def test_the_checker_sees_a_forbidden_import(tmp_path):
    sample = tmp_path / "x.py"
    sample.write_text("def f():\n    import grpc\n    from floering.node.runtime.node import X\n")
    assert [m for m in imports(sample) if within(m, CORE_FORBIDDEN)] == ["grpc", "floering.node.runtime.node"]


# The protocol's decisions: only the node machine (node.core.machine) and durable
# mode's DiskPlan (node.core.persistence) call them. The runtime and the simulation
# are executors of their effects.
DECISIONS = {"floering.node.core.detector": {"combine", "indirect_vias"},
             "floering.node.core.handoff": {"retired_extras", "leave_moves", "split_ring",
                                   "commit_ring"},
             "floering.node.core.membership": {"refill_moves", "rejoin_name", "restarted"},
             "floering.node.core.load": {"choose_shed", "clockwise_nodes"},
             "floering.node.core.split_point": {"plan_split"},
             "floering.node.core.shedding": {"plan_shed", "with_split_tail"},
             "floering.node.core.persistence": {"held_ranges", "disk_image", "overlapping"}}


def decisions_imported(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    return [f"{node.module}.{a.name}" for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module in DECISIONS
            for a in node.names if a.name in DECISIONS[node.module]]


@pytest.mark.parametrize("path", [*files("node/runtime"), ROOT / "tests" / "simulation.py",
                                  ROOT / "tests" / "sim_disk.py",
                                  ROOT / "tests" / "sim_durable.py"], ids=lambda p: p.name)
def test_only_the_machine_makes_protocol_decisions(path):
    bad = decisions_imported(path)
    assert not bad, f"{path.name} decides for itself: {bad}"


def test_the_simulation_drives_the_production_machine_and_outbox():
    imported = imports(ROOT / "tests" / "simulation.py")
    assert "floering.node.core.machine" in imported and "floering.mapper.outbox" in imported


MAX_MODULE_LINES, MAX_FUNCTION_LINES = 520, 60


@pytest.mark.parametrize("path", [*files("node"), *files("mapper")],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_and_functions_stay_small(path):
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
