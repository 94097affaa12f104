#!/usr/bin/env bash
# Installs (once) and caches Azurite, the Azure Blob emulator the storage_azure_test and the
# Azure benchmark run on 127.0.0.1. Prints the path of azurite-blob on stdout.
#
#   scripts/setup-azurite.sh        # install if missing; quick when ready
#
# Where:   ${SHARDPOINT_NPM_CACHE:-/var/cache/shardpoint/npm}/node_modules/.bin/azurite-blob (~60 MB)
# Version: azurite@3.35.0 — 3.37 declares node >= 22 and this machine has node 20.
# Cost:    about a minute from nothing (npm install, network), well under a second when ready.
# Needs:   node + npm, network access to the npm registry, a writable cache folder.
#
# Protocol: 1. take an exclusive lock ("$DIR.lock") so concurrent runs install once;
#           2. if the marker holds $VERSION and the binary exists, print it and stop;
#           3. otherwise npm install into $DIR, then write the marker last.
#
# Failure policy: under SHARDPOINT_REQUIRE_ORACLES=1 any failure exits non-zero. Otherwise it
# warns and exits 0 without printing a path; the Azure tests then skip.
set -uo pipefail

DIR="${SHARDPOINT_NPM_CACHE:-/var/cache/shardpoint/npm}"
VERSION="azurite@3.35.0"
MARKER="$DIR/.shardpoint-azurite-done"
BIN="$DIR/node_modules/.bin/azurite-blob"

TAG="setup-azurite"
WHAT="Azurite"
# shellcheck source=scripts/server-cache.sh
source "$(dirname "${BASH_SOURCE[0]}")/server-cache.sh"
take_cache_lock
print_if_cached
command -v npm >/dev/null || give_up "npm not found (apt-get install npm)"
echo "setup-azurite: npm install $VERSION into $DIR" >&2
timeout 900 npm install --prefix "$DIR" --no-audit --no-fund --loglevel=error "$VERSION" >&2 ||
  give_up "npm install $VERSION failed"
finish_install
