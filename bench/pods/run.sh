#!/usr/bin/env bash
# Pods: time from POST /v2/pods to RUNNING beside `docker run -d` of the same
# image on the same engine, and GET /v2/pods of 100 pods (bench/pods/run.py).
# Usage: bench/pods/run.sh [gantry binary]   (default target/release/gantry)
# Needs root (the private test engine): scripts/test-docker.sh starts it.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin="${1:-target/release/gantry}"
[ -x "$bin" ] || { echo "no gantry binary at $bin: cargo build --release first" >&2; exit 1; }
line="$(bash scripts/test-docker.sh start </dev/null | tail -n1)"
export DOCKER_HOST="${line#DOCKER_HOST=}"
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
exec python3 bench/pods/run.py "$bin"
