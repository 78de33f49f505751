"""Runs a Piper voice's ONNX graph with onnxruntime on given phoneme ids.

    python3 reference.py MODEL.onnx IDS.json NOISE_SCALE LENGTH_SCALE NOISE_W OUT.f32

IDS.json is a JSON list of ints; OUT.f32 gets the output samples as little-endian
float32. One intra-op thread, graph optimisations at onnxruntime's default: the
reference the Rust path (crates/models/speech/tests/voice.rs) is checked against.
"""
import json
import sys

import numpy as np
import onnxruntime as ort


def main() -> None:
    model, ids_path, noise_scale, length_scale, noise_w, out = sys.argv[1:7]
    ids = json.load(open(ids_path))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    audio = session.run(
        None,
        {
            "input": np.array([ids], dtype=np.int64),
            "input_lengths": np.array([len(ids)], dtype=np.int64),
            "scales": np.array([float(noise_scale), float(length_scale), float(noise_w)], dtype=np.float32),
        },
    )[0]
    np.asarray(audio, dtype="<f4").reshape(-1).tofile(out)


if __name__ == "__main__":
    main()
