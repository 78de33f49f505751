"""The hibari-tts package's own synthesis of a text, with the vocoder's noise off.

    python3 hibari_reference.py WHEEL TEXT SPEED OUT.json

WHEEL is hibari_tts-0.2.1-py3-none-any.whl (`pip download --no-deps
hibari-tts==0.2.1`); it is unpacked into a temporary directory and imported
from there, never installed. OUT.json gets
{"chunks": [phoneme strings], "ids": [[ids of each chunk]], "samples": [floats]}:
the reference that crates/models/speech/tests/hibari.rs checks the Rust voice
against (its G2P, ids, graph run and vocoder). Needs numpy and onnxruntime.
"""
import json
import sys
import tempfile
import zipfile

import numpy as np


class Silence:
    """Stands in for numpy's Generator: the vocoder's noise becomes zeros."""

    def standard_normal(self, shape, dtype=np.float64):
        return np.zeros(shape, dtype=dtype)


def main() -> None:
    wheel, text, speed, out = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    with tempfile.TemporaryDirectory() as unpacked:
        zipfile.ZipFile(wheel).extractall(unpacked)
        sys.path.insert(0, unpacked)
        from hibari.tts import Hibari

        tts = Hibari(threads=1)
        chunks = tts.phonemize(text)
        ids = [tts.ids(chunk) for chunk in chunks]
        parts = [tts.from_ids(chunk_ids, speed, Silence()) for chunk_ids in ids]
        samples = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"chunks": chunks, "ids": ids, "samples": samples.astype(float).tolist()}, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
