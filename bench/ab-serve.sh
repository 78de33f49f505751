#!/usr/bin/env bash
# A/B of two `gantry serve` release binaries, alternating, each as its own
# process loaded by wrk: runsync echo at 64 and 1 connections, GET
# /v2/network-volumes at 64, and async jobs (POST /run at 64 connections for
# 5 s, then until the queue has drained: completed jobs per second).
#
# The drain's end is found by one more job, posted after wrk's and claimed
# after them (the queue is first in, first out), whose status is read by id
# on one keep-alive connection; the health counts, which count every kept job
# of the caller, are read only to confirm. Polling them every 50 ms, as this
# script did before, made PostgreSQL read about 1 200 rows per job measured
# (a scan per poll), as much work as the jobs themselves.
set -u
# Usage: OLD=path/to/old/gantry NEW=target/release/gantry [BACKENDS="sqlite postgres"] [ROUNDS=3] bash bench/ab-serve.sh
# Build the old one from a worktree sharing this target dir, e.g.:
#   git worktree add /tmp/old <commit> && (cd /tmp/old && CARGO_TARGET_DIR=$PWD/target cargo build --release -p gantry) \
#     && cp target/release/gantry /tmp/gantry-old
# then, before building this tree into the same target dir:
#   find crates migrations bench -name '*.rs' -exec touch {} +
# (both trees' crates get the same unit hashes, and cargo would take the old
# tree's artifacts for fresh ones: check the new binary, e.g. its migrations).
OLD=${OLD:?set OLD to the old gantry binary}
NEW=${NEW:-target/release/gantry}
BACKENDS=${BACKENDS:-sqlite}
ROUNDS=${ROUNDS:-3}
PG_ADMIN_URL=${PG_ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres}
for tool in wrk curl python3; do
  command -v "$tool" >/dev/null || { echo "ab-serve.sh: no $tool on PATH (Debian: apt-get install wrk curl python3)" >&2; exit 1; }
done
[[ " $BACKENDS " != *" postgres "* ]] || command -v psql >/dev/null ||
  { echo "ab-serve.sh: no psql on PATH, which the postgres backend needs" >&2; exit 1; }
