"""The type check from a checkout: every `floering.…` import resolves (proto/floering
links to the source folders) and mypy, configured in pyproject.toml, reports no error
in the node, the mapper, the Spark driver and the `floe` command."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# No error: a change that adds one fixes it (no ignore, no Any to silence it).
MOST_ERRORS = 0


def run_mypy() -> str:
    ran = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental",
                          "--cache-dir", "/dev/null"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert ran.returncode in (0, 1), ran.stderr + ran.stdout
    return ran.stdout


def test_the_source_folders_are_linked_under_the_package():
    for name in ("node", "mapper", "floe", "chaos", "spark_driver"):
        link = ROOT / "proto" / "floering" / name
        assert link.is_symlink() and link.readlink() == Path("..", "..", name), link
        assert (link / "__init__.py").is_file(), link


def test_mypy_resolves_every_import_and_finds_no_error():
    out = run_mypy()
    unresolved = [line for line in out.splitlines()
                  if "floering" in line and ("import-not-found" in line
                                             or "Cannot find implementation" in line)]
    assert not unresolved, unresolved
    found = re.search(r"Found (\d+) errors?", out)
    errors = int(found.group(1)) if found else 0
    assert found or "Success" in out, out[-2000:]
    assert errors <= MOST_ERRORS, out[-4000:]
