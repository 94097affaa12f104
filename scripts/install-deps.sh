#!/usr/bin/env bash
# Installs the Debian 12 packages shardpoint needs that are not installed yet.
# Idempotent and quiet when everything is present. Needs root (apt-get) only when
# something is missing.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libfmt-dev libcli11-dev nlohmann-json3-dev libzstd-dev libxxhash-dev libisal-dev
  libssl-dev libcurl4-openssl-dev libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev clang-format clang-tidy
  python3-torch python3-numpy libtorch-dev libgloo-dev
  libopenmpi-dev openmpi-bin
  fio liburing-dev debootstrap zstd
)

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
