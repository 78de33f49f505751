#!/usr/bin/env bash
# Packs what bench/gpu/device-check.sh needs on a GPU machine that has no Rust and no network and
# receives at most 64 MiB per call (the working tree included), into bench/gpu/payload/call-1,
# call-2, ... (git-ignored), each at most $BUDGET_MIB (default 48) of chunks, in the order the
# device uses them:
#   1. llama.cpp.tar.xz  the llama.cpp tree the text engine links (the copy vendored in the
#                        llama-cpp-sys-2 crate Cargo.lock pins), without the backends it does not use
#   2. gantry.xz         the CUDA release binary (scripts/build-cuda.sh --with-sd-bench)
#   3. sd_bench.xz, write_tiny_weights.xz, gan_bench.xz, transcribe_bench.xz   the image and
#      Whisper benchmark programs on CUDA
#   4. wheels.tar        diffusers and transformers with what they need beyond torch and numpy
#                        (CPython 3.12, manylinux x86_64), for the SD peer
#   5. the GGUF          SmolLM2-135M-Instruct Q4_1 from the model cache
#   6. the GAN weights   dcgan-faces-64.safetensors, eyes-128.safetensors from the model cache
#   7. Whisper           whisper-tiny-en.tar (its model.bin, config and tokenizer) and speech16k.wav
#                        (bench/gpu/speech-sample.sh)
# Each call dir has a MANIFEST ("<file> <chunks> <sha256>") for the files it has chunks of.
#
#   scripts/build-cuda.sh --with-sd-bench && bench/gpu/pack.sh
#   then, with the device tool, once per part (the same command each time):
#     run(command="bash bench/gpu/device-check.sh", carry=["bench/gpu/payload/call-K"])
#
#   bench/gpu/pack.sh --llama-only   only the llama.cpp tarball, into bench/gpu/work, where
#                                    DEVICE_CHECK_CPU=1 bench/gpu/device-check.sh builds it on the CPU
#
# Environment: DIST (target/cuda/dist), GANTRY_MODELS_DIR (~/.cache/gantry/models), BUDGET_MIB,
# WITH_SD=0 (no SD programs and no wheels: the device check then leaves SD out).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
repo="$PWD"
dist="${DIST:-$repo/target/cuda/dist}"
models="${GANTRY_MODELS_DIR:-$HOME/.cache/gantry/models}"
budget_mib="${BUDGET_MIB:-48}"
payload="$repo/bench/gpu/payload"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
say() { printf '== %s\n' "$*" >&2; }
llama_only=false
[ "${1:-}" = --llama-only ] && llama_only=true

with_sd="${WITH_SD:-1}"
programs=(gantry)
[ "$with_sd" = 0 ] || programs+=(sd_bench write_tiny_weights gan_bench transcribe_bench)
$llama_only || for file in "${programs[@]/#/$dist/}"; do
  [ -x "$file" ] || { echo "pack.sh: no $file: run scripts/build-cuda.sh --with-sd-bench first" >&2; exit 1; }
done
gguf="$models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
$llama_only || [ -e "$gguf" ] || { echo "pack.sh: no $gguf: run gantry models pull smollm2-135m-instruct" >&2; exit 1; }

say "llama.cpp's tree, as the text engine links it"
version="$(awk '/^name = "llama-cpp-sys-2"$/ { getline; gsub(/[^0-9.]/, ""); print; exit }' Cargo.lock)"
crate="$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"llama-cpp-sys-2-$version" | head -n1)"
[ -f "$crate/llama.cpp/include/llama.h" ] || { echo "pack.sh: no llama.cpp tree in $crate (cargo fetch)" >&2; exit 1; }
mkdir -p "$stage/llama"
cp -r "$crate/llama.cpp" "$stage/llama/llama.cpp"
# Only the CPU and CUDA backends are built; the others' sources stay behind.
find "$stage/llama/llama.cpp/ggml/src" -mindepth 1 -maxdepth 1 -type d -name 'ggml-*' \
  ! -name ggml-cpu ! -name ggml-cuda -exec rm -rf {} +
