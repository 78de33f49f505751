#!/usr/bin/env bash
# The GPU benchmark, run on a GPU machine (an H100 or H200 with nvcc 13.0, cmake, ninja and
# Python 3.12 with torch; no Rust, no network) from the repository's root, in one call per payload
# part. bench/gpu/pack.sh (run here, after scripts/build-cuda.sh --with-sd-bench) splits what it
# needs into bench/gpu/payload/call-1, call-2, ... (each under what one call may carry); every
# call carries the next part and runs this same script, which does whatever the parts that have
# arrived allow and says which part it waits for:
#   - with llama.cpp's source: builds the reference benchmark (bench/text/llama_bench.cpp, the
#     way upstream's llama-bench measures, plus --npl for batched generation like
#     llama-batched-bench) from the very llama.cpp tree Gantry's text engine links, with CUDA;
#   - with everything: the text model (SmolLM2-135M Q4_1, every layer on the GPU) through
#     `runsync` on the release binary at 1, 8, 32 and 64 streams, greedy and sampled (a fresh
#     `gantry serve` for each, stopped with SIGTERM: its exit status is checked, and its log
#     says where the engine's steps went), beside the reference at the same concurrency; then
#     Stable Diffusion 1.5's architecture at 512x512 (random weights, written there) on candle's
#     CUDA backend beside diffusers/PyTorch on the same GPU; then both GAN image generators
#     (their real weights) on candle's CUDA backend beside the same network in PyTorch, at batch 1
#     and a batch that fills the GPU, with the outputs compared (float32, TF32 off); then Whisper
#     (whisper-tiny-en, about a minute of espeak-ng speech) on candle's CUDA backend beside
#     faster-whisper on CUDA where the peer's Python has it, audio seconds per wall second.
# It writes $OUT/device-check.md (one table) and the raw logs under $OUT (or bench/gpu/out).
#
#   bash bench/gpu/device-check.sh                  on the GPU machine, once per part
#   DEVICE_CHECK_CPU=1 bash bench/gpu/device-check.sh
#       here, on the CPU: the same steps with no payload (the CPU binary, the cached weights,
#       fewer streams, no SD unless SD_BENCH names sd_bench, the llama.cpp reference built for
#       the CPU after bench/gpu/pack.sh --llama-only), to check the script itself
#
# Environment: STREAMS ("1 8 32 64"), TOKENS (128), PYTHON (python3, with torch), GANTRY_BIN,
# LLAMA_BENCH, SD_STEPS (20), SD_RUNS (3), SKIP_SD=1, GAN_BATCHES ("1 256"), GAN_ROUNDS (20),
# GAN_BENCH (on the CPU: target/release/examples/gan_bench), SKIP_GAN=1, WHISPER_RUNS (3),
# TRANSCRIBE_BENCH (on the CPU: target/release/examples/transcribe_bench), SKIP_WHISPER=1.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
repo="$PWD"
here="$repo/bench/gpu"
work="$here/work"
out="${OUT:-$here/out}"
mkdir -p "$work" "$out"
cpu="${DEVICE_CHECK_CPU:-0}"
STREAMS="${STREAMS:-1 8 32 64}"
TOKENS="${TOKENS:-128}"
PYTHON="${PYTHON:-python3}"
MODEL=smollm2-135m-instruct
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
log() { printf '== %s\n' "$*" | tee -a "$out/steps.log" >&2; }
: >"$out/steps.log"
started=$(date +%s)

# ---- the payload's parts ----------------------------------------------------------------------
# Each call-K holds MANIFEST lines "<file> <chunks> <sha256>" and the chunks "<file>.<i>" it
# carried; a file is put together (and checked) once all of its chunks have arrived.
ready() { [ -e "$work/$1" ]; }
if [ "$cpu" != 1 ]; then
  missing=()
  while read -r file chunks sha; do
    ready "$file" && continue
    have=0
    for i in $(seq 1 "$chunks"); do
      compgen -G "$here/payload/call-*/$file.$i" >/dev/null && have=$((have + 1))
    done
    if [ "$have" -lt "$chunks" ]; then
      missing+=("$file ($have of $chunks chunks)")
      continue
    fi
    for i in $(seq 1 "$chunks"); do cat "$(compgen -G "$here/payload/call-*/$file.$i" | head -n1)"; done >"$work/$file.tmp"
    [ "$(sha256sum "$work/$file.tmp" | cut -d' ' -f1)" = "$sha" ] || { log "$file: wrong SHA-256, dropped"; rm -f "$work/$file.tmp"; continue; }
    mv "$work/$file.tmp" "$work/$file"
    log "$file: complete"
  done < <(cat "$here"/payload/call-*/MANIFEST 2>/dev/null | sort -u)
  [ -n "$(cat "$here"/payload/call-*/MANIFEST 2>/dev/null)" ] ||
    { log "no payload: run bench/gpu/pack.sh where the CUDA build is, and carry bench/gpu/payload/call-1"; exit 1; }
