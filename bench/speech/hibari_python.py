"""The hibari-tts package itself speaking the same text (its Python G2P,
onnxruntime, its numpy vocoder), timed like examples/hibari_bench.rs:
CONCURRENCY Python threads share one Hibari instance (THREADS intra-op
threads) and speak TEXT until REQUESTS readings are done. Prints one JSON
line of the same shape. The wheel is unpacked into a temporary directory and
imported from there, never installed.

    python3 hibari_python.py WHEEL THREADS CONCURRENCY REQUESTS TEXT SHORT
"""
import json
import sys
import tempfile
import threading
import time
import zipfile


def main() -> None:
    wheel, threads, concurrency, requests, text, short = sys.argv[1:7]
    threads, concurrency, requests = int(threads), max(1, int(concurrency)), int(requests)
    with tempfile.TemporaryDirectory() as unpacked:
        zipfile.ZipFile(wheel).extractall(unpacked)
        sys.path.insert(0, unpacked)
        from hibari.tts import Hibari

        tts = Hibari(threads=threads)
        rate = tts.sample_rate
        tts("Warming up.")

        started = time.perf_counter()
        next(tts.stream(short))
        first_audio_ms = (time.perf_counter() - started) * 1e3

        lock = threading.Lock()
        left = [requests]
        totals = []

        def worker():
            seconds = 0.0
            while True:
                with lock:
                    if left[0] == 0:
                        break
                    left[0] -= 1
                seconds += len(tts(text)) / rate
            with lock:
                totals.append(seconds)

        started = time.perf_counter()
        pool = [threading.Thread(target=worker) for _ in range(concurrency)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        wall = time.perf_counter() - started
    audio = sum(totals)
    print(json.dumps({
        "engine": "hibari-tts 0.2.1 (Python, onnxruntime, numpy)",
        "threads": threads,
        "concurrency": concurrency,
        "requests": requests,
        "audio_s": round(audio, 3),
        "wall_s": round(wall, 3),
        "x_realtime": round(audio / wall, 2),
        "first_audio_ms": round(first_audio_ms, 1),
    }))


if __name__ == "__main__":
    main()
