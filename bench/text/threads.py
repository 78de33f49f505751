#!/usr/bin/env python3
"""Where a running server spends its CPU per generated token, by thread name.

Sends REQUESTS greedy `runsync` requests of MAX_TOKENS tokens to a running
`gantry serve` (after one untimed warm-up), one after the other, and prints
for each thread name of the server process the CPU time (schedstat, in
nanoseconds) and the voluntary context switches (wake-ups) per generated
token over those requests. The text engine's threads (`text-engine-*`, its
ggml threadpool included) decode; every other thread is the platform.

    python3 bench/text/threads.py --pid PID --key gk_...
    python3 bench/text/threads.py --pid PID --key gk_... --requests 12 --max-tokens 256

Standard library only.
"""
import argparse
import collections
import json
import os
import sys
import urllib.request


def snapshot(pid):
    """{tid: (name, cpu ns, voluntary switches)} of the live threads."""
    threads = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        base = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{base}/comm") as f:
                name = f.read().strip()
            with open(f"{base}/schedstat") as f:
                ns = int(f.read().split()[0])
            with open(f"{base}/status") as f:
                wakes = next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))
        except (OSError, ValueError, StopIteration):
            continue  # the thread ended meanwhile
        threads[tid] = (name, ns, wakes)
    return threads


def runsync(args):
    body = {"input": {"prompt": args.prompt, "max_tokens": args.max_tokens, "temperature": 0}}
    request = urllib.request.Request(
        f"{args.url}/v2/{args.model}/runsync",
        json.dumps(body).encode(),
        {"Authorization": f"Bearer {args.key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=args.timeout) as response:
        job = json.load(response)
    if job.get("status") != "COMPLETED":
        sys.exit(f"threads: the request ended {job.get('status')}: {job.get('error')}")
    return job["output"]["usage"]["output"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pid", type=int, required=True, help="the server's process id")
    parser.add_argument("--key", required=True, help="an API key with endpoints:run")
    parser.add_argument("--url", default="http://127.0.0.1:18081", help="the public listener")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--requests", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--timeout", type=float, default=120)
    parser.add_argument("--prompt", default="Write a long story about a lighthouse keeper.")
    args = parser.parse_args()

    runsync(args)  # warm-up
    before = snapshot(args.pid)
    tokens = sum(runsync(args) for _ in range(args.requests))
    after = snapshot(args.pid)

    by_name = collections.defaultdict(lambda: [0, 0, 0])
    for tid, (name, ns, wakes) in after.items():
        _, ns0, wakes0 = before.get(tid, (name, 0, 0))
        entry = by_name[name]
        entry[0] += ns - ns0
        entry[1] += wakes - wakes0
        entry[2] += 1
    print(f"{tokens} tokens in {args.requests} requests")
    print("| thread | threads | CPU µs per token | wake-ups per token |")
    print("|---|---:|---:|---:|")
    platform = 0
    for name, (ns, wakes, count) in sorted(by_name.items(), key=lambda item: -item[1][0]):
        if ns <= 0:
            continue
        if not name.startswith("text-engine"):
            platform += ns
        print(f"| `{name}` | {count} | {ns / 1e3 / tokens:.1f} | {wakes / tokens:.2f} |")
    print(f"| platform (all but text-engine) | | {platform / 1e3 / tokens:.1f} | |")


if __name__ == "__main__":
    main()
