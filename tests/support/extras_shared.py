"""Helpers of tests/unit/test_extras.py that other test files use too: SHIM, _env, _run.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.helpers import ROOT


SHIM = "import sys\nfor _name in {missing!r}:\n    sys.modules[_name] = None\n"


def _env(tmp_path, *missing: str) -> dict:
    shim = tmp_path / "shim"
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text(SHIM.format(missing=list(missing)))
    return dict(os.environ, PYTHONPATH=f"{shim}:{ROOT}:{ROOT / 'proto'}")


def _run(tmp_path, args, *missing, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=timeout, env=_env(tmp_path, *missing))
