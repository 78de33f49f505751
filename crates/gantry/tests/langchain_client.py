"""Drives Gantry's OpenAI-compatible chat route with LangChain's `ChatOpenAI`
(package `langchain-openai`), as an application built on LangChain would:
a chat, a streamed chat, a tool call through `bind_tools` with a forced
`tool_choice`, the tool's result sent back, and structured output. Run by
the Rust test `text::langchain_chat_openai_works_against_it`."""
import os

from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

llm = ChatOpenAI(
    model=os.environ["GANTRY_MODEL"],
    base_url=os.environ["OPENAI_BASE_URL"],
    api_key=os.environ["OPENAI_API_KEY"],
    temperature=0,
    max_tokens=60,
    max_retries=0,
)

# A chat, whole and streamed: the same text, and token usage in the metadata.
messages = [SystemMessage("Answer in one short sentence."), HumanMessage("What is the capital of France?")]
reply = llm.invoke(messages)
assert "Paris" in reply.content, reply
assert reply.usage_metadata["total_tokens"] > 0, reply.usage_metadata
streamed = "".join(chunk.content for chunk in llm.stream(messages))
assert streamed == reply.content, (streamed, reply.content)


@tool
def get_weather(city: str, unit: str) -> str:
    """The current weather in a city; unit is celsius or fahrenheit."""
    return f'{{"city": "{city}", "temperature": 21, "unit": "{unit}"}}'


# A forced call of the bound tool: LangChain parses it into `tool_calls`.
with_tools = llm.bind_tools([get_weather], tool_choice="get_weather", parallel_tool_calls=False)
question = HumanMessage("What is the weather in Paris, in celsius?")
call_message = with_tools.invoke([question])
assert len(call_message.tool_calls) >= 1, call_message
call = call_message.tool_calls[0]
assert call["name"] == "get_weather", call
assert isinstance(call["args"].get("city"), str) and isinstance(call["args"].get("unit"), str), call
assert call["id"], call
assert not call_message.invalid_tool_calls, call_message.invalid_tool_calls

# The same, streamed: LangChain assembles the fragments into the same call.
chunks = None
for chunk in with_tools.stream([question]):
    chunks = chunk if chunks is None else chunks + chunk
assert chunks.tool_calls and chunks.tool_calls[0]["name"] == "get_weather", chunks
assert chunks.tool_calls[0]["args"] == call["args"], (chunks.tool_calls, call)

# The tool's result goes back; the model answers in text.
result = get_weather.invoke(call)
assert isinstance(result, ToolMessage), result
answer = llm.bind_tools([get_weather], tool_choice="none").invoke([question, call_message, result])
assert isinstance(answer.content, str) and answer.content, answer
assert not answer.tool_calls, answer


# Structured output the way LangChain asks for it (a JSON schema response format).
class City(BaseModel):
    """A city and its country."""

    name: str = Field(max_length=40)
    country: str = Field(max_length=40)


city = llm.with_structured_output(City, method="json_schema").invoke("Name a city in France.")
assert isinstance(city, City), city

print("langchain: all checks passed")
