"""Load generator for a speech model over the public HTTP API (standard library only).

    python3 client.py rtf BASE_URL KEY MODEL TEXT CONCURRENCY REQUESTS
        CONCURRENCY threads each POST /runsync {"prompt": TEXT} until REQUESTS jobs are done in
        all; prints one JSON line: wall seconds, audio seconds, real-time factor (wall / audio:
        below 1 is faster than real time), per-request latency percentiles.
    python3 client.py first-chunk BASE_URL KEY MODEL TEXT REPEATS
        REPEATS times, one after another: POST /run, then read GET /stream/<id> (SSE) and time
        from the POST until the first `event: chunk` arrives; prints one JSON line.
"""
import json
import statistics
import sys
import threading
import time
import urllib.parse
import http.client


def connection(base):
    url = urllib.parse.urlsplit(base)
    return http.client.HTTPConnection(url.hostname, url.port, timeout=300)


def post(conn, path, key, body):
    conn.request("POST", path, json.dumps(body), {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    res = conn.getresponse()
    data = res.read()
    if res.status != 200:
        raise RuntimeError(f"{path}: {res.status} {data[:300]!r}")
    return json.loads(data)


def rtf(base, key, model, text, concurrency, requests):
    lock = threading.Lock()
    left = [requests]
    latencies, audio = [], []
    errors = []

    def worker():
        conn = connection(base)
        while True:
            with lock:
                if left[0] == 0:
                    return
                left[0] -= 1
            started = time.perf_counter()
            job = post(conn, f"/v2/{model}/runsync", key, {"input": {"prompt": text}})
            took = time.perf_counter() - started
            with lock:
                if job.get("status") != "COMPLETED":
                    errors.append(job)
                    continue
                latencies.append(took)
                audio.append(job["output"]["duration"])

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    latencies.sort()
    print(json.dumps({
        "path": "gantry http runsync",
        "concurrency": concurrency,
        "requests": len(latencies),
        "errors": len(errors),
        "wall_s": round(wall, 3),
        "audio_s": round(sum(audio), 3),
        "rtf": round(wall / sum(audio), 4),
        "x_real_time": round(sum(audio) / wall, 2),
        "latency_p50_s": round(latencies[len(latencies) // 2], 3),
        "latency_max_s": round(latencies[-1], 3),
    }), flush=True)


def first_chunk(base, key, model, text, repeats):
    times = []
    for _ in range(repeats):
        conn = connection(base)
        started = time.perf_counter()
        job = post(conn, f"/v2/{model}/run", key, {"input": {"prompt": text}})
        conn.request("GET", f"/v2/{model}/stream/{job['id']}", headers={"Authorization": f"Bearer {key}", "Accept": "text/event-stream"})
        res = conn.getresponse()
        buffer = b""
        while b"event: chunk" not in buffer:
            piece = res.read1(65536)
            if not piece:
                raise RuntimeError(f"stream ended without a chunk: {buffer[:300]!r}")
            buffer += piece
        times.append(time.perf_counter() - started)
        res.read()  # to the end of the job
        conn.close()
    times.sort()
    print(json.dumps({
        "path": "gantry http run + SSE, first chunk",
        "text": text,
        "repeats": repeats,
        "first_chunk_median_ms": round(statistics.median(times) * 1000, 1),
        "first_chunk_min_ms": round(times[0] * 1000, 1),
        "first_chunk_max_ms": round(times[-1] * 1000, 1),
    }), flush=True)


if __name__ == "__main__":
    mode, base, key, model, text = sys.argv[1:6]
    if mode == "rtf":
        rtf(base, key, model, text, int(sys.argv[6]), int(sys.argv[7]))
    elif mode == "first-chunk":
        first_chunk(base, key, model, text, int(sys.argv[6]))
    else:
        raise SystemExit(f"unknown mode {mode}")
