#!/usr/bin/env python3
"""N concurrent streams of text `runsync` requests against a running Gantry,
standard library only (the GPU machines have no network to install a client).

    load.py --url http://127.0.0.1:PORT --key gk_... --model smollm2-135m-instruct \
            --streams 64 --tokens 128 --rounds 3 --temperature 0.8

Each stream is a thread with its own keep-alive connection that sends
`rounds` requests one after another, every one asking for exactly `tokens`
tokens (`ignore_eos`). One untimed request first warms the server. Prints
one JSON object: the generated tokens per second over the wall time of all
streams (first request sent to last answer), the median request latency, and
how many requests failed (any failure is reported, none is retried).
"""

import argparse
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse

PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle stays upright.",
    "Describe a walk through a pine forest in winter.",
    "List some uses of a paperclip, with a sentence on each.",
]


def request(conn, path, key, body):
    conn.request(
        "POST",
        path,
        body=json.dumps(body),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    response = conn.getresponse()
    data = response.read()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {data[:200]!r}")
    job = json.loads(data)
    if job.get("status") != "COMPLETED":
        raise RuntimeError(f"job {job.get('id')} is {job.get('status')}: {str(job.get('error'))[:200]}")
    return job["output"]["usage"]["output"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--streams", type=int, required=True)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.8)
    args = parser.parse_args()
    url = urllib.parse.urlparse(args.url)
    path = f"/v2/{args.model}/runsync?wait=300000"

    def body(i):
        return {
            "input": {
                "prompt": PROMPTS[i % len(PROMPTS)],
                "max_tokens": args.tokens,
                "temperature": args.temperature,
                "ignore_eos": True,
            }
        }

    warm = http.client.HTTPConnection(url.hostname, url.port, timeout=300)
    request(warm, path, args.key, body(0))
    warm.close()

    latencies, tokens, failures = [], [0], []
    lock = threading.Lock()
    start = threading.Barrier(args.streams + 1)

    def stream(index):
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=300)
        start.wait()
        for r in range(args.rounds):
            sent = time.perf_counter()
            try:
                made = request(conn, path, args.key, body(index + r))
            except Exception as error:  # noqa: BLE001 - every failure is counted and shown
                with lock:
                    failures.append(str(error))
                conn.close()
                conn = http.client.HTTPConnection(url.hostname, url.port, timeout=300)
                continue
            with lock:
                latencies.append(time.perf_counter() - sent)
                tokens[0] += made
        conn.close()

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(args.streams)]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began
    print(
        json.dumps(
            {
                "streams": args.streams,
                "temperature": args.temperature,
                "tokens_per_request": args.tokens,
                "requests": len(latencies),
                "failed": len(failures),
                "first_failure": failures[0] if failures else None,
                "tokens": tokens[0],
                "wall_s": round(wall, 3),
                "tok_s": round(tokens[0] / wall, 1) if wall > 0 else 0,
                "median_latency_s": round(statistics.median(latencies), 3) if latencies else None,
            }
        )
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
