#!/usr/bin/env bash
# The text engine's own work per step, outside llama.cpp's decode, with the model on the CPU:
# examples/throughput at 1, 16 and 64 streams, greedy and sampled, once with the tokens of a step
# drawn one after another on the engine thread (--sampling-threads 1: what the engine did before
# it had sampling threads, and still does by default with the model on the CPU) and once on
# $THREADS sampling threads, alternating within each round so that a VM whose speed drifts meets
# both alike.
#
#   bench/text/engine-step.sh            # ROUNDS=3 TOKENS=64 THREADS=2 STREAMS="1 16 64"
#   ENGINE_B=/path/to/other/throughput bench/text/engine-step.sh
#       two builds instead of two thread settings: ENGINE against ENGINE_B, both with
#       SAMPLING_THREADS (default 1) sampling threads, alternating in the same way
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

# The two variants compared, as "label engine sampling-threads".
if [ -n "${ENGINE_B:-}" ]; then
    [ -e "$ENGINE_B" ] || { echo "engine-step: missing $ENGINE_B" >&2; exit 1; }
    variants=("A $ENGINE ${SAMPLING_THREADS:-1}" "B $ENGINE_B ${SAMPLING_THREADS:-1}")
    echo "A = $ENGINE, B = $ENGINE_B, sampling threads ${SAMPLING_THREADS:-1}"
else
    variants=("1 $ENGINE 1" "$THREADS $ENGINE $THREADS")
fi

# One run: the N-streams phase's report lines, as "tokens/s other_ms share_percent".
one() {
    local streams=$1 temperature=$2 engine=$3 sampling=$4
    GANTRY_TEST_MODELS_DIR="$MODELS_DIR" "$engine" "$GGUF" --temperature "$temperature" --threads "$THREADS" \
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
            order="0 1"
            [ $((round % 2)) = 0 ] && order="1 0"
            for v in $order; do
                read -r label engine sampling <<<"${variants[$v]}"
                read -r tps other share < <(one "$streams" "$temperature" "$engine" "$sampling")
                printf 'round %s  streams %-3s temperature %-4s %s (sampling threads %s)  %8s tok/s  outside decode %7s ms/step (%s %%)\n' \
                    "$round" "$streams" "$temperature" "$label" "$sampling" "$tps" "$other" "$share"
                echo "$streams $temperature $label $tps $other $share" >>"$results"
            done
        done
    done
done

echo
echo "medians over $ROUNDS rounds (threads $THREADS, $TOKENS tokens per stream; sampling threads 1 = on the engine thread)"
read -r first _ <<<"${variants[0]}"
read -r second _ <<<"${variants[1]}"
python3 - "$results" "$first" "$second" <<'EOF'
import statistics, sys
from collections import defaultdict
runs = defaultdict(list)
for line in open(sys.argv[1]):
    streams, temperature, label, tps, other, share = line.split()
    runs[(int(streams), temperature, label)].append((float(tps), float(other), float(share)))
first, second = sys.argv[2], sys.argv[3]
print(f"| streams | temperature | {first}: ms/step outside decode (% of decode) | {second}: ms/step (% of decode) | tok/s, {first} → {second} |")
print("|---:|---|---:|---:|---|")
for (streams, temperature) in sorted({(s, t) for s, t, _ in runs}):
    a = runs[(streams, temperature, first)]
    b = runs[(streams, temperature, second)]
    med = lambda xs, i: statistics.median(x[i] for x in xs)
    print(f"| {streams} | {temperature} | {med(a, 1):.3f} ({med(a, 2):.1f} %) | {med(b, 1):.3f} ({med(b, 2):.1f} %) | {med(a, 0):.1f} → {med(b, 0):.1f} |")
EOF
