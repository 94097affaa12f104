#!/usr/bin/env bash
# The CUDA path of async staging, in one short GPU run (no GPU here): pinned buffers reused,
# non-blocking copies on a side stream, staging complete = the stream's event, staging time vs
# one pinned device-to-host copy, and dcp.async_save on one rank where the wheel loads.
#
#   scripts/device-check-cuda-staging.sh [--mib 1024] [--rounds 5]
#
# Python: $PY, else the project venv (scripts/setup-python.sh), else python3; it needs torch with
# CUDA. PYTHONPATH gets build-wheel/site (carry it to the device) and python/ (HostStaging needs
# only torch). Exit: 0 all passed, 1 a check failed, 77 no CUDA device. About a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-}
if [[ -z "$PY" && -x scripts/setup-python.sh ]]; then PY=$(scripts/setup-python.sh 2>/dev/null || true); fi
PY=${PY:-python3}
export PYTHONPATH="$PWD/build-wheel/site:$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || true
exec timeout 300 "$PY" bench/cuda_staging_check.py "$@"
