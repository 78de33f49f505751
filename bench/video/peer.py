#!/usr/bin/env python3
"""The Python peer of `interpolate-video`: the same video made in Python with
the same RIFE weights on onnxruntime (the graph of reference.py, one session
built once, N intra-op threads), the frames piped to Debian's ffmpeg for
H.264 (libx264, baseline profile, yuv420p) in MP4. The keyframes, the frame
schedule and the sizes are the platform's (docs/video.md).

    peer.py WEIGHTS INPUT_JSON THREADS ROUNDS OUT.mp4

INPUT_JSON is a file holding the job input ({"images": [base64 PNG...],
"duration", "fps"}), the same file bench/video/run.sh sends to the platform.
Prints one JSON line with the wall time per video (median of ROUNDS) and the
video seconds made per wall second.
"""
import base64
import io
import json
import os
import subprocess
import sys
import time
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference  # noqa: E402


def decode_png(data):
    """8-bit RGB PNG (no interlace, as run.sh writes them) to planar floats."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, w, h = 8, b"", 0, 0
    while pos < len(data):
        n = int.from_bytes(data[pos:pos + 4], "big")
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h = int.from_bytes(body[:4], "big"), int.from_bytes(body[4:8], "big")
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(h, 1 + 3 * w)
    assert (raw[:, 0] == 0).all(), "filter type 0 only"
    rgb = raw[:, 1:].reshape(h, w, 3).astype(np.float32) / 255.0
    return rgb.transpose(2, 0, 1).copy(), w, h


def main():
    weights, input_path, threads, rounds, out = sys.argv[1:6]
    threads, rounds = int(threads), int(rounds)
    job = json.load(open(input_path))
    keys = [decode_png(base64.b64decode(s)) for s in job["images"]]
    _, w, h = keys[0]
    keys = [k[0] for k in keys]
    fps = int(job["fps"])
    frames = max(2, round(job["duration"] * fps))
    tensors = reference.read_weights(weights)
    ph, pw = -(-h // reference.PAD_TO) * reference.PAD_TO, -(-w // reference.PAD_TO) * reference.PAD_TO
    sess = reference.session(tensors, ph, pw, reference.SCALES, threads)
    padded = [reference.padded(k, h, w) for k in keys]

    def video():
        enc = subprocess.Popen(
            ["ffmpeg", "-v", "error", "-y", "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{w}x{h}",
             "-r", str(fps), "-i", "-", "-c:v", "libx264", "-profile:v", "baseline", "-pix_fmt", "yuv420p",
             "-movflags", "+faststart", out],
            stdin=subprocess.PIPE)
        n = len(keys)
        for f in range(frames):
            p = f * (n - 1) / (frames - 1)
            k = min(int(p), n - 1)
            t = p - k
            if t < 1e-6 or k == n - 1:
                frame = keys[k]
            else:
                feeds = {"img0": padded[k], "img1": padded[k + 1],
                         "timestep": np.full((1, 1, ph, pw), t, dtype=np.float32)}
                frame = np.clip(sess.run(None, feeds)[0][0, :, :h, :w], 0.0, 1.0)
            enc.stdin.write((frame.transpose(1, 2, 0) * 255.0 + 0.5).astype(np.uint8).tobytes())
        enc.stdin.close()
        assert enc.wait() == 0, "ffmpeg failed"

    video()  # warm-up
    times = []
    for _ in range(max(rounds, 1)):
        started = time.perf_counter()
        video()
        times.append(time.perf_counter() - started)
    times.sort()
    median = times[len(times) // 2]
    print(json.dumps({"engine": "onnxruntime+ffmpeg", "threads": threads, "frames": frames,
                      "median_s_per_video": round(median, 3),
                      "video_s_per_wall_s": round(frames / fps / median, 3),
                      "frames_per_s": round(frames / median, 2)}))


if __name__ == "__main__":
    main()
