#!/usr/bin/env bash
# The Python package's tests: builds the wheel (the documented `pip wheel .`, objects from
# ccache), installs it into build-wheel/site, and runs python/tests with pytest from the
# project's venv (scripts/setup-python.sh); the tests start ranks in that venv (newest
# PyTorch) and in the PyTorch 2.6 oracle root, both importing the installed wheel.
#
#   scripts/test-python.sh [PYTEST ARGS...]
#
# Without a venv (no network, not root) the tests are skipped with a warning, or fail when
# SHARDPOINT_REQUIRE_ORACLES=1 (setup-python.sh's policy).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd -P)

PY=$(scripts/setup-python.sh)
if [[ -z "$PY" ]]; then
  echo "test-python: no Python venv; Python tests skipped" >&2
  exit 0
fi

export CCACHE_BASEDIR="$REPO" CCACHE_NOHASHDIR=1
# The C++ build (make passes $(BUILD)), absolute.
MAIN_BUILD=${BUILD:-build}
[[ "$MAIN_BUILD" == /* ]] || MAIN_BUILD="$REPO/$MAIN_BUILD"
# The wheel's compiler is the C++ build's: scikit-build-core would otherwise take Python's
# (sysconfig's g++ where CMake chose c++), and ccache keys on the compiler's name, so every
# object would compile again.
MAIN_CACHE="$MAIN_BUILD/CMakeCache.txt"
if [[ -z "${CXX:-}" && -f "$MAIN_CACHE" ]]; then
  CXX=$(sed -n 's/^CMAKE_CXX_COMPILER:FILEPATH=//p' "$MAIN_CACHE")
  CC=$(sed -n 's/^CMAKE_C_COMPILER:FILEPATH=//p' "$MAIN_CACHE")
  if [[ -n "$CXX" ]]; then export CXX; else unset CXX; fi
  if [[ -n "$CC" ]]; then export CC; else unset CC; fi
fi
echo "== python: building the wheel (pip wheel .)"
rm -rf build-wheel/dist build-wheel/site
"$PY" -m pip wheel . --no-deps --no-build-isolation -q -w build-wheel/dist
WHEEL=$(ls build-wheel/dist/shardpoint-*.whl)
"$PY" -m pip install -q --no-deps --target build-wheel/site "$WHEEL"
echo "== python: $(basename "$WHEEL") -> build-wheel/site"

export SHARDPOINT_PYTHONPATH="$REPO/build-wheel/site"
# The C++ build whose shardpoint-train the trainer interop tests run (make passes $(BUILD)).
export SHARDPOINT_BUILD_DIR="${SHARDPOINT_BUILD_DIR:-$MAIN_BUILD}"
cd python/tests
exec "$PY" -m pytest -q -p no:cacheprovider --durations=15 "$@"
