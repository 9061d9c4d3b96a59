#!/usr/bin/env bash
# Runs one tier of the suite (scripts/test.sh, scripts/test-all.sh) in two passes:
#   1. the in-process tests (not marked `multiprocess`) on FLOE_TEST_WORKERS (default
#      2) pytest-xdist workers;
#   2. the tests marked `multiprocess` (real node processes on loopback ports, Spark)
#      one at a time, as their timings expect; with FLOE_MULTIPROCESS_WORKERS=N (N > 1),
#      those not marked `alone` (tests/conftest.py) on N workers, a test file to a
#      worker, then the `alone` ones one at a time.
# Each pass ends with its slowest tests (--durations), so a run's log says where its
# time went.
# Usage: pytest-split.sh MARKER-EXPRESSION [pytest arguments...]. A `-m EXPR` among
# the arguments takes the place of the tier's expression, as a later -m does in
# pytest. Fails if either pass fails; exits 5 (pytest's "no tests collected") only
# when neither pass found a test.
set -uo pipefail
cd "$(dirname "$0")/.."
expr=$1
shift
args=()
while (($#)); do
  case $1 in
    -m) expr=$2; shift 2 ;;
    --markexpr=*) expr=${1#--markexpr=}; shift ;;
    -m?*) expr=${1#-m}; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
workers=${FLOE_TEST_WORKERS:-2}

.venv/bin/python -m pytest -m "($expr) and not multiprocess" --durations=25 \
  -n "$workers" --dist worksteal "${args[@]}"
inproc=$?
mp_workers=${FLOE_MULTIPROCESS_WORKERS:-1}
if [ "$mp_workers" -gt 1 ]; then
  .venv/bin/python -m pytest -m "($expr) and multiprocess and not alone" --durations=40 \
    -n "$mp_workers" --dist loadfile "${args[@]}"
  shared=$?
  .venv/bin/python -m pytest -m "($expr) and multiprocess and alone" --durations=40 "${args[@]}"
  multi=$?
  if [ "$multi" = 5 ] || { [ "$shared" != 0 ] && [ "$shared" != 5 ]; }; then
    multi=$shared
  fi
else
  .venv/bin/python -m pytest -m "($expr) and multiprocess" --durations=40 "${args[@]}"
  multi=$?
fi

for rc in "$inproc" "$multi"; do
  if [ "$rc" != 0 ] && [ "$rc" != 5 ]; then
    echo "pytest-split: in-process pass exited $inproc, multiprocess pass $multi" >&2
    exit "$rc"
  fi
done
if [ "$inproc" = 5 ] && [ "$multi" = 5 ]; then
  exit 5
fi
exit 0
