#!/usr/bin/env bash
# Live-stream latency: how long a chunk takes from the worker that sends it to
# an SSE reader of `GET /v2/gantry-echo/stream/{id}`, with STREAMS streams at
# once, against the release `gantry serve` as its own process (bundled echo
# worker over loopback gRPC), on SQLite and, with PG_ADMIN_URL, PostgreSQL.
#
#   bench/stream/run.sh
#   BINS="target/release/gantry /tmp/gantry-old" ROUNDS=3 bench/stream/run.sh
#   PG_ADMIN_URL=postgres://postgres@127.0.0.1:5432/postgres bench/stream/run.sh
#   PG_ADMIN_URL=... REDIS_URL=redis://127.0.0.1:6379 bench/stream/run.sh
#       adds the split topology: `gantry api`, `gantry scheduler` and `gantry
#       worker` as three processes on PostgreSQL, the readers on the API
#       process, the chunks reaching it over Redis signals
#
# Environment (defaults): STREAMS=100 CHUNKS=200 INTERVAL_MS=20 ROUNDS=2
#   BACKENDS (sqlite, plus postgres with PG_ADMIN_URL, plus split with REDIS_URL too)
#   BINS (target/release/gantry, built if missing): binaries measured in
#   turn, round after round, so that old and new builds meet the same machine.
#   CLIENT=rust (gantry-bench-stream, bench/jobs/src/stream.rs, one thread) or
#   python (bench/stream/client.py: the same measurement, more client time
#   per event, which shows in the tail).
set -euo pipefail
cd "$(dirname "$0")/../.."
STREAMS=${STREAMS:-100}
CHUNKS=${CHUNKS:-200}
INTERVAL_MS=${INTERVAL_MS:-20}
ROUNDS=${ROUNDS:-2}
BINS=${BINS:-target/release/gantry}
MGMT=127.0.0.1:18080
PUBLIC=127.0.0.1:18081
CLIENT=${CLIENT:-rust}
[ -x target/release/gantry ] || cargo build --release -q -p gantry --bin gantry
[ "$CLIENT" != rust ] || cargo build --release -q -p gantry-bench-jobs --bin gantry-bench-stream

pids=()
DATA=""
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; [ -z "$DATA" ] || rm -rf "$DATA"; }
trap cleanup EXIT
wait_up() { for _ in $(seq 1 3000); do curl -sf "http://$1/healthz" >/dev/null 2>&1 && return 0; sleep 0.01; done; return 1; }

run_one() { # bin backend
  local bin=$1 backend=$2 key db_url=""
  DATA=$(mktemp -d)
  if [ "$backend" = postgres ]; then
    local name="gantry_stream_bench_$$"
    psql -q "$PG_ADMIN_URL" -c "DROP DATABASE IF EXISTS $name" -c "CREATE DATABASE $name" >/dev/null
    db_url="${PG_ADMIN_URL%/*}/$name"
  fi
  export GANTRY_DATA_DIR=$DATA GANTRY_LOG=warn GANTRY_SCHEDULER__ADDR=127.0.0.1:0 \
    GANTRY_SCHEDULER__BUNDLED_WORKERS="[gantry-echo]" GANTRY_SCHEDULER__BUNDLED_SLOTS=$((STREAMS + 8)) \
    GANTRY_BILLING__REQUIRE_CREDIT=false
  if [ -n "$db_url" ]; then export GANTRY_DATABASE_URL=$db_url; else unset GANTRY_DATABASE_URL; fi
  "$bin" users create bench@example.test >/dev/null 2>&1 || true
  "$bin" users set-limits bench@example.test --minute 1000000000 --hour 1000000000 --day 1000000000 >/dev/null
  key=$("$bin" keys create --user bench@example.test --scopes all 2>/dev/null)
  GANTRY_MANAGEMENT_ADDR=$MGMT GANTRY_PUBLIC_ADDR=$PUBLIC "$bin" serve >"$DATA/serve.log" 2>&1 &
  local pid=$!; pids+=("$pid")
  wait_up "$MGMT"
  local result
  local client=(target/release/gantry-bench-stream)
  [ "$CLIENT" = rust ] || client=(python3 bench/stream/client.py)
  result=$("${client[@]}" --base "$PUBLIC" --key "$key" --streams "$STREAMS" \
    --chunks "$CHUNKS" --interval-ms "$INTERVAL_MS")
  local rss; rss=$(awk '/VmHWM/ {printf "%.0f", $2/1024}' "/proc/$pid/status")
  kill "$pid"; wait "$pid" 2>/dev/null || true
  echo "{\"bin\": \"$bin\", \"backend\": \"$backend\", \"peak_rss_mib\": $rss, \"result\": $result}"
  rm -rf "$DATA"; DATA=""
  if [ "$backend" = postgres ]; then psql -q "$PG_ADMIN_URL" -c "DROP DATABASE IF EXISTS gantry_stream_bench_$$" >/dev/null; fi
}