fi

# ---- llama.cpp's reference benchmark ----------------------------------------------------------
llama_bench="${LLAMA_BENCH:-$work/llama-build/bin/gantry-llama-bench}"
if [ ! -x "$llama_bench" ] && ready llama.cpp.tar.xz; then
  cuda=ON
  [ "$cpu" = 1 ] && cuda=OFF
  log "building the llama.cpp reference (CUDA $cuda) from the tree the text engine links"
  rm -rf "$work/llama-src" && mkdir -p "$work/llama-src"
  tar -C "$work/llama-src" -xJf "$work/llama.cpp.tar.xz"
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  cmake -S bench/text/llama -B "$work/llama-build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_SRC="$work/llama-src/llama.cpp" -DGANTRY_LLAMA_SOURCE_ID="$(cat "$work/llama-src/SOURCE" 2>/dev/null || echo vendored)" \
    -DGGML_CUDA="$cuda" -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES:-90-real}" -DGGML_NATIVE=OFF \
    -DLLAMA_CURL=OFF >"$out/llama-build.log" 2>&1
  cmake --build "$work/llama-build" --target gantry-llama-bench -j "$(nproc)" >>"$out/llama-build.log" 2>&1 ||
    { tail -30 "$out/llama-build.log" >&2; exit 1; }
  log "built $llama_bench in $(($(date +%s) - started)) s"
fi

if [ "$cpu" != 1 ] && [ ${#missing[@]} -gt 0 ]; then
  log "waiting for: ${missing[*]}; carry the next bench/gpu/payload/call-K and run this again"
  exit 0
fi

# ---- the binaries, the weights, the GPU's libraries -------------------------------------------
if [ "$cpu" = 1 ]; then
  gantry="${GANTRY_BIN:-$repo/target/release/gantry}"
  [ -x "$gantry" ] || gantry="$repo/target/debug/gantry"
  models="${GANTRY_MODELS_DIR:-$HOME/.cache/gantry/models}"
  gpu_layers=0
  sd_bench="${SD_BENCH:-}"
  write_weights="${SD_WRITE_WEIGHTS:-}"
  gan_bench="${GAN_BENCH:-$repo/target/release/examples/gan_bench}"
  gan_weights() { echo "$models/$1/$2"; }
  transcribe_bench="${TRANSCRIBE_BENCH:-$repo/target/release/examples/transcribe_bench}"
  whisper_dir="$models/whisper-tiny-en"
  speech_wav="$work/speech16k.wav"
  if [ ! -e "$speech_wav" ] && command -v espeak-ng >/dev/null && command -v ffmpeg >/dev/null; then
    bash bench/gpu/speech-sample.sh "$speech_wav"
  fi
else
  for file in gantry sd_bench write_tiny_weights gan_bench transcribe_bench; do
    [ -x "$work/$file" ] || ! ready "$file.xz" ||
      { xz -dc "$work/$file.xz" >"$work/$file.tmp" && chmod +x "$work/$file.tmp" && mv "$work/$file.tmp" "$work/$file"; }
  done
  [ -x "$work/gantry" ] || { log "no gantry binary in the payload"; exit 1; }
  gantry="$work/gantry" sd_bench="$work/sd_bench" write_weights="$work/write_tiny_weights"
  gan_bench="$work/gan_bench"
  gan_weights() { echo "$work/$1.safetensors"; }
  transcribe_bench="$work/transcribe_bench"
  whisper_dir="$work/whisper-tiny-en"
  [ -d "$whisper_dir" ] || ! ready whisper-tiny-en.tar || tar -C "$work" -xf "$work/whisper-tiny-en.tar"
  speech_wav="$work/speech16k.wav"
  models="$work/models"
  mkdir -p "$models/$MODEL"
  ln -sf "$work/$GGUF_NAME" "$models/$MODEL/$GGUF_NAME"
  # The model store's mark of a checked file: its SHA-256 (checked against the MANIFEST above).
  sha256sum "$work/$GGUF_NAME" | cut -d' ' -f1 >"$models/$MODEL/$GGUF_NAME.verified"
  gpu_layers=999
  # The CUDA 13 libraries the binaries name: PyTorch's wheels have them, else a system toolkit.
  cuda_lib="$("$PYTHON" -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13", "lib"))' 2>/dev/null || true)"
  [ -e "$cuda_lib/libcublas.so.13" ] || cuda_lib="$(dirname "$(ls /usr/local/cuda*/lib64/libcublas.so.13 2>/dev/null | head -n1)" 2>/dev/null || true)"
  export LD_LIBRARY_PATH="$cuda_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  log "CUDA libraries from $cuda_lib; $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)"
  ldd "$gantry" | grep -q "not found" && { ldd "$gantry" | grep "not found" >&2; log "the binary lacks libraries"; exit 1; }
