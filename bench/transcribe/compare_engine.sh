#!/usr/bin/env bash
# Speed of the Rust Whisper engine (its kernels, and the same model on
# candle's CPU device, the operations of its GPU path) against faster-whisper
# on one WAV (16 kHz mono 16-bit), at 1 and 2 threads: audio seconds per wall
# second, best of N.
#   bench/transcribe/compare_engine.sh MODEL_DIR AUDIO.wav [RUNS]
set -euo pipefail
model=${1:?MODEL_DIR}; wav=${2:?AUDIO.wav}; runs=${3:-3}
here=$(cd "$(dirname "$0")" && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/tmp/target-whisper}
cargo build -q -p gantry-model-transcribe --release --example transcribe_bench
bin=$CARGO_TARGET_DIR/release/examples/transcribe_bench
for t in 1 2; do
  echo "rust         $("$bin" "$model" "$wav" --threads $t --runs "$runs" 2>/dev/null)"
  # candle's CPU device takes its threads from RAYON_NUM_THREADS.
  echo "rust candle  $(RAYON_NUM_THREADS=$t "$bin" "$model" "$wav" --threads $t --runs "$runs" --backend candle 2>/dev/null)"
  echo "fw float32   $(python3 "$here/reference.py" "$model" "$wav" --bench "$runs" --threads $t)"
  echo "fw int8      $(python3 "$here/reference.py" "$model" "$wav" --bench "$runs" --threads $t --compute-type int8)"
done
