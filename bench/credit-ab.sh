#!/usr/bin/env bash
# A/B of credit admission: the same release `gantry serve`, with
# billing.require_credit on and off, alternating, three rounds. Measures
# runsync echo at 64 and 1 connections with wrk (what admission costs: one
# transaction per submit that locks the user's account row, and no unstored
# fast lane for runsync).
# Usage: BIN=target/release/gantry bash bench/credit-ab.sh
set -u
BIN=${BIN:-target/release/gantry}
LUA=$(mktemp)
cat > "$LUA" <<'LUA'
wrk.method = "POST"
wrk.body = '{"input":{"prompt":"hi"}}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. os.getenv("KEY")
LUA
run_one() { # require_credit label
  local credit=$1 label=$2 dir; dir=$(mktemp -d)
  GANTRY_DATA_DIR=$dir GANTRY_LOG=warn GANTRY_SCHEDULER__BUNDLED_WORKERS='[gantry-echo]' \
  GANTRY_BILLING__REQUIRE_CREDIT=$credit \
  GANTRY_RATE_LIMITS__PUBLIC__MINUTE=100000000 GANTRY_RATE_LIMITS__PUBLIC__HOUR=100000000 GANTRY_RATE_LIMITS__PUBLIC__DAY=100000000 \
  GANTRY_MANAGEMENT_ADDR=127.0.0.1:38080 GANTRY_PUBLIC_ADDR=127.0.0.1:38081 GANTRY_SCHEDULER__ADDR=127.0.0.1:35051 \
    "$BIN" serve > "$dir/out" 2> "$dir/err" &
  local pid=$!
  for _ in $(seq 1 100); do curl -sf http://127.0.0.1:38080/healthz >/dev/null && break; sleep 0.1; done
  sleep 0.5
  export KEY; KEY=$(grep -o "gk_[A-Za-z0-9_]*" "$dir/out" | head -1)
  local r64 r1 p50
  r64=$(wrk -t2 -c64 -d8s -s "$LUA" http://127.0.0.1:38081/v2/gantry-echo/runsync | awk '/Requests\/sec/{print $2}')
  read -r r1 p50 < <(wrk -t1 -c1 -d5s --latency -s "$LUA" http://127.0.0.1:38081/v2/gantry-echo/runsync | awk '/Requests\/sec/{r=$2} /^ +50%/{p=$2} END{print r, p}')
  kill $pid; wait $pid 2>/dev/null
  echo "$label runsync@64=$r64 runsync@1=$r1 p50@1=$p50"
  rm -rf "$dir"
}
for round in 1 2 3; do
  run_one false credit-off
  run_one true credit-on
done
rm -f "$LUA"
