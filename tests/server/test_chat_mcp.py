"""MCP servers named in a chat completion's tools, over the fake engine and the sample MCP server (the
official `mcp` SDK's, in a subprocess), through the `openai` SDK: the server lists the tools, runs the call
the reply makes and answers from its result in the same completion, whole or streamed; a client's own
function is still the client's; approvals, dead servers and servers off the allow-list are refused."""

import json

import openai
import pytest
import pytest_asyncio
from support.fake_call import fake_server

from voicepipe.bench.mcp_server import free_port, serve_http
from voicepipe.call.limits import Limits
from voicepipe.constrained import tools
from voicepipe.mcp_servers import McpPolicy

pytestmark = pytest.mark.asyncio(loop_scope="module")
DEAD = f"http://127.0.0.1:{free_port()}/mcp"  # allowed, and nothing listens there
REPLIES = {"Weather in Paris?": tools.call_text("forecast", '{"city": "Paris"}'),
           "Weather in Oslo?": "Let me look." + tools.call_text("forecast", '{"city": "Oslo"}'),
           "Call me back.": tools.call_text("call_back", '{"when": "now"}')}
CALL_BACK = {"type": "function", "function": {"name": "call_back", "parameters": {
    "type": "object", "properties": {"when": {"type": "string"}}, "required": ["when"]}}}


def server_tool(url: str, **fields) -> dict:
    return {"type": "mcp", "server_label": "weather", "server_url": url, "require_approval": "never", **fields}


@pytest.fixture(scope="module")
def weather():
    with serve_http() as url:
        yield url


@pytest_asyncio.fixture(loop_scope="module")
async def client(weather):
    async with fake_server(Limits(), replies=REPLIES, mcp=McpPolicy(allowed_urls=(weather, DEAD))) as (server, _):
        yield openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused")


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


async def test_the_server_runs_the_call_and_answers_from_its_result_in_the_same_completion(client, weather):
    answer = await client.chat.completions.create(model="voicepipe", messages=ask("Weather in Paris?"),
                                                  tools=[server_tool(weather, allowed_tools=["forecast"])])
    message = answer.choices[0].message
    assert message.content == "The answer is Sunny in Paris, 21 degrees.."  # the fake reads the result out
    assert message.tool_calls is None and answer.choices[0].finish_reason == "stop"
    ran = message.model_extra["mcp_calls"]
    assert [(c["server_label"], c["name"], json.loads(c["arguments"]), c["output"]) for c in ran] == \
        [("weather", "forecast", {"city": "Paris"}, "Sunny in Paris, 21 degrees.")]
    assert answer.usage.completion_tokens > 6  # the call's tokens and the answer's


async def test_a_streamed_completion_carries_the_answer_and_never_the_servers_call(client, weather):
    stream = await client.chat.completions.create(model="voicepipe", messages=ask("Weather in Paris?"),
                                                  tools=[server_tool(weather)], stream=True)
    chunks = [chunk async for chunk in stream]
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == "The answer is Sunny in Paris, 21 degrees.."
    assert not any(d.tool_calls for d in deltas)
    assert chunks[-1].choices[0].finish_reason == "stop"


async def test_words_before_the_call_and_the_answer_read_the_same_whole_and_streamed(client, weather):
    whole = await client.chat.completions.create(model="voicepipe", messages=ask("Weather in Oslo?"),
                                                 tools=[server_tool(weather)])
    stream = await client.chat.completions.create(model="voicepipe", messages=ask("Weather in Oslo?"),
                                                  tools=[server_tool(weather)], stream=True)
    streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert whole.choices[0].message.content == streamed == "Let me look. The answer is Sunny in Oslo, 21 degrees.."


async def test_a_function_of_the_clients_is_still_the_clients_beside_a_server(client, weather):
    answer = await client.chat.completions.create(model="voicepipe", messages=ask("Call me back."),
                                                  tools=[server_tool(weather), CALL_BACK])
    message = answer.choices[0].message
    assert [c.function.name for c in message.tool_calls] == ["call_back"]
    assert answer.choices[0].finish_reason == "tool_calls" and "mcp_calls" not in (message.model_extra or {})


@pytest.mark.parametrize("tool, status, param", [
    ({"type": "mcp", "server_label": "weather", "server_url": "WEATHER"}, 400, "tools[0].require_approval"),
    (server_tool("http://127.0.0.1:9/elsewhere"), 400, "tools[0].server_url"),
    (server_tool(DEAD), 424, "tools[0].server_label"),
])
async def test_a_server_that_needs_approval_is_not_allowed_or_is_dead_is_refused(client, weather, tool, status,
                                                                                 param):
    if tool.get("server_url") == "WEATHER":
        tool = {**tool, "server_url": weather}
    with pytest.raises(openai.APIStatusError) as refused:
        await client.chat.completions.create(model="voicepipe", messages=ask("Weather in Paris?"), tools=[tool])
    assert refused.value.status_code == status and refused.value.body["param"] == param
