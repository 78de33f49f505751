"""Drives Gantry's OpenAI-compatible routes with the official `openai` SDK,
changing only base_url and api_key. Run by the Rust test
`text::the_official_openai_python_sdk_works_against_it`."""
import os
import sys

import json

import jsonschema
import openai
from openai import OpenAI
from pydantic import BaseModel, Field

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

# Structured output: any JSON object, then a schema, enforced while generating.
capital = [{"role": "user", "content": 'What is the capital of France? Answer in JSON, like {"capital": "..."}.'}]
answer = client.chat.completions.create(
    model=model, messages=capital, max_tokens=100, temperature=0, response_format={"type": "json_object"}
)
assert answer.choices[0].finish_reason == "stop", answer
assert isinstance(json.loads(answer.choices[0].message.content), dict), answer

schema = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "country": {"type": "string", "maxLength": 30},
        "population": {"type": "integer", "minimum": 0},
        "landmarks": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 3},
        "coastal": {"type": "boolean"},
    },
    "required": ["city", "country", "population", "landmarks", "coastal"],
    "additionalProperties": False,
}
answer = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Describe Paris."}],
    max_tokens=200,
    temperature=0,
    response_format={"type": "json_schema", "json_schema": {"name": "city", "strict": True, "schema": schema}},
)
assert answer.choices[0].finish_reason == "stop", answer
jsonschema.validate(json.loads(answer.choices[0].message.content), schema)

# `{"type": "text"}` is plain text; a schema the grammar cannot express is a 400 naming `response_format`.
answer = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0, response_format={"type": "text"})
assert answer.choices[0].message.content, answer
unsupported = {"type": "json_schema", "json_schema": {"name": "code", "schema": {"type": "string", "pattern": "^[A-Z]{3}$"}}}
for stream in (False, True):
    try:
        client.chat.completions.create(model=model, messages=messages, max_tokens=8, response_format=unsupported, stream=stream)
        sys.exit("an unsupported schema was accepted")
    except openai.BadRequestError as error:
        assert error.param == "response_format", (error.param, error)
        assert "pattern" in str(error), error


class Landmark(BaseModel):
    name: str = Field(max_length=40)
    year_built: int


class City(BaseModel):
    name: str = Field(max_length=40)
    country: str = Field(max_length=40)
    landmarks: list[Landmark] = Field(max_length=2)


parse = client.beta.chat.completions.parse if hasattr(client, "beta") and hasattr(client.beta, "chat") else client.chat.completions.parse
parsed = parse(
    model=model,
    messages=[{"role": "user", "content": "Tell me about Paris and one of its landmarks."}],
    max_tokens=250,
    temperature=0,
    response_format=City,
)
city = parsed.choices[0].message.parsed
assert isinstance(city, City), parsed
assert len(city.landmarks) <= 2, city

# Function calling: forced calls, named calls, streamed calls as the SDK assembles them.
weather_tool = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
time_tool = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
tools = [weather_tool, time_tool]
ask = [{"role": "user", "content": "What is the weather in Paris?"}]
for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
    answer = client.chat.completions.create(
        model=model, messages=ask, tools=tools, tool_choice=choice, parallel_tool_calls=False, max_tokens=100, temperature=0
    )
    message = answer.choices[0].message
    assert answer.choices[0].finish_reason == "tool_calls", answer
    assert len(message.tool_calls) == 1, message
    call = message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_"), call
    assert call.function.name in ("get_weather", "get_time"), call
    if isinstance(choice, dict) or call.function.name == "get_weather":
        assert call.function.name == "get_weather", call
        jsonschema.validate(json.loads(call.function.arguments), weather_tool["function"]["parameters"])

