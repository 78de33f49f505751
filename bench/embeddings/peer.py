"""The peer of bench/embeddings/run.sh: sentence-transformers encoding the
same sentences on the same CPU, one at a time and 64 at a time, for the
given number of seconds each. Prints: sentences/s at batch 1, at batch 64,
and the library versions."""
import json
import os
import sys
import time

import torch
from sentence_transformers import SentenceTransformer
import sentence_transformers

directory, sentences_path, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
torch.set_num_threads(os.cpu_count())
model = SentenceTransformer(directory, device="cpu")
sentences = json.load(open(sentences_path))


def rate(texts, batch_size):
    model.encode(texts, batch_size=batch_size)  # warm-up
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        model.encode(texts, batch_size=batch_size)
        done += len(texts)
    return done / (time.perf_counter() - start)


one = rate([sentences["one"]], 1)
batch = rate(sentences["batch"], 64)
print(f"{one:.1f} {batch:.1f} sentence-transformers-{sentence_transformers.__version__}/torch-{torch.__version__}")
