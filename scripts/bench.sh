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
# Object stores (S3 on s3s-fs, Azure Blob on Azurite, GCS on fake-gcs-server) against the SDKs and
# fsspec file systems of each: the bench venv, and the Python package installed into
# build-wheel/site (make test-python builds it); skipped without them.
PY=$(scripts/setup-python.sh bench)
if [[ -n "$PY" && -d build-wheel/site ]]; then
  SHARDPOINT_PYTHONPATH="$PWD/build-wheel/site" "$PY" bench/object_store_bench.py "$BUILD" \
    --servers s3s,azurite,fake-gcs --rounds "$ROUNDS"
fi
