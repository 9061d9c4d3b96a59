#!/usr/bin/env bash
# Set up (if needed) and run the whole suite, as CI does: every test but the long
# variants marked `slow` (each has a CI-sized variant here). Extra arguments go to
# pytest (`-m slow` runs the long variants).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -m "not slow" "$@"
