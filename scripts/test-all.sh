#!/usr/bin/env bash
# Set up (if needed) and run the whole suite, as CI does: every test but the long
# variants marked `slow` (each has a CI-sized variant here): the in-process tests on
# two workers, then the multi-process ones one at a time (scripts/pytest-split.sh).
# Extra arguments go to both pytest runs (`-m slow` runs the long variants).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec bash scripts/pytest-split.sh "not slow" "$@"
