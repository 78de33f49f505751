#!/usr/bin/env bash
# Benchmark of kokoro-hibari as a user sees it, beside the hibari-tts package
# itself (Python: its G2P, onnxruntime, its numpy vocoder) on the same text, in
# the same run:
#   (a) the release `gantry serve` in its own process (kokoro-hibari bundled,
#       SESSIONS graph sessions of 1 intra-op thread each), loaded through
#       /runsync by client.py at 1 and 4 concurrent requests: real-time factor
#       (wall / audio) with G2P, graph, vocoder, WAV, chunks, file storage and
#       the signed URL included; and first-chunk latency of a short sentence
#       (POST /run, then SSE until the first `event: chunk`);
#   (b) the engine in process (examples/hibari_bench.rs) and the package in
#       Python (hibari_python.py), 1 thread per session, 1 and 4 concurrent
#       readings: times real time, and the time to the first sentence's audio.
#
#   bench/speech/hibari.sh        # results in /tmp/gantry-bench-hibari
#
# Needs the model (gantry models pull kokoro-hibari), pip (the package's wheel
# is fetched once, never installed), and python3 with numpy and onnxruntime.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
REQUESTS_1="${REQUESTS_1:-16}"
REQUESTS_4="${REQUESTS_4:-32}"
SESSIONS="${SESSIONS:-$(nproc)}"
OUT_DIR="${OUT_DIR:-/tmp/gantry-bench-hibari}"
PUBLIC_ADDR="${PUBLIC_ADDR:-127.0.0.1:18381}"
MODELS_DIR="${GANTRY_MODELS_DIR:-$HOME/.cache/gantry/models}"
MODEL=kokoro-hibari
TEXT="${TEXT:-The old lighthouse keeper climbed the stairs every evening at dusk. He trimmed the wick, polished the great lens, and watched the ships pass safely by. Nobody in the village remembered a night when the light had failed.}"
SHORT="${SHORT:-Hello, how can I help you today?}"
log() { echo "hibari.sh: $*" >&2; }
target="${CARGO_TARGET_DIR:-$repo/target}"
mkdir -p "$OUT_DIR"
[ -f "$MODELS_DIR/$MODEL/hibari.onnx" ] || { log "no model in $MODELS_DIR/$MODEL (gantry models pull $MODEL)"; exit 1; }
WHEEL="$OUT_DIR/hibari_tts-0.2.1-py3-none-any.whl"
[ -f "$WHEEL" ] || python3 -m pip download -q --no-deps hibari-tts==0.2.1 -d "$OUT_DIR"

log "building the release binary and the engine example (cargo build --release)"
(cd "$repo" && cargo build -q --release -p gantry && cargo build -q --release -p gantry-model-speech --example hibari_bench)
BIN="$target/release/gantry"

# --- (a) the platform ------------------------------------------------------------------
DATA="$(mktemp -d /tmp/gantry-bench-hibari-data.XXXXXX)"
SERVER_PID=""
cleanup() {
    if [ -n "$SERVER_PID" ]; then kill -TERM "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
    [ -f "$DATA/serve.log" ] && cp "$DATA/serve.log" "$OUT_DIR/serve.log"
    rm -rf "$DATA"
}
trap cleanup EXIT
(
    cd "$DATA"
    export GANTRY_DATA_DIR="$DATA" GANTRY_MODELS_DIR="$MODELS_DIR" \
        GANTRY_SCHEDULER__BUNDLED_WORKERS="[$MODEL]" GANTRY_SCHEDULER__BUNDLED_SLOTS=4 \
        GANTRY_SPEECH__THREADS=1 GANTRY_SPEECH__SESSIONS="$SESSIONS" \
        GANTRY_MANAGEMENT_ADDR=127.0.0.1:18380 GANTRY_PUBLIC_ADDR="$PUBLIC_ADDR" GANTRY_SCHEDULER__ADDR=127.0.0.1:15351 \
        GANTRY_RATE_LIMITS__PUBLIC__MINUTE=100000000 GANTRY_RATE_LIMITS__PUBLIC__HOUR=100000000 GANTRY_RATE_LIMITS__PUBLIC__DAY=100000000
    exec "$BIN" serve >"$DATA/serve.log" 2>&1
) &
SERVER_PID=$!
KEY=""
for i in $(seq 1 600); do
    kill -0 "$SERVER_PID" 2>/dev/null || { log "the server exited"; tail -n 30 "$DATA/serve.log" >&2; exit 1; }
    [ -n "$KEY" ] || KEY="$(grep -o 'gk_[A-Za-z0-9_-]*' "$DATA/serve.log" | head -n1 || true)"
    if [ -n "$KEY" ] && curl -sf -m 30 -o /dev/null -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
        -d '{"input":{"prompt":"Warming up."}}' "http://$PUBLIC_ADDR/v2/$MODEL/runsync"; then
        break
    fi
    [ "$i" = 600 ] && { log "the server did not come up"; exit 1; }
    sleep 0.1
done
: >"$OUT_DIR/results.jsonl"
python3 "$here/client.py" rtf "http://$PUBLIC_ADDR" "$KEY" "$MODEL" "$TEXT" 1 "$REQUESTS_1" | tee -a "$OUT_DIR/results.jsonl"
python3 "$here/client.py" rtf "http://$PUBLIC_ADDR" "$KEY" "$MODEL" "$TEXT" 4 "$REQUESTS_4" | tee -a "$OUT_DIR/results.jsonl"
python3 "$here/client.py" first-chunk "http://$PUBLIC_ADDR" "$KEY" "$MODEL" "$SHORT" 10 | tee -a "$OUT_DIR/results.jsonl"
RSS_KB="$(awk '/VmRSS/ {print $2}' "/proc/$SERVER_PID/status")"
echo "{\"what\": \"gantry serve RSS after the load\", \"rss_mib\": $((RSS_KB / 1024))}" | tee -a "$OUT_DIR/results.jsonl"
kill -TERM "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true; SERVER_PID=""

# --- (b) the engine in process, and the package in Python, same text and threads ----------
for concurrency in 1 4; do
    requests=$([ "$concurrency" = 1 ] && echo "$REQUESTS_1" || echo "$REQUESTS_4")
    "$target/release/examples/hibari_bench" "$MODELS_DIR/$MODEL" 1 "$concurrency" "$requests" "$TEXT" "$SHORT" | tee -a "$OUT_DIR/results.jsonl"
    python3 "$here/hibari_python.py" "$WHEEL" 1 "$concurrency" "$requests" "$TEXT" "$SHORT" | tee -a "$OUT_DIR/results.jsonl"
done
log "results in $OUT_DIR/results.jsonl ($(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
