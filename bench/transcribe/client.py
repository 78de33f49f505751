#!/usr/bin/env python3
"""Drives a speech-to-text model through the public endpoints and prints one
JSON line. Standard library only.

    client.py BASE_URL KEY MODEL WAV CONCURRENCY SECONDS
        /runsync with the WAV inline (base64), CONCURRENCY requests at a
        time for SECONDS: transcriptions, audio seconds heard per wall
        second, latency percentiles.
    client.py BASE_URL KEY MODEL WAV first REPEATS
        /run, then the job's SSE stream: the time from the request to the
        first segment (a chunk event) and to the end, REPEATS times.
"""
import base64
import json
import sys
import threading
import time
import urllib.request


def post(url, key, body, timeout=600):
    request = urllib.request.Request(
        url, data=body, method="POST",
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


def percentile(values, p):
    values = sorted(values)
    if not values:
        return None
    return round(values[min(len(values) - 1, int(p / 100 * len(values)))], 3)


def load(base, key, model, body, concurrency, seconds):
    url = f"{base}/v2/{model}/runsync?wait=300000"
    latencies, heard, failures = [], [0.0], []
    lock = threading.Lock()
    started_all = time.monotonic()
    deadline = started_all + seconds

    def worker():
        while time.monotonic() < deadline:
            started = time.monotonic()
            try:
                job = post(url, key, body)
            except Exception as error:  # noqa: BLE001 - reported, not raised
                with lock:
                    failures.append(str(error))
                continue
            took = time.monotonic() - started
            with lock:
                if job.get("status") == "COMPLETED":
                    latencies.append(took)
                    heard[0] += job["output"]["duration"]
                else:
                    failures.append(job.get("error") or job.get("status"))

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - started_all
    return {
        "model": model, "concurrency": concurrency, "wall_s": round(wall, 2),
        "transcriptions": len(latencies), "audio_s": round(heard[0], 2),
        "audio_s_per_s": round(heard[0] / wall, 2),
        "latency_p50_s": percentile(latencies, 50), "latency_p90_s": percentile(latencies, 90),
        "failures": failures[:3], "failed": len(failures),
    }


def first_segment(base, key, model, body, repeats):
    firsts, totals = [], []
    for _ in range(repeats):
        started = time.monotonic()
        job = post(f"{base}/v2/{model}/run", key, body)
        request = urllib.request.Request(
            f"{base}/v2/{model}/stream/{job['id']}",
            headers={"Authorization": f"Bearer {key}", "Accept": "text/event-stream"})
        first = None
        with urllib.request.urlopen(request, timeout=600) as response:
            for line in response:
                if first is None and line.startswith(b"event: chunk"):
                    first = time.monotonic() - started
        firsts.append(first)
        totals.append(time.monotonic() - started)
    return {
        "model": model, "repeats": repeats,
        "first_segment_p50_s": percentile([f for f in firsts if f is not None], 50),
        "whole_p50_s": percentile(totals, 50),
    }


def main():
    base, key, model, wav = sys.argv[1:5]
    with open(wav, "rb") as f:
        body = json.dumps({"input": {"audio": base64.b64encode(f.read()).decode()}}).encode()
    if sys.argv[5] == "first":
        result = first_segment(base, key, model, body, int(sys.argv[6]))
    else:
        result = load(base, key, model, body, int(sys.argv[5]), float(sys.argv[6]))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
