#!/usr/bin/env bash
# What a submit costs as its caller's queue grows: `gantry serve` with no
# worker (nothing drains), and wrk posting async echo jobs in 5 s phases at
# 64 connections, each phase starting on the queue the ones before it left.
# With credit required (the default), each submit is admitted against the
# holds of its caller's jobs in flight; the figure per phase shows whether
# that costs more the deeper the queue is. Each binary runs as its own
# process, one after the other, on a database of its own.
set -u
# Usage: BINS="old=/tmp/gantry-old new=target/release/gantry" [BACKEND=postgres] [PHASES=5] bash bench/deep-queue.sh
BINS=${BINS:?set BINS to label=path pairs}
BACKEND=${BACKEND:-postgres}
PHASES=${PHASES:-5}
PG_ADMIN_URL=${PG_ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres}
LUA=$(mktemp)
cat > "$LUA" <<'LUA'
wrk.method = "POST"
wrk.body = '{"input":{"prompt":"hi"}}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. os.getenv("KEY")
LUA
queued() {
  curl -sf -H "Authorization: Bearer $KEY" http://127.0.0.1:38081/v2/gantry-echo/health |
    python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"]; print(j["inQueue"])'
}
for pair in $BINS; do
  label=${pair%%=*} bin=${pair#*=} dir=$(mktemp -d) db_url="" db_name=""
  if [ "$BACKEND" = postgres ]; then
    db_name="gantry_deep_$$_$RANDOM"
    psql "$PG_ADMIN_URL" -qAtc "CREATE DATABASE $db_name" >/dev/null
    db_url="${PG_ADMIN_URL%/*}/$db_name"
  fi
  GANTRY_DATA_DIR=$dir GANTRY_LOG=warn GANTRY_SCHEDULER__BUNDLED_WORKERS='[]' \
  GANTRY_DATABASE_URL=$db_url GANTRY_PULL_ON_START=false \
  GANTRY_RATE_LIMITS__PUBLIC__MINUTE=100000000 GANTRY_RATE_LIMITS__PUBLIC__HOUR=100000000 GANTRY_RATE_LIMITS__PUBLIC__DAY=100000000 \
  GANTRY_RATE_LIMITS__MANAGEMENT__MINUTE=100000000 GANTRY_RATE_LIMITS__MANAGEMENT__HOUR=100000000 GANTRY_RATE_LIMITS__MANAGEMENT__DAY=100000000 \
  GANTRY_MANAGEMENT_ADDR=127.0.0.1:38080 GANTRY_PUBLIC_ADDR=127.0.0.1:38081 GANTRY_SCHEDULER__ADDR=127.0.0.1:35051 \
    "$bin" serve > "$dir/out" 2> "$dir/err" &
  pid=$!
  for _ in $(seq 1 100); do curl -sf http://127.0.0.1:38080/healthz >/dev/null && break; sleep 0.1; done
  sleep 0.5
  export KEY; KEY=$(grep -o "gk_[A-Za-z0-9_]*" "$dir/out" | head -1)
  if [ -z "$KEY" ]; then
    echo "$label: the server did not start:" >&2; tail -n 3 "$dir/err" >&2
    kill $pid 2>/dev/null; continue
  fi
  line="$label $BACKEND"
  for phase in $(seq 1 "$PHASES"); do
    depth=$(queued)
    rate=$(wrk -t2 -c64 -d5s -s "$LUA" http://127.0.0.1:38081/v2/gantry-echo/run | awk '/Requests\/sec/{print $2}')
    line="$line | from $depth queued: $rate submits/s"
  done
  echo "$line | $(queued) queued at the end"
  kill $pid; wait $pid 2>/dev/null
  rm -rf "$dir"
  [ -n "$db_name" ] && psql "$PG_ADMIN_URL" -qAtc "DROP DATABASE $db_name WITH (FORCE)" >/dev/null
done
rm -f "$LUA"
