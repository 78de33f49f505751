"""Drives Gantry's OpenAI-compatible routes with the official `openai` SDK,
changing only base_url and api_key. Run by the Rust test
`text::the_official_openai_python_sdk_works_against_it`."""
import os
import sys

import openai
from openai import OpenAI

model = os.environ["GANTRY_MODEL"]
client = OpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"], max_retries=0)
messages = [{"role": "user", "content": "What is the capital of France?"}]

answer = client.chat.completions.create(model=model, messages=messages, max_tokens=16, temperature=0)
text = answer.choices[0].message.content
assert "Paris" in text, text
assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens

streamed = []
usage = None
for chunk in client.chat.completions.create(
    model=model, messages=messages, max_tokens=16, temperature=0, stream=True, stream_options={"include_usage": True}
):
    if chunk.usage is not None:
        usage = chunk.usage
    for choice in chunk.choices:
        if choice.delta.content:
            streamed.append(choice.delta.content)
assert "".join(streamed) == text, ("".join(streamed), text)
assert usage is not None and usage.completion_tokens == answer.usage.completion_tokens, usage

completion = client.completions.create(model=model, prompt="The capital of France is", max_tokens=4, temperature=0)
assert "Paris" in completion.choices[0].text, completion

assert [m.id for m in client.models.list()] == [model]

try:
    client.chat.completions.create(model=model, messages=[], max_tokens=4)
    sys.exit("an empty conversation was accepted")
except openai.BadRequestError as error:
    assert "messages" in str(error), error

bad = OpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key="gk_not_a_key", max_retries=0)
try:
    bad.models.list()
    sys.exit("a bad key was accepted")
except openai.AuthenticationError:
    pass

print("openai sdk: all checks passed")
