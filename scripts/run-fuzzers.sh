#!/usr/bin/env bash
# Runs every libFuzzer target built in BUILD_DIR/fuzz for SECONDS each, starting from the
# seed corpus in fuzz/corpus/<target>/ when present. A crash fails the script (exit 1) and
# leaves the reproducer in BUILD_DIR/fuzz/artifacts/.
set -euo pipefail
BUILD_DIR=${1:-build-fuzz}
SECONDS_EACH=${2:-30}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$BUILD_DIR/fuzz/artifacts"
status=0
for bin in "$BUILD_DIR"/fuzz/*_fuzzer; do
  [[ -f "$bin" && -x "$bin" ]] || continue  # skip the corpus-* folders
  name=$(basename "$bin")
  corpus="$BUILD_DIR/fuzz/corpus-$name"
  mkdir -p "$corpus"
  seeds=()
  [[ -d "$ROOT/fuzz/corpus/$name" ]] && seeds=("$ROOT/fuzz/corpus/$name")
  echo "fuzz: $name for ${SECONDS_EACH}s"
  if ! "$bin" -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -timeout=10 \
       -artifact_prefix="$BUILD_DIR/fuzz/artifacts/$name-" -print_final_stats=1 \
       "$corpus" "${seeds[@]}" 2>"$BUILD_DIR/fuzz/$name.log"; then
    echo "fuzz: $name FAILED; log tail:"; tail -40 "$BUILD_DIR/fuzz/$name.log"
    status=1
  else
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$BUILD_DIR/fuzz/$name.log" || true
  fi
done
exit $status
