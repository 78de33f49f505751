#!/usr/bin/env bash
# Idle memory of `gantry serve` with only the echo model: starts the binary as
# its own process on a fresh data dir (SQLite), waits until it answers, lets it
# idle, then prints its PSS and where it is (anonymous memory, the binary's own
# pages, shared libraries), its threads, and the anonymous regions over 1 MiB.
# Any MIMALLOC_* variable set by the caller passes through (see
# docs/benchmarks.md, "Idle memory").
# Usage: BIN=target/release/gantry [IDLE=10] [RUNS=3] bash bench/memory-idle.sh
set -euo pipefail
BIN=${BIN:-target/release/gantry}
IDLE=${IDLE:-10}
RUNS=${RUNS:-3}
for run in $(seq 1 "$RUNS"); do
  dir=$(mktemp -d)
  GANTRY_DATA_DIR=$dir GANTRY_SCHEDULER__BUNDLED_WORKERS='["gantry-echo"]' GANTRY_PULL_ON_START=false \
  GANTRY_MANAGEMENT_ADDR=127.0.0.1:18080 GANTRY_PUBLIC_ADDR=127.0.0.1:18081 GANTRY_SCHEDULER__ADDR=127.0.0.1:15051 \
    "$BIN" serve > "$dir/log" 2>&1 &
  pid=$!
  for _ in $(seq 1 150); do
    curl -s -o /dev/null http://127.0.0.1:18080/v2/openapi.json && break
    sleep 0.2
  done
  sleep "$IDLE"
  echo "run $run: PSS $(awk '/^Pss:/ {printf "%.1f MiB", $2/1024}' "/proc/$pid/smaps_rollup"), threads $(awk '/^Threads:/ {print $2}' "/proc/$pid/status")"
  awk '
    /^[0-9a-f]+-[0-9a-f]+ / { name = ($6 == "" ? "anonymous" : $6)
                              if (name ~ /gantry$/) name = "the binary"; else if (name ~ /\.so/) name = "shared libraries" }
    /^Pss:/ { pss[name] += $2 }
    END { for (n in pss) if (pss[n] >= 512) printf "  %-18s %6.1f MiB\n", n, pss[n] / 1024 }' "/proc/$pid/smaps" | sort -k2 -rn
  awk '/^[0-9a-f]+-[0-9a-f]+ / { region = $1; anon = ($6 == "") }
       /^Rss:/ { if (anon && $2 > 1024) printf "  anonymous region %s: %.1f MiB resident\n", region, $2 / 1024 }' "/proc/$pid/smaps"
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  rm -rf "$dir"
done
