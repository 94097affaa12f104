#!/usr/bin/env bash
# Lints the Python of the whole tree: ruff (pyflakes, pycodestyle, bugbear; pyproject.toml
# [tool.ruff]) over python/ and bench/, and mypy over the package python/shardpoint (which
# ships py.typed), from the project's test venv (scripts/setup-python.sh, which pins both in
# python/requirements-test.txt).
#
#   scripts/lint-python.sh
#
# Exit status: 0 clean, 1 findings (printed), 2 no venv (under SHARDPOINT_REQUIRE_ORACLES=1;
# otherwise skipped with a note, as the Python tests are).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(scripts/setup-python.sh)
if [[ -z "$PY" ]]; then
  if [[ "${SHARDPOINT_REQUIRE_ORACLES:-0}" == 1 ]]; then
    echo "lint-python: no Python venv" >&2
    exit 2
  fi
  echo "lint-python: no Python venv; skipped" >&2
  exit 0
fi
"$PY" -m ruff check --no-cache python bench
(cd python && "$PY" -m mypy --no-incremental --cache-dir=/dev/null shardpoint)
echo "lint-python: ruff and mypy clean"
