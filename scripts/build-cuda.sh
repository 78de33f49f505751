#!/usr/bin/env bash
# Builds the release `gantry` binary for NVIDIA GPUs on a machine with no GPU and no system CUDA
# toolkit: the toolkit comes from NVIDIA's PyPI wheels (CUDA 13.0), installed into a private
# virtual environment under the cache, never into the system.
#
#   scripts/build-cuda.sh                 the `cuda` feature: the text engine (llama.cpp's CUDA
#                                         backend) and candle's CUDA backend (diffusion, embeddings)
#   scripts/build-cuda.sh --text-only     only the text engine on CUDA (fewer libraries to ship)
#   scripts/build-cuda.sh --toolkit-only  assembles the toolkit and checks it (nvcc compiles and
#                                         links a kernel); builds nothing of Gantry
#   scripts/build-cuda.sh --arch 89       the GPU architecture (compute capability without the
#                                         dot); default 90, the H100 and H200
#   scripts/build-cuda.sh --out DIR       where the binary goes (default target/cuda/dist)
#   scripts/build-cuda.sh --with-sd-bench also the Stable Diffusion pipeline's benchmark programs
#                                         (sd_bench, write_tiny_weights, gan_bench, transcribe_bench) on CUDA, for bench/gpu
#   scripts/build-cuda.sh --bundle-libs   also copies the CUDA libraries the binary needs (not the
#                                         driver) into DIR/lib, for an image without a toolkit
#
# What it does, in order (each step is skipped when its result is already there):
#   1. The wheels, into $CACHE/venv: nvcc, the runtime, cuBLAS, CCCL, the C runtime headers and
#      NVVM (and for the full build NVRTC and cuRAND, which candle links). 13.0 because the
#      GPU machines' drivers (580) run 13.0 code; a newer nvcc makes code such a driver refuses.
#   2. A toolkit root that CMake's FindCUDAToolkit and cudarc accept, in $CACHE/root: bin,
#      include and nvvm linked from the wheels; lib with the wheels' libraries plus the
#      unversioned names the linker looks for; lib64 -> lib.
#   3. A link-time stand-in for the driver (libcuda.so.1): no stub ships on PyPI, so one is built
#      from the functions cuda.h declares, each returning CUDA_ERROR_STUB_LIBRARY. It lives in
#      lib/stubs only, which is never on the library path where the binary runs; there the GPU
#      driver's own libcuda.so.1 is used.
#   4. llama-cpp-sys-2 asks for cuBLAS's static archives, which the wheels do not ship: empty
#      archives of those names satisfy its search, and cuBLAS is linked dynamically instead.
#   5. cargo build --release of `gantry` with the feature, for one architecture only
#      (CMAKE_CUDA_ARCHITECTURES=<arch>-real, CUDA_COMPUTE_CAP=<arch> for candle's kernels), and
#      the binary's list of the shared libraries it needs (DIR/gantry.needs).
#
# Where the binary runs, it needs the GPU driver (libcuda.so.1) and the CUDA 13 libraries it
# names (libcublas.so.13, libcublasLt.so.13, libcudart.so.13; with the full build also
# libcurand.so.10 and libnvrtc.so.13): $CACHE/root/lib has them all, and any CUDA 13 runtime
# (a PyTorch venv's nvidia/cu13/lib, the nvidia/cuda images) serves. Two cores take about 25 minutes
# for llama.cpp's CUDA kernels alone.
#
# Environment: GANTRY_CUDA_CACHE (default ~/.cache/gantry/cuda-13.0), GANTRY_CUDA_ARCH,
# PIP_INDEX_URL (a mirror of PyPI).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${GANTRY_CUDA_CACHE:-$HOME/.cache/gantry/cuda-13.0}"
ARCH="${GANTRY_CUDA_ARCH:-90}"
# Its own target directory: the CPU build's target/release is left alone.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$REPO/target/cuda}"
OUT="$CARGO_TARGET_DIR/dist"
mode=full
sd_bench=false
bundle=false
while [ $# -gt 0 ]; do
  case "$1" in
  --text-only) mode=text ;;
  --toolkit-only) mode=toolkit ;;
  --with-sd-bench) sd_bench=true ;;
  --bundle-libs) bundle=true ;;
  --arch) ARCH="${2:?--arch needs a number, e.g. 90}"; shift ;;
  --out) OUT="${2:?--out needs a directory}"; shift ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "build-cuda.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ "$sd_bench" = false ] || [ "$mode" = full ] ||
  { echo "build-cuda.sh: --with-sd-bench needs the full build (candle on CUDA)" >&2; exit 2; }
