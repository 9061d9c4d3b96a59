#!/usr/bin/env bash
# Create .venv (Python >= 3.11) and install floe-ring with every extra the README's
# commands need (spark, plots) and its test tools, at the versions constraints.txt
# pins. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "floe-ring needs Python >= 3.11 (found $("$PYTHON" --version 2>&1))" >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.installed-$(cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  # An editable install of packages mapped from their folders (floering.node from node/)
  # goes through an import finder, and setuptools warns about folders named like the
  # package in the working directory; there is none (floering is in proto/): quiet it.
  PYTHONWARNINGS="ignore:Editable installation" \
    .venv/bin/python -m pip install --quiet -c constraints.txt -e '.[spark,plots,dev]'
  rm -f .venv/.installed-*
  touch "$stamp"
fi
# The web page's test (tests/cluster/test_webui_live.py) drives a headless Chromium, Debian's
# `chromium` package: installed here when missing, as root with apt-get; elsewhere
# that test is skipped, saying so.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing chromium (apt-get) for the web page's test" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends chromium >/dev/null; } ||
      echo "could not install chromium: tests/cluster/test_webui_live.py's browser test will skip" >&2
  else
    echo "chromium is not installed (as root: apt-get install chromium):" \
         "tests/cluster/test_webui_live.py's browser test will skip" >&2
  fi
fi
# The compiled modules (setup.py), built again in place when a .pyx is newer than its
# module (an install made before it changed, or before it existed).
for pyx in node/core/columnar/ctable.pyx mapper/ccombine.pyx; do
  built=$(ls "${pyx%.pyx}".cpython-*.so 2>/dev/null | head -n 1 || true)
  if [ -z "$built" ] || [ "$pyx" -nt "$built" ]; then
    .venv/bin/python setup.py --quiet build_ext --inplace
    break
  fi
done
# Byte-code for the project's modules, written once here: with PYTHONDONTWRITEBYTECODE
# set (as on CI machines) every node, mapper and test process would otherwise compile
# every module from source at each start (about 0.3 of a node's 1 s of CPU to import).
# Python checks each file against its source, so an edited module is compiled again.
.venv/bin/python -m compileall -q -j 0 node mapper wire floe chaos spark_driver tests \
  proto/floering >/dev/null
