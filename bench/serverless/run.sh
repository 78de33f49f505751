#!/usr/bin/env bash
# Serverless endpoints: cold start on Docker, per-job cost and throughput of
# the RunPod worker protocol beside a minimal in-memory server of it, and
# Gantry's memory per idle endpoint (bench/serverless/run.py says how).
# Usage: bench/serverless/run.sh [gantry binary]   (default target/release/gantry)
# Needs root (the private test engine): scripts/test-docker.sh starts it.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin="${1:-target/release/gantry}"
[ -x "$bin" ] || { echo "no gantry binary at $bin: cargo build --release first" >&2; exit 1; }
line="$(bash scripts/test-docker.sh start </dev/null | tail -n1)"
export DOCKER_HOST="${line#DOCKER_HOST=}"
python="$(bash scripts/test-docker.sh venv </dev/null | tail -n1)"
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
exec "$python" bench/serverless/run.py "$bin"
