#!/usr/bin/env bash
# Benchmark of the video models as a user sees them, beside onnxruntime on
# the same RIFE weights:
#   (a) the release `gantry serve` in its own process, each video model
#       loaded through /runsync by a standard-library Python client
#       (client.py): keyframes, every RIFE frame, H.264 encoding, file storage
#       and the signed URL included; video seconds delivered per wall second;
#   (b) RIFE alone at 256x256: the Rust engine (examples/rife_bench.rs) and
#       onnxruntime in Python (reference.py, the same network built from the
#       same safetensors), one frame on one thread, and two frames at once on
#       two threads (Rust: one frame per thread, as a video job draws them;
#       onnxruntime: one frame on two intra-op threads); and one frame on one
#       thread on candle's CPU device (RIFE_BACKEND=candle, the graph that
#       video.cuda_device runs on a GPU);
#   (c) the image-to-video job of (a) made in Python (peer.py): the same
#       frames by onnxruntime on two threads, encoded by ffmpeg (libx264).
#
#   bench/video/run.sh          # SECONDS_PER_RUN=60, results in /tmp/gantry-bench-video
#
# Needs the weights (gantry models pull faces-morph-video interpolate-video)
# and python3 with numpy, onnx and onnxruntime.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
SECONDS_PER_RUN="${SECONDS_PER_RUN:-60}"
OUT_DIR="${OUT_DIR:-/tmp/gantry-bench-video}"
PUBLIC_ADDR="${PUBLIC_ADDR:-127.0.0.1:18281}"
MODELS_DIR="${GANTRY_MODELS_DIR:-$HOME/.cache/gantry/models}"
log() { echo "run.sh: $*" >&2; }
mkdir -p "$OUT_DIR"
FLOWNET="$MODELS_DIR/interpolate-video/flownet.safetensors"
[ -f "$FLOWNET" ] || { log "no weights at $FLOWNET (gantry models pull faces-morph-video interpolate-video)"; exit 1; }

log "building the release binary and the engine benchmark (cargo build --release)"
(cd "$repo" && cargo build -q --release -p gantry && cargo build -q --release -p gantry-model-video --example rife_bench)
BIN="$repo/target/release/gantry"
RIFE_BENCH="$repo/target/release/examples/rife_bench"

# --- (b) RIFE alone, Rust beside onnxruntime (first: nothing else running) -------
: >"$OUT_DIR/engines.jsonl"
for threads in 1 2; do
    rust="$("$RIFE_BENCH" "$FLOWNET" 256 256 20 "$threads")"
    ort="$(python3 "$here/reference.py" time "$FLOWNET" 256 256 20 "$threads")"
    echo "{\"threads\": $threads, \"rust\": $rust, \"onnxruntime\": $ort}" | tee -a "$OUT_DIR/engines.jsonl"
done
candle="$(RAYON_NUM_THREADS=1 RIFE_BACKEND=candle "$RIFE_BENCH" "$FLOWNET" 256 256 5 1)"
echo "{\"threads\": 1, \"candle\": $candle}" | tee -a "$OUT_DIR/engines.jsonl"

# --- (a) the platform ---------------------------------------------------------
DATA="$(mktemp -d /tmp/gantry-bench-video-data.XXXXXX)"
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
        GANTRY_SCHEDULER__BUNDLED_WORKERS="[faces-morph-video,interpolate-video]" GANTRY_SCHEDULER__BUNDLED_SLOTS=1 \
        GANTRY_MANAGEMENT_ADDR=127.0.0.1:18280 GANTRY_PUBLIC_ADDR="$PUBLIC_ADDR" GANTRY_SCHEDULER__ADDR=127.0.0.1:15251 \
        GANTRY_RATE_LIMITS__PUBLIC__MINUTE=100000000 GANTRY_RATE_LIMITS__PUBLIC__HOUR=100000000 GANTRY_RATE_LIMITS__PUBLIC__DAY=100000000
    exec "$BIN" serve >"$DATA/serve.log" 2>&1
) &
SERVER_PID=$!
KEY=""
for i in $(seq 1 600); do
    kill -0 "$SERVER_PID" 2>/dev/null || { log "the server exited"; tail -n 30 "$DATA/serve.log" >&2; exit 1; }
    [ -n "$KEY" ] || KEY="$(grep -o 'gk_[A-Za-z0-9_-]*' "$DATA/serve.log" | head -n1 || true)"
    if [ -n "$KEY" ] && curl -sf -m 60 -o /dev/null -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
        -d '{"input":{"seed":1,"duration":1,"fps":8,"width":64,"height":64}}' "http://$PUBLIC_ADDR/v2/faces-morph-video/runsync"; then
        break
    fi
    [ "$i" = 600 ] && { log "the server did not come up"; exit 1; }
    sleep 0.1
done
# Two 256x256 keyframes for image to video (PNG, base64): smooth patterns, shifted.
python3 - "$OUT_DIR/interpolate-input.json" <<'PY'
import base64, io, json, struct, zlib, math
def png(shift):
    w = h = 256
    rows = b"".join(b"\0" + bytes(
        int(255 * (0.5 + 0.4 * math.sin((x - shift) / 11 + c) * math.cos(y / 17)))
        for x in range(w) for c in range(3)) for y in range(h))
    chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) + \
        chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
import sys
images = [base64.b64encode(png(s)).decode() for s in (0, 24)]
with open(sys.argv[1], "w") as f:
    json.dump({"images": images, "duration": 4, "fps": 24}, f)
PY
: >"$OUT_DIR/platform.jsonl"
python3 "$here/client.py" "http://$PUBLIC_ADDR" "$KEY" faces-morph-video \
    '{"seed":1,"duration":4,"fps":24,"width":256,"height":256}' 1 "$SECONDS_PER_RUN" | tee -a "$OUT_DIR/platform.jsonl"
python3 "$here/client.py" "http://$PUBLIC_ADDR" "$KEY" interpolate-video \
    "@$OUT_DIR/interpolate-input.json" 1 "$SECONDS_PER_RUN" | tee -a "$OUT_DIR/platform.jsonl"
python3 "$here/client.py" "http://$PUBLIC_ADDR" "$KEY" faces-morph-video \
    '{"seed":1,"duration":2,"fps":24,"width":512,"height":512}' 1 "$SECONDS_PER_RUN" | tee -a "$OUT_DIR/platform.jsonl"
kill -TERM "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true; SERVER_PID=""

# --- (c) the same image-to-video job made in Python: onnxruntime + ffmpeg -------
python3 "$here/peer.py" "$FLOWNET" "$OUT_DIR/interpolate-input.json" 2 5 "$OUT_DIR/peer.mp4" | tee "$OUT_DIR/peer.jsonl"
log "results in $OUT_DIR/engines.jsonl, $OUT_DIR/platform.jsonl and $OUT_DIR/peer.jsonl"
