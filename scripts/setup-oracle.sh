#!/usr/bin/env bash
# Creates (once) and caches the PyTorch 2.6 oracle: a Debian trixie root with python3-torch,
# python3-numpy and python3-safetensors, used by the interop tests through scripts/oracle-python.
#
#   scripts/setup-oracle.sh            # build if missing; quiet when the root is ready
#
# Where:   ${SHARDPOINT_ORACLE_ROOT:-/var/cache/shardpoint/oracle-trixie}  (~1.3 GB)
# Cost:    about one minute from nothing (debootstrap minbase + apt-get), 3-4 s when ready.
# Needs:   root (debootstrap, chroot, mount), network access to deb.debian.org.
#
# Protocol:
#   1. Take an exclusive lock ("$ROOT.lock") so concurrent runs build the root once.
#   2. If "$ROOT/.shardpoint-oracle-done" holds the current $ORACLE_VERSION, refresh the host
#      name in its /etc/hosts and stop.
#   3. Otherwise the root is missing, half built or built for another package list: make sure
#      nothing is mounted under it (a bind-mounted host folder would be deleted with it), remove it.
#   4. debootstrap --variant=minbase trixie, then in a private mount namespace (so /proc is
#      unmounted when it ends, whatever happens) chroot + apt-get install the packages.
#   5. Clean apt's cache, write the marker last.
#
# Failure policy: when SHARDPOINT_REQUIRE_ORACLES=1 any failure exits non-zero. Otherwise a
# failure (not root, no network, ...) prints a warning and exits 0; the oracle tests then skip.
set -uo pipefail

ROOT="${SHARDPOINT_ORACLE_ROOT:-/var/cache/shardpoint/oracle-trixie}"
PACKAGES=(python3-torch python3-numpy python3-safetensors)
# Change this string (or the package list) to force a rebuild of existing roots.
ORACLE_VERSION="shardpoint-oracle v1 trixie minbase: ${PACKAGES[*]}"
MARKER="$ROOT/.shardpoint-oracle-done"

required() { [[ "${SHARDPOINT_REQUIRE_ORACLES:-}" == "1" ]]; }

# Ends the script after a setup failure, following the failure policy above.
give_up() {
  echo "setup-oracle: $*" >&2
  if required; then
    echo "setup-oracle: SHARDPOINT_REQUIRE_ORACLES=1, failing" >&2
    exit 1
  fi
  echo "setup-oracle: WARNING: PyTorch 2.6 oracle unavailable; oracle tests will be skipped" >&2
  exit 0
}

# Prints the mount points at or below $1 (from this namespace's mount table).
mounts_under() {
  local dir
  dir=$(readlink -f "$1")
  awk -v d="$dir" '$5 == d || index($5, d "/") == 1 { print $5 }' /proc/self/mountinfo
}

# Removes a root safely: unmounts anything left under it first (deepest first), refuses if
# something stays mounted, and never crosses into another filesystem.
remove_root() {
  local dir="$1" m
  [[ -e "$dir" ]] || return 0
  for m in $(mounts_under "$dir" | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done
  if [[ -n "$(mounts_under "$dir")" ]]; then
    give_up "refusing to remove $dir: still mounted under it: $(mounts_under "$dir" | tr '\n' ' ')"
  fi
  rm -rf --one-file-system "$dir" || give_up "cannot remove half-built root $dir"
}

ensure_hosts() {
  local host
  host=$(hostname 2>/dev/null || cat /proc/sys/kernel/hostname)
  [[ -n "$host" && -f "$ROOT/etc/hosts" ]] || return 0
  if ! grep -qE "^[0-9.:]+[[:space:]].*\b${host}\b" "$ROOT/etc/hosts"; then
    printf '127.0.1.1 %s\n' "$host" >>"$ROOT/etc/hosts"
  fi
}

if [[ $(id -u) -ne 0 ]]; then
  give_up "needs root (debootstrap, chroot, mount); run it as root, e.g. sudo make oracle"
fi

mkdir -p "$(dirname "$ROOT")" || give_up "cannot create $(dirname "$ROOT")"
exec 9>"$ROOT.lock" || give_up "cannot open lock file $ROOT.lock"
flock 9 || give_up "cannot lock $ROOT.lock"

# 2. Ready?
if [[ -f "$MARKER" && "$(cat "$MARKER")" == "$ORACLE_VERSION" ]]; then
  ensure_hosts
  exit 0
fi

# 3. Missing, half built, or stale.
for tool in debootstrap chroot unshare; do
  command -v "$tool" >/dev/null || give_up "missing $tool (apt-get install debootstrap util-linux)"
done
if [[ -e "$ROOT" ]]; then
  echo "setup-oracle: removing incomplete or outdated root $ROOT" >&2
  remove_root "$ROOT"
fi

echo "setup-oracle: building the PyTorch 2.6 oracle root in $ROOT (about 1 minute)" >&2
LOG="$ROOT.log"
: >"$LOG"

# 4a. Base system.
if ! debootstrap --variant=minbase trixie "$ROOT" >>"$LOG" 2>&1; then
  tail -n 20 "$LOG" >&2
  remove_root "$ROOT"
  give_up "debootstrap trixie failed (no network?); log: $LOG"
fi

cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true
ensure_hosts

# 4b. Packages, with /proc mounted in a private namespace: the mount dies with the namespace.
install_script="
set -e
mount -t proc proc '$ROOT/proc'
chroot '$ROOT' /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root DEBIAN_FRONTEND=noninteractive \
  sh -c 'apt-get -q update && apt-get install -y -q --no-install-recommends ${PACKAGES[*]} && apt-get clean'
"
if ! unshare --mount --propagation private bash -c "$install_script" >>"$LOG" 2>&1; then
  tail -n 20 "$LOG" >&2
  remove_root "$ROOT"
  give_up "apt-get install ${PACKAGES[*]} in the trixie root failed; log: $LOG"
fi
rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/cache/apt/*.bin

# Sanity check before declaring the root ready.
if ! unshare --mount --propagation private bash -c \
    "mount -t proc proc '$ROOT/proc' && chroot '$ROOT' /usr/bin/env -i PATH=/usr/bin:/bin python3 -c 'import torch, numpy, safetensors; print(torch.__version__)'" \
    >>"$LOG" 2>&1; then
  tail -n 20 "$LOG" >&2
  remove_root "$ROOT"
  give_up "the new root's python3 cannot import torch, numpy, safetensors; log: $LOG"
fi

# 5. Marker last: its presence means the root is complete.
printf '%s\n' "$ORACLE_VERSION" >"$MARKER"
echo "setup-oracle: ready: $ROOT (torch $(tail -n 1 "$LOG"))" >&2