# The same forced call, streamed: the fragments assemble into the same call.
calls = {}
finish = None
for chunk in client.chat.completions.create(
    model=model, messages=ask, tools=tools, tool_choice={"type": "function", "function": {"name": "get_weather"}},
    parallel_tool_calls=False, max_tokens=100, temperature=0, stream=True,
):
    for choice in chunk.choices:
        for delta in choice.delta.tool_calls or []:
            entry = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
            if delta.id:
                entry["id"] = delta.id
            if delta.function and delta.function.name:
                entry["name"] += delta.function.name
            if delta.function and delta.function.arguments:
                entry["arguments"] += delta.function.arguments
        finish = choice.finish_reason or finish
assert finish == "tool_calls", finish
assert list(calls) == [0] and calls[0]["name"] == "get_weather" and calls[0]["id"], calls
assert json.loads(calls[0]["arguments"]) == json.loads(call.function.arguments), (calls, call)

# The SDK's own stream helper assembles them too, and parses strict tools' arguments.
class GetWeather(BaseModel):
    city: str = Field(max_length=40)
    unit: str = Field(max_length=12)


with client.beta.chat.completions.stream(
    model=model, messages=ask, tools=[openai.pydantic_function_tool(GetWeather)], tool_choice="required",
    parallel_tool_calls=False, max_tokens=100, temperature=0,
) as stream:
    for _ in stream:
        pass
    final = stream.get_final_completion()
streamed_call = final.choices[0].message.tool_calls[0]
assert streamed_call.function.name == "GetWeather", final
assert isinstance(streamed_call.function.parsed_arguments, GetWeather), streamed_call

# A tool's result in the conversation, answered with text (no tools offered again).
history = ask + [
    {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
    {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "sky": "clear"}'},
]
answer = client.chat.completions.create(model=model, messages=history, tools=tools, tool_choice="none", max_tokens=40, temperature=0)
assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls, answer
# `auto`: text or a call, well formed either way.
answer = client.chat.completions.create(model=model, messages=ask, tools=tools, max_tokens=60, temperature=0)
for call in answer.choices[0].message.tool_calls or []:
    json.loads(call.function.arguments)

# Log-probabilities, penalties, min_p, n > 1 (streamed too), seed and user.
answer = client.chat.completions.create(
    model=model, messages=messages, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2,
    presence_penalty=0.5, frequency_penalty=0.5, seed=3, user="sdk-test", extra_body={"min_p": 0.05},
)
entries = answer.choices[0].logprobs.content
assert len(entries) == answer.usage.completion_tokens, (len(entries), answer.usage)
assert all(e.logprob <= 0 and len(e.top_logprobs) == 2 for e in entries), entries
assert "".join(e.token for e in entries).startswith(answer.choices[0].message.content[:3]), entries

answer = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=1.0, seed=5, n=2)
assert [c.index for c in answer.choices] == [0, 1], answer
texts = {0: "", 1: ""}
usage = None
for chunk in client.chat.completions.create(
    model=model, messages=messages, max_tokens=8, temperature=1.0, seed=5, n=2, stream=True, stream_options={"include_usage": True}
):
    usage = chunk.usage or usage
    for choice in chunk.choices:
        texts[choice.index] += choice.delta.content or ""
assert [texts[0], texts[1]] == [c.message.content for c in answer.choices], (texts, answer)
assert usage.completion_tokens == answer.usage.completion_tokens and usage.prompt_tokens == answer.usage.prompt_tokens, usage

# The legacy operation: logprobs as a count; echo and suffix are refused by name.
completion = client.completions.create(model=model, prompt="The capital of France is", max_tokens=4, temperature=0, logprobs=2)
assert len(completion.choices[0].logprobs.tokens) == completion.usage.completion_tokens, completion
assert all(len(top) == 2 for top in completion.choices[0].logprobs.top_logprobs), completion
for extra in ({"echo": True}, {"suffix": " and that is all."}):
    try:
        client.completions.create(model=model, prompt="Hello", max_tokens=4, **extra)
        sys.exit(f"{extra} was accepted")
    except openai.BadRequestError as error:
        assert error.param == next(iter(extra)), error

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
