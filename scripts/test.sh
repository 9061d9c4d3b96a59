#!/usr/bin/env bash
# Set up (if needed) and run the fast tier (tests/conftest.py): every in-process test
# with a rotating share of the seeded simulation runs, and a few real-cluster smoke
# tests. Extra arguments go to pytest; scripts/test-all.sh runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -m fast "$@"
