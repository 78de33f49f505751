#!/usr/bin/env bash
# Benchmark of the speech model piper-en-us-joe as a user sees it, beside the same
# ONNX graph run by onnxruntime in Python, in the same run:
#   (a) the release `gantry serve` in its own process, loaded through /runsync by a
#       standard-library Python client at 1 and 4 concurrent requests (phonemes, ONNX
#       Runtime, WAV encoding, chunks, file storage and the signed URL included):
#       real-time factor = wall seconds / audio seconds;
#   (b) first-chunk latency for a short sentence: POST /run, then SSE until the first
#       `event: chunk`;
#   (c) onnxruntime in Python (python_ort.py) on the same phoneme ids (computed by the
#       worker's own code, `--example speech_ids`), same threads, 1 and 4 concurrent texts.
#
#   bench/speech/run.sh          # THREADS=2, results in /tmp/gantry-bench-speech
#
# Needs the voice (gantry models pull piper-en-us-joe), espeak-ng, and python3 with
# numpy and onnxruntime.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
THREADS="${THREADS:-$(nproc)}"
REQUESTS_1="${REQUESTS_1:-8}"
REQUESTS_4="${REQUESTS_4:-16}"
OUT_DIR="${OUT_DIR:-/tmp/gantry-bench-speech}"
PUBLIC_ADDR="${PUBLIC_ADDR:-127.0.0.1:18281}"
MODELS_DIR="${GANTRY_MODELS_DIR:-$HOME/.cache/gantry/models}"
MODEL=piper-en-us-joe
TEXT="${TEXT:-The old lighthouse keeper climbed the stairs every evening at dusk. He trimmed the wick, polished the great lens, and watched the ships pass safely by. Nobody in the village remembered a night when the light had failed.}"
SHORT="${SHORT:-Hello, how can I help you today?}"
log() { echo "run.sh: $*" >&2; }
target="${CARGO_TARGET_DIR:-$repo/target}"
mkdir -p "$OUT_DIR"
VOICE="$MODELS_DIR/$MODEL/en_US-joe-medium.onnx"
[ -f "$VOICE" ] || { log "no voice at $VOICE (gantry models pull $MODEL)"; exit 1; }

log "building the release binary and the id dump (cargo build --release)"
(cd "$repo" && cargo build -q --release -p gantry && cargo build -q --release -p gantry-model-speech --example speech_ids)
BIN="$target/release/gantry"
"$target/release/examples/speech_ids" "$VOICE.json" "$TEXT" >"$OUT_DIR/ids.json"
"$target/release/examples/speech_ids" "$VOICE.json" "$SHORT" >"$OUT_DIR/short-ids.json"

# --- (a), (b) the platform -------------------------------------------------------------
DATA="$(mktemp -d /tmp/gantry-bench-speech-data.XXXXXX)"
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
        GANTRY_SCHEDULER__BUNDLED_WORKERS="[$MODEL]" GANTRY_SPEECH__THREADS="$THREADS" \
        GANTRY_MANAGEMENT_ADDR=127.0.0.1:18280 GANTRY_PUBLIC_ADDR="$PUBLIC_ADDR" GANTRY_SCHEDULER__ADDR=127.0.0.1:15251 \
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
kill -TERM "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true; SERVER_PID=""

# --- (c) onnxruntime in Python, same ids ----------------------------------------------------
python3 "$here/python_ort.py" "$VOICE" "$OUT_DIR/ids.json" "$THREADS" 1 "$REQUESTS_1" "$OUT_DIR/short-ids.json" | tee -a "$OUT_DIR/results.jsonl"
python3 "$here/python_ort.py" "$VOICE" "$OUT_DIR/ids.json" "$THREADS" 4 "$REQUESTS_4" | tee -a "$OUT_DIR/results.jsonl"
log "results in $OUT_DIR/results.jsonl ($(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
