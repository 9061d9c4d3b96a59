"""The package layering, checked on the source: the pure core does no I/O, the mapper
uses only the node's shared vocabulary, the Spark driver only the mapper."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# No clock, randomness, threads, processes or network in the protocol core: it is
# driven with an explicit `now` by the runtime and by the simulation alike.
CORE_FORBIDDEN = ("asyncio", "grpc", "grpc_health", "floering", "socket", "subprocess",
                  "threading", "time", "random", "node.runtime", "node.transport", "node.app",
                  "mapper", "chaos", "spark_driver")
# What the mapper may use of the node: the shared wire vocabulary.
MAPPER_ALLOWED_NODE = ("node.core.ring", "node.core.hashing", "node.core.batch", "node.core.codec",
                       "node.core.errors", "node.core.epochs", "node.transport.status")


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
    bad = [m for m in imports(path) if within(m, ("node",)) and not within(m, MAPPER_ALLOWED_NODE)]
    bad += [m for m in imports(path) if within(m, ("chaos", "spark_driver"))]
    assert not bad, f"{path.name} imports {bad}"


@pytest.mark.parametrize("path", files("spark_driver"), ids=lambda p: p.name)
def test_the_spark_driver_imports_only_the_mapper(path):
    bad = [m for m in imports(path) if within(m, ("node", "chaos", "floering"))]
    assert not bad, f"{path.name} imports {bad}"


def test_no_private_names_imported_across_modules():
    bad = []
    for package in ("node", "mapper", "chaos", "spark_driver"):
        for path in files(package):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                        and within(node.module, ("node", "mapper", "chaos", "spark_driver")):
                    bad += [f"{path.relative_to(ROOT)}: {node.module}.{a.name}"
                            for a in node.names if a.name.startswith("_")]
    assert not bad, bad


def test_the_checker_sees_a_forbidden_import(tmp_path):
    sample = tmp_path / "x.py"
    sample.write_text("def f():\n    import grpc\n    from node.runtime.node import X\n")
    assert [m for m in imports(sample) if within(m, CORE_FORBIDDEN)] == ["grpc", "node.runtime.node"]
