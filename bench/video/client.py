#!/usr/bin/env python3
"""Drives a video model through /runsync, one or more requests at a time, and
prints one JSON line: videos made, video seconds delivered per wall second,
frames per second, latency percentiles. Standard library only.

    client.py BASE_URL KEY MODEL INPUT_JSON CONCURRENCY SECONDS

INPUT_JSON may be @FILE to read it from a file (images in base64 are long).
"""
import json
import sys
import threading
import time
import urllib.request


def summary(value):
    """The input as printed: long strings (base64 images) cut short."""
    if isinstance(value, dict):
        return {k: summary(v) for k, v in value.items()}
    if isinstance(value, list):
        return [summary(v) for v in value]
    if isinstance(value, str) and len(value) > 40:
        return value[:16] + f"...({len(value)} chars)"
    return value


def main():
    base, key, model, input_json, concurrency, seconds = sys.argv[1:7]
    concurrency, seconds = int(concurrency), float(seconds)
    if input_json.startswith("@"):
        with open(input_json[1:]) as f:
            input_json = f.read()
    body = json.dumps({"input": json.loads(input_json)}).encode()
    url = f"{base}/v2/{model}/runsync?wait=300000"
    latencies, delivered, frames, failures = [], [0.0], [0], []
    lock = threading.Lock()
    started_all = time.monotonic()
    deadline = started_all + seconds

    def worker():
        while time.monotonic() < deadline:
            req = urllib.request.Request(url, data=body, method="POST", headers={
                "Authorization": f"Bearer {key}", "Content-Type": "application/json"})
            started = time.monotonic()
            with urllib.request.urlopen(req, timeout=600) as res:
                job = json.load(res)
            elapsed = time.monotonic() - started
            with lock:
                if job.get("status") != "COMPLETED":
                    failures.append(job)
                    continue
                latencies.append(elapsed)
                delivered[0] += job["output"]["duration"]
                frames[0] += job["output"]["frames"]

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - started_all
    latencies.sort()
    pick = lambda q: round(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1e3) if latencies else None
    print(json.dumps({
        "model": model, "input": summary(json.loads(input_json)), "concurrency": concurrency,
        "videos": len(latencies), "failures": len(failures), "wall_s": round(wall, 2),
        "video_s_per_wall_s": round(delivered[0] / wall, 3),
        "frames_per_s": round(frames[0] / wall, 2),
        "p50_ms": pick(0.5), "p90_ms": pick(0.9),
    }))
    if failures:
        print(json.dumps(failures[0]), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
