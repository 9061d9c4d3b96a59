import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_grpc_modules_are_current():
    result = subprocess.run([sys.executable, "scripts/gen_proto.py", "--check"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, (
        "generated modules are stale; run `python scripts/gen_proto.py`:\n" + result.stdout)


def test_no_bare_proto_package():
    # `proto` must not be importable from this project (proto-plus owns that name).
    assert not (ROOT / "proto" / "__init__.py").exists()
