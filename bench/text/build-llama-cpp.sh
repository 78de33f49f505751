#!/usr/bin/env bash
# Builds plain llama.cpp, from the exact source the text worker links (the
# tree vendored in the llama-cpp-sys-2 crate that Cargo.lock pins), together
# with the two reference programs in this folder:
#
#   gantry-greedy-ref   greedy continuation of raw prompts, as JSON (fixtures)
#   gantry-llama-bench  pp/tg tokens/s measured like upstream llama-bench
#
# The crate vendors only the library part of llama.cpp: its tools/ and
# examples/ folders hold READMEs, not the sources of llama-simple, llama-cli or
# llama-bench, which is why those two programs exist. If a later crate version
# ships them, this script says so.
#
# Builds, CPU only, Release, no curl (the first two by default):
#   native  llama.cpp's defaults on this machine (GGML_NATIVE=ON, OpenMP):
#           what a llama.cpp user who builds it here gets
#   gantry  the flags llama-cpp-sys-2's build.rs gives the gantry binary
#           (GGML_NATIVE=OFF, -march=x86-64 with ggml's AVX/AVX2/FMA/F16C/
#           BMI2/SSE4.2 defaults, no AVX-512, no OpenMP): same kernels as ours
#   omp     gantry's flags with OpenMP (decode threads kept between graphs)
#   avx512  gantry's flags plus ggml's AVX-512 (F, VBMI, VNNI, BF16) kernels
#
#   bench/text/build-llama-cpp.sh            # native and gantry, skips what is built
#   GANTRY_LLAMA_CPP_VARIANTS=native bench/text/build-llama-cpp.sh
#   GANTRY_LLAMA_CPP_BUILD=/some/dir ...     # default ~/.cache/gantry/llama.cpp-build
#   GANTRY_LLAMA_CPP_JOBS=1 ...              # parallel compile jobs (default nproc)
#
# Prints nothing on stdout but the build folder, so scripts can capture it.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
build_root="${GANTRY_LLAMA_CPP_BUILD:-$HOME/.cache/gantry/llama.cpp-build}"
variants="${GANTRY_LLAMA_CPP_VARIANTS:-native gantry}"
jobs="${GANTRY_LLAMA_CPP_JOBS:-$(nproc)}"

log() { echo "build-llama-cpp: $*" >&2; }

command -v cmake >/dev/null || { log "cmake is required"; exit 1; }

# --- the vendored source Cargo.lock pins ------------------------------------
version="$(awk '/^name = "llama-cpp-sys-2"$/ { getline; gsub(/[^0-9.]/, ""); print; exit }' "$repo/Cargo.lock")"
[ -n "$version" ] || { log "llama-cpp-sys-2 is not in $repo/Cargo.lock"; exit 1; }
crate_dir="$(cd "$repo" && cargo metadata --format-version 1 --locked 2>/dev/null |
    python3 -c '
import json, os, sys
v = sys.argv[1]
for p in json.load(sys.stdin)["packages"]:
    if p["name"] == "llama-cpp-sys-2" and p["version"] == v:
        print(os.path.dirname(p["manifest_path"]))
        break
' "$version" 2>/dev/null || true)"
if [ -z "$crate_dir" ]; then
    # cargo metadata can fail while the workspace is mid-edit; the registry path will do.
    crate_dir="$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"llama-cpp-sys-2-$version" 2>/dev/null | head -n1 || true)"
fi
src="$crate_dir/llama.cpp"
[ -f "$src/include/llama.h" ] || { log "no llama.cpp tree for llama-cpp-sys-2 $version (fetch it: cargo fetch)"; exit 1; }

vcs_sha="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["git"]["sha1"])' "$crate_dir/.cargo_vcs_info.json" 2>/dev/null || echo unknown)"
ggml_version="$(awk '/set\(GGML_VERSION_(MAJOR|MINOR|PATCH) / { gsub(/\)/, "", $2); v = v (v ? "." : "") $2 } END { print v }' "$src/ggml/CMakeLists.txt")"
if [ "$(git -C "$src" rev-parse --show-toplevel 2>/dev/null)" = "$src" ]; then
    llama_commit="$(git -C "$src" rev-parse --short HEAD) (b$(git -C "$src" rev-list --count HEAD))"