fi
gguf="$models/$MODEL/$GGUF_NAME"
[ -e "$gguf" ] || { log "no weights at $gguf"; exit 1; }

# ---- Gantry: one serve per case ----------------------------------------------------------------
data="$work/data"
rm -rf "$data" && mkdir -p "$data"
settings=(GANTRY_DATA_DIR="$data" GANTRY_MODELS_DIR="$models" GANTRY_LOG=info
  GANTRY_MANAGEMENT_ADDR=127.0.0.1:0 GANTRY_PUBLIC_ADDR=127.0.0.1:0 GANTRY_SCHEDULER__ADDR=127.0.0.1:0
  GANTRY_SCHEDULER__BUNDLED_WORKERS="[$MODEL]" GANTRY_TEXT__GPU_LAYERS="$gpu_layers"
  GANTRY_TEXT__MAX_SEQUENCES=64 GANTRY_TEXT__CONTEXT_TOKENS=$((64 * (TOKENS + 64))))
gantry_env() { env -u GANTRY_DATABASE_URL -u RUST_LOG "${settings[@]}" "$@"; }
email=bench@example.test
gantry_env "$gantry" users create "$email" >/dev/null 2>&1
gantry_env "$gantry" users set-limits "$email" --exempt >/dev/null 2>&1
gantry_env "$gantry" users add-credit "$email" 1000 >/dev/null 2>&1
key="$(gantry_env "$gantry" keys create --user "$email" --scopes endpoints:run 2>/dev/null)"

results="$out/text.jsonl"
: >"$results"
for temperature in 0 0.8; do
  for streams in $STREAMS; do
    case_log="$out/serve-t$temperature-s$streams.log"
    # A simple command, so that $! is the server itself (env execs it) and the SIGTERM below
    # reaches it, not a subshell.
    env -u GANTRY_DATABASE_URL -u RUST_LOG "${settings[@]}" "$gantry" serve >"$case_log" 2>&1 &
    pid=$!
    for _ in $(seq 600); do
      grep -q "connected to the scheduler" "$case_log" && break
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    public="$(sed -n 's/.*gantry is serving.* public=\([^ ]*\).*/\1/p' "$case_log" | head -n1)"
    [ -n "$public" ] || { tail -20 "$case_log" >&2; log "serve did not start"; exit 1; }
    rounds=$((streams >= 32 ? 3 : 24 / streams))
    utilization="$out/util-t$temperature-s$streams.csv"
    util_pid=""
    if command -v nvidia-smi >/dev/null && [ "$cpu" != 1 ]; then
      nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 100 >"$utilization" &
      util_pid=$!
    fi
    load="$("$PYTHON" "$here/load.py" --url "http://$public" --key "$key" --model "$MODEL" --streams "$streams" \
      --tokens "$TOKENS" --rounds "$rounds" --temperature "$temperature")" || true
    [ -n "$util_pid" ] && kill "$util_pid" 2>/dev/null
    kill -TERM "$pid"
    status=0
    wait "$pid" || status=$?
    engine="$(grep "text engine stopped" "$case_log" | tail -n1 || true)"
    field() { sed -n "s/.* $1=\([0-9]*\).*/\1/p" <<<"$engine"; }
    util="$( [ -s "$utilization" ] && awk '{ s += $1; n++ } END { if (n) printf "%.0f", s / n }' "$utilization" || echo "")"
    "$PYTHON" - "$load" "$status" "$(field steps)" "$(field decode_ms)" "$(field other_ms)" "$util" >>"$results" <<'EOF'
