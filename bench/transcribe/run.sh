#!/usr/bin/env bash
# Benchmark of speech to text as a user sees it, beside faster-whisper
# (CTranslate2) on the same model file:
#   (a) the release `gantry serve` in its own process, whisper-tiny-en
#       driven through /runsync by a standard-library Python client
#       (client.py) with a WAV inline: fetch, decode, resample, transcribe,
#       bill; audio seconds heard per wall second at 1 and 2 requests at a
#       time, and the time from /run to the first streamed segment;
#   (b) the engine alone on the same WAV (examples/transcribe_bench.rs) beside
#       faster-whisper 1.2.1 (reference.py --bench) on 1 and 2 threads,
#       greedy decoding, float32 (and int8 for faster-whisper, for scale).
# The speech is made by the platform itself: piper-en-us-joe reads a fixed
# text of about 60 s.
#
#   bench/transcribe/run.sh     # SECONDS_PER_RUN=60, results in /tmp/gantry-bench-transcribe
#
# Needs the weights (gantry models pull whisper-tiny-en piper-en-us-joe) and
# python3 with faster-whisper==1.2.1.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
SECONDS_PER_RUN="${SECONDS_PER_RUN:-60}"
OUT_DIR="${OUT_DIR:-/tmp/gantry-bench-transcribe}"
PUBLIC_ADDR="${PUBLIC_ADDR:-127.0.0.1:18381}"
MODELS_DIR="${GANTRY_MODELS_DIR:-$HOME/.cache/gantry/models}"
WHISPER="$MODELS_DIR/whisper-tiny-en"
log() { echo "run.sh: $*" >&2; }
mkdir -p "$OUT_DIR"
[ -f "$WHISPER/model.bin" ] || { log "no weights at $WHISPER (gantry models pull whisper-tiny-en)"; exit 1; }

log "building the release binary and the engine benchmark (cargo build --release)"
(cd "$repo" && cargo build -q --release -p gantry && cargo build -q --release -p gantry-model-transcribe --example transcribe_bench)
BIN="$repo/target/release/gantry"
ENGINE_BENCH="$repo/target/release/examples/transcribe_bench"

DATA="$(mktemp -d /tmp/gantry-bench-transcribe-data.XXXXXX)"
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
        GANTRY_SCHEDULER__BUNDLED_WORKERS="[whisper-tiny-en,piper-en-us-joe]" GANTRY_SCHEDULER__BUNDLED_SLOTS=2 \
        GANTRY_MANAGEMENT_ADDR=127.0.0.1:18380 GANTRY_PUBLIC_ADDR="$PUBLIC_ADDR" GANTRY_SCHEDULER__ADDR=127.0.0.1:15351 \
        GANTRY_RATE_LIMITS__PUBLIC__MINUTE=100000000 GANTRY_RATE_LIMITS__PUBLIC__HOUR=100000000 GANTRY_RATE_LIMITS__PUBLIC__DAY=100000000
    exec "$BIN" serve >"$DATA/serve.log" 2>&1
) &
SERVER_PID=$!
KEY=""
TEXT="Good morning, and thank you all for coming. Today we will look at the results of the spring survey. \
Most of the people we asked were happy with the new opening hours, but many said the queues at lunchtime are still too long. \
We also heard that the car park is often full before nine, so we are talking to the council about more spaces. \
The second point is the budget. We spent a little less than planned on repairs, and we would like to use what is left for new chairs in the reading room. \
Finally, the summer programme starts in three weeks. If you want to help with the children's activities, please put your name on the list by the door. \
Thank you, and let us take a few questions."
for i in $(seq 1 600); do
    kill -0 "$SERVER_PID" 2>/dev/null || { log "the server exited"; tail -n 30 "$DATA/serve.log" >&2; exit 1; }
    [ -n "$KEY" ] || KEY="$(grep -o 'gk_[A-Za-z0-9_-]*' "$DATA/serve.log" | head -n1 || true)"
    if [ -n "$KEY" ] && curl -sf -m 120 -o "$DATA/speak.json" -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
        -d "{\"input\":{\"prompt\":\"$TEXT\"}}" "http://$PUBLIC_ADDR/v2/piper-en-us-joe/runsync?wait=120000" \
        && grep -q COMPLETED "$DATA/speak.json"; then
        break
    fi
    [ "$i" = 600 ] && { log "the server did not come up"; exit 1; }
    sleep 0.1
done
URL="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["output"]["audio_url"])' "$DATA/speak.json")"
curl -sf -o "$OUT_DIR/speech.wav" "$URL"
log "speech: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["output"]["duration"])' "$DATA/speak.json") s in $OUT_DIR/speech.wav"

# --- (a) the platform ---------------------------------------------------------
: >"$OUT_DIR/platform.jsonl"
for concurrency in 1 2; do
    python3 "$here/client.py" "http://$PUBLIC_ADDR" "$KEY" whisper-tiny-en "$OUT_DIR/speech.wav" \
        "$concurrency" "$SECONDS_PER_RUN" | tee -a "$OUT_DIR/platform.jsonl"
done
python3 "$here/client.py" "http://$PUBLIC_ADDR" "$KEY" whisper-tiny-en "$OUT_DIR/speech.wav" first 5 \
    | tee -a "$OUT_DIR/platform.jsonl"
grep -E 'VmHWM|VmRSS' "/proc/$SERVER_PID/status" | tr -s ' ' | tee "$OUT_DIR/memory.txt" || true
kill -TERM "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true; SERVER_PID=""

# --- (b) the engine beside faster-whisper, nothing else running ----------------
# Both read the same 16 kHz mono 16-bit WAV (ffmpeg's resampler), so they see
# the same samples.
ffmpeg -loglevel error -y -i "$OUT_DIR/speech.wav" -ar 16000 -ac 1 -sample_fmt s16 "$OUT_DIR/speech16k.wav"
: >"$OUT_DIR/engines.jsonl"
for threads in 1 2; do
    rust="$("$ENGINE_BENCH" "$WHISPER" "$OUT_DIR/speech16k.wav" --runs 3 --threads "$threads" 2>/dev/null)"
    fw="$(python3 "$here/reference.py" "$WHISPER" "$OUT_DIR/speech16k.wav" --bench 3 --threads "$threads")"
    fw8="$(python3 "$here/reference.py" "$WHISPER" "$OUT_DIR/speech16k.wav" --bench 3 --threads "$threads" --compute-type int8)"
    echo "{\"threads\": $threads, \"rust\": $rust, \"faster_whisper\": $fw, \"faster_whisper_int8\": $fw8}" | tee -a "$OUT_DIR/engines.jsonl"
done
log "results in $OUT_DIR/platform.jsonl and $OUT_DIR/engines.jsonl"
