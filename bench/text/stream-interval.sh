#!/usr/bin/env bash
# The text model's stream interval A/B: bench/text/run.sh at one stream, run
# alternately with each value of `text.stream_interval_ms` (the order flips
# from round to round, so a VM whose speed drifts meets both alike), then per
# value the medians over the runs of
#
#   pairs    streamed generation tok/s over llama.cpp's tg at the same depth
#            (alternating pairs inside each run: client.py pairs)
#   stream   the server's CPU outside the engine per streamed token (ms)
#   runsync  the same per runsync token (ms)
#   over     that streamed CPU over a token's wall time
#   client   the benchmark client's own CPU per streamed request (ms; it
#            shares the cores with the server)
#
#   bench/text/stream-interval.sh               # INTERVALS="0 50" ROUNDS=4
#
# Each run is `CONCURRENCY=1 PAIRS=6 ROUNDS=3 run.sh` with its own OUT_DIR
# under $OUT_DIR (default /tmp/gantry-bench-interval); GANTRY_BIN and
# LLAMA_VARIANTS pass through (LLAMA_VARIANTS defaults to `gantry` here).
# About 2 minutes per run on a 2-core machine.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
INTERVALS="${INTERVALS:-0 50}"
ROUNDS="${ROUNDS:-4}"
OUT_DIR="${OUT_DIR:-/tmp/gantry-bench-interval}"
export LLAMA_VARIANTS="${LLAMA_VARIANTS:-gantry}"
read -r -a values <<<"$INTERVALS"
mkdir -p "$OUT_DIR"

for round in $(seq 1 "$ROUNDS"); do
    order=("${values[@]}")
    if [ $((round % 2)) = 0 ]; then
        # reverse the order on even rounds
        for ((i = 0, j = ${#order[@]} - 1; i < j; i++, j--)); do
            t="${order[i]}"; order[i]="${order[j]}"; order[j]="$t"
        done
    fi
    for ms in "${order[@]}"; do
        dir="$OUT_DIR/$ms-$round"
        echo "stream-interval: round $round, text.stream_interval_ms=$ms -> $dir" >&2
        GANTRY_TEXT__STREAM_INTERVAL_MS="$ms" OUT_DIR="$dir" CONCURRENCY=1 PAIRS=6 ROUNDS=3 \
            "$here/run.sh" >"$dir.log" 2>&1 || echo "stream-interval: run failed, see $dir.log" >&2
    done
done

python3 - "$OUT_DIR" "${values[@]}" <<'EOF'
import glob, json, os, statistics, sys

out, values = sys.argv[1], sys.argv[2:]

def pick(doc, *path):
    for key in path:
        if not isinstance(doc, dict) or key not in doc:
            return None
        doc = doc[key]
    return doc

print("| text.stream_interval_ms | runs | pairs ratio per run | median | platform ms/token streamed | runsync "
      "| streamed over token time | client CPU ms/streamed request |")
print("|---:|---:|---|---:|---:|---:|---:|---:|")
for ms in values:
    rows = []
    for path in sorted(glob.glob(os.path.join(out, f"{ms}-*", "latest.json"))):
        doc = json.load(open(path))
        rows.append({
            "ratio": pick(doc, "pairs", "ratio", "median"),
            "stream": pick(doc, "gantry", "runsync", "server_cpu", "platform_ms_per_token_stream", "median"),
            "sync": pick(doc, "gantry", "runsync", "server_cpu", "platform_ms_per_token_runsync", "median"),
            "over": pick(doc, "gantry", "runsync", "server_cpu", "platform_stream_over_token_time", "median"),
            "client": pick(doc, "gantry", "runsync", "paired_stream_client_cpu_s", "median"),
        })
    def med(key):
        xs = [r[key] for r in rows if r[key] is not None]
        return statistics.median(xs) if xs else None
    fmt = lambda v, p=2: "–" if v is None else f"{v:.{p}f}"
    per_run = ", ".join(fmt(r["ratio"]) for r in rows)
    print(f"| {ms} | {len(rows)} | {per_run} | {fmt(med('ratio'))} | {fmt(med('stream'), 3)} "
          f"| {fmt(med('sync'), 3)} | {fmt(100 * med('over') if med('over') is not None else None, 2)} % "
          f"| {fmt(1000 * med('client') if med('client') is not None else None, 1)} |")
EOF