run_split() { # bin
  local bin=$1 key name="gantry_stream_bench_$$" sched=127.0.0.1:15061
  DATA=$(mktemp -d)
  psql -q "$PG_ADMIN_URL" -c "DROP DATABASE IF EXISTS $name" -c "CREATE DATABASE $name" >/dev/null
  export GANTRY_DATA_DIR=$DATA GANTRY_LOG=warn GANTRY_DATABASE_URL="${PG_ADMIN_URL%/*}/$name" \
    GANTRY_REDIS_URL=$REDIS_URL GANTRY_SCHEDULER__SIGNAL_CHANNEL="gantry-stream-bench:$$" \
    GANTRY_SCHEDULER__WORKER_SECRET=stream-bench-secret GANTRY_SCHEDULER__BUNDLED_WORKERS="[]" \
    GANTRY_BILLING__REQUIRE_CREDIT=false
  "$bin" users create bench@example.test >/dev/null 2>&1 || true
  "$bin" users set-limits bench@example.test --minute 1000000000 --hour 1000000000 --day 1000000000 >/dev/null
  key=$("$bin" keys create --user bench@example.test --scopes all 2>/dev/null)
  GANTRY_MANAGEMENT_ADDR=$MGMT GANTRY_PUBLIC_ADDR=$PUBLIC "$bin" api >"$DATA/api.log" 2>&1 &
  local api=$!; pids+=("$api")
  GANTRY_SCHEDULER__ADDR=$sched "$bin" scheduler >"$DATA/scheduler.log" 2>&1 &
  pids+=("$!")
  for _ in $(seq 1 3000); do (exec 3<>"/dev/tcp/${sched%:*}/${sched#*:}") 2>/dev/null && break; sleep 0.01; done
  "$bin" worker --model gantry-echo --scheduler "http://$sched" --slots $((STREAMS + 8)) --id stream-bench \
    >"$DATA/worker.log" 2>&1 &
  pids+=("$!")
  wait_up "$MGMT"
  sleep 1
  local result client=(target/release/gantry-bench-stream)
  [ "$CLIENT" = rust ] || client=(python3 bench/stream/client.py)
  result=$("${client[@]}" --base "$PUBLIC" --key "$key" --streams "$STREAMS" \
    --chunks "$CHUNKS" --interval-ms "$INTERVAL_MS")
  local rss; rss=$(awk '/VmHWM/ {printf "%.0f", $2/1024}' "/proc/$api/status")
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  pids=()
  echo "{\"bin\": \"$bin\", \"backend\": \"split: api + scheduler + worker, PostgreSQL, Redis\", \"peak_rss_mib\": $rss, \"result\": $result}"
  rm -rf "$DATA"; DATA=""
  unset GANTRY_REDIS_URL GANTRY_SCHEDULER__SIGNAL_CHANNEL GANTRY_SCHEDULER__WORKER_SECRET
  psql -q "$PG_ADMIN_URL" -c "DROP DATABASE IF EXISTS $name" >/dev/null
}

echo "# $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "# $STREAMS streams x $CHUNKS chunks, $INTERVAL_MS ms apart"
backends="${BACKENDS:-sqlite}"
[ -n "${BACKENDS:-}" ] || [ -z "${PG_ADMIN_URL:-}" ] || backends="sqlite postgres"
[ -n "${BACKENDS:-}" ] || [ -z "${PG_ADMIN_URL:-}" ] || [ -z "${REDIS_URL:-}" ] || backends="$backends split"
for round in $(seq 1 "$ROUNDS"); do
  for backend in $backends; do
    for bin in $BINS; do
      echo "# round $round"
      if [ "$backend" = split ]; then run_split "$bin"; else run_one "$bin" "$backend"; fi
    done
  done
done
