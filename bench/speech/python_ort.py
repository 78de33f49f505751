"""The same voice run by onnxruntime in Python, on the same phoneme ids the Rust
worker uses (from `--example speech_ids`), one session run per sentence, the
voice's default scales.

    python3 python_ort.py MODEL.onnx IDS.json THREADS CONCURRENCY REQUESTS

One InferenceSession with THREADS intra-op threads; CONCURRENCY Python threads
share it (onnxruntime releases the GIL while it runs), each synthesising the
whole text (every sentence in turn) until REQUESTS texts are done. Prints one
JSON line in the shape of client.py's. Also prints the time to the first
sentence's audio of a short text when given FIRST_IDS.json as a 6th argument.
"""
import json
import statistics
import sys
import threading
import time

import numpy as np
import onnxruntime as ort

RATE = 22050


def main():
    model, ids_path, threads, concurrency, requests = sys.argv[1:6]
    threads, concurrency, requests = int(threads), int(concurrency), int(requests)
    sentences = [s["ids"] for s in json.load(open(ids_path))["sentences"]]
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    scales = np.array([0.667, 1.0, 0.8], dtype=np.float32)

    def speak(ids):
        out = session.run(None, {
            "input": np.array([ids], dtype=np.int64),
            "input_lengths": np.array([len(ids)], dtype=np.int64),
            "scales": scales,
        })[0]
        # Piper's int16 conversion, as the worker does per sentence.
        audio = out.reshape(-1)
        peak = max(float(np.abs(audio).max()), 1e-8)
        pcm = np.clip(np.round(audio * (32767.0 / peak)), -32768, 32767).astype(np.int16)
        return len(pcm) / RATE

    speak(sentences[0])  # warm-up, as the worker's load check is
    lock = threading.Lock()
    left = [requests]
    latencies, audio = [], []

    def worker():
        while True:
            with lock:
                if left[0] == 0:
                    return
                left[0] -= 1
            started = time.perf_counter()
            seconds = sum(speak(ids) for ids in sentences)
            took = time.perf_counter() - started
            with lock:
                latencies.append(took)
                audio.append(seconds)

    pool = [threading.Thread(target=worker) for _ in range(concurrency)]
    started = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    wall = time.perf_counter() - started
    latencies.sort()
    print(json.dumps({
        "path": f"onnxruntime {ort.__version__} in Python (in process, no HTTP)",
        "threads": threads,
        "concurrency": concurrency,
        "requests": len(latencies),
        "wall_s": round(wall, 3),
        "audio_s": round(sum(audio), 3),
        "rtf": round(wall / sum(audio), 4),
        "x_real_time": round(sum(audio) / wall, 2),
        "latency_p50_s": round(latencies[len(latencies) // 2], 3),
        "latency_max_s": round(latencies[-1], 3),
    }), flush=True)

    if len(sys.argv) > 6:
        first = json.load(open(sys.argv[6]))["sentences"][0]["ids"]
        times = []
        for _ in range(10):
            t0 = time.perf_counter()
            speak(first)
            times.append(time.perf_counter() - t0)
        print(json.dumps({
            "path": "onnxruntime in Python, first sentence's audio",
            "threads": threads,
            "first_chunk_median_ms": round(statistics.median(times) * 1000, 1),
            "first_chunk_min_ms": round(min(times) * 1000, 1),
        }), flush=True)


if __name__ == "__main__":
    main()
