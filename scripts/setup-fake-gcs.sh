#!/usr/bin/env bash
# Installs (once) and caches fsouza's fake-gcs-server, the GCS emulator (JSON API, resumable
# uploads, ranged reads, ifGenerationMatch) that the gs:// JSON API tests run on 127.0.0.1.
# Prints the path of the fake-gcs-server binary on stdout.
#
#   scripts/setup-fake-gcs.sh        # install if missing; quick when ready
#
# Where:   ${SHARDPOINT_GO_CACHE:-/var/cache/shardpoint/go}/bin/fake-gcs-server (~35 MB; the
#          module and build caches are removed once it is built)
# Version: github.com/fsouza/fake-gcs-server v1.56.1, `go install` from the Go module proxy
#          (checked against the checksum database, as go does by default).
# Cost:    about 2.2 minutes from nothing on 2 cores (downloads + compile; bench/README.md
#          "Test servers"), well under a second when ready.
# Needs:   go >= 1.26 (on PATH or /usr/local/go/bin), network access to the Go module proxy.
#
# Protocol: 1. take an exclusive lock ("$DIR.lock") so concurrent runs install once;
#           2. if the marker holds $VERSION and the binary exists, print it and stop;
#           3. otherwise go install into $DIR/bin, then write the marker last.
#
# Failure policy: under SHARDPOINT_REQUIRE_ORACLES=1 any failure exits non-zero. Otherwise it
# warns and exits 0 without printing a path; the tests on fake-gcs-server then skip.
set -uo pipefail

DIR="${SHARDPOINT_GO_CACHE:-/var/cache/shardpoint/go}"
MODULE="github.com/fsouza/fake-gcs-server"
VERSION="$MODULE@v1.56.1"
MARKER="$DIR/.shardpoint-fake-gcs-done"
BIN="$DIR/bin/fake-gcs-server"

TAG="setup-fake-gcs"
WHAT="fake-gcs-server"
# shellcheck source=scripts/server-cache.sh
source "$(dirname "${BASH_SOURCE[0]}")/server-cache.sh"
take_cache_lock
print_if_cached
GO="$(command -v go || true)"
[[ -z "$GO" && -x /usr/local/go/bin/go ]] && GO=/usr/local/go/bin/go
[[ -n "$GO" ]] || give_up "go not found (a Go >= 1.26 toolchain on PATH)"
echo "setup-fake-gcs: go install $VERSION into $DIR/bin (about 2 minutes on 2 cores)" >&2
work="$(mktemp -d "${TMPDIR:-/tmp}/shardpoint-fake-gcs.XXXXXX")" || give_up "mktemp failed"
# Private module and build caches (removed after: only the binary is kept); GOTOOLCHAIN=local
# so go never fetches another toolchain; -trimpath so the binary names no build folder.
GOMODCACHE="$work/mod" GOCACHE="$work/cache" GOPATH="$work/path" GOBIN="$DIR/bin" GOFLAGS="-modcacherw -trimpath" \
  GOTOOLCHAIN=local timeout 1200 nice -n 5 "$GO" install -ldflags="-s -w" "$VERSION" >&2
status=$?
rm -rf "$work"
[[ $status -eq 0 ]] || give_up "go install $VERSION failed"
finish_install