import json, sys
load = json.loads(sys.argv[1] or "{}")
load.update(exit_status=int(sys.argv[2]), steps=int(sys.argv[3] or 0), decode_ms=int(sys.argv[4] or 0),
            other_ms=int(sys.argv[5] or 0), gpu_util=float(sys.argv[6]) if sys.argv[6] else None)
print(json.dumps(load))
EOF
    log "text, temperature $temperature, $streams streams: $(tail -n1 "$results")"
  done
done

# ---- llama.cpp at the same concurrency --------------------------------------------------------
npl="$(tr ' ' '\n' <<<"$STREAMS" | awk '$1 > 1' | paste -sd, -)"
if [ -x "$llama_bench" ]; then
  log "llama.cpp reference: tg$TOKENS and --npl $npl"
  "$llama_bench" -m "$gguf" -ngl "$gpu_layers" -t "$(nproc)" -p 0 -n "$TOKENS" -r 3 ${npl:+--npl "$npl"} -o json \
    >"$out/llama.json" 2>"$out/llama.err" || { tail -5 "$out/llama.err" >&2; log "the llama.cpp reference failed"; }
else
  log "no llama.cpp reference (LLAMA_BENCH, or llama.cpp.tar.xz in the payload)"
fi

# ---- Stable Diffusion 1.5's architecture at 512x512 --------------------------------------------
: >"$out/sd.txt"
if [ "${SKIP_SD:-0}" != 1 ] && [ -n "$sd_bench" ] && [ -x "$sd_bench" ]; then
  weights="$work/sd-1.5-random"
  [ -e "$weights/unet/diffusion_pytorch_model.safetensors" ] || "$write_weights" sd-1.5 "$weights" --full >>"$out/sd.log" 2>&1
  size="${SD_SIZE:-512}"
  steps="${SD_STEPS:-20}"
  runs="${SD_RUNS:-3}"
  device=cuda:0
  [ "$cpu" = 1 ] && device=cpu
  log "SD 1.5 (random weights) ${size}x$size, $steps steps, guidance 7.5: candle ($device)"
  gantry_median="$(SD_DEVICE=$device "$sd_bench" "$weights" sd-1.5 "$size" "$size" "$steps" 7.5 "$runs" 2>>"$out/sd.log" | tee -a "$out/sd.log" | sed -n 's/^median \([0-9]*\) ms/\1/p')"
  peer_median=""
  if [ "$cpu" != 1 ] && [ -e "$work/wheels.tar" ] && ! "$PYTHON" -c 'import diffusers, transformers' 2>/dev/null; then
    rm -rf "$work/wheels" "$work/pyenv" && mkdir -p "$work/wheels"
    tar -C "$work/wheels" -xf "$work/wheels.tar"
    "$PYTHON" -m venv --system-site-packages "$work/pyenv"
    "$work/pyenv/bin/pip" install -q --no-index --find-links "$work/wheels" diffusers transformers >>"$out/sd.log" 2>&1 ||
      log "diffusers could not be installed from the carried wheels (see sd.log)"
  fi
  peer_python="$PYTHON"
  [ -x "$work/pyenv/bin/python" ] && peer_python="$work/pyenv/bin/python"
  if "$peer_python" -c 'import diffusers, transformers, torch' 2>/dev/null; then
    log "the same on diffusers/PyTorch ($device)"
    peer_median="$(SD_DEVICE="${device%%:*}" "$peer_python" bench/image/sd_reference.py "$weights" sd-1.5 "$size" "$size" "$steps" 7.5 "$runs" 2>>"$out/sd.log" | tee -a "$out/sd.log" | sed -n 's/^median \([0-9]*\) ms/\1/p')"
  else
    log "no diffusers/PyTorch here: the SD peer is left out"
  fi
  echo "$size $steps $gantry_median $peer_median" >"$out/sd.txt"
fi

