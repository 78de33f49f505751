#!/usr/bin/env bash
# The text engine alone (no HTTP) against plain llama.cpp on the same GGUF,
# interleaved, so that a VM whose speed drifts over minutes meets all three
# sides alike. Each round runs, in an order that rotates from round to round:
#
#   engine   crates/models/text/examples/throughput: one greedy stream of N
#            tokens on the worker's context (8192 cells, 16 sequences)
#   tp       gantry-llama-bench -p 0 -n N in the same geometry, ggml threadpool
#   no-tp    the same with --no-threadpool (ggml's threads made per graph)
#
# and prints the three tok/s per round, then the medians and the per-round
# ratios (median and interquartile range).
#
#   bench/text/engine-vs-llama.sh                  # ROUNDS=16 TOKENS=256 THREADS=2
#
# Needs bench/text/build-llama-cpp.sh (the `gantry` build) and
# `cargo build --release -p gantry-model-text --example throughput`.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
ROUNDS="${ROUNDS:-16}"
TOKENS="${TOKENS:-256}"
THREADS="${THREADS:-2}"
MODELS_DIR="${GANTRY_MODELS_DIR:-$HOME/.cache/gantry/models}"
GGUF="${GGUF:-$MODELS_DIR/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf}"
BENCH="${GANTRY_LLAMA_CPP_BUILD:-$HOME/.cache/gantry/llama.cpp-build}/gantry/bin/gantry-llama-bench"
ENGINE="$repo/target/release/examples/throughput"

for f in "$GGUF" "$BENCH" "$ENGINE"; do
    [ -e "$f" ] || { echo "engine-vs-llama: missing $f (see the header of this script)" >&2; exit 1; }
done

llama() {
    "$BENCH" -m "$GGUF" -t "$THREADS" -p 0 -n "$TOKENS" -r 1 -c 8192 --seq-max 16 -o json "$@" 2>/dev/null |
        python3 -c 'import json, sys; print(next(x["avg_ts"] for x in json.load(sys.stdin) if x["n_gen"]))'
}
engine() {
    # its last report line ends with "per-stream decode tokens/s [R]"
    GANTRY_TEST_MODELS_DIR="$MODELS_DIR" "$ENGINE" "$GGUF" --temperature 0 --threads "$THREADS" --streams 1 \
        --tokens "$TOKENS" 2>&1 | grep 'per-stream decode' | tail -n 1 | sed -E 's/.*\[([0-9.]+)\].*/\1/'
}

rows=()
for round in $(seq 1 "$ROUNDS"); do
    case $((round % 3)) in
        0) e=$(engine); t=$(llama); n=$(llama --no-threadpool) ;;
        1) t=$(llama); n=$(llama --no-threadpool); e=$(engine) ;;
        2) n=$(llama --no-threadpool); e=$(engine); t=$(llama) ;;
    esac
    echo "round $round: engine $e, llama.cpp tp $t, no-tp $n tok/s" >&2
    rows+=("$e $t $n")
done

printf '%s\n' "${rows[@]}" | python3 -c '
import statistics, sys
rows = [list(map(float, line.split())) for line in sys.stdin if line.strip()]
engine, tp, no_tp = zip(*rows)
def quartiles(values):
    q = statistics.quantiles(values, n=4)
    return f"{statistics.median(values):.3f} ({q[0]:.3f}-{q[2]:.3f})"
print(f"rounds {len(rows)}; medians: engine {statistics.median(engine):.1f}, llama.cpp tp {statistics.median(tp):.1f}, "
      f"no-tp {statistics.median(no_tp):.1f} tok/s")
print("engine / llama.cpp tp     " + quartiles([e / t for e, t, _ in rows]))
print("llama.cpp tp / no-tp      " + quartiles([t / n for _, t, n in rows]))
print("engine / llama.cpp no-tp  " + quartiles([e / n for e, _, n in rows]))
'
