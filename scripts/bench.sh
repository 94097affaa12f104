#!/usr/bin/env bash
# Runs every benchmark (each prints its own table). BENCH_ROUNDS sets the rounds.
set -euo pipefail
BUILD=${1:-build}
ROUNDS=${BENCH_ROUNDS:-3}
cd "$(dirname "$0")/.."
/usr/bin/python3 bench/torchfile_bench.py "$BUILD" --rounds "$ROUNDS"
/usr/bin/python3 bench/dcp_bench.py "$BUILD" --rounds "$ROUNDS"
/usr/bin/python3 bench/consolidate_bench.py "$BUILD" --rounds "$ROUNDS"
/usr/bin/python3 bench/reshard_bench.py "$BUILD" --rounds "$ROUNDS"
/usr/bin/python3 bench/train_stall_bench.py "$BUILD" --rounds "$ROUNDS"
# Object store (S3 on moto) vs boto3: needs the Python that has moto and boto3 (pyenv python3 here).
if command -v moto_server >/dev/null 2>&1; then python3 bench/object_store_bench.py "$BUILD" --rounds "$ROUNDS"; fi
