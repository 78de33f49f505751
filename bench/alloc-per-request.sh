#!/usr/bin/env bash
# Heap allocations per echo runsync, with start-up taken out: `gantry serve` (SQLite, echo model)
# under heaptrack, loaded twice by a sequential keep-alive client (N1 then N2 requests, after 20
# warm-up ones); (allocations at N2 - allocations at N1) / (N2 - N1) is one request's count.
# Then the same difference per call site, attributed to the deepest gantry_* frame.
# Needs heaptrack (apt) and a binary built with glibc's malloc, which heaptrack follows:
#   cargo build -p gantry --features system-allocator && bash bench/alloc-per-request.sh target/debug/gantry
set -eu
BIN=$(realpath "${1:?usage: bench/alloc-per-request.sh path/to/gantry [N1] [N2]}")
N1=${2:-1000}
N2=${3:-3000}
work=$(mktemp -d)
drive() { # requests
  KEY=$1 python3 - "$2" <<'PY'
import http.client, json, os, sys
c = http.client.HTTPConnection("127.0.0.1", 38081)
h = {"Content-Type": "application/json", "Authorization": "Bearer " + os.environ["KEY"]}
for _ in range(int(sys.argv[1])):
    c.request("POST", "/v2/gantry-echo/runsync", json.dumps({"input": {"prompt": "hi"}}), h)
    r = c.getresponse(); r.read()
    if r.status != 200: sys.exit(f"runsync answered {r.status}")
PY
}
one() { # requests out
  local dir; dir=$(mktemp -d)
  GANTRY_DATA_DIR=$dir GANTRY_LOG=warn GANTRY_SCHEDULER__BUNDLED_WORKERS='[gantry-echo]' GANTRY_PULL_ON_START=false \
  GANTRY_RATE_LIMITS__PUBLIC__MINUTE=100000000 GANTRY_RATE_LIMITS__PUBLIC__HOUR=100000000 GANTRY_RATE_LIMITS__PUBLIC__DAY=100000000 \
  GANTRY_MANAGEMENT_ADDR=127.0.0.1:38080 GANTRY_PUBLIC_ADDR=127.0.0.1:38081 GANTRY_SCHEDULER__ADDR=127.0.0.1:35051 \
    heaptrack -o "$2" "$BIN" serve > "$dir/out" 2> "$dir/err" &
  local pid=$!
  for _ in $(seq 1 600); do curl -sf http://127.0.0.1:38080/healthz >/dev/null && break; sleep 0.2; done
  local key; key=$(grep -o "gk_[A-Za-z0-9_]*" "$dir/out" | head -1)
  drive "$key" 20
  drive "$key" "$1"
  pkill -INT -f "$BIN serve" || true
  wait "$pid" || true
  heaptrack_print -f "$2.zst" -p 0 -a 0 -T 0 -l 0 -F "$2.folded" --flamegraph-cost-type allocations >/dev/null 2>&1
  rm -rf "$dir"
}
one "$N1" "$work/a"
one "$N2" "$work/b"
python3 - "$work/a.folded" "$work/b.folded" $((N2 - N1)) <<'PY'
import collections, re, sys
def load(path):
    c = collections.Counter()
    for line in open(path, errors="replace"):
        stack, _, n = line.rstrip("\n").rpartition(" ")
        if not n.isdigit():
            continue
        frames = [f for f in stack.split(";") if f]
        ours = [f for f in frames if "gantry" in f]
        c[re.sub(r"::h[0-9a-f]{16}$", "", ours[-1])[:150] if ours else "(outside gantry)"] += int(n)
    return c
a, b, n = load(sys.argv[1]), load(sys.argv[2]), int(sys.argv[3])
per = {k: (b[k] - a[k]) / n for k in set(a) | set(b)}
print(f"allocations per runsync: {sum(per.values()):.1f}")
for k, v in sorted(per.items(), key=lambda kv: -kv[1])[:25]:
    if v >= 0.5:
        print(f"{v:7.2f}  {k}")
PY
rm -rf "$work"
