#!/usr/bin/env bash
# Rewrites tests/data/reference/<variant>.safetensors: what diffusers and
# transformers compute from the tiny test weights (see reference.py).
# PYTHON names an interpreter with torch, diffusers, transformers and
# safetensors (default: python3).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../../../.." && pwd)"
python="${PYTHON:-python3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$root"
cargo build -q -p gantry-model-diffusion --example write_tiny_weights
for variant in sd-1.5 sd-turbo sdxl; do
  target/debug/examples/write_tiny_weights "$variant" "$work/$variant" > /dev/null
  "$python" "$here/reference.py" "$variant" "$work/$variant" "$here/../data/reference/$variant.safetensors"
done
