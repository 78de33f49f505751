#!/usr/bin/env bash
# ONNX Runtime's GPU build, for the ONNX models (the speech voices, terrain-128) on a GPU: the
# three libraries of the onnxruntime-gpu wheel, fetched the way the CPU runtime is (pip download
# --no-deps, never installed; curl from PyPI where there is no pip), checked against the SHA-256
# pinned below, into DIR (default ~/.cache/gantry/onnxruntime-gpu-$VERSION). Prints the path of
# libonnxruntime.so.*: give it to Gantry as `onnx_library` (GANTRY_ONNX_LIBRARY), with
# `speech.cuda_device` / `image.cuda_device`. Files already there and intact are not fetched again.
#
#   scripts/fetch-onnxruntime-gpu.sh [DIR]
#
# Where it runs, the CUDA provider opens the driver (libcuda.so.1) and CUDA 13's libcudart,
# libcublas, libcublasLt, libcurand, libcufft and cuDNN 9: the nvidia-*-cu13 wheels, a PyTorch
# environment's nvidia/cu13/lib, or the nvidia/cuda images (docs/models.md, "GPU").
set -euo pipefail
VERSION=1.31.1
WHEEL="onnxruntime_gpu-$VERSION-cp312-cp312-manylinux_2_28_x86_64.whl"
WHEEL_SHA256=05d548956197b9d01f59b625de740e0d6be3593f874e241a12dc0362650ecdf7
declare -A FILES=(
  ["libonnxruntime.so.$VERSION"]=5104254339ecadae808da771bd0b63b240f0dbd466514234905e54372435c303
  [libonnxruntime_providers_shared.so]=086ec1d5388f64153d9c63470d126693db9a182c8ce236d3a1119068471b8a0d
  [libonnxruntime_providers_cuda.so]=8387867e857499e045caff5d13ac6a5de29571c801562fa2dde0e45f1f31de52
)
dir="${1:-$HOME/.cache/gantry/onnxruntime-gpu-$VERSION}"
say() { printf '== %s\n' "$*" >&2; }
die() { printf 'fetch-onnxruntime-gpu.sh: %s\n' "$*" >&2; exit 1; }
intact() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }

missing=()
for name in "${!FILES[@]}"; do
  intact "$dir/$name" "${FILES[$name]}" || missing+=("$name")
done
if [ ${#missing[@]} -gt 0 ]; then
  mkdir -p "$dir"
  wheels="$HOME/.cache/gantry/wheels"
  mkdir -p "$wheels"
  if ! intact "$wheels/$WHEEL" "$WHEEL_SHA256"; then
    say "onnxruntime-gpu $VERSION (255 MB) from PyPI into $wheels"
    if python3 -m pip --version >/dev/null 2>&1; then
      python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
        --python-version 3.12 --implementation cp --abi cp312 --platform manylinux_2_28_x86_64 \
        -d "$wheels" "onnxruntime-gpu==$VERSION" >&2
    else
      url="$(curl -fsSL "https://pypi.org/pypi/onnxruntime-gpu/$VERSION/json" |
        python3 -c 'import json, sys; print(next(u["url"] for u in json.load(sys.stdin)["urls"] if u["filename"] == sys.argv[1]))' "$WHEEL")"
      curl -fsSL -o "$wheels/$WHEEL.part" "$url" && mv "$wheels/$WHEEL.part" "$wheels/$WHEEL"
    fi
    intact "$wheels/$WHEEL" "$WHEEL_SHA256" || die "$wheels/$WHEEL is not the wheel pinned here (SHA-256)"
  fi
  for name in "${missing[@]}"; do
    python3 - "$wheels/$WHEEL" "onnxruntime/capi/$name" "$dir/$name.part" <<'EOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel, wheel.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF
    intact "$dir/$name.part" "${FILES[$name]}" || die "$name from the wheel does not match its pinned SHA-256"
    mv "$dir/$name.part" "$dir/$name"
  done
  say "ONNX Runtime $VERSION (CUDA) in $dir"
fi
echo "$dir/libonnxruntime.so.$VERSION"
