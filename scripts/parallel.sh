# Sourced by the scripts that run independent jobs a few at a time (run-fuzzers.sh,
# run-sanitized-tests.sh).
#
#   run_in_parallel JOBS FUNCTION ITEM...
#
# Calls `FUNCTION ITEM` for every ITEM in the background, at most JOBS at once, and waits for
# all of them. Returns 1 when any call returned non-zero, after every call has finished.
run_in_parallel() {
  local jobs=$1 fn=$2 status=0 running=0 item
  shift 2
  for item in "$@"; do
    if ((running >= jobs)); then
      wait -n || status=1
      running=$((running - 1))
    fi
    "$fn" "$item" &
    running=$((running + 1))
  done
  while ((running > 0)); do
    wait -n || status=1
    running=$((running - 1))
  done
  return "$status"
}
