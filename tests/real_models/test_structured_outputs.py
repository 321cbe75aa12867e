"""Structured outputs and tool calls from the default model, through the clients people use: the `openai`
SDK's `parse` with a pydantic model and its tool calls, and LangChain's `with_structured_output` and
`bind_tools(..., tool_choice="required")`. Whatever the small model would have said, the grammar makes
each answer a valid object."""

import json

import jsonschema
import openai
import pytest
from pydantic import BaseModel

pytestmark = pytest.mark.asyncio(loop_scope="module")
MULTIPLY = {"type": "function", "function": {
    "name": "multiply", "description": "Multiply two whole numbers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"], "additionalProperties": False}}}


class City(BaseModel):
    name: str
    country: str
    population_millions: float


@pytest.fixture
def client(server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="not-needed", max_retries=0)


async def test_the_sdks_parse_returns_a_valid_object_of_the_schema(client):
    reply = await client.chat.completions.parse(
        model="any", messages=[{"role": "user", "content": "Describe Paris as JSON."}], response_format=City,
        max_tokens=80, temperature=0)
    city = reply.choices[0].message.parsed
    assert isinstance(city, City) and city.name, reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
async def test_a_required_tool_call_has_arguments_that_match_the_tools_schema(client, temperature):
    reply = await client.chat.completions.create(
        model="any", messages=[{"role": "user", "content": "What is 37 times 43?"}], tools=[MULTIPLY],
        tool_choice="required", max_tokens=60, temperature=temperature, seed=1)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    (call,) = choice.message.tool_calls
    assert call.function.name == "multiply"
    jsonschema.validate(json.loads(call.function.arguments), MULTIPLY["function"]["parameters"])


async def test_json_object_mode_answers_one_json_object(client):
    reply = await client.chat.completions.create(
        model="any", messages=[{"role": "user", "content": "Give me a JSON object with a colour."}],
        response_format={"type": "json_object"}, max_tokens=60, temperature=0)
    if reply.choices[0].finish_reason == "stop":  # a small model may still write an object past the limit
        assert isinstance(json.loads(reply.choices[0].message.content), dict)
    else:
        assert reply.choices[0].message.content.startswith("{")


async def test_langchain_structured_output_and_required_tools_give_valid_objects(server):
    langchain_openai = pytest.importorskip("langchain_openai")
    llm = langchain_openai.ChatOpenAI(base_url=f"{server.url}/v1", api_key="not-needed", model="voicepipe",
                                      temperature=0, max_tokens=80, max_retries=0)
    city = await llm.with_structured_output(City).ainvoke("Describe Rome.")
    assert isinstance(city, City) and city.name
    message = await llm.bind_tools([MULTIPLY], tool_choice="required").ainvoke("What is 37 times 43?")
    (call,) = message.tool_calls
    assert call["name"] == "multiply" and set(call["args"]) == {"a", "b"}
    assert all(isinstance(v, int) for v in call["args"].values())