rm -rf "$stage/llama/llama.cpp/"{docs,examples,tests,tools,models,gguf-py,pocs,ci,grammars}
echo "llama-cpp-sys-2 $version" >"$stage/llama/SOURCE"
tar -C "$stage/llama" -cJf "$stage/llama.cpp.tar.xz" llama.cpp SOURCE
if $llama_only; then
  mkdir -p bench/gpu/work
  mv "$stage/llama.cpp.tar.xz" bench/gpu/work/llama.cpp.tar.xz
  say "bench/gpu/work/llama.cpp.tar.xz ($(du -h bench/gpu/work/llama.cpp.tar.xz | cut -f1))"
  exit 0
fi

say "the binaries, compressed"
for file in "${programs[@]}"; do
  xz -T0 -6 -c "$dist/$file" >"$stage/$file.xz"
done

files=(llama.cpp.tar.xz "${programs[@]/%/.xz}")
if [ "$with_sd" != 0 ]; then
  say "diffusers and transformers for the SD peer (CPython 3.12, manylinux x86_64)"
  mkdir -p "$stage/wheels"
  python3 -m pip download -q --disable-pip-version-check -d "$stage/wheels" --only-binary=:all: \
    --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform any \
    diffusers transformers
  # What PyTorch's own environment has already.
  rm -f "$stage"/wheels/{numpy,torch,nvidia_,triton,sympy,mpmath,networkx,jinja2,markupsafe,MarkupSafe,fsspec,filelock,typing_extensions,setuptools}-* \
    "$stage"/wheels/nvidia_*
  tar -C "$stage/wheels" -cf "$stage/wheels.tar" .
  files+=(wheels.tar)
fi
files+=(SmolLM2-135M-Instruct.Q4_1.gguf)
cp "$gguf" "$stage/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ "$with_sd" != 0 ]; then
  for pair in dcgan-faces-64/weights.safetensors eyes-128/generator_model_state.safetensors; do
    [ -e "$models/$pair" ] || { echo "pack.sh: no $models/$pair: run gantry models pull ${pair%%/*}" >&2; exit 1; }
    cp "$models/$pair" "$stage/${pair%%/*}.safetensors"
    files+=("${pair%%/*}.safetensors")
  done
  [ -e "$models/whisper-tiny-en/model.bin" ] || { echo "pack.sh: no $models/whisper-tiny-en: run gantry models pull whisper-tiny-en" >&2; exit 1; }
  tar -C "$models" -cf "$stage/whisper-tiny-en.tar" whisper-tiny-en/model.bin whisper-tiny-en/config.json whisper-tiny-en/tokenizer.json
  bash bench/gpu/speech-sample.sh "$stage/speech16k.wav"
  files+=(whisper-tiny-en.tar speech16k.wav)
fi

rm -rf "$payload"
python3 - "$stage" "$payload" "$budget_mib" "${files[@]}" <<'EOF'
import hashlib, os, sys
stage, payload, budget = sys.argv[1], sys.argv[2], int(sys.argv[3]) << 20
files = sys.argv[4:]
calls, room = [], 0  # calls: list of {file: [(index, bytes)]}
for name in files:
    data = open(os.path.join(stage, name), "rb").read()
    sha = hashlib.sha256(data).hexdigest()
    pieces, at = [], 0
    while at < len(data):
        if room == 0:
            calls.append({})
            room = budget
        take = min(room, len(data) - at)
        pieces.append((len(calls) - 1, data[at:at + take]))
        at += take
        room -= take
    for index, (call, chunk) in enumerate(pieces, 1):
        calls[call].setdefault(name, (sha, len(pieces), []))[2].append((index, chunk))
for number, call in enumerate(calls, 1):
    folder = os.path.join(payload, f"call-{number}")
    os.makedirs(folder)
    with open(os.path.join(folder, "MANIFEST"), "w") as manifest:
        for name, (sha, count, chunks) in call.items():
            manifest.write(f"{name} {count} {sha}\n")
            for index, chunk in chunks:
                open(os.path.join(folder, f"{name}.{index}"), "wb").write(chunk)
    size = sum(len(c) for _, _, chunks in call.values() for _, c in chunks)
    print(f"call-{number}: {size / 2**20:.1f} MiB: {', '.join(call)}")
EOF
say "carry bench/gpu/payload/call-1, call-2, ... in turn, each with: bash bench/gpu/device-check.sh"
