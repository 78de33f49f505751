#!/usr/bin/env bash
# The server's own CPU time per request, old against new: two `gantry serve` release binaries,
# alternating (odd rounds old first), each as its own process with SQLite and the echo model,
# loaded by `wrk -c1` on runsync for 5 s after a 2 s warm-up. The process's utime + stime is
# read from /proc around the run. On a VM whose speed drifts, CPU per request moves less than
# throughput; the p50 of the same run is printed beside it.
# Usage: OLD=/tmp/gantry-old NEW=/tmp/gantry-new [ROUNDS=6] bash bench/cpu-per-request.sh
set -u
OLD=${OLD:?set OLD to the old gantry binary}
NEW=${NEW:-target/release/gantry}
ROUNDS=${ROUNDS:-6}
for tool in wrk curl python3; do
  command -v "$tool" >/dev/null || { echo "cpu-per-request.sh: no $tool on PATH (Debian: apt-get install wrk curl python3)" >&2; exit 1; }
done
LUA=$(mktemp); cat > "$LUA" <<'LUA'
wrk.method = "POST"
wrk.body = '{"input":{"prompt":"hi"}}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. os.getenv("KEY")
LUA
tick=$(getconf CLK_TCK)
one() { # bin label
  local dir; dir=$(mktemp -d)
  GANTRY_DATA_DIR=$dir GANTRY_LOG=warn GANTRY_SCHEDULER__BUNDLED_WORKERS='[gantry-echo]' GANTRY_PULL_ON_START=false \
  GANTRY_RATE_LIMITS__PUBLIC__MINUTE=100000000 GANTRY_RATE_LIMITS__PUBLIC__HOUR=100000000 GANTRY_RATE_LIMITS__PUBLIC__DAY=100000000 \
  GANTRY_MANAGEMENT_ADDR=127.0.0.1:38080 GANTRY_PUBLIC_ADDR=127.0.0.1:38081 GANTRY_SCHEDULER__ADDR=127.0.0.1:35051 \
    "$1" serve > "$dir/out" 2> "$dir/err" &
  local pid=$!
  for _ in $(seq 1 100); do curl -sf http://127.0.0.1:38080/healthz >/dev/null && break; sleep 0.1; done
  sleep 0.5
  export KEY; KEY=$(grep -o "gk_[A-Za-z0-9_]*" "$dir/out" | head -1)
  wrk -t1 -c1 -d2s -s "$LUA" http://127.0.0.1:38081/v2/gantry-echo/runsync >/dev/null
  local before after n
  before=$(awk '{print $14+$15}' /proc/$pid/stat)
  n=$(wrk -t1 -c1 -d5s --latency -s "$LUA" http://127.0.0.1:38081/v2/gantry-echo/runsync | tee "$dir/wrk" | awk "/requests in/{print \$1}")
  after=$(awk '{print $14+$15}' /proc/$pid/stat)
  python3 -c "print('$2', $n, 'requests', round(($after-$before)/$tick/$n*1e6,1), 'us CPU per request', '$(awk '/^ +50%/{print $2}' "$dir/wrk")', 'p50')"
  kill $pid; wait $pid 2>/dev/null; rm -rf "$dir"
}
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then one "$OLD" old; one "$NEW" new; else one "$NEW" new; one "$OLD" old; fi
done
