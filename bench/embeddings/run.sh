#!/usr/bin/env bash
# Sentence embeddings: the release binary as its own process serving
# all-minilm-l6-v2, loaded by wrk through the native runsync route, against
# sentence-transformers (PyTorch) on the same sentences, on the same CPU, in
# the same run. Figures are sentences per second:
#   batch 1   one sentence per request, one connection (what one caller sees);
#   batch 64  64 sentences per request, one connection;
#   1 x 8     one sentence per request, 8 connections at once (the engine
#             batches concurrent requests together; the peer has no server,
#             so it has no figure here).
# Usage: bench/embeddings/run.sh [gantry binary]   (default target/release/gantry)
# Environment: DURATION (default 10s); PEER_PYTHON, a Python with
# sentence-transformers (default ~/.cache/gantry/venv-st/bin/python; make it
# with `python3 -m venv ~/.cache/gantry/venv-st && ~/.cache/gantry/venv-st/bin/pip
# install sentence-transformers`); GANTRY_MODELS_DIR (default ~/.cache/gantry/models,
# which must hold all-minilm-l6-v2: `gantry models pull all-minilm-l6-v2`).
set -euo pipefail
cd "$(dirname "$0")/../.."
bin="${1:-target/release/gantry}"
[ -x "$bin" ] || { echo "no gantry binary at $bin: cargo build --release -p gantry first" >&2; exit 1; }
command -v wrk >/dev/null || { echo "wrk is needed: apt-get install wrk" >&2; exit 1; }
DURATION=${DURATION:-10s}
PEER_PYTHON=${PEER_PYTHON:-$HOME/.cache/gantry/venv-st/bin/python}
MODELS=${GANTRY_MODELS_DIR:-$HOME/.cache/gantry/models}
MODEL=all-minilm-l6-v2
[ -f "$MODELS/$MODEL/model.safetensors" ] || { echo "$MODEL is not in $MODELS: gantry models pull $MODEL" >&2; exit 1; }
MGMT=127.0.0.1:38280
PUBLIC=127.0.0.1:38281
DATA=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$DATA"; }
trap cleanup EXIT

# The sentences: the reference set's short ones (not the 400-token one),
# cycled to 64; batch 1 uses the first.
python3 - "$DATA" <<'PY'
import json, sys
ref = json.load(open("crates/models/embed/tests/reference/reference.json"))
short = [s for s, ids in zip(ref["sentences"], ref["token_ids"]) if len(ids) < 64 and s]
batch = [short[i % len(short)] + ("" if i < len(short) else f" ({i})") for i in range(64)]
json.dump({"one": short[0], "batch": batch}, open(f"{sys.argv[1]}/sentences.json", "w"))
for name, value in (("one", short[0]), ("batch", batch)):
    with open(f"{sys.argv[1]}/{name}.json", "w") as f:
        json.dump({"input": {"input": value}}, f)
PY

export GANTRY_DATA_DIR=$DATA GANTRY_LOG=warn GANTRY_SCHEDULER__ADDR=127.0.0.1:0 \
  GANTRY_SCHEDULER__BUNDLED_WORKERS="[$MODEL]" GANTRY_PULL_ON_START=false GANTRY_MODELS_DIR=$MODELS
GANTRY_MANAGEMENT_ADDR=$MGMT GANTRY_PUBLIC_ADDR=$PUBLIC "$bin" serve >"$DATA/serve.out" 2>"$DATA/serve.err" &
pid=$!
for _ in $(seq 1 3000); do curl -sf "http://$MGMT/healthz" >/dev/null 2>&1 && break; sleep 0.01; done
for _ in $(seq 1 300); do grep -q 'gk_' "$DATA/serve.out" && break; sleep 0.01; done
key=$(grep -o 'gk_[A-Za-z0-9]*' "$DATA/serve.out" | head -n1)
"$bin" users set-limits admin@localhost --exempt >/dev/null
# Wait for the worker (the model loads in a second or two).
for _ in $(seq 1 600); do
  status=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
    --data-binary @"$DATA/one.json" "http://$PUBLIC/v2/$MODEL/runsync" || true)
  [ "$status" = 200 ] && break; sleep 0.1
done

cat >"$DATA/post.lua" <<LUA
wrk.method = "POST"
wrk.headers["Authorization"] = "Bearer $key"
wrk.headers["Content-Type"] = "application/json"
local f = io.open(os.getenv("BODY"), "r"); wrk.body = f:read("*a"); f:close()
LUA
url="http://$PUBLIC/v2/$MODEL/runsync"
rps() { BODY="$1" wrk -t"$2" -c"$3" -d"$DURATION" -s "$DATA/post.lua" "$url" | awk '/Requests\/sec/{print $2}'; }

echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
BODY="$DATA/one.json" wrk -t1 -c1 -d2s -s "$DATA/post.lua" "$url" >/dev/null   # warm-up
one=$(rps "$DATA/one.json" 1 1)
batch=$(rps "$DATA/batch.json" 1 1)
eight=$(rps "$DATA/one.json" 2 8)
read -r peer_one peer_batch peer_version < <("$PEER_PYTHON" bench/embeddings/peer.py "$MODELS/$MODEL" "$DATA/sentences.json" "${DURATION%s}")
awk -v one="$one" -v batch="$batch" -v eight="$eight" -v p1="$peer_one" -v p64="$peer_batch" -v pv="$peer_version" 'BEGIN {
  printf "%-10s %14s %18s %8s\n", "load", "gantry sent/s", "sentence-tf sent/s", "ratio"
  printf "%-10s %14.1f %18.1f %7.2fx\n", "batch 1", one, p1, one / p1
  printf "%-10s %14.1f %18.1f %7.2fx\n", "batch 64", batch * 64, p64, batch * 64 / p64
  printf "%-10s %14.1f %18s %8s\n", "1 x 8", eight, "-", "-"
  printf "peer: %s\n", pv
}'
