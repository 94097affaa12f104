#!/usr/bin/env bash
# Creates (once) and caches the Python test venv: CPython 3.11 with the newest PyTorch from
# PyPI, Lightning and pytest (python/requirements-test.txt). Prints the venv's python on stdout.
#
#   scripts/setup-python.sh          # create or update if missing; quick when ready
#   scripts/setup-python.sh bench    # the benchmarks' venv: the test venv's requirements plus
#                                    # the object-store peers (python/requirements-bench.txt),
#                                    # in a venv of its own (venv-bench-py311), so the peers'
#                                    # pins (s3fs's aiobotocore pins botocore) never move the
#                                    # versions the tests run with
#
# Where:   ${SHARDPOINT_VENV:-/var/cache/shardpoint/venv-py311}, the installer's cache beside it
#          (${SHARDPOINT_PIP_CACHE:-/var/cache/shardpoint/pip}). Never the system Python.
# How:     pip installs uv (pinned, from PyPI) into the venv, and uv installs the requirements:
#          PyTorch's wheel and its CUDA libraries are ~3 GB, which pip takes many minutes to
#          download and unpack one file at a time; uv does it in parallel. pip stays in the venv
#          (the tests build the wheel with `pip wheel`), and is the fallback if uv fails.
#          Bytecode is compiled at install time (compileall; uv does not by default): where
#          PYTHONDONTWRITEBYTECODE is set, as on these machines, every process would otherwise
#          compile PyTorch's sources again when it imports them (import torch: 5 s of CPU
#          instead of 2; every test rank pays it).
# Cost:    about two minutes from nothing, well under a second when ready.
# Needs:   python3.11 (with venv), network access to PyPI, a writable cache folder.
#
# Protocol: 1. lock "$VENV.lock" so concurrent runs create it once; 2. if the marker holds the
# hash of the requirements file, print the python and stop; 3. otherwise create the venv when
# it is missing or broken, pip install the requirements into it (an edited requirements file
# installs only what changed), write the marker last.
#
# Failure policy: under SHARDPOINT_REQUIRE_ORACLES=1 any failure exits non-zero. Otherwise it
# warns and exits 0 without printing a path; the Python tests then skip.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
VENV="${SHARDPOINT_VENV:-/var/cache/shardpoint/venv-py311}"
export PIP_CACHE_DIR="${SHARDPOINT_PIP_CACHE:-/var/cache/shardpoint/pip}"
REQ="$REPO/python/requirements-test.txt"
IMPORTS="torch, lightning, pytest"
HASHED=("$REQ")
if [[ "${1:-}" == "bench" ]]; then
  VENV="${SHARDPOINT_BENCH_VENV:-/var/cache/shardpoint/venv-bench-py311}"
  REQ="$REPO/python/requirements-bench.txt"  # includes requirements-test.txt (-r)
  IMPORTS="torch, boto3, s3fs, s3torchconnector.dcp, azure.storage.blob, adlfs, gcsfs, google.cloud.storage"
  HASHED=("$REQ" "$REPO/python/requirements-test.txt")
fi
MARKER="$VENV/.shardpoint-venv-done"

give_up() {
  echo "setup-python: $*" >&2
  if [[ "${SHARDPOINT_REQUIRE_ORACLES:-}" == "1" ]]; then
    echo "setup-python: SHARDPOINT_REQUIRE_ORACLES=1, failing" >&2
    exit 1
  fi
  echo "setup-python: WARNING: no Python test venv; the Python tests will be skipped" >&2
  exit 0
}

# The marker holds the hash of the requirements and of how they are installed (SETUP), so a
# change to either installs again.
UV_VERSION=0.13.9
SETUP="uv $UV_VERSION, then compileall"
want="$( (cat "${HASHED[@]}"; echo "$SETUP") | sha256sum | cut -d' ' -f1)"
mkdir -p "$(dirname "$VENV")" || give_up "cannot create $(dirname "$VENV")"
exec 9>"$VENV.lock" || give_up "cannot open lock $VENV.lock"
flock -w 1800 9 || give_up "timed out waiting for $VENV.lock"

if [[ -x "$VENV/bin/python" && "$(cat "$MARKER" 2>/dev/null)" == "$want" ]]; then
  echo "$VENV/bin/python"
  exit 0
fi

PY=""
for candidate in python3.11 "$(command -v python3)"; do
  [[ -n "$candidate" ]] || continue
  if "$candidate" -c 'import sys, venv; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
    PY="$(command -v "$candidate")"
    break
  fi
done
[[ -n "$PY" ]] || give_up "no CPython 3.11 with venv found"

if ! "$VENV/bin/python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
  echo "setup-python: creating $VENV from $REQ (a few minutes the first time)" >&2
  rm -rf "$VENV"
  "$PY" -m venv "$VENV" || give_up "python -m venv $VENV failed"
  "$VENV/bin/python" -m pip install -q --upgrade pip >&2 || give_up "pip upgrade failed"
else
  echo "setup-python: updating $VENV from $REQ" >&2
fi
if "$VENV/bin/python" -m pip install -q "uv==$UV_VERSION" >&2 &&
   UV_CACHE_DIR="$PIP_CACHE_DIR/uv" "$VENV/bin/uv" pip install -q --python "$VENV/bin/python" -r "$REQ" >&2; then
  :
else
  echo "setup-python: uv failed; installing with pip (slower)" >&2
  "$VENV/bin/python" -m pip install -q -r "$REQ" >&2 || give_up "pip install -r $REQ failed"
fi
# Not checked: a few files are not meant for 3.11 (PyTorch's tests of 3.12 syntax); the import
# check below is what counts.
"$VENV/bin/python" -m compileall -q -j 0 "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" \
  >/dev/null 2>&1 || true
"$VENV/bin/python" -c "import $IMPORTS" >&2 || give_up "the venv cannot import $IMPORTS"
printf '%s\n' "$want" >"$MARKER"
echo "$VENV/bin/python"
