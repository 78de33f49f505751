#!/usr/bin/env python3
"""terrain-128's graph in onnxruntime, the way the package's own Python code
feeds it (noise scaled by sigma 80, the difficulty as (d - 1) / 99), timed
the way examples/terrain_bench.rs times the worker's engine: warm-up, then
the best and median of ROUNDS runs, with the mapping back to metres.

    terrain_reference.py GRAPH.onnx NOISE.f32 BATCH ROUNDS THREADS
"""
import json
import sys
import time

import numpy as np
import onnxruntime as ort

SIGMA, LEVELS, RANGE, SCALE = 80.0, 100, 22.16864013671875, 0.1


def main():
    graph, noise, batch, rounds, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    sess = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
    noisy = (np.fromfile(noise, dtype="<f4").reshape(batch, 1, 128, 128) * SIGMA).astype(np.float32)
    feed = {
        "noisy": noisy,
        "sigma": np.full(batch, SIGMA, np.float32),
        "difficulty": np.full(batch, (50 - 1) / (LEVELS - 1), np.float32),
    }

    def draw():
        denoised = sess.run(["denoised"], feed)[0]
        unit = np.clip((denoised + 1.0) * 0.5, 0.0, 1.0)
        heights = np.clip(SCALE * np.sinh(unit * np.arcsinh(RANGE / SCALE)), 0.0, RANGE)
        return heights - heights.min(axis=(1, 2, 3), keepdims=True)

    draw()
    times = []
    for _ in range(max(rounds, 1)):
        started = time.perf_counter()
        draw()
        times.append((time.perf_counter() - started) * 1e3)
    times.sort()
    print(json.dumps({"batch": batch, "best_ms": round(times[0], 3), "median_ms": round(times[len(times) // 2], 3)}))


if __name__ == "__main__":
    main()
