#!/usr/bin/env bash
# Installs the Debian 12 packages shardpoint needs that are not installed yet.
# Idempotent and quiet when everything is present. Needs root (apt-get) only when
# something is missing.
#
#   scripts/install-deps.sh [all|demo]
#
# demo: what `make demo` builds and runs (compiler, libraries, LibTorch, Debian's PyTorch);
# all (default): also what the tests, CI, fuzzers and benchmarks use (clang with libFuzzer,
# clang-format/-tidy, Open MPI, fio, debootstrap).
set -euo pipefail

DEMO_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libfmt-dev libcli11-dev nlohmann-json3-dev libzstd-dev libxxhash-dev libisal-dev
  libssl-dev libcurl4-openssl-dev liburing-dev zstd
  python3-torch python3-numpy libtorch-dev libgloo-dev
  # The project's own venv (scripts/setup-python.sh: the Python package, Lightning) needs
  # ensurepip, which Debian ships apart from python3.
  python3-venv
  # The configure of the default build requires GoogleTest (the tests are targets of the
  # same build, not built by the demo); small, so the demo installs it too.
  libgtest-dev libgmock-dev
)
TEST_PACKAGES=(
  clang libclang-rt-14-dev clang-format clang-tidy
  # scripts/tidy_tree.py: clang-tidy 14 cannot read Debian's LibTorch headers in C++20, 16 can.
  clang-tidy-16
  libopenmpi-dev openmpi-bin
  fio debootstrap
)

case "${1:-all}" in
  demo) PACKAGES=("${DEMO_PACKAGES[@]}") ;;
  all) PACKAGES=("${DEMO_PACKAGES[@]}" "${TEST_PACKAGES[@]}") ;;
  *) echo "usage: $0 [all|demo]" >&2; exit 2 ;;
esac

missing=()
for p in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2
if [[ $(id -u) -ne 0 ]]; then
  echo "install-deps: need root to apt-get install: ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >&2
apt-get install -y -q -o DPkg::Lock::Timeout=600 --no-install-recommends "${missing[@]}" >&2
