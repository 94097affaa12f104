#!/usr/bin/env bash
# Checks that every C++ file of the tree is clang-format clean (.clang-format): src/,
# include/, tests/, fuzz/, bench/, examples/. Seconds; run by .ci/run.
#
#   scripts/check-format.sh          # report (exit 1 on findings)
#   scripts/check-format.sh --fix    # rewrite the files in place
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files 'src/*.cc' 'src/*.h' 'include/*.h' 'tests/*.cc' 'tests/*.h' 'tests/*.c' \
  'fuzz/*.cc' 'bench/*.cc' 'bench/*.h' 'examples/*.cc' 'examples/*.h')
if [[ "${1:-}" == "--fix" ]]; then
  clang-format -i "${files[@]}"
  exit 0
fi
if ! clang-format --dry-run -Werror "${files[@]}" 2>/tmp/check-format.$$; then
  grep -E "^[^ ].*: (error|warning):" /tmp/check-format.$$ | head -50 >&2
  echo "check-format: $(grep -cE '^[^ ].*: (error|warning):' /tmp/check-format.$$) places are not clang-format clean (scripts/check-format.sh --fix)" >&2
  rm -f /tmp/check-format.$$
  exit 1
fi
rm -f /tmp/check-format.$$
echo "check-format: ${#files[@]} files clean"