[[ "$ARCH" =~ ^[0-9]{2,3}$ ]] || { echo "build-cuda.sh: --arch is a compute capability without the dot (90, 89, 120), not '$ARCH'" >&2; exit 2; }
say() { printf '== %s\n' "$*" >&2; }

# ---- 1. the wheels ----------------------------------------------------------------------------
wheels=(nvidia-cuda-nvcc==13.0.* nvidia-cuda-runtime==13.0.* nvidia-cublas==13.0.* nvidia-cuda-cccl==13.0.*
  nvidia-cuda-crt==13.0.* nvidia-nvvm==13.0.*)
[ "$mode" = full ] && wheels+=(nvidia-cuda-nvrtc==13.0.* nvidia-curand==10.4.0.*)
mkdir -p "$CACHE"
if [ ! -x "$CACHE/venv/bin/python" ]; then
  say "a virtual environment for the CUDA wheels in $CACHE/venv"
  python3 -m venv "$CACHE/venv"
fi
stamp="$CACHE/venv/.wheels-$(printf '%s\n' "${wheels[@]}" | sha256sum | cut -c1-16)"
if [ ! -e "$stamp" ]; then
  say "the CUDA 13.0 toolkit from PyPI: ${wheels[*]}"
  "$CACHE/venv/bin/pip" install -q --disable-pip-version-check "${wheels[@]}"
  touch "$stamp"
fi
cu13="$("$CACHE/venv/bin/python" -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13"))')"
[ -x "$cu13/bin/nvcc" ] || { echo "build-cuda.sh: no nvcc in $cu13/bin after installing the wheels" >&2; exit 1; }

