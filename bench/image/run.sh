#!/usr/bin/env bash
# Benchmark of the image models as a user sees them, beside onnxruntime on
# the same weights:
#   (a) the release `gantry serve` in its own process, loaded through /runsync
#       by a standard-library Python client at 1 and 4 concurrent requests
#       (generation, PNG encoding, file storage and the signed URL included);
#   (b) the generators alone: the Rust engine (examples/gan_bench.rs) and
#       onnxruntime in Python (reference.py) on the same safetensors and the
#       same inputs, batch 1 and 8, one thread, after checking they agree; and
#       the same network on candle's CPU device (GAN_BACKEND=candle, the graph
#       that image.cuda_device runs on a GPU), checked the same way;
#       terrain-128's graph as the worker runs it (examples/terrain_bench.rs,
#       ONNX Runtime through crates/onnx) and in onnxruntime from Python
#       (terrain_reference.py), same inputs, one thread.
#
#   bench/image/run.sh          # SECONDS_PER_RUN=15, results in /tmp/gantry-bench-image
#
# Needs the weights (gantry models pull dcgan-faces-64 eyes-128 terrain-128) and
# python3 with numpy, onnx and onnxruntime.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
SECONDS_PER_RUN="${SECONDS_PER_RUN:-15}"
OUT_DIR="${OUT_DIR:-/tmp/gantry-bench-image}"
PUBLIC_ADDR="${PUBLIC_ADDR:-127.0.0.1:18181}"
MODELS_DIR="${GANTRY_MODELS_DIR:-$HOME/.cache/gantry/models}"
log() { echo "run.sh: $*" >&2; }
mkdir -p "$OUT_DIR"
FACES="$MODELS_DIR/dcgan-faces-64/weights.safetensors"
EYES="$MODELS_DIR/eyes-128/generator_model_state.safetensors"
TERRAIN="$MODELS_DIR/terrain-128"
for f in "$FACES" "$EYES" "$TERRAIN/terrain_consistency_unet_difficulty100.onnx"; do
    [ -f "$f" ] || { log "no weights at $f (gantry models pull dcgan-faces-64 eyes-128 terrain-128)"; exit 1; }
done

log "building the release binary and the engine benchmark (cargo build --release)"
(cd "$repo" && cargo build -q --release -p gantry && cargo build -q --release -p gantry-model-image --example gan_bench --example terrain_bench)
BIN="$repo/target/release/gantry"
GAN_BENCH="$repo/target/release/examples/gan_bench"
TERRAIN_BENCH="$repo/target/release/examples/terrain_bench"

# --- (a) the platform ---------------------------------------------------------
DATA="$(mktemp -d /tmp/gantry-bench-image-data.XXXXXX)"
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
        GANTRY_SCHEDULER__BUNDLED_WORKERS="[dcgan-faces-64,eyes-128,terrain-128]" \
        GANTRY_MANAGEMENT_ADDR=127.0.0.1:18180 GANTRY_PUBLIC_ADDR="$PUBLIC_ADDR" GANTRY_SCHEDULER__ADDR=127.0.0.1:15151 \
        GANTRY_RATE_LIMITS__PUBLIC__MINUTE=100000000 GANTRY_RATE_LIMITS__PUBLIC__HOUR=100000000 GANTRY_RATE_LIMITS__PUBLIC__DAY=100000000
    exec "$BIN" serve >"$DATA/serve.log" 2>&1
) &
SERVER_PID=$!
KEY=""
for i in $(seq 1 600); do
    kill -0 "$SERVER_PID" 2>/dev/null || { log "the server exited"; tail -n 30 "$DATA/serve.log" >&2; exit 1; }
    [ -n "$KEY" ] || KEY="$(grep -o 'gk_[A-Za-z0-9_-]*' "$DATA/serve.log" | head -n1 || true)"
    if [ -n "$KEY" ] && curl -sf -m 10 -o /dev/null -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
        -d '{"input":{"prompt":"a red eye","seed":1}}' "http://$PUBLIC_ADDR/v2/eyes-128/runsync"; then
        break
    fi
    [ "$i" = 600 ] && { log "the server did not come up"; exit 1; }
    sleep 0.1
