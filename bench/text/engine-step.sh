#!/usr/bin/env bash
# The text engine's own work per step, outside llama.cpp's decode, with the model on the CPU:
# examples/throughput at 1, 16 and 64 streams, greedy and sampled, once with the tokens of a step
# drawn one after another on the engine thread (--sampling-threads 1: what the engine did before
# it had sampling threads, and still does by default with the model on the CPU) and once on
# $THREADS sampling threads, alternating within each round so that a VM whose speed drifts meets
# both alike.
#
#   bench/text/engine-step.sh            # ROUNDS=3 TOKENS=64 THREADS=2 STREAMS="1 16 64"
#
# Needs `cargo build --release -p gantry-model-text --example throughput` (ENGINE= names another
# binary). Prints one line per run and, per case, the medians: the engine's milliseconds per step
# outside the decode, that as a share of the decode, and the aggregate tokens/s.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
ROUNDS="${ROUNDS:-3}"
TOKENS="${TOKENS:-64}"
THREADS="${THREADS:-2}"
STREAMS="${STREAMS:-1 16 64}"
MODELS_DIR="${GANTRY_MODELS_DIR:-$HOME/.cache/gantry/models}"
GGUF="${GGUF:-$MODELS_DIR/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf}"
ENGINE="${ENGINE:-${CARGO_TARGET_DIR:-$repo/target}/release/examples/throughput}"

for f in "$GGUF" "$ENGINE"; do
    [ -e "$f" ] || { echo "engine-step: missing $f (see the header of this script)" >&2; exit 1; }
done

# One run: the N-streams phase's report lines, as "tokens/s other_ms share_percent".
one() {
    local streams=$1 temperature=$2 sampling=$3
    GANTRY_TEST_MODELS_DIR="$MODELS_DIR" "$ENGINE" "$GGUF" --temperature "$temperature" --threads "$THREADS" \
        --sampling-threads "$sampling" --streams "$streams" --tokens "$TOKENS" 2>/dev/null |
        awk -v label="$streams streams" '
            index($0, label ":") == 1 { for (i = 1; i <= NF; i++) if ($i == "tokens/s" && tps == "") tps = $(i - 1) }
            index($0, label " steps:") == 1 {
                for (i = 1; i <= NF; i++) {
                    if ($i == "outside") other = $(i + 2)
                    if ($i == "%") share = substr($(i - 1), 2)
                }
            }
            END { print tps, other, share }'
}

results=$(mktemp)
trap 'rm -f "$results"' EXIT
for round in $(seq 1 "$ROUNDS"); do
    for streams in $STREAMS; do
        for temperature in 0 0.8; do
            order="1 $THREADS"
            [ $((round % 2)) = 0 ] && order="$THREADS 1"
            for sampling in $order; do
                read -r tps other share < <(one "$streams" "$temperature" "$sampling")
                printf 'round %s  streams %-3s temperature %-4s sampling-threads %s  %8s tok/s  outside decode %7s ms/step (%s %%)\n' \
                    "$round" "$streams" "$temperature" "$sampling" "$tps" "$other" "$share"
                echo "$streams $temperature $sampling $tps $other $share" >>"$results"
            done
        done
    done
done

echo
echo "medians over $ROUNDS rounds (threads $THREADS, $TOKENS tokens per stream; sampling-threads 1 = on the engine thread)"
python3 - "$results" "$THREADS" <<'EOF'
import statistics, sys
from collections import defaultdict
runs = defaultdict(list)
for line in open(sys.argv[1]):
    streams, temperature, sampling, tps, other, share = line.split()
    runs[(int(streams), temperature, sampling)].append((float(tps), float(other), float(share)))
print("| streams | temperature | engine thread: ms/step outside decode (% of decode) | sampling threads: ms/step (% of decode) | tok/s, engine thread → sampling threads |")
print("|---:|---|---:|---:|---|")
for (streams, temperature) in sorted({(s, t) for s, t, _ in runs}):
    a = runs[(streams, temperature, "1")]
    b = runs[(streams, temperature, sys.argv[2])]
    med = lambda xs, i: statistics.median(x[i] for x in xs)
    print(f"| {streams} | {temperature} | {med(a, 1):.3f} ({med(a, 2):.1f} %) | {med(b, 1):.3f} ({med(b, 2):.1f} %) | {med(a, 0):.1f} → {med(b, 0):.1f} |")
EOF
