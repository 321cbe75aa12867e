"""With the real models, through the `openai` SDK's Realtime client: a tool the server runs on the sample
MCP server (a subprocess on the official `mcp` SDK) is listed, called and answered in words; and a
conversation's later turns read their prompt's start from the KV cache (`cached_tokens`), kept there by a
`retention_ratio` cut."""

import asyncio

import openai
import pytest
import pytest_asyncio

from voicepipe.bench.mcp_server import serve_http
from voicepipe.mcp_servers import McpPolicy

pytestmark = pytest.mark.asyncio(loop_scope="module")
TIMEOUT_S = 120


@pytest.fixture(scope="module")
def weather():
    with serve_http() as url:
        yield url


@pytest_asyncio.fixture(loop_scope="module")
async def client(server, runtime, weather):
    runtime.mcp = McpPolicy(allowed_urls=(weather,))
    yield openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="not-needed", max_retries=0)
    runtime.mcp = McpPolicy()


async def until(conn, kind: str, seen: list) -> object:
    while True:
        event = await asyncio.wait_for(conn.recv(), TIMEOUT_S)
        seen.append(event)
        if event.type == "error":
            raise AssertionError(event.error.message)
        if event.type == kind:
            return event


async def ask(conn, text: str) -> object:
    await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": text}]})
    await conn.response.create()
    return await until(conn, "response.done", [])


async def test_the_model_calls_an_mcp_tool_and_answers_with_its_result_in_words(client, weather):
    async with client.realtime.connect(model="voicepipe") as conn:
        await conn.session.update(session={
            "type": "realtime", "output_modalities": ["text"], "tool_choice": "required",
            "instructions": "You are a weather assistant. Answer in one short sentence.",
            "tools": [{"type": "mcp", "server_label": "weather", "server_url": weather,
                       "allowed_tools": ["forecast"], "require_approval": "never"}]})
        await until(conn, "mcp_list_tools.completed", [])
        done = await ask(conn, "What will the weather be like in Paris tomorrow?")
    call = next(o for o in done.response.output if o.type == "mcp_call")
    assert call.name == "forecast" and call.output.endswith("21 degrees.") and call.error is None
    answer = next(o for o in done.response.output if o.type == "message").content[0].text
    assert {"sunny", "21"} & set(answer.lower().replace(",", " ").replace(".", " ").split()), answer
    assert not {"<", "{", "function"} & set(answer.lower().split())  # words, not the call format


async def test_later_turns_read_their_prompt_start_from_the_cache_after_a_retention_cut(client):
    async with client.realtime.connect(model="voicepipe") as conn:
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"],
                                           "truncation": {"type": "retention_ratio", "retention_ratio": 0.5}})
        updated = await until(conn, "session.updated", [])
        assert updated.session.truncation.retention_ratio == 0.5
        usages = [(await ask(conn, question)).response.usage for question in (
            "Name a colour.", "Name a fruit.", "Name an animal.")]
    for usage in usages[1:]:  # each turn after the first extends the one before, in the cache
        assert 0 < usage.input_token_details.cached_tokens <= usage.input_tokens
