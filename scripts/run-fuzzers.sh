#!/usr/bin/env bash
# Runs every libFuzzer target built in BUILD_DIR/fuzz for SECONDS each, starting from the
# seed corpus in fuzz/corpus/<target>/ when present, JOBS targets at a time (default: one
# per core; each fuzzer is single-threaded). A crash fails the script (exit 1) and leaves
# the reproducer in BUILD_DIR/fuzz/artifacts/.
#
#   scripts/run-fuzzers.sh [BUILD_DIR [SECONDS [JOBS]]]
set -euo pipefail
BUILD_DIR=${1:-build-san}
SECONDS_EACH=${2:-30}
JOBS=${3:-$(nproc)}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$BUILD_DIR/fuzz/artifacts"

# One target: its log in BUILD_DIR/fuzz/NAME.log, its result line on stdout.
run_one() {
  local bin=$1 name corpus seeds=()
  name=$(basename "$bin")
  corpus="$BUILD_DIR/fuzz/corpus-$name"
  mkdir -p "$corpus"
  [[ -d "$ROOT/fuzz/corpus/$name" ]] && seeds=("$ROOT/fuzz/corpus/$name")
  if "$bin" -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -timeout=10 \
       -artifact_prefix="$BUILD_DIR/fuzz/artifacts/$name-" -print_final_stats=1 \
       "$corpus" "${seeds[@]}" 2>"$BUILD_DIR/fuzz/$name.log"; then
    echo "fuzz: $name ok for ${SECONDS_EACH}s: $(grep -hoE 'stat::(number_of_executed_units|peak_rss_mb): *[0-9]+' \
      "$BUILD_DIR/fuzz/$name.log" | sed 's/stat:://' | tr -s ' \n' ' ')"
  else
    echo "fuzz: $name FAILED; log tail:"
    tail -40 "$BUILD_DIR/fuzz/$name.log"
    return 1
  fi
}

source "$ROOT/scripts/parallel.sh"
fuzzers=()
for bin in "$BUILD_DIR"/fuzz/*_fuzzer; do
  if [[ -f "$bin" && -x "$bin" ]]; then fuzzers+=("$bin"); fi  # not the corpus-* folders
done
run_in_parallel "$JOBS" run_one "${fuzzers[@]}"
