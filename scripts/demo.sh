#!/usr/bin/env bash
# Set up (if needed) and run the main job: a local ring fed a real corpus, exact results.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m floering.chaos.demo "$@"
