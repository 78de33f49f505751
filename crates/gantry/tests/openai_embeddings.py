"""The embeddings route driven by the official OpenAI Python SDK and by
LangChain's OpenAIEmbeddings, against a running Gantry (the Rust test
`embeddings::real_clients_get_the_reference_vectors` starts it).

Environment: OPENAI_BASE_URL (…/v2/<model>/openai/v1), OPENAI_API_KEY,
GANTRY_MODEL, GANTRY_REFERENCE (reference.json of the embedding crate: the
vectors sentence-transformers makes for its sentences).
"""
import json
import math
import os

import openai
from langchain_openai import OpenAIEmbeddings

MODEL = os.environ["GANTRY_MODEL"]
with open(os.environ["GANTRY_REFERENCE"], encoding="utf-8") as f:
    REFERENCE = json.load(f)
SENTENCES = REFERENCE["sentences"]
VECTORS = REFERENCE["embeddings"]


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def check_vector(got, i, how):
    assert len(got) == len(VECTORS[i]), (how, len(got))
    similarity = cosine(got, VECTORS[i])
    assert similarity > 1 - 1e-4, (how, SENTENCES[i], similarity)


client = openai.OpenAI()

# One string; the SDK asks for base64 by default and decodes it itself.
one = client.embeddings.create(model=MODEL, input=SENTENCES[0])
assert one.object == "list" and one.model == MODEL, one
assert len(one.data) == 1 and one.data[0].index == 0 and one.data[0].object == "embedding"
check_vector(one.data[0].embedding, 0, "one string, base64")
tokens_0 = len(REFERENCE["token_ids"][0]) - 2
assert one.usage.prompt_tokens == tokens_0 and one.usage.total_tokens == tokens_0, one.usage

# Floats asked for explicitly: the same vector.
floats = client.embeddings.create(model=MODEL, input=SENTENCES[0], encoding_format="float")
check_vector(floats.data[0].embedding, 0, "one string, float")
assert max(abs(a - b) for a, b in zip(floats.data[0].embedding, one.data[0].embedding)) < 1e-6

# Every reference sentence in one request (long ones cut to the model's
# length, as sentence-transformers does), answered in order.
many = client.embeddings.create(model=MODEL, input=SENTENCES)
assert [d.index for d in many.data] == list(range(len(SENTENCES)))
for i, item in enumerate(many.data):
    check_vector(item.embedding, i, "batch")
expected_tokens = sum(len(ids) - 2 for ids in REFERENCE["token_ids"])
assert many.usage.prompt_tokens == expected_tokens, (many.usage, expected_tokens)

# Token ids of the model's own vocabulary give the text's vector.
ids = [REFERENCE["token_ids"][i][1:-1] for i in (1, 2)]
by_ids = client.embeddings.create(model=MODEL, input=ids)
check_vector(by_ids.data[0].embedding, 1, "token ids")
check_vector(by_ids.data[1].embedding, 2, "token ids")

# The model's own length is accepted; another is refused in OpenAI's shape.
client.embeddings.create(model=MODEL, input="x", dimensions=len(VECTORS[0]))
try:
    client.embeddings.create(model=MODEL, input="x", dimensions=64)
    raise AssertionError("dimensions=64 was accepted")
except openai.BadRequestError as e:
    assert "dimensions" in str(e), e

# LangChain's client, as applications use it with an OpenAI-compatible
# server (no tiktoken token ids: those are OpenAI's vocabulary, not this model's).
lc = OpenAIEmbeddings(
    model=MODEL,
    base_url=os.environ["OPENAI_BASE_URL"],
    api_key=os.environ["OPENAI_API_KEY"],
    check_embedding_ctx_length=False,
)
check_vector(lc.embed_query(SENTENCES[3]), 3, "langchain query")
for i, vector in zip((4, 5, 6), lc.embed_documents(SENTENCES[4:7])):
    check_vector(vector, i, "langchain documents")

print("embeddings clients: all checks passed")
