#!/usr/bin/env bash
# Lints the C++ lines changed since a base commit: clang-format (.clang-format) and
# clang-tidy (.clang-tidy) report only on lines the change added or modified, so code
# written before these configurations existed does not turn CI red until someone edits it.
#
#   scripts/lint-changed.sh [BASE] [BUILD]
#
# BASE (default: $LINT_BASE, else HEAD~1): the commit to compare against. HEAD~1 is HEAD's
#   first parent, i.e. the previously landed commit on main: for a merge commit that is the
#   whole merged branch, for a plain commit that commit alone. It exists in any clone with
#   history (CI builds a fresh clone of main); in a clone without HEAD's parent (shallow,
#   or the very first commit) there is nothing to compare, and the script says so and
#   passes. To check a branch before landing it: scripts/lint-changed.sh "$(git merge-base
#   HEAD main)".
# LINT_JOBS (default: nproc) clang-tidy processes run at once; LINT_TIDY_MAX (default 40)
#   translation units at most, beyond which clang-tidy is skipped with a note (a large merge)
#   and only clang-format runs, to keep CI within its time.
# BUILD (default: $LINT_BUILD, else build): the CMake build folder whose
#   compile_commands.json clang-tidy reads. Files it does not compile, headers with no .cc
#   of the same name there, and units that include LibTorch (whose headers clang 14 cannot
#   compile; the torch and train layers build with GCC only) get clang-format only. Without
#   the folder clang-tidy is skipped with a note.
#
# The diff is taken between BASE and the working tree, so uncommitted edits count too.
# Exit status: 0 clean, 1 findings (printed), 2 usage or missing tools.
set -euo pipefail
cd "$(dirname "$0")/.."

base="${1:-${LINT_BASE:-HEAD~1}}"
build="${2:-${LINT_BUILD:-build}}"
CLANG_FORMAT="${CLANG_FORMAT:-clang-format-14}"
CLANG_FORMAT_DIFF="${CLANG_FORMAT_DIFF:-clang-format-diff-14}"
CLANG_TIDY="${CLANG_TIDY:-clang-tidy-14}"

for tool in "$CLANG_FORMAT" "$CLANG_FORMAT_DIFF" "$CLANG_TIDY"; do
  if ! command -v "$tool" >/dev/null; then
    echo "lint-changed: $tool not found (scripts/install-deps.sh installs clang-format and clang-tidy)" >&2
    exit 2
  fi
done
if ! git rev-parse --verify --quiet "$base^{commit}" >/dev/null; then
  echo "lint-changed: no commit $base in this clone; nothing to compare against, nothing checked"
  exit 0
fi

# C++ files added, copied, modified or renamed since base (deleted ones have no lines).
mapfile -t files < <(git diff --name-only --diff-filter=ACMR "$base" -- '*.cc' '*.h' | sort)
if ((${#files[@]} == 0)); then
  echo "lint-changed: no C++ file changed since $(git rev-parse --short "$base")"
  exit 0
fi
echo "lint-changed: ${#files[@]} C++ file(s) changed since $(git rev-parse --short "$base")"

status=0

# 1. clang-format on the changed lines: clang-format-diff prints what it would change.
format_diff=$(git diff -U0 --no-color "$base" -- "${files[@]}" |
  "$CLANG_FORMAT_DIFF" -p1 -style=file -binary "$(command -v "$CLANG_FORMAT")")
if [[ -n "$format_diff" ]]; then
  echo "$format_diff"
  echo "lint-changed: clang-format: changed lines are not formatted (fix: git diff -U0 $base | $CLANG_FORMAT_DIFF -p1 -i)" >&2
  status=1
fi

# 2. clang-tidy on the changed lines of the files the build compiles. A changed header is
# checked through the .cc of the same name (its diagnostics are reported for the header's
# changed lines only).
if [[ ! -f "$build/compile_commands.json" ]]; then
  echo "lint-changed: $build/compile_commands.json missing; clang-tidy skipped (configure the build first)" >&2
  exit "$status"
fi
# Changed line ranges per file, as clang-tidy's -line-filter wants them, and the .cc files to run.
plan=$(git diff -U0 --no-color "$base" -- "${files[@]}" | python3 -c '
import json, os, re, sys
root = os.getcwd()
compiled, torch = set(), set()
for e in json.load(open(sys.argv[1])):
    path = os.path.realpath(os.path.join(e["directory"], e["file"]))
    command = e.get("command") or " ".join(e.get("arguments", []))
    # LibTorch headers do not compile with clang 14 (the torch and train layers build with
    # GCC only), so clang-tidy cannot read those units.
    (torch if "torch/csrc/api/include" in command else compiled).add(path)
ranges, name = {}, None
for line in sys.stdin:
    m = re.match(r"^\+\+\+ b/(.*)$", line.rstrip("\n"))
    if m:
        name = m.group(1)
        continue
    m = re.match(r"^@@ .* \+(\d+)(?:,(\d+))? @@", line)
    if m and name:
        start, count = int(m.group(1)), int(m.group(2) or 1)
        if count:
            ranges.setdefault(name, []).append([start, start + count - 1])
units, skipped = set(), set()
for name in ranges:
    stem, ext = os.path.splitext(name)
    cc = name if ext == ".cc" else stem + ".cc"
    full = os.path.realpath(os.path.join(root, cc))
    if full in compiled:
        units.add(cc)
    elif full in torch:
        skipped.add(cc)
for cc in sorted(skipped):
    print("lint-changed: clang-tidy skips " + cc + " (LibTorch; clang-format only)", file=sys.stderr)
for cc in sorted(units):
    stem = os.path.splitext(cc)[0]
    filt = [{"name": n, "lines": ranges[n]} for n in (cc, stem + ".h") if n in ranges]
    print(cc + "\t" + json.dumps(filt, separators=(",", ":")))
' "$build/compile_commands.json")

jobs="${LINT_JOBS:-$(nproc)}"
max_units="${LINT_TIDY_MAX:-40}"
units=$(grep -c . <<<"$plan" || true)
if ((units == 0)); then
  echo "lint-changed: clang-tidy: no changed file is compiled by $build"
elif ((units > max_units)); then
  # A change this large (a big merge) would take CI's time; clang-format above still ran.
  echo "lint-changed: clang-tidy skipped: $units translation units changed, more than LINT_TIDY_MAX=$max_units" >&2
else
  echo "lint-changed: clang-tidy on $units translation unit(s), $jobs at a time"
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
  # One clang-tidy per unit; a unit's findings go to its own log, printed below.
  tidy_one() {  # $1: "<unit>\t<line filter>"
    local unit=${1%%$'\t'*} filter=${1#*$'\t'}
    local log="$out/${unit//\//_}.log"
    if ! "$CLANG_TIDY" -p "$build" --quiet --line-filter="$filter" "$unit" >"$log" 2>/dev/null; then
      echo "$unit" >"$log.failed"
      return 1
    fi
  }
  export -f tidy_one
  export CLANG_TIDY build out
  if ! xargs -d '\n' -n 1 -P "$jobs" bash -c 'tidy_one "$1"' _ <<<"$plan"; then
    status=1
  fi
  for log in "$out"/*.log; do
    if [[ -f "$log.failed" ]]; then
      echo "lint-changed: clang-tidy findings in $(cat "$log.failed"):"
      cat "$log"
    fi
  done
fi

if ((status == 0)); then
  echo "lint-changed: clean"
fi
exit "$status"
