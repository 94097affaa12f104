#!/usr/bin/env bash
# Installs (once) and caches s3s-fs, the S3 server of the s3s project (Rust: SigV4 checked,
# multipart uploads, If-None-Match / If-Match, ranged GETs, objects as files) that the S3
# tests run on 127.0.0.1 beside moto. Prints the path of the s3s-fs binary on stdout.
#
#   scripts/setup-s3s.sh        # install if missing; quick when ready
#
# Where:   ${SHARDPOINT_CARGO_CACHE:-/var/cache/shardpoint/cargo}/bin/s3s-fs (~10 MB; the
#          downloaded crates and the build folder are removed once it is built)
# Version: s3s-fs 0.14.1 with --locked: 0.15 and later declare rustc >= 1.96 (here: 1.95).
# Cost:    about 3.2 minutes from nothing on 2 cores (cargo install: 200 crates, most of it
#          compiling; bench/README.md "Test servers"), well under a second when ready.
# Needs:   cargo + rustc >= 1.92 (on PATH or in ~/.cargo/bin), network access to crates.io.
#
# Protocol: 1. take an exclusive lock ("$DIR.lock") so concurrent runs install once;
#           2. if the marker holds $VERSION and the binary exists, print it and stop;
#           3. otherwise cargo install into $DIR, then write the marker last.
#
# Failure policy: under SHARDPOINT_REQUIRE_ORACLES=1 any failure exits non-zero. Otherwise it
# warns and exits 0 without printing a path; the tests on s3s-fs then skip.
set -uo pipefail

DIR="${SHARDPOINT_CARGO_CACHE:-/var/cache/shardpoint/cargo}"
CRATE="s3s-fs"
VERSION="s3s-fs 0.14.1 --features binary --locked"
MARKER="$DIR/.shardpoint-s3s-done"
BIN="$DIR/bin/s3s-fs"

TAG="setup-s3s"
WHAT="s3s-fs"
# shellcheck source=scripts/server-cache.sh
source "$(dirname "${BASH_SOURCE[0]}")/server-cache.sh"
take_cache_lock
print_if_cached
CARGO="$(command -v cargo || true)"
[[ -z "$CARGO" && -x "$HOME/.cargo/bin/cargo" ]] && CARGO="$HOME/.cargo/bin/cargo"
[[ -n "$CARGO" ]] || give_up "cargo not found (rustup, or a Rust >= 1.92 toolchain on PATH)"
export PATH="$(dirname "$CARGO"):$PATH"  # rustc beside cargo
echo "setup-s3s: cargo install $VERSION into $DIR (about 3 minutes on 2 cores)" >&2
work="$(mktemp -d "${TMPDIR:-/tmp}/shardpoint-s3s-build.XXXXXX")" || give_up "mktemp failed"
# A private CARGO_HOME (its download cache) and target folder, removed after: only the binary
# is kept, and the user's ~/.cargo is not touched.
CARGO_HOME="$work/home" CARGO_TARGET_DIR="$work/target" timeout 1200 nice -n 5 \
  "$CARGO" install "$CRATE" --version 0.14.1 --features binary --locked --root "$DIR" \
  -j "$(nproc)" --quiet >&2
status=$?
rm -rf "$work"
[[ $status -eq 0 ]] || give_up "cargo install $VERSION failed"
finish_install