# ---- the GAN image generators, beside PyTorch -------------------------------------------------
: >"$out/gan.jsonl"
if [ "${SKIP_GAN:-0}" != 1 ] && [ -x "$gan_bench" ]; then
  backend=cuda:0 torch_device=cuda
  [ "$cpu" = 1 ] && backend=kernels torch_device=cpu
  peer_python="$PYTHON"
  [ -x "$work/pyenv/bin/python" ] && peer_python="$work/pyenv/bin/python"
  "$peer_python" -c 'import torch' 2>/dev/null || { log "no PyTorch here: the GAN peer is left out"; peer_python=""; }
  # model, weight file, tensor prefix, input width (noise, then the labels' one-hot)
  for spec in "dcgan-faces-64 weights.safetensors netG_state_dict.main 100" \
    "eyes-128 generator_model_state.safetensors main 108"; do
    read -r model file prefix width <<<"$spec"
    weights="$(gan_weights "$model" "$file")"
    [ -e "$weights" ] || { log "no $weights: $model is left out"; continue; }
    for batch in ${GAN_BATCHES:-1 256}; do
      z="$work/gan-z.f32" image="$work/gan-out.f32"
      "$PYTHON" -c 'import numpy, sys; numpy.random.default_rng(7).standard_normal((int(sys.argv[2]), int(sys.argv[3]))).astype("<f4").tofile(sys.argv[1])' \
        "$z" "$batch" "$width"
      ours="$(GAN_BACKEND=$backend "$gan_bench" "$weights" "$prefix" "$z" "$batch" "${GAN_ROUNDS:-20}" "$image" 2>>"$out/gan.log")" ||
        { log "gan_bench failed on $model (gan.log)"; continue; }
      peer=null
      if [ -n "$peer_python" ]; then
        peer="$("$peer_python" bench/image/reference.py torch "$weights" "$prefix" "$z" "$batch" "${GAN_ROUNDS:-20}" "$torch_device" "$image" 2>>"$out/gan.log")" ||
          log "$model at batch $batch: PyTorch disagrees with Gantry, or failed: $peer (gan.log)"
        [ -n "$peer" ] || peer=null
      fi
      echo "{\"model\": \"$model\", \"batch\": $batch, \"ours\": $ours, \"peer\": $peer}" | tee -a "$out/gan.jsonl" >&2
    done
  done
fi

# ---- Whisper -------------------------------------------------------------------------------------
: >"$out/whisper.jsonl"
if [ "${SKIP_WHISPER:-0}" != 1 ] && [ -x "$transcribe_bench" ] && [ -e "$whisper_dir/model.bin" ] && [ -e "$speech_wav" ]; then
  backends=cuda:0 fw_device=cuda
  [ "$cpu" = 1 ] && backends="kernels candle" fw_device=cpu
  peer_python="$PYTHON"
  [ -x "$work/pyenv/bin/python" ] && peer_python="$work/pyenv/bin/python"
  "$peer_python" -c 'import faster_whisper' 2>/dev/null || { log "no faster-whisper here: the Whisper peer is left out"; peer_python=""; }
  peer=null
  if [ -n "$peer_python" ]; then
    peer="$("$peer_python" bench/transcribe/reference.py "$whisper_dir" "$speech_wav" --bench "${WHISPER_RUNS:-3}" --device "$fw_device" 2>>"$out/whisper.log")" ||
      { log "faster-whisper on $fw_device failed (whisper.log)"; peer=null; }
    [ -n "$peer" ] || peer=null
  fi
  # The transcript on the CPU's kernels: each backend's must be the same text.
  "$transcribe_bench" "$whisper_dir" "$speech_wav" --backend kernels --json >"$work/whisper-kernels.json" 2>>"$out/whisper.log" ||
    log "transcribe_bench --json failed on the kernels (whisper.log)"
  for backend in $backends; do
    ours="$("$transcribe_bench" "$whisper_dir" "$speech_wav" --backend "$backend" --runs "${WHISPER_RUNS:-3}" 2>>"$out/whisper.log")" ||
      { log "transcribe_bench failed on $backend (whisper.log)"; continue; }
    same=null
    if "$transcribe_bench" "$whisper_dir" "$speech_wav" --backend "$backend" --json >"$work/whisper-$backend.json" 2>>"$out/whisper.log"; then
      same="$("$PYTHON" -c 'import json, sys; a, b = (json.load(open(p))["text"] for p in sys.argv[1:]); print("true" if a == b else "false")' \
        "$work/whisper-kernels.json" "$work/whisper-$backend.json" 2>>"$out/whisper.log" || echo null)"
    fi
    [ "$same" = false ] && log "Whisper on $backend transcribes otherwise than the kernels (whisper-$backend.json)"
    echo "{\"backend\": \"$backend\", \"ours\": $ours, \"peer\": $peer, \"same_text\": $same}" | tee -a "$out/whisper.jsonl" >&2
  done
