#!/usr/bin/env bash
# Runs every benchmark (each prints its own table). BENCH_ROUNDS sets the rounds.
set -euo pipefail
BUILD=${1:-build}
ROUNDS=${BENCH_ROUNDS:-3}
cd "$(dirname "$0")/.."
/usr/bin/python3 bench/torchfile_bench.py "$BUILD" --rounds "$ROUNDS"
/usr/bin/python3 bench/dcp_bench.py "$BUILD" --rounds "$ROUNDS"
/usr/bin/python3 bench/consolidate_bench.py "$BUILD" --rounds "$ROUNDS"
