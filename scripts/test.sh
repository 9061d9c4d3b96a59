#!/usr/bin/env bash
# Set up (if needed) and run the fast tier (tests/conftest.py): every in-process test
# with a rotating share of the seeded simulation runs, and a few real-cluster smoke
# tests: the in-process ones on two workers, then the smoke tests one at a time
# (scripts/pytest-split.sh). Extra arguments go to both pytest runs;
# scripts/test-all.sh runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec bash scripts/pytest-split.sh fast "$@"