fi

# ---- the table --------------------------------------------------------------------------------
"$PYTHON" - "$results" "$out/llama.json" "$out/sd.txt" "$TOKENS" "$out/gan.jsonl" "$out/whisper.jsonl" >"$out/device-check.md" <<'EOF'
import json, os, sys
results_path, llama_path, sd_path, tokens, gan_path, whisper_path = sys.argv[1:7]
rows = [json.loads(line) for line in open(results_path) if line.strip()]
llama = {}
if os.path.exists(llama_path) and os.path.getsize(llama_path):
    for r in json.load(open(llama_path)):
        if r["n_gen"] and not r["n_prompt"]:
            llama[r["n_parallel"]] = r["avg_ts"]
print(f"| streams | mode | Gantry tok/s | llama.cpp tok/s (decode only) | ratio | engine CPU per step / decode | GPU busy | exit status |")
print("|---:|---|---:|---:|---:|---:|---:|---:|")
for r in rows:
    peer = llama.get(r.get("streams"))
    ratio = f"{r['tok_s'] / peer:.2f}x" if peer and r.get("tok_s") else ""
    share = f"{100 * r['other_ms'] / r['decode_ms']:.0f} %" if r.get("decode_ms") else ""
    util = f"{r['gpu_util']:.0f} %" if r.get("gpu_util") is not None else ""
    mode = "greedy" if r.get("temperature") == 0 else f"temperature {r.get('temperature')}"
    failed = f" ({r['failed']} failed)" if r.get("failed") else ""
    print(f"| {r.get('streams')} | {mode} | {r.get('tok_s', 0):.0f}{failed} | {f'{peer:.0f}' if peer else ''} | {ratio} | {share} | {util} | {r['exit_status']} |")
sd = open(sd_path).read().split() if os.path.exists(sd_path) else []
if len(sd) >= 3:
    size, steps, ours = sd[:3]
    peer = sd[3] if len(sd) > 3 else ""
    print()
    print("| SD 1.5 architecture, random weights | Gantry (candle) ms | diffusers/PyTorch ms | Gantry speed vs peer |")
    print("|---|---:|---:|---:|")
    vs = f"{int(peer) / int(ours):.2f}x" if peer and ours else ""
    print(f"| {size}x{size}, {steps} steps, guidance 7.5, f32 | {ours} | {peer} | {vs} |")
gan = [json.loads(line) for line in open(gan_path) if line.strip()] if os.path.exists(gan_path) else []
if gan:
    print()
    print("| GAN generator | batch | Gantry backend | Gantry median ms | PyTorch median ms | Gantry speed vs peer | max abs diff |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for r in gan:
        ours, peer = r["ours"], r.get("peer") or {}
        vs = f"{peer['median_ms'] / ours['median_ms']:.2f}x" if peer.get("median_ms") and ours.get("median_ms") else ""
        diff = f"{peer['max_abs_diff']:.1e}" if "max_abs_diff" in peer else ""
        print(f"| {r['model']} | {r['batch']} | {ours.get('backend', '')} | {ours.get('median_ms', '')} | {peer.get('median_ms', '')} | {vs} | {diff} |")
whisper = [json.loads(line) for line in open(whisper_path) if line.strip()] if os.path.exists(whisper_path) else []
if whisper:
    print()
    print("| whisper-tiny-en, greedy | Gantry backend | Gantry audio s per s | faster-whisper audio s per s (device) | Gantry speed vs peer | text as the CPU kernels' |")
    print("|---|---|---:|---:|---:|---|")
    for r in whisper:
        ours, peer = r["ours"], r.get("peer") or {}
        vs = f"{ours['audio_s_per_s'] / peer['audio_s_per_s']:.2f}x" if peer.get("audio_s_per_s") else ""
        fw = f"{peer['audio_s_per_s']:.1f} ({peer.get('device', '')})" if peer.get("audio_s_per_s") else ""
        same = {True: "yes", False: "**no**"}.get(r.get("same_text"), "")
        print(f"| {ours['audio_s']:.0f} s of speech | {r['backend']} | {ours['audio_s_per_s']:.1f} | {fw} | {vs} | {same} |")
EOF
log "done in $(($(date +%s) - started)) s: $out/device-check.md"
cat "$out/device-check.md"
