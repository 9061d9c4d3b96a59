"""Regenerate the Python modules from proto/floering/v1/*.proto.

    python scripts/gen_proto.py          # rewrite the generated modules
    python scripts/gen_proto.py --check  # exit 1 if they are stale

Generation runs with `-I proto` so generated imports are package-qualified
(`from floering.v1 import ...`) and no bare `proto` package is ever importable.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(out_dir: pathlib.Path) -> list[pathlib.Path]:
    from grpc_tools import protoc

    protos = sorted(PROTO_ROOT.glob("floering/v1/*.proto"))
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *[str(p.relative_to(PROTO_ROOT)) for p in protos],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted(p for p in out_dir.rglob("*") if p.name.endswith(SUFFIXES))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale files")
    check = parser.parse_args().check
    with tempfile.TemporaryDirectory() as tmp:
        tmp_dir = pathlib.Path(tmp)
        stale = []
        for fresh in generate(tmp_dir):
            target = PROTO_ROOT / fresh.relative_to(tmp_dir)
            if not target.exists() or target.read_bytes() != fresh.read_bytes():
                stale.append(target)
                if not check:
                    target.write_bytes(fresh.read_bytes())
    for path in stale:
        print(f"{'stale' if check else 'wrote'}: {path.relative_to(ROOT)}")
    return 1 if (check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
