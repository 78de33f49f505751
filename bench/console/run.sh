#!/usr/bin/env bash
# The web console's server render time: the release binary as its own
# process, a user with 1,000 jobs in their history signed in, each page
# loaded by wrk at 1 connection (p50 and p99 of the whole request over
# loopback) and at 8 connections (pages per second); and each page's size.
# Usage: bench/console/run.sh [gantry binary]   (default target/release/gantry)
# Environment: DURATION (default 10s), JOBS (default 1000).
set -euo pipefail
cd "$(dirname "$0")/../.."
bin="${1:-target/release/gantry}"
[ -x "$bin" ] || { echo "no gantry binary at $bin: cargo build --release -p gantry first" >&2; exit 1; }
command -v wrk >/dev/null || { echo "wrk is needed: apt-get install wrk" >&2; exit 1; }
DURATION=${DURATION:-10s}
JOBS=${JOBS:-1000}
MGMT=127.0.0.1:38180
PUBLIC=127.0.0.1:38181
DATA=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$DATA"; }
trap cleanup EXIT

export GANTRY_DATA_DIR=$DATA GANTRY_LOG=warn GANTRY_SCHEDULER__ADDR=127.0.0.1:0 \
  GANTRY_SCHEDULER__BUNDLED_WORKERS="[gantry-echo]" GANTRY_PULL_ON_START=false
GANTRY_MANAGEMENT_ADDR=$MGMT GANTRY_PUBLIC_ADDR=$PUBLIC "$bin" serve >"$DATA/serve.out" 2>"$DATA/serve.err" &
pid=$!
for _ in $(seq 1 3000); do curl -sf "http://$MGMT/healthz" >/dev/null 2>&1 && break; sleep 0.01; done
for _ in $(seq 1 300); do grep -q 'with this password' "$DATA/serve.out" && break; sleep 0.01; done
key=$(grep -o 'gk_[A-Za-z0-9]*' "$DATA/serve.out" | head -n1)
password=$(grep -A2 'with this password' "$DATA/serve.out" | tail -n1 | tr -d ' ')
"$bin" users set-limits admin@localhost --exempt >/dev/null

echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "history: $JOBS echo jobs of the signed-in user"
python3 - "$PUBLIC" "$key" "$JOBS" <<'PY'
import http.client, json, sys
host, key, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
conn = http.client.HTTPConnection(host)
for i in range(n):
    conn.request("POST", "/v2/gantry-echo/runsync", json.dumps({"input": {"prompt": f"job {i}"}}),
                 {"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    res = conn.getresponse(); res.read()
    assert res.status == 200, res.status
PY

# Sign in as a browser does: the form's token and cookie, then the form.
jar="$DATA/cookies"
form=$(curl -s -c "$jar" "http://$MGMT/console/sign-in" | grep -o 'name="form" value="[0-9a-f]*"' | cut -d'"' -f4)
curl -s -b "$jar" -c "$jar" -o /dev/null --data-urlencode "email=admin@localhost" \
  --data-urlencode "password=$password" --data-urlencode "form=$form" "http://$MGMT/console/sign-in"
session=$(awk '$6 == "gantry_session" {print $7}' "$jar")
[ -n "$session" ] || { echo "sign-in failed" >&2; exit 1; }
cookie="Cookie: gantry_session=$session"

printf '%-28s %9s %9s %9s %10s\n' page bytes p50 p99 "pages/s@8"
for page in /console /console/jobs /console/billing /console/keys /console/volumes /console/playground/gantry-echo /console/admin; do
  bytes=$(curl -s -H "$cookie" -o /dev/null -w '%{size_download}' "http://$MGMT$page")
  read -r p50 p99 < <(wrk -t1 -c1 -d"$DURATION" --latency -H "$cookie" "http://$MGMT$page" |
    awk '/^ +50%/{a=$2} /^ +99%/{b=$2} END{print a, b}')
  rate=$(wrk -t2 -c8 -d"$DURATION" -H "$cookie" "http://$MGMT$page" | awk '/Requests\/sec/{print $2}')
  printf '%-28s %9s %9s %9s %10s\n' "$page" "$bytes" "$p50" "$p99" "$rate"
done