else
    llama_commit="unknown: the crate's copy has no git metadata"
fi

mkdir -p "$build_root"
info="$build_root/source-info.json"
tree_hash_file="$build_root/.tree-sha256.$version"
if [ ! -s "$tree_hash_file" ]; then
    log "hashing $src ..."
    (cd "$src" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-64) >"$tree_hash_file"
fi
tree_sha="$(cat "$tree_hash_file")"
source_id="llama.cpp vendored in llama-cpp-sys-2 $version (llama-cpp-rs $vcs_sha), ggml $ggml_version, llama.cpp commit $llama_commit, tree sha256 ${tree_sha:0:16}"
python3 - "$info" "$version" "$crate_dir" "$vcs_sha" "$ggml_version" "$llama_commit" "$tree_sha" "$source_id" <<'EOF'
import json, sys
path, version, crate_dir, vcs, ggml, commit, tree, sid = sys.argv[1:]
json.dump({"crate": "llama-cpp-sys-2", "crate_version": version, "crate_dir": crate_dir,
           "llama_cpp_rs_commit": vcs, "ggml_version": ggml, "llama_cpp_commit": commit,
           "tree_sha256": tree, "source_id": sid}, open(path, "w"), indent=2)
EOF

for tool in tools/llama-bench/llama-bench.cpp examples/simple/simple.cpp tools/cli/cli.cpp tools/main/main.cpp; do
    if [ -f "$src/$tool" ]; then
        log "note: the vendored tree has $tool; upstream's tool could be built from it"
    fi
done

# --- builds -----------------------------------------------------------------
own_hash="$(cat "$here/llama/CMakeLists.txt" "$here/greedy_ref.cpp" "$here/llama_bench.cpp" | sha256sum | cut -c1-16)"
# llama-cpp-sys-2's C/C++ flags for a gantry binary (x86-64 baseline, no -march=native)
base="-ffunction-sections -fdata-sections -fPIC -m64 -march=x86-64"
for variant in $variants; do
    case "$variant" in
        native) flags=(-DGGML_NATIVE=ON) ;;
        gantry)
            flags=(-DGGML_NATIVE=OFF -DGGML_OPENMP=OFF "-DCMAKE_C_FLAGS=$base" "-DCMAKE_CXX_FLAGS=$base")
            ;;
        omp)
            # the gantry flags with OpenMP: decode threads that persist between graphs
            flags=(-DGGML_NATIVE=OFF -DGGML_OPENMP=ON "-DCMAKE_C_FLAGS=$base" "-DCMAKE_CXX_FLAGS=$base")
            ;;
        avx512)
            # the gantry flags plus ggml's AVX-512 kernels (GGML_AVX512* environment
            # variables at cargo build time give the gantry binary the same)
            flags=(-DGGML_NATIVE=OFF -DGGML_OPENMP=OFF "-DCMAKE_C_FLAGS=$base" "-DCMAKE_CXX_FLAGS=$base"
                -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON)
            ;;
        *) log "unknown variant $variant (native, gantry, omp, avx512)"; exit 1 ;;
    esac
    dir="$build_root/$variant"
    stamp="$dir/.gantry-stamp"
    want="$source_id | $own_hash | ${flags[*]}"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] &&
        [ -x "$dir/bin/gantry-greedy-ref" ] && [ -x "$dir/bin/gantry-llama-bench" ]; then
        log "$variant: up to date in $dir"
        continue
    fi
    log "$variant: configuring in $dir"
    rm -f "$stamp"
    cmake -S "$here/llama" -B "$dir" -DCMAKE_BUILD_TYPE=Release \
        -DLLAMA_SRC="$src" -DLLAMA_CURL=OFF -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DGGML_BLAS=OFF \
        -DGGML_CCACHE=OFF "-DGANTRY_LLAMA_SOURCE_ID=$source_id" "${flags[@]}" >&2
    log "$variant: compiling with $jobs jobs (several minutes on 2 cores)"
    cmake --build "$dir" --config Release -j "$jobs" --target gantry-greedy-ref gantry-llama-bench >&2
    echo "$want" >"$stamp"
    log "$variant: built $dir/bin/gantry-greedy-ref, $dir/bin/gantry-llama-bench"
done
echo "$build_root"