done
: >"$OUT_DIR/platform.jsonl"
for c in 1 4; do
    python3 "$here/client.py" "http://$PUBLIC_ADDR" "$KEY" dcgan-faces-64 '{"seed":1}' "$c" "$SECONDS_PER_RUN" | tee -a "$OUT_DIR/platform.jsonl"
    python3 "$here/client.py" "http://$PUBLIC_ADDR" "$KEY" eyes-128 '{"prompt":"a blue eye","seed":1}' "$c" "$SECONDS_PER_RUN" | tee -a "$OUT_DIR/platform.jsonl"
    python3 "$here/client.py" "http://$PUBLIC_ADDR" "$KEY" eyes-128 '{"prompt":"a blue eye","seed":1,"width":512,"height":512}' "$c" "$SECONDS_PER_RUN" | tee -a "$OUT_DIR/platform.jsonl"
    python3 "$here/client.py" "http://$PUBLIC_ADDR" "$KEY" terrain-128 '{"difficulty":50,"seed":1}' "$c" "$SECONDS_PER_RUN" | tee -a "$OUT_DIR/platform.jsonl"
done
kill -TERM "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true; SERVER_PID=""

# --- (b) the generators alone, Rust beside onnxruntime --------------------------
python3 - "$OUT_DIR" <<'PY'
import numpy as np, sys
rng = np.random.default_rng(0)
for n in (1, 8):
    z = rng.standard_normal((n, 100)).astype("<f4")
    z.tofile(f"{sys.argv[1]}/faces-{n}.f32")
    labels = np.zeros((n, 8), "<f4"); labels[:, 1] = 1
    np.concatenate([z, labels], 1).astype("<f4").tofile(f"{sys.argv[1]}/eyes-{n}.f32")
    rng.standard_normal((n, 128, 128)).astype("<f4").tofile(f"{sys.argv[1]}/terrain-{n}.f32")
PY
: >"$OUT_DIR/engines.jsonl"
for spec in "faces:$FACES:netG_state_dict.main" "eyes:$EYES:main"; do
    IFS=: read -r name weights prefix <<<"$spec"
    for n in 1 8; do
        rust="$("$GAN_BENCH" "$weights" "$prefix" "$OUT_DIR/$name-$n.f32" "$n" 30 "$OUT_DIR/$name-$n.out.f32")"
        python3 "$here/reference.py" compare "$weights" "$prefix" "$OUT_DIR/$name-$n.f32" "$n" "$OUT_DIR/$name-$n.out.f32" >/dev/null
        ort="$(python3 "$here/reference.py" time "$weights" "$prefix" "$OUT_DIR/$name-$n.f32" "$n" 30 1)"
        # The same network on candle's CPU device (the graph image.cuda_device runs on a GPU).
        candle="$(RAYON_NUM_THREADS=1 GAN_BACKEND=candle "$GAN_BENCH" "$weights" "$prefix" "$OUT_DIR/$name-$n.f32" "$n" 30 "$OUT_DIR/$name-$n.candle.f32")"
        python3 "$here/reference.py" compare "$weights" "$prefix" "$OUT_DIR/$name-$n.f32" "$n" "$OUT_DIR/$name-$n.candle.f32" >/dev/null
        echo "{\"model\": \"$name\", \"rust\": $rust, \"candle\": $candle, \"onnxruntime\": $ort}" | tee -a "$OUT_DIR/engines.jsonl"
    done
done
for n in 1 8; do
    rust="$("$TERRAIN_BENCH" "$TERRAIN" "$OUT_DIR/terrain-$n.f32" "$n" 10)"
    ort="$(python3 "$here/terrain_reference.py" "$TERRAIN/terrain_consistency_unet_difficulty100.onnx" "$OUT_DIR/terrain-$n.f32" "$n" 10 1)"
    echo "{\"model\": \"terrain\", \"rust\": $rust, \"onnxruntime\": $ort}" | tee -a "$OUT_DIR/engines.jsonl"
done
log "results in $OUT_DIR/platform.jsonl and $OUT_DIR/engines.jsonl"
