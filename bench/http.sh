#!/usr/bin/env bash
# HTTP benchmark of the management API against a bare actix-web baseline, plus the idle
# footprint and start-up time of `gantry serve`. Needs wrk (apt-get install wrk).
#   bash bench/http.sh            # embedded mode (SQLite, in-memory limiter)
#   REDIS_URL=redis://127.0.0.1:6379 bash bench/http.sh   # also with the Redis limiter
# Environment: DURATION (default 10s), CONNECTIONS (default 64), WORKERS (default: cores).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v wrk >/dev/null || { echo "wrk is needed: apt-get install wrk" >&2; exit 1; }
DURATION=${DURATION:-10s}
CONNECTIONS=${CONNECTIONS:-64}
WORKERS=${WORKERS:-$(nproc)}
MGMT=127.0.0.1:18080
PUBLIC=127.0.0.1:18081
BARE=127.0.0.1:18090

cargo build --release -q -p gantry --bin gantry
cargo build --release -q -p gantry-api --example bare_json
BIN=target/release/gantry
DATA=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$DATA"; }
trap cleanup EXIT

export GANTRY_DATA_DIR=$DATA GANTRY_LOG=warn GANTRY_HTTP__WORKERS=$WORKERS GANTRY_SCHEDULER__ADDR=127.0.0.1:0
# The management API is measured with the echo model only (no text model to load or fetch).
export GANTRY_SCHEDULER__BUNDLED_WORKERS="[gantry-echo]"
wait_up() { for _ in $(seq 1 2000); do curl -sf "http://$1/healthz" >/dev/null 2>&1 && return 0; sleep 0.001; done; return 1; }
rss_mib() { awk '/VmRSS/ {printf "%.1f", $2/1024}' "/proc/$1/status"; }

start_gantry() {
  local t0 t1
  t0=$(date +%s%N)
  GANTRY_MANAGEMENT_ADDR=$MGMT GANTRY_PUBLIC_ADDR=$PUBLIC "$BIN" serve >"$DATA/serve.out" 2>"$DATA/serve.err" &
  GANTRY_PID=$!; pids+=("$GANTRY_PID")
  wait_up "$MGMT"
  t1=$(date +%s%N)
  echo "start-up: first answer $(( (t1 - t0) / 1000000 )) ms after launch"
}

stop_gantry() { kill "$GANTRY_PID"; wait "$GANTRY_PID" 2>/dev/null || true; }

run_wrk() { # label url [header]
  echo "--- $1"
  if [ -n "${3:-}" ]; then
    wrk -t2 -c"$CONNECTIONS" -d"$DURATION" --latency -H "$3" "$2" | grep -E 'Requests/sec|Latency|50%|99%|Non-2xx'
  else
    wrk -t2 -c"$CONNECTIONS" -d"$DURATION" --latency "$2" | grep -E 'Requests/sec|Latency|50%|99%|Non-2xx'
  fi
}

bench_gantry() { # label
  "$BIN" users create bench@example.test >/dev/null 2>&1 || true
  "$BIN" users set-limits bench@example.test --minute 1000000000 --hour 1000000000 --day 1000000000 >/dev/null
  local key
  key=$("$BIN" keys create --user bench@example.test --scopes all 2>/dev/null)
  for n in 1 2 3; do
    curl -sf -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
      -d "{\"name\":\"bench\",\"size\":50,\"dataCenter\":\"EU-RO-1\"}" "http://$MGMT/v2/network-volumes" >/dev/null
  done
  run_wrk "$1: GET /v2/network-volumes (3 volumes), valid key" "http://$MGMT/v2/network-volumes" "Authorization: Bearer $key"
}

echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo); $CONNECTIONS connections, $DURATION, $WORKERS HTTP workers"
start_gantry
sleep 1
echo "idle RSS of gantry serve: $(rss_mib "$GANTRY_PID") MiB"
bench_gantry "gantry (SQLite, in-memory limiter)"
echo "RSS after load: $(rss_mib "$GANTRY_PID") MiB"
stop_gantry

if [ -n "${REDIS_URL:-}" ]; then
  GANTRY_REDIS_URL=$REDIS_URL start_gantry
  bench_gantry "gantry (SQLite, Redis limiter at $REDIS_URL)"
  stop_gantry
fi

target/release/examples/bare_json "$BARE" "$WORKERS" &
pids+=("$!")
for _ in $(seq 1 500); do curl -sf "http://$BARE/v2/network-volumes" >/dev/null 2>&1 && break; sleep 0.01; done
run_wrk "bare actix-web JSON route (baseline)" "http://$BARE/v2/network-volumes"
