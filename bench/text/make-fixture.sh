#!/usr/bin/env bash
# Writes crates/models/text/tests/fixtures/smollm2-greedy-llama-cpp.json: the
# token ids plain llama.cpp picks when greedy-decoding two raw prompts with
# SmolLM2-135M-Instruct Q4_1, for the text worker's tests to compare against.
#
#   bench/text/make-fixture.sh [MODEL.gguf] [OUTPUT.json]
#
# The ids come from the "gantry" build of build-llama-cpp.sh: the vendored
# llama.cpp compiled with the flags llama-cpp-sys-2 gives the gantry binary
# (AVX2 kernels, no AVX-512). The build matters: with this tiny Q4_1 model,
# llama.cpp's native AVX-512 build picks different tokens part-way through
# (different float rounding, near-tied logits); the file records where, under
# "other_builds". 1 and 2 threads are checked to agree.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
model="${1:-$HOME/.cache/gantry/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf}"
out="${2:-$repo/crates/models/text/tests/fixtures/smollm2-greedy-llama-cpp.json}"
expected_sha="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
n=32
prompts=("The capital of France is" "def fibonacci(n):")

build="$("$here/build-llama-cpp.sh")"
sha="$(sha256sum "$model" | cut -c1-64)"
if [ "$sha" != "$expected_sha" ]; then
    echo "make-fixture: warning: $model has sha256 $sha, not $expected_sha" >&2
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$build/gantry/bin/gantry-greedy-ref" -m "$model" -n "$n" -t 1 -- "${prompts[@]}" >"$tmp/gantry-t1.json"
"$build/gantry/bin/gantry-greedy-ref" -m "$model" -n "$n" -t 2 -- "${prompts[@]}" >"$tmp/gantry-t2.json"
if [ -x "$build/native/bin/gantry-greedy-ref" ]; then
    "$build/native/bin/gantry-greedy-ref" -m "$model" -n "$n" -t 1 -- "${prompts[@]}" >"$tmp/native-t1.json"
fi

mkdir -p "$(dirname "$out")"
python3 - "$tmp" "$build/source-info.json" "$model" "$sha" "$out" <<'EOF'
import json, os, sys

tmp, info_path, model, sha, out = sys.argv[1:]
info = json.load(open(info_path))
ref = json.load(open(os.path.join(tmp, "gantry-t1.json")))
t2 = json.load(open(os.path.join(tmp, "gantry-t2.json")))
ids = lambda doc: [c["tokens"] for c in doc["cases"]]
if ids(ref) != ids(t2):
    sys.exit("make-fixture: 1 and 2 threads disagree; not writing the fixture")

def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))

gantry_flags = ("GGML_NATIVE=OFF, -march=x86-64 plus ggml's SSE4.2/AVX/AVX2/FMA/F16C/BMI2, "
                "no AVX-512, GGML_OPENMP=OFF: what llama-cpp-sys-2's build.rs gives the gantry binary")
fixture = {
    "generated_by": f"bench/text/make-fixture.sh: gantry-greedy-ref (bench/text/greedy_ref.cpp) linked "
                    f"against {info['source_id']}; greedy sampler, 1 thread, CPU, built with {gantry_flags}",
    "llama_cpp": {k: info[k] for k in ("crate", "crate_version", "llama_cpp_rs_commit", "ggml_version",
                                       "llama_cpp_commit", "tree_sha256")},
    "model": os.path.basename(model),
    "model_sha256": sha,
    "system_info": ref["system_info"],
    "method": "prompt tokenized as is (add_special=true: BOS only if the vocabulary asks, which SmolLM2's "
              "does not; special tokens parsed; no chat template), one batch, then greedy argmax one token "
              "at a time in a fresh single-sequence context; an end-of-generation token would stop the "
              "case and not be listed (stop = \"eog\")",
    "n_predict": ref["n_predict"],
    "cases": [
        {k: c[k] for k in ("prompt", "prompt_tokens", "tokens", "text", "stop")} for c in ref["cases"]
    ],
}
native_path = os.path.join(tmp, "native-t1.json")
if os.path.exists(native_path):
    native = json.load(open(native_path))
    fixture["other_builds"] = [{
        "build": "llama.cpp defaults on the generating machine (GGML_NATIVE=ON: AVX-512, OpenMP)",
        "system_info": native["system_info"],
        "cases": [
            {"prompt": c["prompt"], "tokens": c["tokens"], "text": c["text"],
             "first_difference": first_difference(r["tokens"], c["tokens"])}
            for r, c in zip(ref["cases"], native["cases"])
        ],
    }]

with open(out, "w") as f:
    json.dump(fixture, f, indent=2, ensure_ascii=False)
    f.write("\n")
# One line per id list reads better than one line per id.
text = open(out).read()
import re
text = re.sub(r"\[\s+(-?\d+(?:,\s+-?\d+)*)\s+\]",
              lambda m: "[" + ", ".join(re.split(r",\s+", m.group(1))) + "]", text)
open(out, "w").write(text)
json.load(open(out))
print(f"make-fixture: wrote {out}", file=sys.stderr)
EOF
