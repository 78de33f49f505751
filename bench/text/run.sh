#!/usr/bin/env bash
# Benchmark of the bundled text model as a user sees it: `gantry serve` in its
# own process, OpenAI chat completions streamed at 1, 4 and 16 concurrent
# streams, the same request through /runsync, the server's memory, and plain
# llama.cpp (same vendored source, same weights) measured beside it.
#
#   bench/text/run.sh                  # THREADS=2, results in /tmp/gantry-bench-text
#   THREADS=1 CONCURRENCY=1,4 ROUNDS=2 OUT_DIR=/tmp/x bench/text/run.sh
#
# Environment (defaults):
#   THREADS=2            GANTRY_TEXT__THREADS and llama-bench -t
#   CONCURRENCY=1,4,16   stream counts; ROUNDS=3 rounds of each
#   PAIRS=6              single-stream requests alternated with llama.cpp runs (0: none)
#   MAX_TOKENS=128       REQUEST_TIMEOUT=60 (s, per request)
#   BUDGET=300           s of client time after which no new round starts
#   OUT_DIR=/tmp/gantry-bench-text   latest.json, latest.md, serve.log, llama-bench-*.json
#   GANTRY_BIN           a gantry binary to use instead of building target/release/gantry
#   GANTRY_TEXT__STREAM_INTERVAL_MS  passed to the server like any setting (0: a chunk per token)
#   LLAMA_VARIANTS="gantry native"   llama.cpp builds to compare (see build-llama-cpp.sh)
#   MANAGEMENT_ADDR=127.0.0.1:18080 PUBLIC_ADDR=127.0.0.1:18081 SCHEDULER_ADDR=127.0.0.1:15051
#
# The release build (thin LTO) is skipped when target/release/gantry is newer
# than every source; it is not counted in the run's time budget. Everything
# after it is bounded: 90 s for the server to come up and 60 s for its first
# job; the client starts no round after BUDGET s, each request has
# REQUEST_TIMEOUT, and the client is killed at BUDGET + 4 x REQUEST_TIMEOUT;
# 90 s per llama-bench run. About 1-2 minutes in all on a quiet 2-core machine.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
THREADS="${THREADS:-2}"
CONCURRENCY="${CONCURRENCY:-1,4,16}"
ROUNDS="${ROUNDS:-3}"
PAIRS="${PAIRS:-6}"
MAX_TOKENS="${MAX_TOKENS:-128}"
REQUEST_TIMEOUT="${REQUEST_TIMEOUT:-60}"
BUDGET="${BUDGET:-300}"
OUT_DIR="${OUT_DIR:-/tmp/gantry-bench-text}"
LLAMA_VARIANTS="${LLAMA_VARIANTS:-gantry native}"
MANAGEMENT_ADDR="${MANAGEMENT_ADDR:-127.0.0.1:18080}"
PUBLIC_ADDR="${PUBLIC_ADDR:-127.0.0.1:18081}"
SCHEDULER_ADDR="${SCHEDULER_ADDR:-127.0.0.1:15051}"
MODEL_ID=smollm2-135m-instruct
MODELS_DIR="${GANTRY_MODELS_DIR:-$HOME/.cache/gantry/models}"
GGUF="$MODELS_DIR/$MODEL_ID/SmolLM2-135M-Instruct.Q4_1.gguf"

log() { echo "run.sh: $*" >&2; }
mkdir -p "$OUT_DIR"
[ -f "$GGUF" ] || { log "no weights at $GGUF (gantry models pull $MODEL_ID)"; exit 1; }

# --- (a) the release binary --------------------------------------------------
if [ -n "${GANTRY_BIN:-}" ]; then
    BIN="$GANTRY_BIN"
else
    BIN="$repo/target/release/gantry"
    newer=""
    if [ -x "$BIN" ]; then
        newer="$(cd "$repo" && find crates proto migrations Cargo.toml Cargo.lock -newer "$BIN" -type f \
            \( -name '*.rs' -o -name '*.toml' -o -name '*.lock' -o -name '*.proto' -o -name '*.sql' \) \
            -not -path '*/tests/*' -print -quit 2>/dev/null || true)"
    fi
    if [ ! -x "$BIN" ] || [ -n "$newer" ]; then
        log "building the release binary${newer:+ ($newer is newer)}: cargo build --release -p gantry (thin LTO, slow)"
        (cd "$repo" && cargo build --release -p gantry)
    else
        log "target/release/gantry is up to date"
    fi
