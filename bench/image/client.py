#!/usr/bin/env python3
"""Drives image models through /runsync at a given concurrency and prints
one JSON line per (model, concurrency): images per second, latency
percentiles, and milliseconds per delivered megapixel. Standard library only.

    client.py BASE_URL KEY MODEL INPUT_JSON CONCURRENCY SECONDS
"""
import json
import sys
import threading
import time
import urllib.request


def main():
    base, key, model, input_json, concurrency, seconds = sys.argv[1:7]
    concurrency, seconds = int(concurrency), float(seconds)
    body = json.dumps({"input": json.loads(input_json)}).encode()
    url = f"{base}/v2/{model}/runsync"
    latencies, pixels, failures = [], [0], []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def worker():
        while time.monotonic() < deadline:
            req = urllib.request.Request(url, data=body, method="POST", headers={
                "Authorization": f"Bearer {key}", "Content-Type": "application/json"})
            started = time.monotonic()
            with urllib.request.urlopen(req, timeout=120) as res:
                job = json.load(res)
            elapsed = time.monotonic() - started
            with lock:
                if job.get("status") != "COMPLETED":
                    failures.append(job)
                    continue
                out = job["output"]
                n = len(out["images"]) if "images" in out else 1
                latencies.append(elapsed)
                pixels[0] += out["width"] * out["height"] * n

    started = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - started
    if failures or not latencies:
        print(json.dumps({"model": model, "error": failures[:1] or "no request finished"}))
        sys.exit(1)
    latencies.sort()
    per_job_images = json.loads(input_json).get("num_images", 1)
    images = len(latencies) * per_job_images
    pct = lambda q: round(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1e3, 2)
    print(json.dumps({
        "model": model, "concurrency": concurrency, "jobs": len(latencies), "images": images,
        "images_per_s": round(images / wall, 1), "p50_ms": pct(0.5), "p90_ms": pct(0.9),
        "ms_per_megapixel": round(wall * 1e3 / (pixels[0] / 1e6), 1),
    }))


if __name__ == "__main__":
    main()
