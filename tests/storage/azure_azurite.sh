#!/usr/bin/env bash
# ctest fixture for storage_azure_test: one Azurite shared by the test processes.
#
#   azure_azurite.sh start STATE_DIR   # install (scripts/setup-azurite.sh), start on a free
#                                      # 127.0.0.1 port, write STATE_DIR/{endpoint,pid}
#   azure_azurite.sh stop STATE_DIR    # kill that PID, remove STATE_DIR
#
# Without Azurite (no npm, no network) `start` warns and exits 0 writing no endpoint: the
# tests then skip. Under SHARDPOINT_REQUIRE_ORACLES=1 it fails instead.
set -uo pipefail
cmd="${1:?start|stop}"
state="${2:?state dir}"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"

fail() {
  echo "azure_azurite: $*" >&2
  if [[ "${SHARDPOINT_REQUIRE_ORACLES:-}" == "1" ]]; then exit 1; fi
  echo "azure_azurite: WARNING: Azure tests will be skipped" >&2
  exit 0
}

stop() {
  if [[ -f "$state/pid" ]]; then
    pid="$(cat "$state/pid")"
    if [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null
    fi
  fi
  rm -rf "$state"
}

case "$cmd" in
  stop) stop; exit 0 ;;
  start) ;;
  *) echo "usage: $0 start|stop STATE_DIR" >&2; exit 2 ;;
esac

stop  # a leftover from an interrupted run
mkdir -p "$state/data"
bin="${SHARDPOINT_AZURITE_BIN:-$("$root/scripts/setup-azurite.sh")}" || exit 1
[[ -n "$bin" && -x "$bin" ]] || fail "azurite-blob unavailable"
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
# setsid: the server outlives this script (ctest runs the tests after it returns).
setsid "$bin" --blobHost 127.0.0.1 --blobPort "$port" --location "$state/data" \
  --skipApiVersionCheck --loose --disableTelemetry > "$state/azurite.log" 2>&1 < /dev/null &
echo $! > "$state/pid"
for _ in $(seq 600); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "http://127.0.0.1:$port" > "$state/endpoint"
    echo "azure_azurite: Azurite on 127.0.0.1:$port (pid $(cat "$state/pid"))"
    exit 0
  fi
  kill -0 "$(cat "$state/pid")" 2>/dev/null || break
  sleep 0.1
done
cat "$state/azurite.log" >&2
stop
fail "Azurite did not start"
