#!/usr/bin/env bash
# A/B: runsync echo at 64 and 1 connections, GET /v2/network-volumes at 64, old vs new serve, alternating.
set -u
# Usage: OLD=path/to/old/gantry NEW=target/release/gantry bash bench/ab-serve.sh
# Build the old one from a worktree, e.g.:
#   git worktree add /tmp/old <commit> && (cd /tmp/old && CARGO_TARGET_DIR=/tmp/old-target cargo build --release -p gantry)
OLD=${OLD:?set OLD to the old gantry binary}
NEW=${NEW:-target/release/gantry}
LUA=$(mktemp)
cat > "$LUA" <<'LUA'
wrk.method = "POST"
wrk.body = '{"input":{"prompt":"hi"}}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. os.getenv("KEY")
LUA
run_one() { # bin label
  local bin=$1 label=$2 dir; dir=$(mktemp -d)
  GANTRY_DATA_DIR=$dir GANTRY_LOG=warn GANTRY_SCHEDULER__BUNDLED_WORKERS='[gantry-echo]' \
  GANTRY_RATE_LIMITS__PUBLIC__MINUTE=100000000 GANTRY_RATE_LIMITS__PUBLIC__HOUR=100000000 GANTRY_RATE_LIMITS__PUBLIC__DAY=100000000 \
  GANTRY_RATE_LIMITS__MANAGEMENT__MINUTE=100000000 GANTRY_RATE_LIMITS__MANAGEMENT__HOUR=100000000 GANTRY_RATE_LIMITS__MANAGEMENT__DAY=100000000 \
  GANTRY_MANAGEMENT_ADDR=127.0.0.1:38080 GANTRY_PUBLIC_ADDR=127.0.0.1:38081 GANTRY_SCHEDULER__ADDR=127.0.0.1:35051 \
    "$bin" serve > "$dir/out" 2> "$dir/err" &
  local pid=$!
  for _ in $(seq 1 100); do curl -sf http://127.0.0.1:38080/healthz >/dev/null && break; sleep 0.1; done
  sleep 0.5
  export KEY; KEY=$(grep -o "gk_[A-Za-z0-9_]*" "$dir/out" | head -1)
  local r64 r1 p50 vol
  r64=$(wrk -t2 -c64 -d8s -s "$LUA" http://127.0.0.1:38081/v2/gantry-echo/runsync | awk '/Requests\/sec/{print $2}')
  read -r r1 p50 < <(wrk -t1 -c1 -d5s --latency -s "$LUA" http://127.0.0.1:38081/v2/gantry-echo/runsync | awk '/Requests\/sec/{r=$2} /^ +50%/{p=$2} END{print r, p}')
  vol=$(wrk -t2 -c64 -d5s -H "Authorization: Bearer $KEY" http://127.0.0.1:38080/v2/network-volumes | awk '/Requests\/sec/{print $2}')
  kill $pid; wait $pid 2>/dev/null
  echo "$label runsync@64=$r64 runsync@1=$r1 p50@1=$p50 volumes@64=$vol"
  rm -rf "$dir"
}
for round in 1 2 3; do
  run_one "$OLD" old
  run_one "$NEW" new
done