fi
[ -x "$BIN" ] || { log "no gantry binary at $BIN"; exit 1; }
BIN="$(readlink -f "$BIN")"

# The llama.cpp builds (skips when built).
LLAMA_BUILD="$(GANTRY_LLAMA_CPP_VARIANTS="$LLAMA_VARIANTS" "$here/build-llama-cpp.sh")"

# --- (b) the server ----------------------------------------------------------
for addr in "$MANAGEMENT_ADDR" "$PUBLIC_ADDR" "$SCHEDULER_ADDR"; do
    if python3 -c 'import socket,sys; h,p=sys.argv[1].rsplit(":",1); s=socket.socket(); s.settimeout(0.5); sys.exit(0 if s.connect_ex((h,int(p))) == 0 else 1)' "$addr"; then
        log "$addr is already in use (another gantry?); set MANAGEMENT_ADDR/PUBLIC_ADDR/SCHEDULER_ADDR"
        exit 1
    fi
done

DATA="$(mktemp -d /tmp/gantry-bench-text-data.XXXXXX)"
SERVER_PID=""
stop_server() {
    if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        for _ in $(seq 1 100); do
            kill -0 "$SERVER_PID" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    SERVER_PID=""
}
cleanup() {
    stop_server
    [ -f "$DATA/serve.log" ] && cp "$DATA/serve.log" "$OUT_DIR/serve.log"
    rm -rf "$DATA"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "starting $BIN serve (data in $DATA, GANTRY_TEXT__THREADS=$THREADS)"
t_launch=$(date +%s%N)
(
    cd "$DATA"
    export GANTRY_DATA_DIR="$DATA" GANTRY_MODELS_DIR="$MODELS_DIR" \
        GANTRY_SCHEDULER__BUNDLED_WORKERS="[$MODEL_ID]" GANTRY_TEXT__THREADS="$THREADS" \
        GANTRY_MANAGEMENT_ADDR="$MANAGEMENT_ADDR" GANTRY_PUBLIC_ADDR="$PUBLIC_ADDR" \
        GANTRY_SCHEDULER__ADDR="$SCHEDULER_ADDR"
    exec "$BIN" serve >"$DATA/serve.log" 2>&1
) &
SERVER_PID=$!

KEY=""
ready=""
for _ in $(seq 1 900); do # 90 s
    kill -0 "$SERVER_PID" 2>/dev/null || { log "the server exited:"; tail -n 30 "$DATA/serve.log" >&2; exit 1; }
    [ -n "$KEY" ] || KEY="$(grep -o 'gk_[A-Za-z0-9_-]*' "$DATA/serve.log" | head -n1 || true)"
    if [ -n "$KEY" ] && curl -sf -m 2 -o /dev/null -H "Authorization: Bearer $KEY" \
        "http://$PUBLIC_ADDR/v2/$MODEL_ID/openai/v1/models"; then
        ready=1
        break
    fi
    sleep 0.1
done
[ -n "$ready" ] || { log "the server did not come up in 90 s (key found: ${KEY:+yes})"; tail -n 30 "$DATA/serve.log" >&2; exit 1; }
t_ready=$(date +%s%N)
log "serving after $(((t_ready - t_launch) / 1000000)) ms, pid $SERVER_PID"

# A first tiny job, until the model's worker answers (it may still be loading).
for i in $(seq 1 60); do
    code="$(curl -s -m 30 -o "$DATA/probe.json" -w '%{http_code}' -H "Authorization: Bearer $KEY" \
        -H 'Content-Type: application/json' \
        -d '{"input": {"prompt": "Hi", "max_tokens": 1, "temperature": 0}}' \
        "http://$PUBLIC_ADDR/v2/$MODEL_ID/runsync" || true)"
    if [ "$code" = 200 ] && grep -q '"COMPLETED"' "$DATA/probe.json"; then
        break
    fi
    [ "$i" = 60 ] && { log "the model never answered: HTTP $code $(head -c 500 "$DATA/probe.json")"; exit 1; }
    sleep 1
done
t_first_job=$(date +%s%N)
log "first job done $(((t_first_job - t_launch) / 1000000)) ms after launch"

# --- (c) the client ----------------------------------------------------------
client_rc=0
timeout "$((BUDGET + 4 * REQUEST_TIMEOUT))" python3 "$here/client.py" measure --url "http://$PUBLIC_ADDR" \
    --key "$KEY" --model "$MODEL_ID" --pid "$SERVER_PID" --concurrency "$CONCURRENCY" --rounds "$ROUNDS" \
    --max-tokens "$MAX_TOKENS" --timeout "$REQUEST_TIMEOUT" --budget "$BUDGET" >"$OUT_DIR/client.json" || client_rc=$?

# Single stream and llama.cpp alternately, the server idle during llama.cpp's
# turns (the first variant's build; PAIRS=0 skips this).
pairs_args=()
first_variant="${LLAMA_VARIANTS%% *}"
pair_tool="$LLAMA_BUILD/$first_variant/bin/gantry-llama-bench"
if [ "$client_rc" = 0 ] && [ "$PAIRS" -gt 0 ] && [ -x "$pair_tool" ]; then
    log "single stream and llama.cpp ($first_variant) alternately, $PAIRS pairs"
    if timeout "$((PAIRS * (REQUEST_TIMEOUT + 90)))" python3 "$here/client.py" pairs --url "http://$PUBLIC_ADDR" \
        --key "$KEY" --model "$MODEL_ID" --pairs "$PAIRS" --max-tokens "$MAX_TOKENS" --timeout "$REQUEST_TIMEOUT" \
        --bench-cmd "$pair_tool -m $GGUF -t $THREADS -p 0 -n $MAX_TOKENS -r 1 -o json" >"$OUT_DIR/pairs.json"; then
        pairs_args=(--pairs "$OUT_DIR/pairs.json")
    else
        log "the alternating phase failed; the report leaves it out"
    fi
fi
stop_server
if [ "$client_rc" != 0 ]; then
    log "the client failed (exit $client_rc); see $OUT_DIR/serve.log"
    exit 1
fi

# --- (d) plain llama.cpp, after the server is gone -----------------------------
bench_args=()
for variant in $LLAMA_VARIANTS; do
    tool="$LLAMA_BUILD/$variant/bin/llama-bench"
    [ -x "$tool" ] || tool="$LLAMA_BUILD/$variant/bin/gantry-llama-bench"
    out="$OUT_DIR/llama-bench-$variant.json"
    extra=()
    npl="$(echo "$CONCURRENCY" | tr ',' '\n' | awk '$1 > 1' | paste -sd, -)"
    # Ours also measures the streams decoded as one batch (upstream's llama-bench has no --npl).
    [ "$(basename "$tool")" = gantry-llama-bench ] && [ -n "$npl" ] && extra=(--npl "$npl")
    log "llama.cpp ($variant build): $(basename "$tool") -m <gguf> -t $THREADS -p 100 -n $MAX_TOKENS -r 3 ${extra[*]} -o json"
    if timeout 90 "$tool" -m "$GGUF" -t "$THREADS" -p 100 -n "$MAX_TOKENS" -r 3 "${extra[@]}" -o json >"$out"; then
        bench_args+=("$variant=$out")
    else
        log "llama-bench ($variant) failed or timed out"
    fi
done

# --- (e) the report ----------------------------------------------------------
cpu="$(lscpu | sed -n 's/^Model name: *//p' | head -n1)"
python3 "$here/client.py" combine \
    --meta "cpu=$cpu" --meta "cores=$(nproc)" --meta "threads=$THREADS" \
    --meta "stream_interval_ms=${GANTRY_TEXT__STREAM_INTERVAL_MS:-default (50)}" \
    --meta "binary=$BIN" --meta "binary_mtime=$(date -r "$BIN" -u +%FT%TZ)" \
    --meta "git_head=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo ?)" \
    --meta "git_dirty=$(git -C "$repo" status --porcelain 2>/dev/null | wc -l) files" \
    --meta "startup_ms=$(((t_ready - t_launch) / 1000000))" \
    --meta "first_job_ms=$(((t_first_job - t_launch) / 1000000))" \
    --meta "date=$(date -u +%FT%TZ)" \
    "${pairs_args[@]}" "$OUT_DIR/client.json" "${bench_args[@]}" >"$OUT_DIR/latest.json"
python3 "$here/client.py" report "$OUT_DIR/latest.json" | tee "$OUT_DIR/latest.md"
log "wrote $OUT_DIR/latest.json and latest.md"
