#!/usr/bin/env bash
# Stable Diffusion on the CPU: Gantry's pipeline (candle) beside diffusers
# (PyTorch) on the same full-size random weights, same size, steps and
# starting latents, the pipeline alone (no HTTP). See docs/benchmarks.md.
#
#   PYTHON=/path/to/python-with-torch-diffusers bench/image/sd.sh
#
# VARIANT=sd-turbo SIZE=256 STEPS="1 2" RUNS=3 THREADS=2 ROUNDS=2 (defaults).
# The weights (about 5 GB for SD-Turbo) are written once, seeded, into
# ~/.cache/gantry/bench/<variant>-random.
set -euo pipefail
cd "$(dirname "$0")/../.."
variant="${VARIANT:-sd-turbo}"
size="${SIZE:-256}"
steps_list="${STEPS:-1 2}"
runs="${RUNS:-3}"
threads="${THREADS:-2}"
rounds="${ROUNDS:-2}"
python="${PYTHON:-python3}"
weights="${WEIGHTS:-$HOME/.cache/gantry/bench/$variant-random}"

cargo build -q --release -p gantry-model-diffusion --example write_tiny_weights --example sd_bench
if [ ! -f "$weights/unet/diffusion_pytorch_model.safetensors" ]; then
  target/release/examples/write_tiny_weights "$variant" "$weights" --full
fi
echo "# $(date -u '+%F %R') UTC, $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# torch $("$python" -c 'import torch, diffusers; print(torch.__version__, "diffusers", diffusers.__version__)' 2>/dev/null)"
for round in $(seq "$rounds"); do
  for steps in $steps_list; do
    rust=$(RAYON_NUM_THREADS="$threads" target/release/examples/sd_bench "$weights" "$variant" "$size" "$size" "$steps" 0 "$runs" | sed -n 's/^median //p')
    torch=$("$python" bench/image/sd_reference.py "$weights" "$variant" "$size" "$size" "$steps" 0 "$runs" "$threads" 2>/dev/null | sed -n 's/^median //p')
    echo "round $round ${size}x${size} steps $steps: gantry $rust, diffusers $torch"
  done
done
