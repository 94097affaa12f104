#!/usr/bin/env bash
# Runs GoogleTest suites of the sanitizer build (`make test-asan`), JOBS suites at a time,
# each with leak detection on. Each suite's output goes to BUILD_DIR/sanitized/NAME.log; a
# failing suite (a test failure or a sanitizer report) prints its log tail and fails the
# script (exit 1) once every suite has finished.
#
#   scripts/run-sanitized-tests.sh BUILD_DIR JOBS SUITE...
set -euo pipefail
BUILD_DIR=$1
JOBS=$2
shift 2
mkdir -p "$BUILD_DIR/sanitized"

# One suite: its result line on stdout, the log tail when it failed.
run_one() {
  local name=$1 bin log start
  bin=$(find "$BUILD_DIR/tests" -name "$name" -type f -perm -u+x | head -1)
  log="$BUILD_DIR/sanitized/$name.log"
  if [[ -z "$bin" ]]; then
    echo "sanitized: $name FAILED: no such test binary in $BUILD_DIR/tests"
    return 1
  fi
  start=$(date +%s)
  if ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 "$bin" --gtest_brief=1 >"$log" 2>&1; then
    echo "sanitized: $name ok ($(grep -ho '[0-9]* tests\? from' "$log" | head -1 | cut -d' ' -f1) tests, $(( $(date +%s) - start )) s)"
  else
    echo "sanitized: $name FAILED; log tail:"
    tail -60 "$log"
    return 1
  fi
}

source "$(dirname "$0")/parallel.sh"
run_in_parallel "$JOBS" run_one "$@"