# ---- 2. the toolkit root ----------------------------------------------------------------------
ROOT="$CACHE/root"
mkdir -p "$ROOT/lib/stubs"
for dir in bin include nvvm; do ln -sfn "$cu13/$dir" "$ROOT/$dir"; done
ln -sfn lib "$ROOT/lib64"
# nvcc finds its own libraries from where its binary really is (the wheel's cu13/bin), in
# ../lib64, which the wheels call lib: the private environment gets the alias too.
ln -sfn lib "$cu13/lib64"
# The static runtime and device runtime too (libcudart_static.a, libcudadevrt.a): nvcc links them
# by default, CMake's compiler check included.
for lib in "$cu13"/lib/*.so* "$cu13"/lib/*.a; do
  name="$(basename "$lib")"
  ln -sf "$lib" "$ROOT/lib/$name"
  # libcublas.so.13 -> libcublas.so as well: the linker looks for the unversioned name.
  case "$name" in *.so.*) ln -sf "$lib" "$ROOT/lib/${name%%.so.*}.so" ;; esac
done

# ---- 3. the driver's stand-in, for linking only ---------------------------------------------
if [ ! -e "$ROOT/lib/stubs/libcuda.so" ] || [ "$ROOT/include/cuda.h" -nt "$ROOT/lib/stubs/libcuda.so" ]; then
  say "a link-time stand-in for libcuda.so.1 (lib/stubs; never on the library path at run time)"
  stub="$(mktemp -d)"
  # Every cu* function cuda.h declares, under the names it declares and the names its macros
  # map them to (cuMemAlloc -> cuMemAlloc_v2), which are the ones object code refers to.
  {
    grep -ohE '\bcu[A-Z][A-Za-z0-9_]*[[:space:]]*\(' "$ROOT/include/cuda.h"
    gcc -E -P -I"$ROOT/include" "$ROOT/include/cuda.h" 2>/dev/null | grep -ohE '\bcu[A-Z][A-Za-z0-9_]*[[:space:]]*\('
  } | tr -d '( \t' | sort -u >"$stub/names"
  # 34 is CUDA_ERROR_STUB_LIBRARY: what a program sees if this file were ever loaded.
  awk '{ printf "int %s(void) { return 34; }\n", $1 }' "$stub/names" >"$stub/libcuda.c"
  gcc -shared -fPIC -o "$ROOT/lib/stubs/libcuda.so" -Wl,-soname,libcuda.so.1 "$stub/libcuda.c"
  ln -sf libcuda.so "$ROOT/lib/stubs/libcuda.so.1"
  say "  $(wc -l <"$stub/names") functions"
  rm -rf "$stub"
fi

# ---- 4. the static archives llama-cpp-sys-2 looks for ----------------------------------------
FAKE="$CACHE/static-stand-ins"
mkdir -p "$FAKE/lib64"
for archive in libcublas_static.a libcublasLt_static.a libculibos.a; do
  [ -e "$FAKE/lib64/$archive" ] || printf '!<arch>\n' >"$FAKE/lib64/$archive"
done

export PATH="$ROOT/bin:$PATH" CUDA_PATH="$ROOT" CUDA_HOME="$ROOT" CUDACXX="$ROOT/bin/nvcc"
# llama-cpp-sys-2 reads library directories from CUDA_LIBRARY_PATH (each entry's lib64 and
# lib64/stubs) and passes CMAKE_* and GGML_* variables on to CMake.
export CUDA_LIBRARY_PATH="$ROOT:$FAKE" CMAKE_CUDA_ARCHITECTURES="$ARCH-real" CUDA_COMPUTE_CAP="$ARCH"

# ---- the toolkit's own check --------------------------------------------------------------
check="$(mktemp -d)"
trap 'rm -rf "$check"' EXIT
cat >"$check/add.cu" <<'EOF'
#include <cuda.h>
#include <cuda_runtime.h>
#include <cublas_v2.h>
__global__ void add(float *x, float y) { x[threadIdx.x] += y; }
int main() {
  float *x;
  cublasHandle_t handle;
  if (cuInit(0) != CUDA_SUCCESS || cudaMalloc(&x, 32 * sizeof(float)) != cudaSuccess) return 1;
  add<<<1, 32>>>(x, 1.0f);
  return cublasCreate(&handle) == CUBLAS_STATUS_SUCCESS ? 0 : 1;
}
EOF
say "checking the toolkit: nvcc $("$ROOT/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') compiles a kernel for sm_$ARCH and links it"
# Machine code for the architecture (a cubin), then a whole program linked the way the build
# links: the runtime and cuBLAS shared, the driver from the stand-in.
"$ROOT/bin/nvcc" -arch="sm_$ARCH" -cubin -o "$check/add.cubin" "$check/add.cu"
readelf -h "$check/add.cubin" | grep -q "NVIDIA CUDA" ||
  { echo "build-cuda.sh: nvcc made no sm_$ARCH machine code" >&2; exit 1; }
"$ROOT/bin/nvcc" -arch="sm_$ARCH" -c -o "$check/add.o" "$check/add.cu"
g++ -o "$check/add" "$check/add.o" -L"$ROOT/lib" -L"$ROOT/lib/stubs" -lcudart -lcuda -lcublas \
  -Wl,-rpath-link="$ROOT/lib"
if [ "$mode" = toolkit ]; then
  say "the toolkit is ready: $ROOT"
  exit 0
fi

# ---- 5. the binary ----------------------------------------------------------------------------
case "$mode" in
full) features=cuda ;;
text) features=gantry-model-text/cuda ;;
esac
say "cargo build --release -p gantry --features $features (sm_$ARCH)"
cd "$REPO"
cargo rustc --release --locked -p gantry --bin gantry --features "$features" -- \
  -C link-arg=-L"$ROOT/lib" -C link-arg=-L"$ROOT/lib/stubs" -C link-arg=-lcublas -C link-arg=-lcublasLt -C link-arg=-Wl,-rpath-link="$ROOT/lib"
mkdir -p "$OUT"
install -m 0755 "$CARGO_TARGET_DIR/release/gantry" "$OUT/gantry"
# What it needs where it runs (the driver and the CUDA 13 libraries), from its own ELF header.
readelf -d "$OUT/gantry" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' >"$OUT/gantry.needs"
say "built $OUT/gantry; it needs: $(tr '\n' ' ' <"$OUT/gantry.needs")"
if [ "$bundle" = true ]; then
  mkdir -p "$OUT/lib"
  while read -r needed; do
    [ -e "$ROOT/lib/$needed" ] && cp -L "$ROOT/lib/$needed" "$OUT/lib/$needed"
  done <"$OUT/gantry.needs"
  # NVRTC opens its builtins itself, by name, when it compiles.
  if grep -q '^libnvrtc' "$OUT/gantry.needs"; then
    cp -L "$ROOT"/lib/libnvrtc-builtins.so.13.* "$OUT/lib/"
  fi
  say "the CUDA libraries it needs, in $OUT/lib: $(ls "$OUT/lib" | tr '\n' ' ')"
fi
if [ "$sd_bench" = true ]; then
  say "the image and Whisper benchmark programs on CUDA (sd_bench, write_tiny_weights, gan_bench, transcribe_bench)"
  cargo build --release --locked -p gantry-model-diffusion --features cuda --example sd_bench --example write_tiny_weights
  cargo build --release --locked -p gantry-model-image --features cuda --example gan_bench
  cargo build --release --locked -p gantry-model-transcribe --features cuda --example transcribe_bench
  for example in sd_bench write_tiny_weights gan_bench transcribe_bench; do
    install -m 0755 "$CARGO_TARGET_DIR/release/examples/$example" "$OUT/$example"
  done
fi
