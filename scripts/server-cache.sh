# Sourced by the setup scripts of the object-store test servers (setup-azurite.sh,
# setup-s3s.sh, setup-fake-gcs.sh): the cache protocol they share. The caller sets
#   TAG      the script's name for messages ("setup-s3s")
#   WHAT     what the server is, for the warning ("s3s-fs")
#   DIR      the cache folder; "$DIR.lock" is its lock
#   VERSION  what is installed, as the marker records it
#   MARKER   the marker file, written last, when the install is complete
#   BIN      the program the caller prints on stdout when ready
# then calls: take_cache_lock; print_if_cached; <install>; finish_install.
#
# Failure policy (give_up): under SHARDPOINT_REQUIRE_ORACLES=1 any failure exits non-zero.
# Otherwise it warns and exits 0 without printing a path; the tests on that server skip.

give_up() {
  echo "$TAG: $*" >&2
  if [[ "${SHARDPOINT_REQUIRE_ORACLES:-}" == "1" ]]; then
    echo "$TAG: SHARDPOINT_REQUIRE_ORACLES=1, failing" >&2
    exit 1
  fi
  echo "$TAG: WARNING: $WHAT unavailable; the tests on it will be skipped" >&2
  exit 0
}

# An exclusive lock on "$DIR.lock" (fd 9, held until the script exits): concurrent runs
# install once.
take_cache_lock() {
  mkdir -p "$DIR" 2>/dev/null || give_up "cannot create $DIR"
  exec 9>"$DIR.lock" || give_up "cannot open lock $DIR.lock"
  flock -w 900 9 || give_up "timed out waiting for $DIR.lock"
}

# Prints $BIN and exits when the marker holds $VERSION and the program exists; otherwise
# removes the marker (an install is about to start) and returns.
print_if_cached() {
  if [[ -x "$BIN" && "$(cat "$MARKER" 2>/dev/null)" == "$VERSION" ]]; then
    echo "$BIN"
    exit 0
  fi
  rm -f "$MARKER"
}

# After the install: checks the program is there, writes the marker, prints $BIN.
finish_install() {
  [[ -x "$BIN" ]] || give_up "the install finished but $BIN is missing"
  echo "$VERSION" > "$MARKER"
  echo "$BIN"
}