LUA=$(mktemp)
cat > "$LUA" <<'LUA'
wrk.method = "POST"
wrk.body = '{"input":{"prompt":"hi"}}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. os.getenv("KEY")
LUA
# Counts of the caller's jobs on the echo model: "<completed> <inQueue+inProgress>".
counts() {
  curl -sf -H "Authorization: Bearer $KEY" http://127.0.0.1:38081/v2/gantry-echo/health |
    python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"]; print(j["completed"], j["inQueue"]+j["inProgress"])'
}
# Waits for the queue to drain (see the top); prints "<completed> <when, in
# seconds since the epoch>", or nothing after 300 s.
drained() {
  python3 - <<'PY'
import http.client, json, os, time
key = os.environ["KEY"]
auth = {"Authorization": "Bearer " + key, "Content-Type": "application/json"}
conn = http.client.HTTPConnection("127.0.0.1", 38081)
def call(method, path, body=None):
    conn.request(method, path, body=body, headers=auth)
    reply = conn.getresponse()
    return json.loads(reply.read())
sentinel = call("POST", "/v2/gantry-echo/run", '{"input":{"prompt":"hi"}}')["id"]
deadline = time.time() + 300
while time.time() < deadline:
    if call("GET", f"/v2/gantry-echo/status/{sentinel}")["status"] == "COMPLETED":
        break
    time.sleep(0.01)
# The drain ended when the sentinel did, unless an earlier job still ran.
ended = time.time()
while time.time() < deadline:
    jobs = call("GET", "/v2/gantry-echo/health")["jobs"]
    if jobs["inQueue"] + jobs["inProgress"] == 0:
        print(jobs["completed"], ended)
        break
    time.sleep(0.05)
    ended = time.time()
PY
}
run_one() { # bin label backend
  local bin=$1 label=$2 backend=$3 dir db_url="" db_name=""; dir=$(mktemp -d)
  if [ "$backend" = postgres ]; then
    db_name="gantry_ab_$$_$RANDOM"
    psql "$PG_ADMIN_URL" -qAtc "CREATE DATABASE $db_name" >/dev/null
    db_url="${PG_ADMIN_URL%/*}/$db_name"
  fi
  GANTRY_DATA_DIR=$dir GANTRY_LOG=warn GANTRY_SCHEDULER__BUNDLED_WORKERS='[gantry-echo]' \
  GANTRY_DATABASE_URL=$db_url GANTRY_PULL_ON_START=false \
  GANTRY_RATE_LIMITS__PUBLIC__MINUTE=100000000 GANTRY_RATE_LIMITS__PUBLIC__HOUR=100000000 GANTRY_RATE_LIMITS__PUBLIC__DAY=100000000 \
  GANTRY_RATE_LIMITS__MANAGEMENT__MINUTE=100000000 GANTRY_RATE_LIMITS__MANAGEMENT__HOUR=100000000 GANTRY_RATE_LIMITS__MANAGEMENT__DAY=100000000 \
  GANTRY_MANAGEMENT_ADDR=127.0.0.1:38080 GANTRY_PUBLIC_ADDR=127.0.0.1:38081 GANTRY_SCHEDULER__ADDR=127.0.0.1:35051 \
    "$bin" serve > "$dir/out" 2> "$dir/err" &
  local pid=$!
  for _ in $(seq 1 100); do curl -sf http://127.0.0.1:38080/healthz >/dev/null && break; sleep 0.1; done
  sleep 0.5
  export KEY; KEY=$(grep -o "gk_[A-Za-z0-9_]*" "$dir/out" | head -1)
  local r64 r1 p50 vol start done_at completed left
  r64=$(wrk -t2 -c64 -d8s -s "$LUA" http://127.0.0.1:38081/v2/gantry-echo/runsync | awk '/Requests\/sec/{print $2}')
  read -r r1 p50 < <(wrk -t1 -c1 -d5s --latency -s "$LUA" http://127.0.0.1:38081/v2/gantry-echo/runsync | awk '/Requests\/sec/{r=$2} /^ +50%/{p=$2} END{print r, p}')
  vol=$(wrk -t2 -c64 -d5s -H "Authorization: Bearer $KEY" http://127.0.0.1:38080/v2/network-volumes | awk '/Requests\/sec/{print $2}')
  read -r before _ < <(counts)
  start=$(date +%s.%N)
  wrk -t2 -c64 -d5s -s "$LUA" http://127.0.0.1:38081/v2/gantry-echo/run >/dev/null
  if ! read -r completed done_at < <(drained); then
    echo "$label $backend: the queue did not drain in 300 s" >&2
    kill $pid; wait $pid 2>/dev/null; return 1
  fi
  local async; async=$(python3 -c "print(round(($completed - $before) / ($done_at - $start)))")
  kill $pid; wait $pid 2>/dev/null
  echo "$label $backend runsync@64=$r64 runsync@1=$r1 p50@1=$p50 volumes@64=$vol async_jobs/s=$async"
  rm -rf "$dir"
  [ -n "$db_name" ] && psql "$PG_ADMIN_URL" -qAtc "DROP DATABASE $db_name WITH (FORCE)" >/dev/null
}
# Odd rounds run old first, even rounds new first: this machine's speed
# drifts within minutes, and a fixed order would charge the drift to one side.
for round in $(seq 1 "$ROUNDS"); do
  for backend in $BACKENDS; do
    if [ $((round % 2)) = 1 ]; then
      run_one "$OLD" old "$backend"
      run_one "$NEW" new "$backend"
    else
      run_one "$NEW" new "$backend"
      run_one "$OLD" old "$backend"
    fi
  done
done
